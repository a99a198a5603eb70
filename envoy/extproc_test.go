package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// threeTiers is a LAN, a self-hosted and an external target serving
// "chat"; with the default weights a public request prefers the external
// one (quality 0.95).
func threeTiers() []*route.Target {
	return []*route.Target{
		{Name: "lan", Tier: "T1", Models: []string{"chat=small-lan"}, LatencyMS: 300, Quality: map[string]float64{"default": 0.6}},
		{Name: "selfhosted", Tier: "T2", Models: []string{"chat=mid-remote"}, PriceIn: 0.2, PriceOut: 0.6, LatencyMS: 400, Quality: map[string]float64{"default": 0.75}},
		{Name: "external", Tier: "T3", Models: []string{"chat=gpt-4o-mini"}, PriceIn: 0.15, PriceOut: 0.6, LatencyMS: 800, Quality: map[string]float64{"default": 0.95}},
	}
}

func chatBody(prompt string, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": "chat", "stream": stream, "messages": []any{map[string]any{"role": "user", "content": prompt}}})
	return b
}

func post(body []byte) call {
	return call{method: "POST", path: "/v1/chat/completions", header: map[string]string{"content-type": "application/json"}, body: body}
}

// sseText decodes a chat completion stream as the client gets it: the
// concatenated delta contents, the data payloads and whether [DONE] came.
func sseText(t *testing.T, b []byte) (text string, events []string, done bool) {
	t.Helper()
	dec := relay.NewDecoder(bytes.NewReader(b))
	var sb strings.Builder
	for {
		ev, err := dec.Next()
		if errors.Is(err, io.EOF) {
			return sb.String(), events, done
		}
		if err != nil {
			t.Fatalf("the stream the client gets does not decode: %v\n%s", err, b)
		}
		if ev.IsDone() {
			done = true
			continue
		}
		events = append(events, string(ev.Data))
		gjson.GetBytes(ev.Data, "choices.#.delta.content").ForEach(func(_, v gjson.Result) bool {
			sb.WriteString(v.String())
			return true
		})
	}
}

func TestPolicyPointRoutesBySensitivityWithEnvoysMessageSequence(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"}})
	cases := []struct {
		name, prompt, cluster, tier, secret string
	}{
		{"a public prompt goes to the cluster the objective prefers", "Write a haiku about autumn", "external", "T3", ""},
		{"an email keeps the prompt off the external cluster", "Reply to mario.rossi@example.com about the invoice", "selfhosted", "T2", "mario.rossi@example.com"},
		{"a card number keeps the prompt on the LAN cluster", "My card is 4111 1111 1111 1111, is it valid?", "lan", "T1", "4111 1111 1111 1111"},
	}
	for _, tc := range cases {
		for _, mode := range []struct {
			name     string
			buffered bool
			pieces   int
		}{{"buffered", true, 1}, {"full duplex in 7 pieces", false, 7}} {
			t.Run(tc.name+"/"+mode.name, func(t *testing.T) {
				c := post(chatBody(tc.prompt, false))
				c.buffered, c.reqPieces, c.respPieces = mode.buffered, mode.pieces, mode.pieces
				c.header["authorization"] = "Bearer sk-client-key-not-forwarded"
				c.header["x-client-secret"] = "never upstream"
				c.header[HeaderCluster] = "external" // a client cannot pick the cluster
				c.header[HeaderModel] = "chat"
				out := f.play(t, c)
				if out.immediate != nil {
					t.Fatalf("answered immediately: %d %s", out.status, out.body)
				}
				if out.cluster != tc.cluster || out.route != "chat/"+tc.cluster {
					t.Fatalf("routed to %s by route %s, want %s", out.cluster, out.route, tc.cluster)
				}
				if out.meta["tier"] != tc.tier || out.meta["cluster"] != tc.cluster {
					t.Fatalf("dynamic metadata %v, want tier %s cluster %s", out.meta, tc.tier, tc.cluster)
				}
				if got := out.header.Get("x-molly-tier"); got != tc.tier {
					t.Fatalf("X-Molly-Tier %q, want %s", got, tc.tier)
				}
				if id := out.header.Get("x-molly-decision-id"); len(id) != 36 {
					t.Fatalf("X-Molly-Decision-Id %q, want a UUID", id)
				}
				want := tc.cluster + " says: " + tc.prompt
				if got := gjson.GetBytes(out.body, "choices.0.message.content").String(); got != want {
					t.Fatalf("answer %q, want %q", got, want)
				}
				// The upstream gets the upstream model name and none of the client's headers.
				if m := gjson.GetBytes(out.sent, "model").String(); m == "chat" {
					t.Fatalf("the model name was not rewritten: %s", out.sent)
				}
				for _, h := range []string{"Authorization", "X-Client-Secret", "X-Molly-Cluster", "X-Molly-Model"} {
					if v := out.sentHead.Get(h); v != "" {
						t.Fatalf("the upstream got %s: %q", h, v)
					}
				}
				if tc.secret != "" && f.ups["external"].Contains(tc.secret) {
					t.Fatalf("the external upstream received %q", tc.secret)
				}
			})
		}
	}
}

