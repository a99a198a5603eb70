package classify

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
)

// TestRedactKeepsTheJSONValid: every kind of scanned position is written
// back so that the body stays a valid OpenAI request: a number becomes a
// string, a key is renamed (nested and escaped ones too), a data URL is
// re-encoded, a participant name fits ^[a-zA-Z0-9_-]+$, tool arguments
// stay JSON.
func TestRedactKeepsTheJSONValid(t *testing.T) {
	body := `{"model":"m","metadata":{"alice@example.com":{"bob@example.org":"x"},"k":4111111111111111,"team.lead":{"dave@example.com":"y"}},` +
		`"messages":[{"role":"user","name":"erin@example.org","content":[{"type":"text","text":"hi alice@example.com"},` +
		`{"type":"image_url","image_url":{"url":"data:image/svg+xml;base64,PHN2Zz5jYXJvbEBleGFtcGxlLm5ldDwvc3ZnPg=="}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"to\":\"alice@example.com\"}"}}]}]}`
	a := classifyBody(t, openai.EndpointChat, body, "")
	red, err := a.Redact([]string{"EMAIL", "CREDIT_CARD"})
	if err != nil {
		t.Fatal(err)
	}
	if !gjson.Valid(red.Body) {
		t.Fatalf("the redacted body is not JSON: %s", red.Body)
	}
	if _, perr := openai.ParseRequest(openai.EndpointChat, []byte(red.Body)); perr != nil {
		t.Fatalf("the redacted body is not a valid request: %v\n%s", perr, red.Body)
	}
	// Placeholders are issued in document order; a value seen again gets its first one.
	want := map[string]string{
		"metadata.k":                                 "[CREDIT_CARD_1]",
		"messages.0.name":                            "EMAIL_4",
		"messages.0.content.0.text":                  "hi [EMAIL_1]",
		"messages.0.content.1.image_url.url":         "data:image/svg+xml;base64,PHN2Zz5bRU1BSUxfNV08L3N2Zz4=", // <svg>[EMAIL_5]</svg>
		"messages.1.tool_calls.0.function.arguments": `{"to":"[EMAIL_1]"}`,
	}
	for path, v := range want {
		if got := gjson.Get(red.Body, path); got.Type != gjson.String || got.Str != v {
			t.Errorf("%s = %s, want the string %q", path, got.Raw, v)
		}
	}
	// Keys are renamed deepest first; a renamed member moves to the end of its object.
	if got, want := gjson.Get(red.Body, "metadata").Raw, `{"k":"[CREDIT_CARD_1]","team.lead":{"[EMAIL_3]":"y"},"[EMAIL_1]":{"[EMAIL_2]":"x"}}`; got != want {
		t.Errorf("metadata = %s, want %s", got, want)
	}
	for _, v := range []string{"alice@", "bob@", "dave@", "erin@", "4111111111111111", "PHN2Zz5jYXJvbEBleGFtcGxlLm5ldDwvc3ZnPg"} {
		if strings.Contains(red.Body, v) {
			t.Errorf("the redacted body still holds %q", v)
		}
	}
	if red.Replaced != 6 || red.Vault.Restore("[EMAIL_5] [CREDIT_CARD_1] [EMAIL_4]") != "carol@example.net 4111111111111111 erin@example.org" {
		t.Errorf("Replaced %d; want 6 values, each restorable", red.Replaced)
	}
	if a.Body() != body {
		t.Error("Redact changed the annotation's body")
	}
}

func TestRedactNothingKeepsTheBody(t *testing.T) {
	body := chatBody("mail alice@example.com")
	a := classifyBody(t, openai.EndpointChat, body, "")
	for _, types := range [][]string{nil, {"PHONE"}} {
		red, err := a.Redact(types)
		if err != nil || red.Body != body || red.Vault != nil || red.Replaced != 0 {
			t.Fatalf("Redact(%v) = %+v, %v; want the body unchanged", types, red, err)
		}
	}
}

