package router

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/redaction"
)

// Tests of the redaction settings the classifier carries to NewDispatch:
// per-type modes, user-defined types, values split across fields, and
// failing closed when a detector fails.

func TestNewDispatchAppliesTheConfiguredModes(t *testing.T) {
	_, tg := dispatchTargets(t)
	key := []byte(strings.Repeat("k", 32))
	cls := NewClassifier(testScanner(t), nil,
		WithRedactionModes(map[string]redaction.Mode{"EMAIL": redaction.ModeHash, "CREDIT_CARD": redaction.ModeMask}),
		WithHashKey(key))
	d := allowTiers(t, []string{"T1", "T3"}, map[string][]string{"T3": {"EMAIL", "CREDIT_CARD", "PHONE"}})
	send := func(prompt string) (string, *Dispatch) {
		t.Helper()
		a, err := cls.Classify(EndpointChat, []byte(chatBody(prompt)), "", "")
		if err != nil {
			t.Fatal(err)
		}
		disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
		if err != nil {
			t.Fatal(err)
		}
		return gjson.GetBytes(disp.Body(), "messages.0.content").String(), disp
	}
	first, disp := send("mail alice@example.com, card 4111 1111 1111 1111, call +1 415 555 2671")
	pseudo := regexp.MustCompile(`^mail \[EMAIL#[0-9a-f]{16}\], card \[CREDIT_CARD\], call \[PHONE_1\]$`)
	if !pseudo.MatchString(first) {
		t.Fatalf("T3 content = %q, want a pseudonym, a mask and a placeholder", first)
	}
	// Only the placeholder is restorable; all three count as redacted.
	if got := disp.vault.Placeholders(); !reflect.DeepEqual(got, map[string]string{"[PHONE_1]": "+1 415 555 2671"}) || disp.Redacted() != 3 {
		t.Fatalf("vault = %v, Redacted %d; want only the phone restorable, 3 replaced", got, disp.Redacted())
	}
	token := first[len("mail ") : len("mail ")+len("[EMAIL#0123456789abcdef]")]
	second, _ := send("again alice@example.com and bob@example.org")
	if !strings.HasPrefix(second, "again "+token+" and [EMAIL#") || strings.Count(second, token) != 1 {
		t.Fatalf("second request = %q, want alice's pseudonym %s again and another for bob", second, token)
	}
	// The same value under another key gets another pseudonym.
	other := NewClassifier(testScanner(t), nil, WithRedactionModes(map[string]redaction.Mode{"EMAIL": redaction.ModeHash}),
		WithHashKey([]byte(strings.Repeat("o", 32))))
	a, _ := other.Classify(EndpointChat, []byte(chatBody("alice@example.com")), "", "")
	disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
	if err != nil {
		t.Fatal(err)
	}
	if got := gjson.GetBytes(disp.Body(), "messages.0.content").String(); got == token || !strings.HasPrefix(got, "[EMAIL#") {
		t.Fatalf("another key gave %q, want a different pseudonym than %s", got, token)
	}
	if disp.vault != nil || disp.Redacted() != 1 {
		t.Fatalf("vault %v, Redacted %d; want no vault and 1 value replaced", disp.vault, disp.Redacted())
	}
}