func TestPolicyPointRedactsForT3AndRestoresStreamedChunks(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"},
		overrides: map[string]classify.Sensitivity{"EMAIL": classify.Public}})
	prompt := "Draft a reply to anna@example.org and cc anna@example.org"
	for _, chunks := range []int{3, 17, 40} {
		f.ups["external"].Chunks = chunks
		for _, pieces := range []int{1, 5, 64} {
			c := post(chatBody(prompt, true))
			c.reqPieces, c.respPieces = 3, pieces
			out := f.play(t, c)
			if out.cluster != "external" {
				t.Fatalf("routed to %q (%d %s), want external", out.cluster, out.status, out.body)
			}
			if bytes.Contains(out.sent, []byte("anna@example.org")) || !bytes.Contains(out.sent, []byte("[EMAIL_1]")) {
				t.Fatalf("the body sent to T3 is not redacted: %s", out.sent)
			}
			if !gjson.GetBytes(out.sent, "stream_options.include_usage").Bool() {
				t.Fatalf("the stream does not ask for usage: %s", out.sent)
			}
			text, events, done := sseText(t, out.body)
			if want := "external says: " + prompt; text != want || !done {
				t.Fatalf("%d chunks in %d pieces: streamed %q (done %v), want %q", chunks, pieces, text, done, want)
			}
			for _, e := range events {
				if gjson.Get(e, "usage").Exists() {
					t.Fatalf("the client did not ask for usage but got it: %s", e)
				}
			}
			if ct := out.header.Get("content-type"); !strings.HasPrefix(ct, "text/event-stream") {
				t.Fatalf("content-type %q", ct)
			}
		}
	}
}

