package router

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/redaction"
)

// dispatchTargets is one target per tier, all serving "m" (as "up-m" upstream on T3).
func dispatchTargets(t *testing.T) (*Catalogue, map[string]*Target) {
	ts := []*Target{
		{Name: "device", Tier: "T0", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m"}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}},
		{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"m"}, Region: "EU"},
		{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:4/v1", Models: []string{"m=up-m"}, Region: "US"},
	}
	c := newCatalogue(t, ts...)
	byTier := map[string]*Target{}
	for _, tg := range ts {
		byTier[tg.Tier] = tg
	}
	return c, byTier
}

func candidate(tg *Target, model string) Candidate {
	return Candidate{Target: tg, Model: tg.models[model]}
}

func TestNewDispatchRefusesTargetsTheDecisionDoesNotAllow(t *testing.T) {
	_, tg := dispatchTargets(t)
	a := classify(t, EndpointChat, chatBody("hello"), "")
	tests := []struct {
		name     string
		decision map[string]any
		target   *Target
		msg      string
	}{
		{"a tier outside the allowed ones", decisionMap([]string{"T0", "T1"}, nil), tg["T3"], "cloud (T3): target not allowed by the policy decision"},
		{"T2 when only T0 is allowed", decisionMap([]string{"T0"}, nil), tg["T2"], "remote (T2): target not allowed by the policy decision"},
		{"any tier of a denial", map[string]any{"allow": false, "tiers": []any{"T0", "T1", "T2", "T3"}, "reasons": []any{"no"}}, tg["T0"], "device (T0): target not allowed by the policy decision"},
		{"an allowed tier in a region outside the decision's", decisionMap([]string{"T0", "T1", "T2", "T3"}, map[string]any{"regions": []any{"EU", "local"}}), tg["T3"], "cloud (T3): target not allowed by the policy decision"},
		{"a candidate without a target", decisionMap([]string{"T0"}, nil), nil, "<nil>: target not allowed by the policy decision"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Candidate{Target: tt.target, Model: "m"}
			disp, err := NewDispatch(decisionOf(t, tt.decision), a, c)
			if disp != nil || !errors.Is(err, ErrNotAllowed) || err.Error() != tt.msg {
				t.Fatalf("NewDispatch = %v, %v; want nil and %q", disp, err, tt.msg)
			}
		})
	}
	t.Run("the region the decision names is allowed", func(t *testing.T) {
		d := decisionOf(t, decisionMap([]string{"T2"}, map[string]any{"regions": []any{"EU"}}))
		if _, err := NewDispatch(d, a, candidate(tg["T2"], "m")); err != nil {
			t.Fatal(err)
		}
	})
}

func TestNewDispatchRedactsForTheTier(t *testing.T) {
	_, tg := dispatchTargets(t)
	body := `{"model":"m","temperature":0.2,"messages":[` +
		`{"role":"system","content":"reply to alice@example.com"},` +
		`{"role":"user","name":"bob@example.org","content":[{"type":"text","text":"cc alice@example.com, pay 4111 1111 1111 1111, call +1 415 555 2671"},{"type":"image_url","image_url":{"url":"https://img/alice@example.com.png"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"pay","arguments":"{\"card\":\"4111111111111111\",\"to\":\"alice@example.com\"}"}}]},` +
		`{"role":"tool","tool_call_id":"c","content":"receipt sent to [EMAIL_1]"}]}`
	a := classify(t, EndpointChat, body, "")
	d := allowTiers(t, []string{"T0", "T1", "T2", "T3"}, map[string][]string{"T3": {"EMAIL", "CREDIT_CARD"}, "T2": {"SECRET"}})

	disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
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
		"messages.1.content.1.image_url.url":         "https://[EMAIL_4]",
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
	// Every string is scanned, the image URL included.
	if n := strings.Count(string(out), "alice@example.com"); n != 0 {
		t.Errorf("alice's address appears %d times in the T3 body, want 0", n)
	}
	for _, v := range []string{"bob@example.org", "4111 1111 1111 1111", "4111111111111111"} {
		if strings.Contains(string(out), v) {
			t.Errorf("the T3 body still contains %q", v)
		}
	}
	if disp.Redacted() != 5 || disp.Target() != tg["T3"] {
		t.Errorf("Redacted, Target = %d, %v; want 5 values for cloud", disp.Redacted(), disp.Target().Name)
	}
	if got := disp.vault.Placeholders(); !reflect.DeepEqual(got, map[string]string{
		"[EMAIL_2]": "alice@example.com", "[EMAIL_3]": "bob@example.org", "[EMAIL_4]": "img/alice@example.com.png",
		"[CREDIT_CARD_1]": "4111 1111 1111 1111", "[CREDIT_CARD_2]": "4111111111111111",
	}) {
		t.Errorf("placeholders = %v", got)
	}
	if string(a.Body) != body {
		t.Error("NewDispatch changed the annotation's body")
	}

	t.Run("other tiers get the values unless their own list names them", func(t *testing.T) {
		for _, tier := range []string{"T0", "T1", "T2"} {
			disp, err := NewDispatch(d, a, candidate(tg[tier], "m"))
			if err != nil {
				t.Fatal(err)
			}
			if string(disp.Body()) != body || disp.Redacted() != 0 || disp.vault != nil {
				t.Errorf("%s body = %s (redacted %d); want the request unchanged", tier, disp.Body(), disp.Redacted())
			}
		}
	})
}