func TestRedactFailsClosedOnUnscannedTypes(t *testing.T) {
	emailOnly, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	for _, prompt := range []string{"alice@example.com, +1 415 555 2671", "hello"} {
		a, err := New(emailOnly, nil).Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody(prompt))})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a.Scanned(), []string{"EMAIL"}) {
			t.Fatalf("Scanned = %v", a.Scanned())
		}
		// Whether or not anything was found: what is never looked for cannot be removed.
		red, err := a.Redact([]string{"EMAIL", "PHONE"})
		if !errors.Is(err, ErrUnscannedType) || err.Error() != "PHONE: no detector finds this entity type" || red.Body != a.Body() {
			t.Fatalf("%q: Redact = %q, %v; want a refusal naming PHONE", prompt, red.Body, err)
		}
	}
}

func TestRedactAppliesTheConfiguredModes(t *testing.T) {
	key := []byte(strings.Repeat("k", 32))
	cls := New(testScanner(t), nil,
		WithRedactionModes(map[string]redaction.Mode{"EMAIL": redaction.ModeHash, "CREDIT_CARD": redaction.ModeMask}),
		WithHashKey(key))
	types := []string{"EMAIL", "CREDIT_CARD", "PHONE"}
	redact := func(c *Classifier, prompt string) Redacted {
		t.Helper()
		a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody(prompt))})
		if err != nil {
			t.Fatal(err)
		}
		red, err := a.Redact(types)
		if err != nil {
			t.Fatal(err)
		}
		return red
	}
	content := func(r Redacted) string { return gjson.Get(r.Body, "messages.0.content").String() }
	first := redact(cls, "mail alice@example.com, card 4111 1111 1111 1111, call +1 415 555 2671")
	pseudo := regexp.MustCompile(`^mail \[EMAIL#[0-9a-f]{16}\], card \[CREDIT_CARD\], call \[PHONE_1\]$`)
	if !pseudo.MatchString(content(first)) {
		t.Fatalf("content = %q, want a pseudonym, a mask and a placeholder", content(first))
	}
	// Only the placeholder is restorable; all three count as redacted.
	if got := first.Vault.Placeholders(); !reflect.DeepEqual(got, map[string]string{"[PHONE_1]": "+1 415 555 2671"}) || first.Replaced != 3 {
		t.Fatalf("vault = %v, Replaced %d; want only the phone restorable, 3 replaced", got, first.Replaced)
	}
	token := content(first)[len("mail ") : len("mail ")+len("[EMAIL#0123456789abcdef]")]
	second := content(redact(cls, "again alice@example.com and bob@example.org"))
	if !strings.HasPrefix(second, "again "+token+" and [EMAIL#") || strings.Count(second, token) != 1 {
		t.Fatalf("second request = %q, want alice's pseudonym %s again and another for bob", second, token)
	}
	t.Run("another key gives another pseudonym", func(t *testing.T) {
		other := New(testScanner(t), nil, WithRedactionModes(map[string]redaction.Mode{"EMAIL": redaction.ModeHash}),
			WithHashKey([]byte(strings.Repeat("o", 32))))
		r := redact(other, "alice@example.com")
		if got := content(r); got == token || !strings.HasPrefix(got, "[EMAIL#") {
			t.Fatalf("another key gave %q, want a different pseudonym than %s", got, token)
		}
		if r.Vault != nil || r.Replaced != 1 {
			t.Fatalf("vault %v, Replaced %d; want no vault and 1 value replaced", r.Vault, r.Replaced)
		}
	})
}