func TestPolicyPointAnswersErrorsInOpenAIShape(t *testing.T) {
	targets := threeTiers()
	f := startFleet(t, fleetOptions{targets: targets, ups: []string{"lan", "selfhosted", "external"}, keys: true})
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := f.reg.PutMember(ctx, registry.Member{Name: "alice"})
	must(err)
	alice, _, err := f.reg.CreateKey(ctx, "alice", "")
	must(err)
	_, _, err = f.reg.PutMember(ctx, registry.Member{Name: "scoped", Models: []string{"other-*"}})
	must(err)
	scoped, _, err := f.reg.CreateKey(ctx, "scoped", "")
	must(err)
	_, _, err = f.reg.PutMember(ctx, registry.Member{Name: "broke", BudgetUSD: 0.000001})
	must(err)
	broke, _, err := f.reg.CreateKey(ctx, "broke", "")
	must(err)
	_, err = f.reg.Record(ctx, registry.Usage{Member: "broke", DecisionID: "d", Model: "chat", Target: "external", Tier: "T3", PromptTokens: 10, CompletionTokens: 10, CostUSD: 0.01})
	must(err)

	withKey := func(c call, key string) call {
		if key != "" {
			c.header["authorization"] = "Bearer " + key
		}
		return c
	}
	cases := []struct {
		name   string
		c      call
		status int
		code   string
	}{
		{"no key is a 401", post(chatBody("hi", false)), 401, "invalid_api_key"},
		{"an unknown key is a 401", withKey(post(chatBody("hi", false)), "sk-molly-"+strings.Repeat("x", 43)), 401, "invalid_api_key"},
		{"a spent budget is a 429", withKey(post(chatBody("hi", false)), broke), 429, "insufficient_quota"},
		{"a model outside the key's scope is a 403", withKey(post(chatBody("hi", false)), scoped), 403, ""},
		{"a body that is not a chat request is a 400", withKey(post([]byte(`{"model":"chat"}`)), alice), 400, ""},
		{"an unknown model is a 404", withKey(post([]byte(`{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)), alice), 404, "model_not_found"},
		{"the Responses API is a 404 in fleet mode", withKey(call{method: "POST", path: "/v1/responses", header: map[string]string{},
			body: []byte(`{"model":"chat","input":"hi"}`)}, alice), 404, "unsupported_endpoint"},
		{"malformed JSON is a 400", withKey(post([]byte(`{"model":"chat","messages":[`)), alice), 400, ""},
		{"an unknown URL is a 404", withKey(call{method: "POST", path: "/v1/nothing", header: map[string]string{}, body: []byte("{}")}, alice), 404, "unknown_url"},
	}
	for _, tc := range cases {
		for _, buffered := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/buffered=%v", tc.name, buffered), func(t *testing.T) {
				c := tc.c
				c.buffered = buffered
				c.header = map[string]string{}
				for k, v := range tc.c.header {
					c.header[k] = v
				}
				out := f.play(t, c)
				if out.immediate == nil || out.status != tc.status {
					t.Fatalf("status %d (immediate %v), want an immediate %d; body %s", out.status, out.immediate != nil, tc.status, out.body)
				}
				if ct := out.header.Get("content-type"); ct != "application/json" {
					t.Fatalf("content-type %q", ct)
				}
				e := gjson.GetBytes(out.body, "error")
				if !e.Get("message").Exists() || !e.Get("type").Exists() || (tc.code != "" && e.Get("code").String() != tc.code) {
					t.Fatalf("error body %s, want OpenAI's shape with code %q", out.body, tc.code)
				}
				if tc.status == 401 && out.header.Get("www-authenticate") == "" {
					t.Fatal("a 401 without WWW-Authenticate")
				}
				if got, want := out.header.Get("x-should-retry"), map[string]string{"insufficient_quota": "false"}[tc.code]; got != want {
					t.Fatalf("x-should-retry %q, want %q: no retry changes a spent budget", got, want)
				}
			})
		}
	}
	for _, u := range f.ups {
		if n := u.Count(); n != 0 {
			t.Fatalf("%s got %d requests; refused requests reach no upstream", u.Name, n)
		}
	}

	// A valid key is served, and its usage is recorded before the answer.
	out := f.play(t, withKey(post(chatBody("Write a haiku", false)), alice))
	if out.status != 200 || out.cluster != "external" {
		t.Fatalf("alice: %d via %q: %s", out.status, out.cluster, out.body)
	}
	s, err := f.reg.Summarize(ctx, "alice", 10)
	must(err)
	if s.Requests != 1 || s.PromptTokens != 5 || s.CompletionTokens != 5 || s.Recent[0].Target != "external" {
		t.Fatalf("alice's usage %+v, want one record of 5+5 tokens on external", s)
	}
	// The model listing is answered by the policy point itself.
	out = f.play(t, withKey(call{method: "GET", path: "/v1/models", header: map[string]string{}}, alice))
	if out.status != 200 || gjson.GetBytes(out.body, "data.#").Int() != 1 || gjson.GetBytes(out.body, "data.0.id").String() != "chat" {
		t.Fatalf("models: %d %s", out.status, out.body)
	}
}

// A Messages API request (Anthropic's, which fleet mode does not
// translate) is refused in Anthropic's error shape, {"type":"error",
// "error":{"type","message"}} with the type of Anthropic's errors
// reference for the status, as Molly's own listener answers it: an
// Anthropic SDK reads an OpenAI body as an error of no type.
func TestPolicyPointAnswersTheMessagesAPIInAnthropicsShape(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"}})
	msg := []byte(`{"model":"chat","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	anthropic := map[string]string{"anthropic-version": "2023-06-01", "x-api-key": "k"}
	cases := []struct {
		name   string
		c      call
		status int
		typ    string
		allow  string
	}{
		{"POST /v1/messages is a 404 not_found_error", call{method: "POST", path: "/v1/messages", header: anthropic, body: msg}, 404, "not_found_error", ""},
		{"POST /v1/messages/count_tokens is a 404 not_found_error", call{method: "POST", path: "/v1/messages/count_tokens", header: anthropic, body: msg}, 404, "not_found_error", ""},
		{"a base URL with a prefix and a trailing slash is still the Messages API", call{method: "POST", path: "/anthropic/v1/messages/?beta=true", header: anthropic, body: msg}, 404, "not_found_error", ""},
		{"GET /v1/messages is a 405 invalid_request_error with Allow", call{method: "GET", path: "/v1/messages", header: anthropic}, 405, "invalid_request_error", "POST"},
	}
	for _, tc := range cases {
		for _, buffered := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/buffered=%v", tc.name, buffered), func(t *testing.T) {
				c := tc.c
				c.buffered = buffered
				c.header = map[string]string{}
				for k, v := range tc.c.header {
					c.header[k] = v
				}
				out := f.play(t, c)
				if out.immediate == nil || out.status != tc.status {
					t.Fatalf("status %d (immediate %v), want an immediate %d; body %s", out.status, out.immediate != nil, tc.status, out.body)
				}
				b := gjson.ParseBytes(out.body)
				if b.Get("type").Str != "error" || b.Get("error.type").Str != tc.typ || b.Get("error.message").Str == "" ||
					b.Get("error.code").Exists() || b.Get("error.param").Exists() || out.header.Get("content-type") != "application/json" {
					t.Fatalf("body %s (content-type %q), want Anthropic's error shape with type %s", out.body, out.header.Get("content-type"), tc.typ)
				}
				if out.header.Get("allow") != tc.allow {
					t.Fatalf("Allow %q, want %q", out.header.Get("allow"), tc.allow)
				}
			})
		}
	}
	for _, u := range f.ups {
		if n := u.Count(); n != 0 {
			t.Fatalf("%s got %d requests", u.Name, n)
		}
	}
}

func TestPolicyPointTurnsAFailedUpstreamIntoA503(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"}})
	for _, buffered := range []bool{true, false} {
		c := post(chatBody("please FAIL500 now", false))
		c.buffered = buffered
		out := f.play(t, c)
		if out.immediate == nil || out.status != 503 || gjson.GetBytes(out.body, "error.code").String() != "no_target_available" ||
			!strings.Contains(gjson.GetBytes(out.body, "error.message").String(), "external: HTTP 500") {
			t.Fatalf("buffered %v: %d %s, want a 503 naming the failed target", buffered, out.status, out.body)
		}
	}
}

func TestPolicyPointBillsAClientThatResetsMidStream(t *testing.T) {
	targets := []*route.Target{{Name: "external", Tier: "T3", Models: []string{"chat=gpt-4o-mini"}, PriceIn: 1, PriceOut: 1}}
	f := startFleet(t, fleetOptions{targets: targets, ups: []string{"external"}, keys: true})
	ctx := context.Background()
	m, _, err := f.reg.PutMember(ctx, registry.Member{Name: "bob", BudgetUSD: 1})
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := f.reg.CreateKey(ctx, "bob", "")
	if err != nil {
		t.Fatal(err)
	}
	f.ups["external"].Chunks = 20
	c := post(chatBody("tell me a long story about the sea and the wind", true))
	c.header["authorization"] = "Bearer " + key
	c.respPieces, c.resetAfter = 10, 3
	out := f.play(t, c)
	if out.cluster != "external" || len(out.body) == 0 {
		t.Fatalf("the stream did not start: %d %q", out.status, out.body)
	}
	// The policy point sees the stream break off: the reservation is
	// released and what was streamed is billed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := f.reg.Summarize(ctx, "bob", 5)
		if err != nil {
			t.Fatal(err)
		}
		usd, tokens, err := f.reg.Held(ctx, "bob")
		if err != nil {
			t.Fatal(err)
		}
		if s.Requests == 1 && usd == 0 && tokens == 0 {
			u := s.Recent[0]
			// The usage chunk comes last, so what was streamed is counted by Molly.
			if u.PromptTokens <= 0 || u.CostUSD <= 0 || u.Member != m.Name || !u.Estimated {
				t.Fatalf("the reset stream's usage %+v, want the prompt and the streamed text billed, estimated", u)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the reset: %d records, %.6f USD and %d tokens still held", s.Requests, usd, tokens)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPolicyPointScrubsTheTargetsKeyFromAnswers: an answer that holds the
// target's API key — here the echo of a prompt holding it, as an upstream
// echoing its Authorization header gives — reaches the client with
// REDACTED in its place through the policy point too, whole or streamed in
// pieces cut anywhere; the upstream was sent the key.
func TestPolicyPointScrubsTheTargetsKeyFromAnswers(t *testing.T) {
	const key = "plainwordslanupstreamkey"
	t.Setenv("MOLLY_TEST_LAN_KEY", key)
	targets := threeTiers()
	targets[0].APIKeyEnv = "MOLLY_TEST_LAN_KEY"
	f := startFleet(t, fleetOptions{targets: targets, ups: []string{"lan", "selfhosted", "external"}})
	f.ups["lan"].Chunks = 1 // the text in one event, its bytes cut into pieces (a key cut across two deltas is not recognised)
	prompt := "please repeat " + key + " twice: " + key
	for _, stream := range []bool{false, true} {
		for _, pieces := range []int{1, 7, 64} {
			c := post(chatBody(prompt, stream))
			c.header["x-molly-sensitivity"] = "confidential" // lan only
			c.respPieces = pieces
			out := f.play(t, c)
			if out.cluster != "lan" || out.sentHead.Get("Authorization") != "Bearer "+key {
				t.Fatalf("routed to %q with Authorization %q, want lan with its key", out.cluster, out.sentHead.Get("Authorization"))
			}
			answer := string(out.body)
			if stream {
				answer, _, _ = sseText(t, out.body)
			} else {
				answer = gjson.GetBytes(out.body, "choices.0.message.content").Str
			}
			if want := "lan says: please repeat REDACTED twice: REDACTED"; answer != want || bytes.Contains(out.body, []byte(key)) {
				t.Fatalf("stream %v in %d pieces: the client got %q (%s), want %q", stream, pieces, answer, out.body, want)
			}
		}
	}
}

// An upstream that answers a streamed request with one whole JSON answer
// (a server that does not stream) reaches the client through Envoy as the
// stream that says the same, as through Molly's own proxy: it was relayed
// as JSON, which a streaming client cannot read.
func TestPolicyPointStreamsAWholeAnswerToAStreamedRequest(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"}})
	for _, mode := range []struct {
		name     string
		buffered bool
		pieces   int
	}{{"buffered", true, 1}, {"full duplex in 5 pieces", false, 5}} {
		t.Run(mode.name, func(t *testing.T) {
			c := post(chatBody("WHOLE haiku about autumn", true))
			c.buffered, c.reqPieces, c.respPieces = mode.buffered, mode.pieces, mode.pieces
			out := f.play(t, c)
			text, _, done := sseText(t, out.body)
			if out.status != 200 || !strings.HasPrefix(out.header.Get("content-type"), "text/event-stream") || !done ||
				text != out.cluster+" says: WHOLE haiku about autumn" {
				t.Fatalf("%d %q: streamed %q (done %v): %s", out.status, out.header.Get("content-type"), text, done, out.body)
			}
			if n := out.header.Get("content-length"); n != "" && n != strconv.Itoa(len(out.body)) {
				t.Fatalf("content-length %s for %d bytes", n, len(out.body))
			}
		})
	}
}

// An upstream that streams its answer to a request that asked for none
// reaches the client through Envoy as the whole JSON answer that stream
// says, as through Molly's own proxy: it was relayed as a stream.
func TestPolicyPointJoinsAStreamToAWholeRequest(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"}})
	for _, mode := range []struct {
		name     string
		buffered bool
		pieces   int
	}{{"buffered", true, 1}, {"full duplex in 5 pieces", false, 5}} {
		t.Run(mode.name, func(t *testing.T) {
			c := post(chatBody("ALWAYSSTREAM haiku about autumn", false))
			c.buffered, c.reqPieces, c.respPieces = mode.buffered, mode.pieces, mode.pieces
			out := f.play(t, c)
			if out.status != 200 || !strings.HasPrefix(out.header.Get("content-type"), "application/json") ||
				gjson.GetBytes(out.body, "choices.0.message.content").Str != out.cluster+" says: ALWAYSSTREAM haiku about autumn" {
				t.Fatalf("%d %q: %s", out.status, out.header.Get("content-type"), out.body)
			}
		})
	}
}

// TestPolicyPointSendsNoneOfTheClientsEnvoyHeaders: x-envoy-* headers a
// client sends (retry and timeout overrides Envoy's router honours on a
// request it deems internal, or anything else under that prefix) are
// removed with the client's other headers: the upstream gets none, as
// in-Caddy's dispatch sends none.
func TestPolicyPointSendsNoneOfTheClientsEnvoyHeaders(t *testing.T) {
	f := startFleet(t, fleetOptions{targets: threeTiers(), ups: []string{"lan", "selfhosted", "external"}})
	for _, buffered := range []bool{true, false} {
		c := post(chatBody("hi", false))
		c.buffered = buffered
		c.header["x-envoy-max-retries"] = "50"
		c.header["x-envoy-retry-on"] = "5xx"
		c.header["x-envoy-upstream-rq-timeout-ms"] = "1"
		c.header["x-envoy-note"] = "AKIAIOSFODNN7EXAMPLE"
		out := f.play(t, c)
		if out.status != 200 {
			t.Fatalf("buffered=%v: %d %s", buffered, out.status, out.body)
		}
		for k := range out.sentHead {
			if strings.HasPrefix(strings.ToLower(k), "x-envoy-") {
				t.Fatalf("buffered=%v: the upstream was sent the client's %s: %v", buffered, k, out.sentHead)
			}
		}
	}
}

// TestPolicyPointCapsTheCompletionOfABudgetedCaller: Envoy sends the
// dispatch's body, so the completion cap Molly's reservation holds for a
// budgeted member's request without max_tokens (route.DefaultCompletionTokens)
// must be in that body, as it is in Molly's own upstream calls; a caller
// without a budget or TPM gets the client's body unchanged.
func TestPolicyPointCapsTheCompletionOfABudgetedCaller(t *testing.T) {
	targets := []*route.Target{{Name: "external", Tier: "T3", Models: []string{"chat=gpt-4o-mini"}, PriceIn: 1, PriceOut: 1}}
	f := startFleet(t, fleetOptions{targets: targets, ups: []string{"external"}, keys: true})
	ctx := context.Background()
	for _, m := range []registry.Member{{Name: "bob", BudgetUSD: 1}, {Name: "free"}} {
		if _, _, err := f.reg.PutMember(ctx, m); err != nil {
			t.Fatal(err)
		}
		key, _, err := f.reg.CreateKey(ctx, m.Name, "")
		if err != nil {
			t.Fatal(err)
		}
		c := post(chatBody("tell me about the sea", false))
		c.header["authorization"] = "Bearer " + key
		out := f.play(t, c)
		if out.cluster != "external" || out.status != 200 {
			t.Fatalf("%s: status %d cluster %q: %s", m.Name, out.status, out.cluster, out.body)
		}
		got, want := gjson.GetBytes(out.sent, "max_tokens"), int64(route.DefaultCompletionTokens)
		if m.BudgetUSD == 0 {
			want = 0
		}
		if got.Int() != want {
			t.Fatalf("%s: Envoy sent max_tokens %s, want %d: %s", m.Name, got.Raw, want, out.sent)
		}
	}
}
