package classify

import (
	"context"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/openai"
)

// mapsOnly hides an annotation's PolicyValue, so Decide converts its
// PolicyInput maps (the reference path).
type mapsOnly struct{ *Annotation }

func (m mapsOnly) Digest() policies.Digest     { return m.Annotation.Digest() }
func (m mapsOnly) PolicyInput() map[string]any { return m.Annotation.PolicyInput() }

func TestPolicyValueIsPolicyInput(t *testing.T) {
	c := FailScansOn(New(testScanner(t), nil), "DETECTOR-BUG")
	eng, err := policies.New(context.Background(), policies.Options{})
	if err != nil {
		t.Fatal(err)
	}
	inputs := []Input{
		{Endpoint: openai.EndpointChat, Body: []byte(chatBody("hello"))},
		{Endpoint: openai.EndpointChat, Declared: "confidential", Residency: "EU",
			Body: []byte(`{"model":"m","stream":true,"max_tokens":9,"n":2,"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":[{"type":"text","text":"mail alice@example.com, +39 333 123 4567"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`)},
		{Endpoint: openai.EndpointChat, Body: []byte(chatBody("key sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6 and card 4111 1111 1111 1111"))},
		{Endpoint: openai.EndpointChat, Body: []byte(chatBody("DETECTOR-BUG"))},
		{Endpoint: openai.EndpointCompletions, Body: []byte(`{"model":"m","prompt":[[1,2],"x"],"best_of":3}`)},
		{Endpoint: openai.EndpointEmbeddings, Declared: "internal", Body: []byte(`{"model":"m","input":"bob@example.org"}`)},
		{Endpoint: openai.EndpointModels, Path: "/v1/models"},
	}
	// Inputs alike but for one member field each, after the ones they
	// resemble: the request and sovereignty members shared between alike
	// annotations (termCache) must never be another annotation's.
	base := `{"model":"m","messages":[{"role":"user","content":"mail alice@example.com"}]}`
	variants := []Input{
		{Endpoint: openai.EndpointChat, Body: []byte(base)},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, `"m"`, `"m2"`, 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, `"m"`, `"m","stream":true`, 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, `"m"`, `"m","n":3`, 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, `"m"`, `"m","tools":[{"type":"function","function":{"name":"g"}}]`, 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, `"m"`, `"m","tools":[{"type":"function","function":{"name":"h"}}]`, 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, "alice@example.com", "alice@example.com and bob@example.org", 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, "alice@example.com", "alice@example.com and 4111 1111 1111 1111", 1))},
		{Endpoint: openai.EndpointChat, Body: []byte(strings.Replace(base, "alice@example.com", "nothing personal", 1))},
		{Endpoint: openai.EndpointChat, Declared: "confidential", Body: []byte(base)},
		{Endpoint: openai.EndpointChat, Residency: "EU", Body: []byte(base)},
		{Endpoint: openai.EndpointCompletions, Body: []byte(`{"model":"m","prompt":"mail alice@example.com"}`)},
	}
	// Twice: the second pass finds every member in the caches.
	inputs = append(append(append(inputs, variants...), inputs...), variants...)
	for _, in := range inputs {
		a, err := c.Classify(in)
		if err != nil {
			t.Fatal(err)
		}
		want, err := policies.ValueOf(a.PolicyInput())
		if err != nil {
			t.Fatal(err)
		}
		if got := a.PolicyValue(); ast.Compare(got, want) != 0 {
			t.Fatalf("%s: PolicyValue =\n%v\nPolicyInput converted =\n%v", in.Body, got, want)
		}
		req, capability, sov := a.PolicyMembers()
		for k, m := range map[string]*ast.Term{"request": req, "capability": capability, "sovereignty": sov} {
			if w := want.(ast.Object).Get(ast.StringTerm(k)); m == nil || ast.Compare(m.Value, w.Value) != 0 {
				t.Fatalf("%s: PolicyMembers' %s = %v, PolicyInput's %v", in.Body, k, m, w)
			}
		}
		fast := eng.Decide(context.Background(), policies.Input{Subject: a}).Decision()
		slow := eng.Decide(context.Background(), policies.Input{Subject: mapsOnly{a}}).Decision()
		if fast.Allowed() != slow.Allowed() || strings.Join(fast.Tiers(), ",") != strings.Join(slow.Tiers(), ",") || strings.Join(fast.Reasons(), "\n") != strings.Join(slow.Reasons(), "\n") {
			t.Fatalf("%s: decisions differ: %v %v %v / %v %v %v", in.Body, fast.Allowed(), fast.Tiers(), fast.Reasons(), slow.Allowed(), slow.Tiers(), slow.Reasons())
		}
	}
}