func TestUserDefinedTypesAreClassifiedAndRedacted(t *testing.T) {
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
			a, err := New(sc, tc.overrides).Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody(tc.prompt))})
			if err != nil {
				t.Fatal(err)
			}
			if a.Sensitivity() != tc.want || !reflect.DeepEqual(a.Findings(), tc.findings) {
				t.Fatalf("Sensitivity %v findings %v; want %v %v", a.Sensitivity(), a.Findings(), tc.want, tc.findings)
			}
		})
	}
	t.Run("a redaction can name them", func(t *testing.T) {
		a, _ := New(sc, nil).Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("ship Falcon to E-123456 and falcon again"))})
		if s := a.Scanned(); !reflect.DeepEqual(s[len(s)-2:], []string{"EMPLOYEE_ID", "PROJECT"}) {
			t.Fatalf("Scanned = %v", s)
		}
		red, err := a.Redact([]string{"PROJECT", "EMPLOYEE_ID"})
		if err != nil {
			t.Fatal(err)
		}
		if got := gjson.Get(red.Body, "messages.0.content").String(); got != "ship [PROJECT_1] to [EMPLOYEE_ID_1] and [PROJECT_2] again" {
			t.Fatalf("content = %q", got)
		}
	})
}

func TestRedactReplacesEachPartOfASplitValue(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"card 4111 1111"},{"role":"user","content":"1111 1111 and mail anna.rossi@"},{"role":"user","content":"example.it"}]}`
	a := classifyBody(t, openai.EndpointChat, body, "")
	red, err := a.Redact([]string{"CREDIT_CARD", "EMAIL"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"card [CREDIT_CARD_1]", "[CREDIT_CARD_2] and mail [EMAIL_1]", "[EMAIL_2]"}
	for i, w := range want {
		if got := gjson.Get(red.Body, fmt.Sprintf("messages.%d.content", i)).String(); got != w {
			t.Errorf("messages.%d.content = %q, want %q", i, got, w)
		}
	}
	// The model echoes the placeholders back together; each part returns.
	if got := red.Vault.Restore("[CREDIT_CARD_1] [CREDIT_CARD_2], [EMAIL_1][EMAIL_2]"); got != "4111 1111 1111 1111, anna.rossi@example.it" {
		t.Fatalf("restored %q", got)
	}
}

func TestRedactNeverIssuesAPlaceholderTheClientWrote(t *testing.T) {
	body := `{"model":"m","metadata":{"note":"[EMAIL_1]"},"messages":[{"role":"user","content":"mail alice@example.com"}]}`
	a := classifyBody(t, openai.EndpointChat, body, "")
	red, err := a.Redact([]string{"EMAIL"})
	if err != nil {
		t.Fatal(err)
	}
	if got := gjson.Get(red.Body, "messages.0.content").String(); got != "mail [EMAIL_2]" || gjson.Get(red.Body, "metadata.note").String() != "[EMAIL_1]" {
		t.Fatalf("body %s; want alice as [EMAIL_2], the client's [EMAIL_1] left alone", red.Body)
	}
	if got := red.Vault.Restore("[EMAIL_1] [EMAIL_2]"); got != "[EMAIL_1] alice@example.com" {
		t.Fatalf("restored %q", got)
	}
}

// TestRedactNumbersWithAnExponent: a JSON number is scanned as the value
// an upstream's parser reads, so a card number written with an exponent
// or as a fraction of a power of ten (4111111111111111e0,
// 4.111111111111111E15, 41111111.11111111e8) is found and replaced like
// the plain literal. The oracle is the card's digits, searched in the
// redacted body with every non-digit removed from each number.
func TestRedactNumbersWithAnExponent(t *testing.T) {
	const card = "4111111111111111"
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"a":"x"},` +
		`"x":4111111111111111e0,"y":4.111111111111111E15,"z":41111111.11111111e8,"w":-0.4111111111111111e+16,"v":1.5e3,"u":2e-3}`
	a := classifyBody(t, openai.EndpointChat, body, "")
	if a.Findings()["CREDIT_CARD"] != 4 {
		t.Fatalf("findings %v, want 4 cards", a.Findings())
	}
	red, err := a.Redact([]string{"CREDIT_CARD"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"x", "y", "z"} {
		if got := gjson.Get(red.Body, k); got.Str != "[CREDIT_CARD_1]" {
			t.Errorf("%s = %s, want the placeholder", k, got.Raw)
		}
	}
	if got := gjson.Get(red.Body, "w").Str; got != "-[CREDIT_CARD_1]" {
		t.Errorf("w = %q, want -[CREDIT_CARD_1]", got)
	}
	gjson.Parse(red.Body).ForEach(func(k, v gjson.Result) bool {
		digits := strings.Map(func(r rune) rune {
			if r >= '0' && r <= '9' {
				return r
			}
			return -1
		}, v.Raw)
		if v.Type == gjson.Number && strings.Contains(digits, card[:15]) {
			t.Errorf("%s still holds the card's digits: %s", k, v.Raw)
		}
		return true
	})
	// Numbers without card digits are left as they were.
	if gjson.Get(red.Body, "v").Raw != "1.5e3" || gjson.Get(red.Body, "u").Raw != "2e-3" {
		t.Errorf("other numbers were rewritten: %s", red.Body)
	}
}