func TestUserDefinedTypesAreClassifiedAndRedacted(t *testing.T) {
	_, tg := dispatchTargets(t)
	sc, err := redaction.NewScanner(redaction.Config{
		Patterns:     map[string][]string{"EMPLOYEE_ID": {`\bE-\d{6}\b`}},
		Dictionaries: map[string][]string{"PROJECT": {"Falcon", "Blue Heron"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name      string
		overrides map[string]Sensitivity
		prompt    string
		want      Sensitivity
		findings  map[string]int
	}{
		{"a custom type implies confidential by default", nil, "status of falcon for E-123456?", Confidential, map[string]int{"PROJECT": 1, "EMPLOYEE_ID": 1}},
		{"its class can be overridden", map[string]Sensitivity{"PROJECT": Public}, "is Blue Heron late?", Public, map[string]int{"PROJECT": 1}},
		{"the highest class of all findings wins", map[string]Sensitivity{"PROJECT": Public}, "Falcon, mail bob@example.org", Internal, map[string]int{"PROJECT": 1, "EMAIL": 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := NewClassifier(sc, tc.overrides).Classify(EndpointChat, []byte(chatBody(tc.prompt)), "", "")
			if err != nil {
				t.Fatal(err)
			}
			if a.Sensitivity != tc.want || !reflect.DeepEqual(a.Sovereignty.Findings, tc.findings) {
				t.Fatalf("Sensitivity %v findings %v; want %v %v", a.Sensitivity, a.Sovereignty.Findings, tc.want, tc.findings)
			}
		})
	}
	t.Run("the policy can name them in redact lists", func(t *testing.T) {
		a, _ := NewClassifier(sc, nil).Classify(EndpointChat, []byte(chatBody("ship Falcon to E-123456 and falcon again")), "", "")
		if !reflect.DeepEqual(a.Scanned[len(a.Scanned)-2:], []string{"EMPLOYEE_ID", "PROJECT"}) {
			t.Fatalf("Scanned = %v", a.Scanned)
		}
		d := allowTiers(t, []string{"T3"}, map[string][]string{"T3": {"PROJECT", "EMPLOYEE_ID"}})
		disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
		if err != nil {
			t.Fatal(err)
		}
		if got := gjson.GetBytes(disp.Body(), "messages.0.content").String(); got != "ship [PROJECT_1] to [EMPLOYEE_ID_1] and [PROJECT_2] again" {
			t.Fatalf("T3 content = %q", got)
		}
	})
}

func TestClassifyFindsValuesSplitAcrossFields(t *testing.T) {
	args := func(s string) string { return jsonString(s) }
	cases := []struct {
		name     string
		body     string
		findings map[string]int
		parts    []string // "path:TYPE:text"
	}{
		{"card digits over two user messages",
			`{"model":"m","messages":[{"role":"user","content":"my card is 4111 1111"},{"role":"user","content":"1111 1111 thanks"}]}`,
			map[string]int{"CREDIT_CARD": 1},
			[]string{"messages.0.content:CREDIT_CARD:4111 1111", "messages.1.content:CREDIT_CARD:1111 1111"}},
		{"an address over two content parts",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"write to anna.rossi@"},{"type":"text","text":"example.it now"}]}]}`,
			map[string]int{"EMAIL": 1},
			[]string{"messages.0.content.0.text:EMAIL:anna.rossi@", "messages.0.content.1.text:EMAIL:example.it"}},
		{"an address over two arguments of one tool call",
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":` + args(`{"user":"mario.rossi","domain":"@example.it"}`) + `}}]}]}`,
			map[string]int{"EMAIL": 1},
			[]string{"messages.1.tool_calls.0.function.arguments:EMAIL:mario.rossi", "messages.1.tool_calls.0.function.arguments:EMAIL:@example.it"}},
		{"an IBAN over two tool calls",
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[` +
				`{"id":"a","type":"function","function":{"name":"f","arguments":` + args(`{"iban":"IT60 X054 2811"}`) + `}},` +
				`{"id":"b","type":"function","function":{"name":"f","arguments":` + args(`{"rest":"1010 0000 0123 456"}`) + `}}]}]}`,
			map[string]int{"IBAN": 1},
			[]string{"messages.1.tool_calls.0.function.arguments:IBAN:IT60 X054 2811", "messages.1.tool_calls.1.function.arguments:IBAN:1010 0000 0123 456"}},
		{"a whole value next to the following message is not split",
			`{"model":"m","messages":[{"role":"user","content":"reply to alice@example.com"},{"role":"user","content":"cc bob"}]}`,
			map[string]int{"EMAIL": 1},
			[]string{"messages.0.content:EMAIL:alice@example.com"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := classify(t, EndpointChat, tc.body, "")
			if !reflect.DeepEqual(a.Sovereignty.Findings, tc.findings) {
				t.Errorf("findings = %v, want %v", a.Sovereignty.Findings, tc.findings)
			}
			var got []string
			for _, f := range a.Findings {
				fl := a.Fields[f.Field]
				got = append(got, fl.Path+":"+f.Type+":"+fl.Text[f.Start:f.End])
			}
			if !reflect.DeepEqual(got, tc.parts) {
				t.Errorf("findings\n got %q\nwant %q", got, tc.parts)
			}
		})
	}
}

func TestNewDispatchRedactsEachPartOfASplitValue(t *testing.T) {
	_, tg := dispatchTargets(t)
	body := `{"model":"m","messages":[{"role":"user","content":"card 4111 1111"},{"role":"user","content":"1111 1111 and mail anna.rossi@"},{"role":"user","content":"example.it"}]}`
	a := classify(t, EndpointChat, body, "")
	d := allowTiers(t, []string{"T3"}, map[string][]string{"T3": {"CREDIT_CARD", "EMAIL"}})
	disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"card [CREDIT_CARD_1]", "[CREDIT_CARD_2] and mail [EMAIL_1]", "[EMAIL_2]"}
	for i, w := range want {
		if got := gjson.GetBytes(disp.Body(), fmt.Sprintf("messages.%d.content", i)).String(); got != w {
			t.Errorf("messages.%d.content = %q, want %q", i, got, w)
		}
	}
	// The model echoes the placeholders back together; each part returns.
	if got := disp.vault.Restore("[CREDIT_CARD_1] [CREDIT_CARD_2], [EMAIL_1][EMAIL_2]"); got != "4111 1111 1111 1111, anna.rossi@example.it" {
		t.Fatalf("restored %q", got)
	}
}

// failingScan makes the classifier's detector panic on text containing
// "BOOM", standing for a detector bug or a resource failure.
func failingScan(c *Classifier) *Classifier {
	scan := c.scan
	c.scan = func(text string) []redaction.Finding {
		if strings.Contains(text, "BOOM") {
			panic("detector failure")
		}
		return scan(text)
	}
	return c
}

func TestAFailedScanFailsClosed(t *testing.T) {
	_, tg := dispatchTargets(t)
	cls := failingScan(NewClassifier(testScanner(t), map[string]Sensitivity{"EMAIL": Public}))
	a, err := cls.Classify(EndpointChat, []byte(`{"model":"m","messages":[{"role":"user","content":"mail alice@example.com"},{"role":"user","content":"BOOM"}]}`), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if !a.ScanFailed || a.Detected != Restricted || a.Sensitivity != Restricted {
		t.Fatalf("ScanFailed %v, Detected %v, Sensitivity %v; want true, restricted, restricted", a.ScanFailed, a.Detected, a.Sensitivity)
	}
	if got := PolicyInput(a, "x", nil)["sovereignty"].(map[string]any)["scan_failed"]; got != true {
		t.Fatalf("input.sovereignty.scan_failed = %v", got)
	}
	d := allowTiers(t, []string{"T1", "T3"}, map[string][]string{"T3": {"EMAIL"}})
	disp, err := NewDispatch(d, a, candidate(tg["T3"], "m"))
	if disp != nil || !errors.Is(err, ErrScanFailed) ||
		err.Error() != "cloud (T3 redacts EMAIL): content scan failed, so the redaction the policy requires cannot be guaranteed" {
		t.Fatalf("NewDispatch(T3) = %v, %v; want a refusal", disp, err)
	}
	if disp, err := NewDispatch(d, a, candidate(tg["T1"], "m")); err != nil || string(disp.Body()) != string(a.Body) {
		t.Fatalf("NewDispatch(T1) = %v; want the request unchanged, as the policy asks no redaction there", err)
	}
	t.Run("a clean request is unaffected", func(t *testing.T) {
		a, _ := cls.Classify(EndpointChat, []byte(chatBody("mail alice@example.com")), "", "")
		if a.ScanFailed || a.Sensitivity != Public {
			t.Fatalf("ScanFailed %v Sensitivity %v", a.ScanFailed, a.Sensitivity)
		}
	})
	t.Run("a failure while joining fields fails closed too", func(t *testing.T) {
		c := NewClassifier(testScanner(t), nil)
		c.scanAcross = func([]string) []redaction.SegmentFinding { panic("join failure") }
		a, _ := c.Classify(EndpointChat, []byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`), "", "")
		if !a.ScanFailed || a.Sensitivity != Restricted {
			t.Fatalf("ScanFailed %v Sensitivity %v", a.ScanFailed, a.Sensitivity)
		}
	})
}

