package pipeline

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/router/route"
)

// answering is an upstream that answers every request with status and body.
func answering(t *testing.T, status int, body string) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// The refusals of a prompt past the context window, as each server family
// writes them (from their documentation and sources), and 400s that are not.
var contextRefusals = []struct {
	name, body string
	status     int
}{
	{"OpenAI", `{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, 400},
	{"vLLM's flat form", `{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion).","type":"BadRequestError","param":null,"code":400}`, 400},
	{"llama.cpp's server", `{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5000,"n_ctx":4096}}`, 400},
	{"Anthropic's, relayed", `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}`, 400},
	{"a 413", `{"error":{"message":"Request too large: the prompt exceeds the context window of this model","type":"invalid_request_error"}}`, 413},
}

func TestAPromptPastOneContextWindowFallsBackToTheNext(t *testing.T) {
	for _, tc := range contextRefusals {
		t.Run(tc.name, func(t *testing.T) {
			small, hits := answering(t, tc.status, tc.body)
			big := upstreamtest.Start("big")
			t.Cleanup(big.Close)
			gw, _ := startGateway(t, setup{targets: []*route.Target{
				{Name: "small", Tier: "T1", Endpoint: small.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
				{Name: "big", Tier: "T2", Endpoint: big.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
			}})
			r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
			if r.status != 200 || r.header.Get(HeaderTarget) != "big" || hits.Load() != 1 || gjson.Get(r.body, "choices.0.message.content").String() != "big says: hello" {
				t.Fatalf("status %d target %q, small got %d: %s", r.status, r.header.Get(HeaderTarget), hits.Load(), r.body)
			}
			if route := r.header.Get(HeaderRoute); !strings.Contains(route, "small") || !strings.HasSuffix(route, "; fallback") {
				t.Fatalf("X-Molly-Route = %q, want the small target named and a fallback", route)
			}
		})
	}
	t.Run("when no candidate holds it the client gets the last refusal", func(t *testing.T) {
		a, _ := answering(t, 400, contextRefusals[2].body)
		b, _ := answering(t, 400, contextRefusals[0].body)
		gw, _ := startGateway(t, setup{targets: []*route.Target{
			{Name: "a", Tier: "T1", Endpoint: a.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			{Name: "b", Tier: "T2", Endpoint: b.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		}})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
		if r.status != 400 || gjson.Get(r.body, "error.code").String() != "context_length_exceeded" || r.header.Get(HeaderTarget) != "b" {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
	})
	t.Run("a refusal, then a failure: the refusal", func(t *testing.T) {
		a, _ := answering(t, 400, contextRefusals[0].body)
		b, _ := failing(t, 500)
		gw, _ := startGateway(t, setup{targets: []*route.Target{
			{Name: "a", Tier: "T1", Endpoint: a.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
			{Name: "b", Tier: "T2", Endpoint: b.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		}})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
		if r.status != 400 || gjson.Get(r.body, "error.code").String() != "context_length_exceeded" || r.header.Get(HeaderTarget) != "a" {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
	})
	t.Run("another 400 is the answer", func(t *testing.T) {
		for _, body := range []string{
			`{"error":{"message":"Invalid value for 'temperature'","type":"invalid_request_error","param":"temperature","code":"invalid_value"}}`,
			`{"error":{"message":"max_tokens is too large: 100000. This model supports at most 4096 completion tokens","type":"invalid_request_error","param":"max_tokens","code":null}}`,
		} {
			bad, _ := answering(t, 400, body)
			lan := upstreamtest.Start("lan")
			t.Cleanup(lan.Close)
			gw, _ := startGateway(t, setup{targets: []*route.Target{
				{Name: "best", Tier: "T1", Endpoint: bad.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
				{Name: "lan", Tier: "T2", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
			}})
			r := post(t, gw.URL+"/v1/chat/completions", chatBody("hello"))
			if r.status != 400 || r.header.Get(HeaderTarget) != "best" || lan.Count() != 0 {
				t.Fatalf("%s: status %d target %q, lan got %d", body, r.status, r.header.Get(HeaderTarget), lan.Count())
			}
		}
	})
}