func TestNumberText(t *testing.T) {
	for raw, want := range map[string]string{
		"4111111111111111": "4111111111111111", "3.14": "3.14", "1.5e3": "1500", "2e-3": "0.002",
		"4.111111111111111E15": "4111111111111111", "4111111111111111e0": "4111111111111111",
		"-0.4111111111111111e+16": "-4111111111111111", "41111111.11111111e8": "4111111111111111",
		"1e65": "1e65", "1.25e1": "12.5", "0e5": "0", "100e-2": "1",
	} {
		if got := numberText(raw); got != want {
			t.Errorf("numberText(%s) = %s, want %s", raw, got, want)
		}
	}
}

// TestRedactNumbersWithAnExponentInToolArguments: tool-call arguments are
// JSON the model reads as text; a card number written there with an
// exponent is found and replaced by a quoted placeholder (the arguments
// stay JSON), restored as the literal the client wrote.
func TestRedactNumbersWithAnExponentInToolArguments(t *testing.T) {
	for _, n := range []string{"4111111111111111e0", "4.111111111111111E15", "41111111.11111111e+8"} {
		args := `{"n":` + n + `,"m":[1.5e3]}`
		body := `{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":` +
			fmt.Sprintf("%q", args) + `}}]}]}`
		a := classifyBody(t, openai.EndpointChat, body, "")
		red, err := a.Redact([]string{"CREDIT_CARD"})
		if err != nil {
			t.Fatal(err)
		}
		got := gjson.Get(red.Body, "messages.1.tool_calls.0.function.arguments").Str
		if got != `{"n":"[CREDIT_CARD_1]","m":[1.5e3]}` {
			t.Errorf("%s: arguments sent %s, want the number as a quoted placeholder", n, got)
			continue
		}
		if back := string(red.Vault.RestoreJSON([]byte(got))); back != args {
			t.Errorf("%s: restored %s, want %s", n, back, args)
		}
	}
}

