package egress

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The in-process transport carries any http.Handler; these handlers are
// the situations the engine can put it in (a slow stream, a panic, a
// handler that writes nothing), which the real engine cannot be made to
// produce on demand.
func TestHandlerTransport(t *testing.T) {
	t.Run("a handler that writes nothing answers 200 with an empty body", func(t *testing.T) {
		rt := &handlerTransport{h: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodPost, "http://engine.molly.internal/v1/chat/completions", nil))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Status != "200 OK" || len(b) != 0 || err != nil {
			t.Fatalf("status %q body %q err %v", resp.Status, b, err)
		}
	})
	t.Run("the request, status and headers pass as they are", func(t *testing.T) {
		var got *http.Request
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got = r
			w.Header().Set("X-Test", "1")
			w.WriteHeader(http.StatusTeapot)
			_, _ = io.WriteString(w, "short and stout")
		})}
		req := httptest.NewRequest(http.MethodGet, "http://engine.molly.internal/v1/models", nil)
		req.Header.Set("X-Molly-Decision-Id", "d-1")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 418 || resp.Header.Get("X-Test") != "1" || string(b) != "short and stout" {
			t.Fatalf("status %d header %v body %q", resp.StatusCode, resp.Header, b)
		}
		if got.Header.Get("X-Molly-Decision-Id") != "d-1" || got.URL.Path != "/v1/models" {
			t.Fatalf("the handler got %s %v", got.URL, got.Header)
		}
	})
	t.Run("a stream reaches the reader chunk by chunk while the handler is still writing", func(t *testing.T) {
		release := make(chan struct{})
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-release
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		})}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodPost, "http://engine.molly.internal/v1/chat/completions", nil))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); err != nil || line != "data: one\n" {
			t.Fatalf("first line %q, %v; want it before the handler finishes", line, err)
		}
		close(release)
		rest, _ := io.ReadAll(br)
		if string(rest) != "\ndata: [DONE]\n\n" {
			t.Fatalf("rest %q", rest)
		}
	})
	t.Run("closing the body cancels the handler's context", func(t *testing.T) {
		cancelled := make(chan struct{})
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "data: first\n\n")
			<-r.Context().Done()
			close(cancelled)
		})}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodPost, "http://engine.molly.internal/v1/chat/completions", nil))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		select {
		case <-cancelled:
		case <-time.After(5 * time.Second):
			t.Fatal("the handler's context was not cancelled after the body was closed")
		}
	})
	t.Run("a request cancelled before the header returns the context error", func(t *testing.T) {
		block := make(chan struct{})
		defer close(block)
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block })} // writes no header while the test runs
		ctx, cancel := context.WithCancel(t.Context())
		req := httptest.NewRequest(http.MethodGet, "http://engine.molly.internal/v1/models", nil).WithContext(ctx)
		cancel()
		if resp, err := rt.RoundTrip(req); err != context.Canceled || resp != nil {
			t.Fatalf("RoundTrip = %v, %v; want context.Canceled", resp, err)
		}
	})
	t.Run("a handler that panics before writing is a 500", func(t *testing.T) {
		rt := &handlerTransport{h: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("engine bug") })}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodPost, "http://engine.molly.internal/v1/chat/completions", nil))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 500 {
			t.Fatalf("status %d, want 500", resp.StatusCode)
		}
	})
	t.Run("a panic after the header truncates the body with an error", func(t *testing.T) {
		rt := &handlerTransport{h: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "partial")
			panic(http.ErrAbortHandler)
		})}
		resp, err := rt.RoundTrip(httptest.NewRequest(http.MethodGet, "http://engine.molly.internal/v1/models", nil))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "partial" || err != io.ErrUnexpectedEOF {
			t.Fatalf("body %q err %v; want partial and unexpected EOF", b, err)
		}
	})
}
