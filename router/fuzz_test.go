package router

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// residencySeeds are request bodies with the entities the detectors know,
// in every text-bearing place a request has.
var residencySeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"what is the capital of France?"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"mail alice@example.com and bob@example.org"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"pay with 4111 1111 1111 1111 or 5500-0000-0000-0004"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"wire to DE89370400440532013000, ref GB82WEST12345698765432"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"call me on +1 415 555 2671 or +39 06 6982 1234"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"my key is sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"aws AKIAIOSFODNN7EXAMPLE and https://admin:hunter2@db.example.com/x"}]}`,
	`{"model":"m","messages":[{"role":"system","content":"you help alice@example.com"},{"role":"user","name":"carol@example.net","content":[{"type":"text","text":"card 4111111111111111"},{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"text","text":"and +1 415 555 2671"}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"pay"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"pay","arguments":"{\"card\":\"4111 1111 1111 1111\",\"email\":\"alice@example.com\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sent to alice@example.com, [EMAIL_1]"}]}`,
	`{"model":"m","messages":[{"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{\"iban\":\"IT60X0542811101000000123456\"}"}},{"role":"user","content":"ok"}]}`,
	`{"model":"m","stream":true,"max_tokens":50,"messages":[{"role":"user","content":"alice\u0040example.com \u0034111 1111 1111 1111"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"ＡＬＩＣＥ＠ＥＸＡＭＰＬＥ．ＣＯＭ and a\u200blice@example.com"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"ip 8.8.8.8, ssn 123-45-6789, cf RSSMRA85T10A562S"}]}`,
	`{"model":"m","prompt":"complete: alice@example.com","suffix":"4111 1111 1111 1111"}`,
	`{"model":"m","prompt":["a@b.co",[1,2,3]]}`,
	`{"model":"m","input":["embed +1 415 555 2671","sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"]}`,
	`{"model":"m","input":[[1,2],[3]]}`,
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":[{"role":"user","content":"alice@example.com"}]}`,
}

// FuzzResidency drives arbitrary bodies through classify → the embedded
// default policy → Rank → NewDispatch, with two classifiers (the defaults,
// and one where an operator declared contact data public, so T3 receives
// redacted requests), and checks the residency invariant of DESIGN.md §2:
//
//   - a restricted request is dispatched only to T0, a confidential one only
//     to T0–T1, an internal one never to T3;
//   - a T3 body holds none of the found values of the types the decision
//     redacts for T3, in any scanned field as an upstream JSON parser
//     decodes it, and nowhere in the bytes beyond the unscanned fields that
//     already held it.
func FuzzResidency(f *testing.F) {
	for i, s := range residencySeeds {
		ep := uint8(0)
		if strings.Contains(s, `"prompt"`) {
			ep = 1
		} else if strings.Contains(s, `"input"`) {
			ep = 2
		}
		f.Add([]byte(s), ep, uint8(i%6))
	}
	eng := defaultEngine(f)
	classifiers := []*Classifier{
		testClassifier(f),
		NewClassifier(testScanner(f), map[string]Sensitivity{"EMAIL": Public, "PHONE": Public, "IP_ADDRESS": Public}),
	}
	targets := []*Target{
		{Name: "device", Tier: "T0", Endpoint: "http://127.0.0.1:1/v1", Models: []string{"m", "gpt-4o"}, Modalities: []string{"text", "image", "audio", "file"}},
		{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:2/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.6}},
		{Name: "remote", Tier: "T2", Endpoint: "http://127.0.0.1:3/v1", Models: []string{"m"}, Region: "EU", Quality: map[string]float64{"default": 0.7}},
		{Name: "cloud", Tier: "T3", Endpoint: "http://127.0.0.1:4/v1", Models: []string{"m=up-m", "gpt-4o"}, Region: "US", Quality: map[string]float64{"default": 0.9},
			Modalities: []string{"text", "image"}, PriceIn: 1, PriceOut: 2},
		{Name: "cloud-eu", Tier: "T3", Endpoint: "http://127.0.0.1:5/v1", Models: []string{"m"}, Region: "EU"},
	}
	cat := newCatalogue(f, targets...)
	maxTier := map[Sensitivity]int{Public: 3, Internal: 2, Confidential: 1, Restricted: 0}

	f.Fuzz(func(t *testing.T, body []byte, epb, declaredb uint8) {
		ep := []Endpoint{EndpointChat, EndpointCompletions, EndpointEmbeddings}[int(epb)%3]
		declared := []string{"", "public", "internal", "confidential", "restricted", string([]byte{declaredb})}[int(declaredb)%6]
		for ci, cls := range classifiers {
			a, err := cls.Classify(ep, body, declared, "")
			if err != nil {
				continue
			}
			if a.Sensitivity < a.Declared || a.Sensitivity < a.Detected || (a.Opaque && a.Sensitivity < Confidential) {
				t.Fatalf("classifier %d: sensitivity %s below declared %s / detected %s (opaque %v)", ci, a.Sensitivity, a.Declared, a.Detected, a.Opaque)
			}
			d := eng.DecideMap(t.Context(), PolicyInput(a, "fuzz", cat))
			cands, _, _ := cat.Rank(a, d, DefaultWeights)
			for _, c := range cands {
				if !d.AllowsTier(c.Target.Tier) {
					t.Fatalf("Rank offered %s (%s), which the decision %v does not allow", c.Target.Name, c.Target.Tier, d.Tiers())
				}
			}
			// Every target, not only the ranked ones: NewDispatch itself must hold the line.
			for _, tg := range cat.Targets() {
				model := a.Model
				if _, ok := tg.models[model]; !ok {
					model = "m"
				}
				disp, err := NewDispatch(d, a, Candidate{Target: tg, Model: tg.models[model]})
				if err != nil {
					continue
				}
				tier := slices.Index([]string{"T0", "T1", "T2", "T3"}, tg.Tier)
				if tier > maxTier[a.Sensitivity] {
					t.Fatalf("classifier %d: a %s request (findings %v, declared %s) was dispatched to %s (%s)",
						ci, a.Sensitivity, a.Sovereignty.Findings, a.Declared, tg.Name, tg.Tier)
				}
				if tg.Tier == "T3" {
					checkRedacted(t, a, d.Redact("T3"), disp.Body())
				}
			}
		}
	})
}

