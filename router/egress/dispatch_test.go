package egress

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

func TestNewDispatchRefusesTargetsTheDecisionDoesNotAllow(t *testing.T) {
	e, tg := tierTargets(t)
	a := annotate(t, nil, openai.EndpointChat, chatBody("hello"))
	tests := []struct {
		name     string
		decision map[string]any
		target   *route.Target
		msg      string
	}{
		{"a tier outside the allowed ones", allowTiers([]string{"T0", "T1"}, nil), tg["T3"], "cloud (T3): target not allowed by the policy decision"},
		{"T2 when only T0 is allowed", allowTiers([]string{"T0"}, nil), tg["T2"], "remote (T2): target not allowed by the policy decision"},
		{"any tier of a denial", map[string]any{"allow": false, "tiers": []any{"T0", "T1", "T2", "T3"}, "reasons": []any{"no"}}, tg["T0"], "device (T0): target not allowed by the policy decision"},
		{"an allowed tier in a region outside the decision's", policytest.Allow(allTiers, nil, map[string]any{"regions": []any{"EU", "local"}}), tg["T3"], "cloud (T3): target not allowed by the policy decision"},
		{"a candidate without a target", allowTiers([]string{"T0"}, nil), nil, "<nil>: target not allowed by the policy decision"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			disp, err := e.NewDispatch(decided(t, a, tt.decision), a, route.Candidate{Target: tt.target, Model: "m"})
			if disp != nil || !errors.Is(err, ErrNotAllowed) || err.Error() != tt.msg {
				t.Fatalf("NewDispatch = %v, %v; want nil and %q", disp, err, tt.msg)
			}
		})
	}
	t.Run("the region the decision names is allowed", func(t *testing.T) {
		d := decided(t, a, policytest.Allow([]string{"T2"}, nil, map[string]any{"regions": []any{"EU"}}))
		if _, err := e.NewDispatch(d, a, route.Candidate{Target: tg["T2"], Model: "m"}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("a target the egress has no client for is refused", func(t *testing.T) {
		stranger := &route.Target{Name: "stranger", Tier: "T1"}
		if _, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: stranger, Model: "m"}); err == nil ||
			err.Error() != "stranger: no client for this target" {
			t.Fatalf("err = %v", err)
		}
	})
}

var allTiers = []string{"T0", "T1", "T2", "T3"}

