package redaction

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

func customScanner(t testing.TB) *Scanner {
	t.Helper()
	s, err := NewScanner(Config{DefaultRegion: "IT",
		Patterns: map[string][]string{
			"EMPLOYEE_ID": {`\bE-\d{6}\b`, `(?i)badge\s*#(?P<value>\d{4,8})`},
		},
		Dictionaries: map[string][]string{
			"PROJECT": {"Falcon", "Blue Heron", "Apollo", "Apollo 11", "Ünità"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestUserDefinedDetectors(t *testing.T) {
	s := customScanner(t)
	cases := []struct {
		name, text string
		want       []string
	}{
		{"a pattern match is a finding of its type", "ask E-123456 about it", []string{"EMPLOYEE_ID:E-123456"}},
		{"a value group narrows the finding to it", "my Badge #00451 expired", []string{"EMPLOYEE_ID:00451"}},
		{"a pattern is matched on the normalised view", "ask Е-１２３４５６ now", []string{"EMPLOYEE_ID:Е-１２３４５６"}},
		{"a dictionary word is found in any case", "the FALCON launch and falcon again", []string{"PROJECT:FALCON", "PROJECT:falcon"}},
		{"a dictionary word inside a longer word is not", "Falconry and falcons", nil},
		{"a phrase matches across any white space", "project blue\u00a0 heron is late", []string{"PROJECT:blue\u00a0 heron"}},
		{"the longest entry wins at one place", "Apollo 11 landed; Apollo 13 did not", []string{"PROJECT:Apollo 11", "PROJECT:Apollo"}},
		{"a longer entry cut by a word falls back to a shorter one", "Apollo 11x", []string{"PROJECT:Apollo"}},
		{"non-ASCII letters count as word characters", "xÜnità and Ünità", []string{"PROJECT:Ünità"}},
		{"a word behind a zero-width space is found", "Fal\u200bcon", []string{"PROJECT:Fal\u200bcon"}},
		{"a word in base64 is found as the encoded run", "see " + base64.StdEncoding.EncodeToString([]byte("code name Falcon")), []string{"PROJECT:" + base64.StdEncoding.EncodeToString([]byte("code name Falcon"))}},
		{"built-in types are still found beside custom ones", "E-123456 is mario@example.it", []string{"EMPLOYEE_ID:E-123456", "EMAIL:mario@example.it"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, f := range s.Scan(c.text) {
				got = append(got, f.Type+":"+c.text[f.Start:f.End])
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("Scan(%q)\n got %q\nwant %q", c.text, got, c.want)
			}
		})
	}
	if got, want := s.Types(), append(BuiltinTypes(), "EMPLOYEE_ID", "PROJECT"); !slices.Equal(got, want) {
		t.Errorf("Types() = %v, want %v", got, want)
	}
}

func TestUserDefinedTypesAreValidated(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		want string
	}{
		{"a lower-case name", Config{Patterns: map[string][]string{"Project": {"x"}}}, `custom type "Project" must be upper-case`},
		{"a name starting with a digit", Config{Dictionaries: map[string][]string{"1PROJECT": {"x"}}}, `custom type "1PROJECT" must start with an upper-case letter`},
		{"a name longer than 32 bytes", Config{Dictionaries: map[string][]string{strings.Repeat("A", 33): {"x"}}}, "1 to 32 characters"},
		{"a built-in name", Config{Patterns: map[string][]string{"IBAN": {"x"}}}, `custom type "IBAN" is a built-in type`},
		{"a regex that does not compile", Config{Patterns: map[string][]string{"CODE": {"(x"}}}, "pattern for CODE: error parsing regexp: missing closing )"},
		{"a regex matching the empty string", Config{Patterns: map[string][]string{"CODE": {"x?"}}}, `pattern "x?" for CODE matches the empty string`},
		{"an empty word", Config{Dictionaries: map[string][]string{"PROJECT": {"Falcon", " "}}}, "dictionary for PROJECT holds an empty word"},
		{"a type with nothing to find", Config{Patterns: map[string][]string{"CODE": nil}}, "custom type CODE has no pattern and no word"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewScanner(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("NewScanner error = %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestUserDefinedTypesAreRedactedAndRestored(t *testing.T) {
	s := customScanner(t)
	text := "Falcon status for E-123456: ask E-123456 before the [PROJECT_1] review"
	v := NewVault()
	red := v.Redact(text, s.Scan(text), map[string]bool{"PROJECT": true, "EMPLOYEE_ID": true})
	if want := "[PROJECT_2] status for [EMPLOYEE_ID_1]: ask [EMPLOYEE_ID_1] before the [PROJECT_1] review"; red != want {
		t.Fatalf("Redact = %q, want %q", red, want)
	}
	if got := v.Restore(red); got != text {
		t.Fatalf("Restore = %q, want %q", got, text)
	}
}

func TestReplacedCountsValuesInEveryMode(t *testing.T) {
	s := mustScanner(t)
	text := "a@example.com, a@example.com, b@example.com, 4111 1111 1111 1111 and +39 333 123 4567"
	v := NewVault(WithMode(TypeEmail, ModeHash), WithMode(TypeCreditCard, ModeMask))
	v.Redact(text, s.Scan(text), allTypes)
	if v.Len() != 1 || v.Replaced() != 4 {
		t.Fatalf("Len %d Replaced %d; want 1 placeholder (the phone) and 4 distinct values replaced", v.Len(), v.Replaced())
	}
}