// checkRedacted asserts that out (a T3 dispatch body) holds no value of a
// finding whose type is in types.
func checkRedacted(t *testing.T, a *Annotation, types []string, out []byte) {
	t.Helper()
	var doc any
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatalf("the T3 body is not JSON an upstream can read: %v\n%s", err, out)
	}
	// The original body with every scanned field emptied: what was never scanned.
	unscanned := a.Body
	for _, fld := range a.Fields {
		var err error
		if unscanned, err = sjson.SetBytes(slices.Clone(unscanned), fld.Path, ""); err != nil {
			t.Fatalf("blanking %s: %v", fld.Path, err)
		}
	}
	for _, f := range a.Findings {
		if !slices.Contains(types, f.Type) {
			continue
		}
		value := a.Fields[f.Field].Text[f.Start:f.End]
		for _, fld := range a.Fields {
			got, ok := lookup(doc, fld.Path)
			if ok && strings.Contains(got, value) {
				t.Fatalf("%s value %q reached T3 in %s: %q", f.Type, value, fld.Path, got)
			}
			if g := gjson.GetBytes(out, fld.Path).String(); strings.Contains(g, value) {
				t.Fatalf("%s value %q reached T3 in %s: %q", f.Type, value, fld.Path, g)
			}
		}
		if n, m := strings.Count(string(out), value), strings.Count(string(unscanned), value); n > m {
			t.Fatalf("%s value %q appears %d times in the T3 body, %d outside scanned fields:\n%s", f.Type, value, n, m, out)
		}
	}
}

// lookup follows a gjson path of keys and indices ("messages.1.content.0.text")
// through a document decoded by encoding/json, as an upstream would read it.
func lookup(v any, path string) (string, bool) {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(x) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	s, ok := v.(string)
	return s, ok
}

// The seeds, checked by name so a regression names the case.
func TestResidencySeedsStayResident(t *testing.T) {
	e := defaultEngine(t)
	c, tg := dispatchTargets(t)
	tests := []struct {
		name string
		body string
		want Sensitivity
	}{
		{"an email is internal", residencySeeds[1], Internal},
		{"cards are confidential", residencySeeds[2], Confidential},
		{"IBANs are confidential", residencySeeds[3], Confidential},
		{"phone numbers are internal", residencySeeds[4], Internal},
		{"an API key is restricted", residencySeeds[5], Restricted},
		{"content parts and names are scanned", residencySeeds[7], Confidential},
		{"tool call arguments are scanned", residencySeeds[8], Confidential},
		{"escaped values are decoded before scanning", residencySeeds[10], Confidential},
		{"full-width and zero-width obfuscation is seen through", residencySeeds[11], Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classify(t, EndpointChat, tt.body, "")
			if a.Sensitivity != tt.want {
				t.Fatalf("Sensitivity = %s (findings %v), want %s", a.Sensitivity, a.Sovereignty.Findings, tt.want)
			}
			d := decideDefault(t, e, a, c)
			if _, err := NewDispatch(d, a, candidate(tg["T3"], "m")); err == nil {
				t.Fatalf("a %s request was dispatched to T3", a.Sensitivity)
			}
		})
	}
}