func TestForwarderReroutesOrRefusesAfterAFailedScan(t *testing.T) {
	lan, _, cloud, targets := threeTiers(t)
	cls := failingScan(NewClassifier(testScanner(t), nil))
	body := chatBody("BOOM alice@example.com")
	cases := []struct {
		name     string
		decision map[string]any
		status   int
		target   string
		message  string
	}{
		{"the request goes to an allowed tier that needs no redaction",
			decisionMap([]string{"T1", "T3"}, map[string]any{"redact": map[string]any{"T3": []any{"EMAIL"}}}), 200, "lan", ""},
		{"with only redacting tiers allowed it is refused with the reason",
			decisionMap([]string{"T3"}, map[string]any{"redact": map[string]any{"T3": []any{"EMAIL"}}}), 503, "",
			"cloud: cloud (T3 redacts EMAIL): content scan failed, so the redaction the policy requires cannot be guaranteed)."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cat := newCatalogue(t, targets...)
			a, err := cls.Classify(EndpointChat, []byte(body), "", "")
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			req, _ := http.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
			f := &Forwarder{Catalogue: cat, Weights: DefaultWeights}
			err = f.Serve(rec, req, a, decisionOf(t, tc.decision))
			if tc.status != 200 {
				if err == nil || !strings.Contains(err.Error(), tc.message) {
					t.Fatalf("Serve error = %v, want %q", err, tc.message)
				}
				if cloud.Contains("alice@example.com") || cloud.Count() != 0 {
					t.Fatal("the cloud received the request")
				}
				return
			}
			if err != nil || rec.Code != 200 || rec.Header().Get(HeaderTarget) != tc.target {
				t.Fatalf("Serve = %v, status %d target %q", err, rec.Code, rec.Header().Get(HeaderTarget))
			}
			if !lan.Contains("BOOM alice@example.com") || cloud.Count() != 0 {
				t.Fatalf("lan got %q, cloud %d requests", lan.Received(), cloud.Count())
			}
		})
	}
}
