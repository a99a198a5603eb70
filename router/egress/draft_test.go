package egress

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

func TestVerifyURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.0.0.5:8000/v1":   "http://10.0.0.5:8000/molly/engine/verify",
		"http://10.0.0.5:8000/v1/":  "http://10.0.0.5:8000/molly/engine/verify",
		"https://h/engine/v1":       "https://h/engine/molly/engine/verify",
		"http://h:1":                "http://h:1/molly/engine/verify",
		"http://h/openai":           "http://h/openai/molly/engine/verify",
		"http://user@h/v1?x=1#frag": "http://user@h/molly/engine/verify?x=1#frag",
	} {
		u, err := url.Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := VerifyURL(u); got != want {
			t.Errorf("VerifyURL(%s) = %s, want %s", in, got, want)
		}
	}
}

// The drafting transport: the engine's drafting (here handlers standing
// for its two outcomes) answers a chat completions POST in process, or
// declines it and the request goes to the upstream with its body intact;
// other requests always go to the upstream.
func TestDraftTransport(t *testing.T) {
	var upstreamGot []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		upstreamGot = append(upstreamGot, r.Method+" "+r.URL.Path+" "+string(b))
		_, _ = io.WriteString(w, "upstream")
	}))
	defer up.Close()
	draft := false
	var draftGot []string
	rt := &draftTransport{next: http.DefaultTransport, serve: func(w http.ResponseWriter, r *http.Request, body []byte) bool {
		draftGot = append(draftGot, r.URL.Path+" "+string(body))
		if !draft {
			return false
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "drafted")
		return true
	}}
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, up.URL+path, bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := do(http.MethodPost, "/v1/chat/completions", `{"a":1}`); code != 200 || b != "upstream" {
		t.Fatalf("declined: %d %q", code, b)
	}
	draft = true
	if code, b := do(http.MethodPost, "/v1/chat/completions", `{"b":2}`); code != http.StatusCreated || b != "drafted" {
		t.Fatalf("drafted: %d %q", code, b)
	}
	if code, b := do(http.MethodPost, "/v1/completions", `{"c":3}`); code != 200 || b != "upstream" {
		t.Fatalf("completions: %d %q", code, b)
	}
	if code, b := do(http.MethodGet, "/v1/models", ``); code != 200 || b != "upstream" {
		t.Fatalf("models: %d %q", code, b)
	}
	wantUp := []string{`POST /v1/chat/completions {"a":1}`, `POST /v1/completions {"c":3}`, `GET /v1/models `}
	wantDraft := []string{`/v1/chat/completions {"a":1}`, `/v1/chat/completions {"b":2}`}
	if len(upstreamGot) != len(wantUp) || len(draftGot) != len(wantDraft) {
		t.Fatalf("upstream got %q, drafting got %q", upstreamGot, draftGot)
	}
	for i := range wantUp {
		if upstreamGot[i] != wantUp[i] {
			t.Errorf("upstream request %d: %q, want %q", i, upstreamGot[i], wantUp[i])
		}
	}
	for i := range wantDraft {
		if draftGot[i] != wantDraft[i] {
			t.Errorf("drafting request %d: %q, want %q", i, draftGot[i], wantDraft[i])
		}
	}
}