// TestNewDispatchRefusesADecisionForOtherContent: a dispatch is made only
// under a decision bound to the digest of the very annotation whose bytes
// it sends.
func TestNewDispatchRefusesADecisionForOtherContent(t *testing.T) {
	e, tg := tierTargets(t)
	cls := testClassifier(t)
	judged := annotate(t, cls, openai.EndpointChat, chatBody("hello"))
	d := decided(t, judged, allowTiers(allTiers, nil))
	grown, err := judged.Derive([]byte(`{"model":"m","messages":[{"role":"user","content":"hello"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"alice@example.com"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		d    policies.Decided
		a    *classify.Annotation
	}{
		{"another body", d, annotate(t, cls, openai.EndpointChat, chatBody("hello!"))},
		{"a conversation grown from the judged one", d, grown},
		{"the same body classified by another classifier", d, annotate(t, testClassifier(t), openai.EndpointChat, chatBody("hello"))},
		{"the zero Decided", policies.Decided{}, judged},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, tier := range allTiers {
				disp, err := e.NewDispatch(tc.d, tc.a, route.Candidate{Target: tg[tier], Model: "m"})
				if disp != nil || !errors.Is(err, ErrNotBound) || err.Error() != tg[tier].Name+": the decision was not made for this content" {
					t.Fatalf("%s: NewDispatch = %v, %v; want ErrNotBound", tier, disp, err)
				}
			}
		})
	}
	t.Run("the same bytes classified again by the same classifier are the judged content", func(t *testing.T) {
		again := annotate(t, cls, openai.EndpointChat, chatBody("hello"))
		if _, err := e.NewDispatch(d, again, route.Candidate{Target: tg["T3"], Model: "up-m"}); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewDispatchRedactsForTheTier(t *testing.T) {
	e, tg := tierTargets(t)
	body := `{"model":"m","temperature":0.2,"messages":[` +
		`{"role":"system","content":"reply to alice@example.com"},` +
		`{"role":"user","name":"bob@example.org","content":[{"type":"text","text":"cc alice@example.com, pay 4111 1111 1111 1111, call +1 415 555 2671"},{"type":"image_url","image_url":{"url":"https://img/alice@example.com.png"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"pay","arguments":"{\"card\":\"4111111111111111\",\"to\":\"alice@example.com\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c","content":"receipt sent to [EMAIL_1]"}]}`
	a := annotate(t, nil, openai.EndpointChat, body)
	d := decided(t, a, allowTiers(allTiers, map[string][]string{"T3": {"EMAIL", "CREDIT_CARD"}, "T2": {"SECRET"}}))

	disp, err := e.NewDispatch(d, a, route.Candidate{Target: tg["T3"], Model: "up-m"})
	if err != nil {
		t.Fatal(err)
	}
	out := disp.Body()
	// "[EMAIL_1]" is typed by the user in the tool result, so the vault
	// never issues it: alice is EMAIL_2, bob EMAIL_3.
	want := map[string]string{
		"model":                                      "up-m",
		"temperature":                                "0.2",
		"messages.0.content":                         "reply to [EMAIL_2]",
		"messages.1.name":                            "EMAIL_3", // participant names must match ^[a-zA-Z0-9_-]+$
		"messages.1.content.0.text":                  "cc [EMAIL_2], pay [CREDIT_CARD_1], call +1 415 555 2671",
		"messages.1.content.1.image_url.url":         "https://img/[EMAIL_4]",
		"messages.2.tool_calls.0.function.arguments": `{"card":"[CREDIT_CARD_2]","to":"[EMAIL_2]"}`,
		"messages.3.content":                         "receipt sent to [EMAIL_1]",
	}
	for path, v := range want {
		if got := gjson.GetBytes(out, path).String(); got != v {
			t.Errorf("%s = %q, want %q", path, got, v)
		}
	}
	if !gjson.ValidBytes(out) {
		t.Fatalf("the dispatch body is not valid JSON: %s", out)
	}
	for _, v := range []string{"alice@example.com", "bob@example.org", "4111 1111 1111 1111", "4111111111111111"} {
		if strings.Contains(string(out), v) {
			t.Errorf("the T3 body still contains %q", v)
		}
	}
	if disp.Redacted() != 5 || disp.Target() != tg["T3"] || disp.Model() != "up-m" || disp.DecisionID() != d.Decision().ID() || disp.Stream() {
		t.Errorf("Redacted %d, Target %s, Model %s, DecisionID %s; want 5 values for cloud/up-m under %s", disp.Redacted(), disp.Target().Name, disp.Model(), disp.DecisionID(), d.Decision().ID())
	}
	if got := disp.Vault().Placeholders(); !reflect.DeepEqual(got, map[string]string{
		"[EMAIL_2]": "alice@example.com", "[EMAIL_3]": "bob@example.org", "[EMAIL_4]": "alice@example.com.png",
		"[CREDIT_CARD_1]": "4111 1111 1111 1111", "[CREDIT_CARD_2]": "4111111111111111",
	}) {
		t.Errorf("placeholders = %v", got)
	}
	if a.Body() != body {
		t.Error("NewDispatch changed the annotation's body")
	}
	out[0] = 'X'
	if disp.Body()[0] != '{' {
		t.Error("Body returns the dispatch's own bytes, not a copy")
	}

	t.Run("other tiers get the values unless their own list names them", func(t *testing.T) {
		for _, tier := range []string{"T0", "T1", "T2"} {
			disp, err := e.NewDispatch(d, a, route.Candidate{Target: tg[tier], Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			if string(disp.Body()) != body || disp.Redacted() != 0 || disp.Vault() != nil {
				t.Errorf("%s body = %s (redacted %d); want the request unchanged", tier, disp.Body(), disp.Redacted())
			}
		}
	})
}

func TestNewDispatchRewritesTheModel(t *testing.T) {
	e, tg := tierTargets(t)
	tests := []struct {
		name string
		ep   openai.Endpoint
		body string
		want string
	}{
		{"chat to an aliased model", openai.EndpointChat, chatBody("hi"), `{"model":"up-m","messages":[{"role":"user","content":"hi"}]}`},
		{"a stream always asks for the usage chunk", openai.EndpointChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"up-m","stream":true,"messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true}}`},
		{"a stream that asks for usage is left as it is", openai.EndpointChat, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"up-m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`},
		{"completions", openai.EndpointCompletions, `{"prompt":"hi","model":"m"}`, `{"prompt":"hi","model":"up-m"}`},
		{"embeddings", openai.EndpointEmbeddings, `{"model":"m","input":[1,2]}`, `{"model":"up-m","input":[1,2]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := annotate(t, nil, tt.ep, tt.body)
			disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg["T3"], Model: "up-m"})
			if err != nil || string(disp.Body()) != tt.want {
				t.Fatalf("body = %s, %v; want %s", disp.Body(), err, tt.want)
			}
		})
	}
	t.Run("the model list has no body", func(t *testing.T) {
		a, err := testClassifier(t).Classify(classify.Input{Endpoint: openai.EndpointModels, Path: "/v1/models"})
		if err != nil {
			t.Fatal(err)
		}
		disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg["T3"]})
		if err != nil || disp.Body() != nil {
			t.Fatalf("body = %q, %v; want none", disp.Body(), err)
		}
	})
}

func TestNewDispatchFailsClosedOnUnscannedTypes(t *testing.T) {
	e, tg := tierTargets(t)
	emailOnly, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	cls := classify.New(emailOnly, nil)
	for _, prompt := range []string{"alice@example.com, +1 415 555 2671", "hello"} {
		a := annotate(t, cls, openai.EndpointChat, chatBody(prompt))
		d := decided(t, a, allowTiers([]string{"T1", "T3"}, map[string][]string{"T3": {"EMAIL", "PHONE"}}))
		// Found or not, a type no detector looks for cannot be removed: the tier is refused.
		disp, err := e.NewDispatch(d, a, route.Candidate{Target: tg["T3"], Model: "up-m"})
		if disp != nil || !errors.Is(err, classify.ErrUnscannedType) || errors.Is(err, ErrNotAllowed) ||
			err.Error() != "cloud (T3): PHONE: no detector finds this entity type" {
			t.Fatalf("%q: NewDispatch = %v, %v; want a refusal naming PHONE", prompt, disp, err)
		}
		// A tier without a redaction list is unaffected.
		if _, err := e.NewDispatch(d, a, route.Candidate{Target: tg["T1"], Model: "m"}); err != nil {
			t.Fatalf("T1: %v", err)
		}
	}
}

// With the default policy, T3 only sees public requests; an operator who
// declares e-mail addresses public still gets them replaced on T3.
func TestDefaultPolicyRedactsDetectedTypesForT3(t *testing.T) {
	e, tg := tierTargets(t)
	cls := classify.New(testScanner(t), map[string]classify.Sensitivity{"EMAIL": classify.Public, "PHONE": classify.Public})
	a := annotate(t, cls, openai.EndpointChat, chatBody("mail alice@example.com or call +1 415 555 2671, alice@example.com"))
	d := policytest.Decide(t, policytest.Default(t), a)
	if dec := d.Decision(); !reflect.DeepEqual(dec.Tiers(), allTiers) || !reflect.DeepEqual(dec.Redact("T3"), []string{"EMAIL", "PHONE"}) {
		t.Fatalf("decision = %v redact %v", dec.Tiers(), dec.Redact("T3"))
	}
	disp, err := e.NewDispatch(d, a, route.Candidate{Target: tg["T3"], Model: "up-m"})
	if err != nil {
		t.Fatal(err)
	}
	if got := gjson.GetBytes(disp.Body(), "messages.0.content").String(); got != "mail [EMAIL_1] or call [PHONE_1], [EMAIL_1]" {
		t.Fatalf("T3 content = %q", got)
	}
	disp, err = e.NewDispatch(d, a, route.Candidate{Target: tg["T2"], Model: "m"})
	if err != nil || !strings.Contains(string(disp.Body()), "alice@example.com") {
		t.Fatalf("T2 body = %s, %v; want the address kept", disp.Body(), err)
	}
}

func TestWithParam(t *testing.T) {
	e, tg := tierTargets(t)
	a := annotate(t, nil, openai.EndpointChat, chatBody("mail alice@example.com"))
	d := decided(t, a, allowTiers(allTiers, map[string][]string{"T3": {"EMAIL"}}))
	disp, err := e.NewDispatch(d, a, route.Candidate{Target: tg["T3"], Model: "up-m"})
	if err != nil {
		t.Fatal(err)
	}
	before := string(disp.Body())
	t.Run("a content-free parameter is set on a copy that keeps the binding", func(t *testing.T) {
		lp, err := disp.WithParam("logprobs", true)
		if err != nil {
			t.Fatal(err)
		}
		lp, err = lp.WithParam("top_logprobs", 2)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"model":"up-m","messages":[{"role":"user","content":"mail [EMAIL_1]"}],"logprobs":true,"top_logprobs":2}`
		if got := string(lp.Body()); got != want {
			t.Fatalf("body %s, want %s", got, want)
		}
		if string(disp.Body()) != before || disp.Added("logprobs") {
			t.Fatalf("WithParam changed the original: %s", disp.Body())
		}
		if !lp.Added("logprobs") || !lp.Added("top_logprobs") || lp.Added("stream_options.include_usage") {
			t.Fatal("Added does not report what WithParam set")
		}
		if lp.DecisionID() != disp.DecisionID() || lp.Target() != disp.Target() || lp.Vault() != disp.Vault() || lp.Redacted() != 1 {
			t.Fatal("the copy lost the decision, target or vault")
		}
	})
	t.Run("anything that could carry content is refused", func(t *testing.T) {
		for _, path := range []string{"messages.0.content", "messages", "model", "tools", "metadata.note", "stream", "max_tokens", "logprobs.x", "user"} {
			c, err := disp.WithParam(path, "alice@example.com")
			if c != nil || !errors.Is(err, ErrNotAParam) || err.Error() != path+": not a content-free request parameter" {
				t.Fatalf("WithParam(%s) = %v, %v; want ErrNotAParam", path, c, err)
			}
		}
		if string(disp.Body()) != before {
			t.Fatal("a refused WithParam changed the body")
		}
	})
}

func TestSend(t *testing.T) {
	lan, cloud := upstreamtest.Start("lan"), upstreamtest.Start("cloud")
	t.Cleanup(func() { lan.Close(); cloud.Close() })
	t.Setenv("MOLLY_TEST_CLOUD_KEY", "sk-upstream-test")
	ts := []*route.Target{
		{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}},
		{Name: "cloud", Tier: "T3", Endpoint: cloud.URL() + "/", Models: []string{"m=up-m"}, APIKeyEnv: "MOLLY_TEST_CLOUD_KEY"},
	}
	e := newEgress(t, ts, nil)
	hdr := http.Header{}
	for k, v := range map[string]string{"X-Request-Id": "req-1", "Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"Authorization": "Bearer client-key", "Cookie": "session=1", "X-Molly-Sensitivity": "internal", "User-Agent": "client/1"} {
		hdr.Set(k, v)
	}
	send := func(t *testing.T, tg *route.Target, model string, ep openai.Endpoint, body string) (*Dispatch, int, string) {
		t.Helper()
		var a *classify.Annotation
		if ep == openai.EndpointModels {
			var err error
			if a, err = testClassifier(t).Classify(classify.Input{Endpoint: ep, Path: "/v1/models"}); err != nil {
				t.Fatal(err)
			}
		} else {
			a = annotate(t, nil, ep, body)
		}
		disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg, Model: model})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := disp.Send(context.Background(), hdr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return disp, resp.StatusCode, string(b)
	}
	t.Run("a self-hosted target gets the correlation headers and the decision id, nothing of the client's", func(t *testing.T) {
		disp, status, body := send(t, ts[0], "m", openai.EndpointChat, chatBody("hi"))
		if status != 200 || gjson.Get(body, "choices.0.message.content").String() != "lan says: hi" {
			t.Fatalf("status %d: %s", status, body)
		}
		h := lan.Headers()[0]
		want := http.Header{"X-Request-Id": {"req-1"}, "Traceparent": {hdr.Get("Traceparent")}, "X-Molly-Decision-Id": {disp.DecisionID()},
			"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"}}
		for k, v := range want {
			if !reflect.DeepEqual(h.Values(k), v) {
				t.Errorf("%s = %q, want %q", k, h.Values(k), v)
			}
		}
		for _, k := range []string{"Authorization", "Cookie", "X-Molly-Sensitivity"} {
			if h.Get(k) != "" {
				t.Errorf("the upstream got the client's %s", k)
			}
		}
		if h.Get("User-Agent") == "client/1" {
			t.Error("the upstream got the client's User-Agent")
		}
	})
	t.Run("an external API gets its key and no decision id", func(t *testing.T) {
		_, status, body := send(t, ts[1], "up-m", openai.EndpointCompletions, `{"model":"m","prompt":"say hi"}`)
		if status != 200 || gjson.Get(body, "choices.0.text").String() != "cloud says: say hi" {
			t.Fatalf("status %d: %s", status, body)
		}
		h := cloud.Headers()[0]
		if h.Get("Authorization") != "Bearer sk-upstream-test" || h.Get("X-Molly-Decision-Id") != "" {
			t.Fatalf("cloud headers %v", h)
		}
		if got := gjson.GetBytes(cloud.Received()[0], "model").String(); got != "up-m" {
			t.Fatalf("cloud was asked for %q", got)
		}
	})
	t.Run("embeddings and the model listing go to their paths", func(t *testing.T) {
		if _, status, body := send(t, ts[0], "m", openai.EndpointEmbeddings, `{"model":"m","input":"embed"}`); status != 200 || gjson.Get(body, "data.0.embedding.#").Int() != 3 {
			t.Fatalf("embeddings: %d %s", status, body)
		}
		if _, status, body := send(t, ts[0], "", openai.EndpointModels, ""); status != 200 || gjson.Get(body, "data.0.owned_by").String() != "lan" {
			t.Fatalf("models: %d %s", status, body)
		}
	})
}

func TestNewMakesOneClientPerTarget(t *testing.T) {
	t.Setenv("MOLLY_TEST_KEY", "sk-test")
	eng := demoEngine(t)
	ts := []*route.Target{
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:1/v1/", Models: []string{"m"}},
		{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m=up"}, APIKeyEnv: "MOLLY_TEST_KEY"},
		{Name: "engine", Tier: "T0", Kind: route.KindEngine, Models: []string{"m"}},
	}
	e := newEgress(t, ts, eng)
	if len(e.clients) != 3 || e.clients["remote"].apiKey != "sk-test" || e.clients["lan"].apiKey != "" {
		t.Fatalf("clients %v", e.clients)
	}
	if got := e.clients["lan"].base.String(); got != "http://127.0.0.1:1/v1" {
		t.Errorf("lan base %s", got)
	}
	if got := e.clients["engine"].base.String(); got != "http://engine.molly.internal/v1" {
		t.Errorf("engine base %s", got)
	}
	if _, ok := e.clients["engine"].client.Transport.(*handlerTransport); !ok {
		t.Errorf("the engine is reached through %T, want the in-process transport", e.clients["engine"].client.Transport)
	}
	t.Run("an engine target needs the engine", func(t *testing.T) {
		cat, err := route.NewCatalogue([]*route.Target{{Name: "e", Tier: "T0", Kind: route.KindEngine}}, eng)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := New(cat, nil); err == nil || err.Error() != "target e: kind engine needs the molly app's engine, and none is configured" {
			t.Fatalf("New = %v", err)
		}
	})
}

// TestSendReachesTheEngineInProcess: a dispatch to a kind engine target is
// answered by the real T0 engine without a network hop.
func TestSendReachesTheEngineInProcess(t *testing.T) {
	eng := demoEngine(t)
	ts := []*route.Target{{Name: "device", Tier: "T0", Kind: route.KindEngine, Models: []string{"m=molly-demo"}}}
	e := newEgress(t, ts, eng)
	for _, stream := range []bool{false, true} {
		body := `{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`
		if stream {
			body = `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
		}
		a := annotate(t, nil, openai.EndpointChat, body)
		disp, err := e.NewDispatch(decided(t, a, allowTiers([]string{"T0"}, nil)), a, route.Candidate{Target: ts[0], Model: "molly-demo"})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := disp.Send(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%v: status %d: %s", stream, resp.StatusCode, b)
		}
		if !stream && (gjson.GetBytes(b, "model").String() != "molly-demo" || gjson.GetBytes(b, "usage.completion_tokens").Int() < 1) {
			t.Fatalf("answer %s", b)
		}
		if stream && (!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !strings.HasSuffix(string(b), "data: [DONE]\n\n") ||
			!strings.Contains(string(b), `"usage"`)) {
			t.Fatalf("stream %s", b)
		}
	}
}

// TestHeaderLeavesOutForwardedValuesWithFindings: the forwarded
// correlation headers are client free text the classifier never reads (the
// decision never saw them); to any tier off the device a request id or
// trace state holding an address, a card number or a key is not sent (a
// fresh request id goes instead), while clean values go as they were.
func TestHeaderLeavesOutForwardedValuesWithFindings(t *testing.T) {
	t.Setenv("MOLLY_TEST_CLOUD_KEY", "sk-upstream-test")
	ts := []*route.Target{
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:9/v1", Models: []string{"m"}},
		{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:9/v1", Models: []string{"m"}, APIKeyEnv: "MOLLY_TEST_CLOUD_KEY"},
		{Name: "selfhosted", Tier: "T2", Endpoint: "http://127.0.0.1:9/v1", Models: []string{"m"}},
	}
	e := newEgress(t, ts, nil)
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	header := func(tg *route.Target, id, state string) http.Header {
		t.Helper()
		a := annotate(t, nil, openai.EndpointChat, chatBody("hi"))
		disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		return disp.Header(http.Header{"X-Request-Id": {id}, "Traceparent": {traceparent}, "Tracestate": {state}})
	}
	h := header(ts[1], "mario.rossi@example.com", "vendor=mario.rossi@example.com")
	if id := h.Get("X-Request-Id"); !strings.HasPrefix(id, "req_") || len(id) != 36 {
		t.Errorf("T3 X-Request-Id = %q, want a fresh req_ id", id)
	}
	if h.Get("Tracestate") != "" || h.Get("Traceparent") != traceparent {
		t.Errorf("T3 trace headers %q, %q", h.Get("Traceparent"), h.Get("Tracestate"))
	}
	h = header(ts[1], "req-42", "vendor=abc")
	if h.Get("X-Request-Id") != "req-42" || h.Get("Tracestate") != "vendor=abc" {
		t.Errorf("clean values to T3: %v", h)
	}
	// A self-hosted tier the body's class allows is not allowed a card or
	// a key the decision never saw.
	for _, tg := range []*route.Target{ts[0], ts[2]} {
		h = header(tg, "4111 1111 1111 1111", "vendor=ghp_R4nd0mT0k3nV4lu3Xy2Zq8Wm1Lp9Kd7Hs5Jq")
		if id := h.Get("X-Request-Id"); !strings.HasPrefix(id, "req_") || h.Get("Tracestate") != "" || h.Get("Traceparent") != traceparent {
			t.Errorf("%s headers %v, want a fresh request id and no trace state", tg.Tier, h)
		}
		h = header(tg, "req-42", "vendor=abc")
		if h.Get("X-Request-Id") != "req-42" || h.Get("Tracestate") != "vendor=abc" {
			t.Errorf("clean values to %s: %v", tg.Tier, h)
		}
	}
}

// TestHeaderForwardsMollysRequestIDsUnscanned: an id Molly made
// (openai.NewRequestID) is forwarded without the detectors' scan, and only
// such an id: with an operator's pattern that finds every "req_" id, Molly's
// own goes as it is while a client's of the same shape (random digits,
// not minted) is replaced by a new one of Molly's.
func TestHeaderForwardsMollysRequestIDsUnscanned(t *testing.T) {
	sc, err := redaction.NewScanner(redaction.Config{Patterns: map[string][]string{"REQUEST_ID": {`req_[0-9a-f]{32}`}}})
	if err != nil {
		t.Fatal(err)
	}
	tg := &route.Target{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:9/v1", Models: []string{"m"}}
	e := newEgress(t, []*route.Target{tg}, nil)
	a := annotate(t, classify.New(sc, nil), openai.EndpointChat, chatBody("hi"))
	disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	minted := openai.NewRequestID()
	if got := disp.Header(http.Header{"X-Request-Id": {minted}}).Get("X-Request-Id"); got != minted {
		t.Errorf("Molly's id %q went as %q", minted, got)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	foreign := "req_" + hex.EncodeToString(b[:])
	if len(sc.Scan(foreign)) == 0 {
		t.Fatalf("the pattern finds nothing in %q", foreign)
	}
	if got := disp.Header(http.Header{"X-Request-Id": {foreign}}).Get("X-Request-Id"); got == foreign || !openai.Minted(got) {
		t.Errorf("a client's id %q went as %q, want a new id of Molly's", foreign, got)
	}
}

// Molly's own request parameters (the engine's reasoning budget and
// chains) never reach an OpenAI-compatible upstream, which would refuse
// them as unknown (OpenAI: "Unrecognized request argument"); the spec's
// reasoning_effort and a vendor's top_k go as the client sent them, and
// the in-process engine gets everything.
func TestNewDispatchKeepsMollysExtensionsOnTheDevice(t *testing.T) {
	const body = `{"model":"m","max_reasoning_tokens":900,"min_reasoning_tokens":10,"n_chains":3,"reasoning_effort":"low","top_k":4,"messages":[{"role":"user","content":"hi"}]}`
	e, tg := tierTargets(t)
	for _, tier := range []string{"T1", "T2", "T3"} {
		a := annotate(t, nil, openai.EndpointChat, body)
		disp, err := e.NewDispatch(decided(t, a, allowTiers(allTiers, nil)), a, route.Candidate{Target: tg[tier], Model: "up-m"})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"model":"up-m","reasoning_effort":"low","top_k":4,"messages":[{"role":"user","content":"hi"}]}`; string(disp.Body()) != want {
			t.Fatalf("%s: body %s, want %s", tier, disp.Body(), want)
		}
	}
	eng := demoEngine(t)
	ts := []*route.Target{{Name: "device", Tier: "T0", Kind: route.KindEngine, Models: []string{"m=molly-demo"}}}
	ee := newEgress(t, ts, eng)
	a := annotate(t, nil, openai.EndpointChat, body)
	disp, err := ee.NewDispatch(decided(t, a, allowTiers([]string{"T0"}, nil)), a, route.Candidate{Target: ts[0], Model: "molly-demo"})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range Extensions {
		if !gjson.GetBytes(disp.Body(), f).Exists() {
			t.Fatalf("the engine did not get %s: %s", f, disp.Body())
		}
	}
}

// A target's answer that redirects is its answer: Send follows no
// redirect, so a LAN target answering 307 or 308 with the address of
// another host (an external API, a host outside the decision's residency)
// never makes Molly send that host the prompt, which the decision allowed
// for this target only.
func TestSendFollowsNoRedirect(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[]}`)
	}))
	t.Cleanup(other.Close)
	for _, code := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		lan := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, code)
		}))
		tg := &route.Target{Name: "lan", Tier: "T1", Endpoint: lan.URL + "/v1", Models: []string{"m"}}
		e := newEgress(t, []*route.Target{tg}, nil)
		a := annotate(t, nil, openai.EndpointChat, chatBody("my account is private"))
		disp, err := e.NewDispatch(decided(t, a, allowTiers([]string{"T1"}, nil)), a, route.Candidate{Target: tg, Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := disp.Send(context.Background(), http.Header{})
		if err != nil {
			t.Fatalf("%d: Send: %v", code, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		lan.Close()
		if resp.StatusCode != code {
			t.Errorf("a %d from the target came back as %d", code, resp.StatusCode)
		}
		if n := elsewhere.Load(); n != 0 {
			t.Fatalf("after a %d from the target, the host it named got %d requests", code, n)
		}
	}
}
