package egress

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"sync"
)

// handlerTransport is an http.RoundTripper that calls an http.Handler in
// process: the T0 engine is reached without a loopback hop, yet through the
// same Dispatch, fallback and streaming code as any upstream. The response
// is available as soon as the handler writes its header; the body streams
// through a pipe, and closing it cancels the handler's context.
type handlerTransport struct {
	h http.Handler
}

func (t *handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, _, err := serveInProcess(req, func(w http.ResponseWriter, r *http.Request) bool {
		t.h.ServeHTTP(w, r)
		return true
	})
	return resp, err
}

// serveInProcess runs serve on req in a goroutine and returns the response
// it writes, as soon as its header is written (the body streams through a
// pipe; closing it cancels serve's context). serve returning false without
// having written anything declines the request: served is then false and
// nothing else happened. A panic in serve is a 500 whose body ends with
// io.ErrUnexpectedEOF.
func serveInProcess(req *http.Request, serve func(http.ResponseWriter, *http.Request) bool) (resp *http.Response, served bool, err error) {
	ctx, cancel := context.WithCancel(req.Context())
	pr, pw := io.Pipe()
	rw := &pipeResponseWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	declined := make(chan struct{})
	go func() {
		ok := true
		defer func() {
			if p := recover(); p != nil {
				rw.fail(http.StatusInternalServerError)
			}
			if !ok && !rw.written() {
				close(declined)
				_ = pw.Close()
				return
			}
			rw.WriteHeader(http.StatusOK) // no-op when already written
			_ = pw.Close()
		}()
		ok = serve(rw, req.WithContext(ctx))
	}()
	select {
	case <-rw.ready:
	case <-declined:
		cancel()
		_ = pr.Close()
		return nil, false, nil
	case <-ctx.Done():
		cancel()
		_ = pr.Close()
		return nil, true, ctx.Err()
	}
	return &http.Response{
		Status:     strconv.Itoa(rw.status) + " " + http.StatusText(rw.status), // "200 OK", as net/http sets it
		StatusCode: rw.status,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        rw.header.Clone(),
		Body:          &cancelOnClose{ReadCloser: pr, cancel: cancel},
		ContentLength: -1,
		Request:       req,
	}, true, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	c.cancel()
	return c.ReadCloser.Close()
}

// pipeResponseWriter is the handler's side of handlerTransport.
type pipeResponseWriter struct {
	header http.Header
	pw     *io.PipeWriter
	once   sync.Once
	status int
	ready  chan struct{}
}

func (w *pipeResponseWriter) Header() http.Header { return w.header }

func (w *pipeResponseWriter) WriteHeader(status int) {
	w.once.Do(func() {
		w.status = status
		close(w.ready)
	})
}

// written reports whether the header was written.
func (w *pipeResponseWriter) written() bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

func (w *pipeResponseWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

// Flush is a no-op: the pipe hands every Write to the reader at once.
func (w *pipeResponseWriter) Flush() {}

func (w *pipeResponseWriter) fail(status int) {
	w.WriteHeader(status)
	_ = w.pw.CloseWithError(io.ErrUnexpectedEOF)
}