func TestNewDispatchRewritesTheModel(t *testing.T) {
	_, tg := dispatchTargets(t)
	d := allowTiers(t, []string{"T0", "T1", "T2", "T3"}, nil)
	tests := []struct {
		name string
		ep   Endpoint
		body string
		want string
	}{
		{"chat to an aliased model", EndpointChat, chatBody("hi"), `{"model":"up-m","messages":[{"role":"user","content":"hi"}]}`},
		{"completions", EndpointCompletions, `{"prompt":"hi","model":"m"}`, `{"prompt":"hi","model":"up-m"}`},
		{"embeddings", EndpointEmbeddings, `{"model":"m","input":[1,2]}`, `{"model":"up-m","input":[1,2]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			disp, err := NewDispatch(d, classify(t, tt.ep, tt.body, ""), candidate(tg["T3"], "m"))
			if err != nil || string(disp.Body()) != tt.want {
				t.Fatalf("body = %s, %v; want %s", disp.Body(), err, tt.want)
			}
		})
	}
	t.Run("the model list has no body", func(t *testing.T) {
		a := classify(t, EndpointModels, "", "")
		disp, err := NewDispatch(d, a, Candidate{Target: tg["T3"]})
		if err != nil || disp.Body() != nil {
			t.Fatalf("body = %q, %v; want none", disp.Body(), err)
		}
	})
}

func TestNewDispatchFailsClosedOnUnscannedTypes(t *testing.T) {
	_, tg := dispatchTargets(t)
	emailOnly, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewClassifier(emailOnly, nil).Classify(EndpointChat, []byte(chatBody("alice@example.com, +1 415 555 2671")), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Scanned, []string{"EMAIL"}) {
		t.Fatalf("Scanned = %v", a.Scanned)
	}
	d := allowTiers(t, []string{"T1", "T3"}, map[string][]string{"T3": {"EMAIL", "PHONE"}})
	disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
	if disp != nil || err == nil || err.Error() != "policy requires redacting PHONE for T3, which no detector finds; refusing to send" {
		t.Fatalf("NewDispatch = %v, %v; want a refusal naming PHONE", disp, err)
	}
	if errors.Is(err, ErrNotAllowed) {
		t.Error("the refusal is reported as a tier refusal")
	}
	// A tier without a redaction list is unaffected.
	if _, err := NewDispatch(d, a, candidate(tg["T1"], "m")); err != nil {
		t.Fatalf("T1: %v", err)
	}
	// The same holds when nothing of the type was found: the policy cannot be honoured.
	a2, _ := NewClassifier(emailOnly, nil).Classify(EndpointChat, []byte(chatBody("hello")), "", "")
	if _, err := NewDispatch(d, a2, candidate(tg["T3"], "m")); err == nil {
		t.Fatal("a request without findings was sent although PHONE cannot be scanned")
	}
}

// With the default policy, T3 only sees public requests; an operator who
// declares e-mail addresses public still gets them replaced on T3.
func TestDefaultPolicyRedactsDetectedTypesForT3(t *testing.T) {
	c, tg := dispatchTargets(t)
	cls := NewClassifier(testScanner(t), map[string]Sensitivity{"EMAIL": Public, "PHONE": Public})
	a, err := cls.Classify(EndpointChat, []byte(chatBody("mail alice@example.com or call +1 415 555 2671, alice@example.com")), "", "")
	if err != nil {
		t.Fatal(err)
	}
	d := decideDefault(t, defaultEngine(t), a, c)
	if !reflect.DeepEqual(d.Tiers(), []string{"T0", "T1", "T2", "T3"}) || !reflect.DeepEqual(d.Redact("T3"), []string{"EMAIL", "PHONE"}) {
		t.Fatalf("decision = %v redact %v", d.Tiers(), d.Redact("T3"))
	}
	disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
	if err != nil {
		t.Fatal(err)
	}
	if got := gjson.GetBytes(disp.Body(), "messages.0.content").String(); got != "mail [EMAIL_1] or call [PHONE_1], [EMAIL_1]" {
		t.Fatalf("T3 content = %q", got)
	}
	disp, err = NewDispatch(d, a, candidate(tg["T2"], "m"))
	if err != nil || !strings.Contains(string(disp.Body()), "alice@example.com") {
		t.Fatalf("T2 body = %s, %v; want the address kept", disp.Body(), err)
	}
}
