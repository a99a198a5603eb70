package pipeline

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/router/route"
)

// A stream the upstream ends ([DONE]) with a choice it never finished — a
// server that sends finish_reason for choice 0 of n=2 only, or for a tool
// call never — reaches the client with every choice finished before
// [DONE]: the spec's choices end with a finish_reason, and the SDKs'
// stream helpers (openai-node's finalChatCompletion: "missing
// finish_reason for choice 1") refuse one without. The choice finishes
// "stop", or "tool_calls" when it streamed a call; choice 0 keeps the
// upstream's; every chunk is spec-valid.
func TestUnfinishedChoicesAreFinishedAtTheStreamsEnd(t *testing.T) {
	spec := openapitest.Load(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `data: {"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[%s]}` + "\n\n"
		fmt.Fprintf(w, chunk, `{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":"Yo"},"finish_reason":null}`)
		fmt.Fprintf(w, chunk, `{"index":2,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}`)
		fmt.Fprintf(w, chunk, `{"index":0,"delta":{},"finish_reason":"length"}`)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}}})
	resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"m","n":3,"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	finish := map[int64]string{}
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(data))
		gjson.Get(data, "choices").ForEach(func(_, ch gjson.Result) bool {
			if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
				if _, twice := finish[ch.Get("index").Int()]; twice {
					t.Errorf("choice %d finished twice: %s", ch.Get("index").Int(), data)
				}
				finish[ch.Get("index").Int()] = fr.Str
			}
			return true
		})
	}
	if want := map[int64]string{0: "length", 1: "stop", 2: "tool_calls"}; !done || fmt.Sprint(finish) != fmt.Sprint(want) {
		t.Fatalf("finish reasons %v ([DONE] %v), want %v", finish, done, want)
	}
}

// An upstream's 401 refuses the target's API key — Molly's credentials,
// not the client's. The client's SDK must not get a
// 401 (openai-node's AuthenticationError: "your API key is invalid") for a
// key that is valid: the next target serves, and when none does the
// answer is 502 upstream_auth_failed with x-should-retry: false (retrying
// cannot fix the operator's key), never the upstream's body (which may
// echo the key).
func TestAnUpstreamRefusingItsKeyIsNotTheClientsAuthError(t *testing.T) {
	spec := openapitest.Load(t)
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if n := calls.Add(1); n == 1 || strings.Contains(r.URL.Path, "/refusing/") {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":{"message":"Incorrect API key provided: sk-upstr****1234.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)
			return
		}
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(up.Close)
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	gw, _ := startGateway(t, setup{targets: []*route.Target{
		{Name: "a", Tier: "T2", Endpoint: up.URL + "/v1", Models: []string{"m"}},
		{Name: "b", Tier: "T2", Endpoint: up.URL + "/v1", Models: []string{"m"}},
	}})
	if r := post(t, gw.URL+"/v1/chat/completions", body); r.status != 200 || gjson.Get(r.body, "choices.0.message.content").Str != "ok" || calls.Load() != 2 {
		t.Fatalf("with a second target: %d %s after %d upstream calls", r.status, r.body, calls.Load())
	}
	gw, _ = startGateway(t, setup{targets: []*route.Target{{Name: "a", Tier: "T2", Endpoint: up.URL + "/refusing/v1", Models: []string{"m"}}}})
	r := post(t, gw.URL+"/v1/chat/completions", body)
	spec.Validate(t, "ErrorResponse", []byte(r.body))
	if r.status != http.StatusBadGateway || gjson.Get(r.body, "error.code").Str != "upstream_auth_failed" ||
		r.header.Get("X-Should-Retry") != "false" || strings.Contains(r.body, "sk-upstr") {
		t.Fatalf("alone: %d %v %s", r.status, r.header, r.body)
	}
}

// An embeddings request for base64 (openai-node's default) answered with
// floats by a server that ignores encoding_format reaches the client as
// base64 — the little-endian float32 values, here of 0.5 and -1:
// AAAAPwAAgL8= — and one asking for floats keeps them.
func TestEmbeddingsComeInTheEncodingAskedFor(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"object":"list","model":"e","data":[{"object":"embedding","index":0,"embedding":[0.5,-1]}],"usage":{"prompt_tokens":1,"total_tokens":1}}`)
	}))
	t.Cleanup(up.Close)
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"e"}}}})
	for format, want := range map[string]string{`"base64"`: `"AAAAPwAAgL8="`, `"float"`: `[0.5,-1]`, `null`: `[0.5,-1]`} {
		r := post(t, gw.URL+"/v1/embeddings", `{"model":"e","input":"hi","encoding_format":`+format+`}`)
		if got := gjson.Get(r.body, "data.0.embedding").Raw; r.status != 200 || got != want {
			t.Errorf("encoding_format %s: %d %s, want the embedding %s", format, r.status, r.body, want)
		}
	}
}