// TestRedactAValueCutBetweenATextAndToolArguments: a value cut between a
// message's text and the arguments of the tool call that follows it (or
// between the arguments and the next message) reads as one to the model;
// each part is replaced in its own field. The oracle is the value's two
// halves in the redacted body.
func TestRedactAValueCutBetweenATextAndToolArguments(t *testing.T) {
	for _, tc := range []struct{ body, head, tail string }{
		{`{"model":"m","messages":[{"role":"user","content":"mail mario.rossi@"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"example.com"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`,
			"mario.rossi@", "example.com"},
		{`{"model":"m","messages":[{"role":"user","content":"mail mario.rossi@"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"to\":\"example.com\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"ok"}]}`,
			"mario.rossi@", "example.com"},
		{`{"model":"m","messages":[{"role":"user","content":"pay"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"pay","arguments":"{\"iban\":\"IT60X05428111\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"01000000123456 accepted"}]}`,
			"IT60X05428111", "01000000123456"},
	} {
		a := classifyBody(t, openai.EndpointChat, tc.body, "")
		red, err := a.Redact([]string{"EMAIL", "IBAN"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(red.Body, tc.head) || strings.Contains(red.Body, tc.tail) {
			t.Errorf("the redacted body still holds a part of %s%s: %s", tc.head, tc.tail, red.Body)
			continue
		}
		ph := "[EMAIL_1][EMAIL_2]"
		if strings.HasPrefix(tc.head, "IT") {
			ph = "[IBAN_1][IBAN_2]"
		}
		if got := red.Vault.Restore(ph); got != tc.head+tc.tail {
			t.Errorf("restored %q, want %q", got, tc.head+tc.tail)
		}
	}
}

// TestRedactKeysThatLookLikePathSyntax: a member name is written into an
// sjson path; one gjson/sjson read as syntax ("[0]" is a multipath, ":x" a
// flag, "@this" a modifier) named nothing, so the placeholder went into a
// new member beside the value, which reached the upstream as it was (and a
// renamed key lost its value: invalid JSON). Every such name, as the key
// of a value with a finding and as a key with a finding, is redacted in
// place; the oracle is the address's text in the redacted body, and the
// body is valid JSON with as many members as before.
func TestRedactKeysThatLookLikePathSyntax(t *testing.T) {
	for _, k := range []string{`[0]`, `{a}`, `a,b`, `:x`, `@this`, `!x`, `#`, `*`, `?`, `a|b`, `-1`, ``, `..`, `\\`, `a\\.b`, `x\"y`, `a(b)`, `$`, `%`, `é`} {
		for _, body := range []string{
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"` + k + `":"mail mario.rossi@example.com"},` +
				`"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"` + k + `":{"type":"string","description":"mario.rossi@example.com"}}}}}}`,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"` + k + `mario.rossi@example.com":"x"},"` + k + `":"mario.rossi@example.com"}`,
		} {
			a := classifyBody(t, openai.EndpointChat, body, "")
			red, err := a.Redact([]string{"EMAIL"})
			if err != nil {
				t.Errorf("key %q: %v", k, err)
				continue
			}
			if strings.Contains(red.Body, "mario.rossi") || !gjson.Valid(red.Body) ||
				gjson.Get(red.Body, "metadata.@keys.#").Int() != gjson.Get(body, "metadata.@keys.#").Int() {
				t.Errorf("key %q: redacted %s", k, red.Body)
			}
		}
	}
}

// TestRedactAValueSplitAcrossEscapedArguments: a value cut between two
// string values of tool-call arguments is found when a part is written
// with JSON escapes (a line break, \u0040 for the '@'): such values used
// to be left out of the sequence joined across values. Each part is
// replaced; the oracle is the parts' text in the redacted arguments, and
// the restored placeholders give the value back.
func TestRedactAValueSplitAcrossEscapedArguments(t *testing.T) {
	for _, tc := range []struct{ args, want, back string }{
		{`{"a":"mario.rossi\u0040exa","b":"mple.com"}`, `{"a":"[EMAIL_1]","b":"[EMAIL_2]"}`, "mario.rossi@example.com"},
		{`{"a":"mario.rossi@exa","b":"mple\u002ecom"}`, `{"a":"[EMAIL_1]","b":"[EMAIL_2]"}`, "mario.rossi@example.com"},
		{`{"a":"card 4111\n1111","b":"1111 1111"}`, `{"a":"card [CREDIT_CARD_1]","b":"[CREDIT_CARD_2]"}`, "4111\n1111 1111 1111"},
	} {
		body := `{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":` +
			fmt.Sprintf("%q", tc.args) + `}}]}]}`
		a := classifyBody(t, openai.EndpointChat, body, "")
		red, err := a.Redact([]string{"CREDIT_CARD", "EMAIL"})
		if err != nil {
			t.Fatal(err)
		}
		if got := gjson.Get(red.Body, "messages.1.tool_calls.0.function.arguments").Str; got != tc.want {
			t.Errorf("%s: sent %s, want %s", tc.args, got, tc.want)
			continue
		}
		ph := "[EMAIL_1][EMAIL_2]"
		if strings.Contains(tc.want, "CARD") {
			ph = "[CREDIT_CARD_1] [CREDIT_CARD_2]"
		}
		if got := red.Vault.Restore(ph); got != tc.back {
			t.Errorf("%s: restored %q, want %q", tc.args, got, tc.back)
		}
	}
}
