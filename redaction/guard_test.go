package redaction

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestRedactJSONKeepsTheJSONValidAndRestoresExactly: a card written as a
// JSON number, an e-mail in a key and a value with an escape are
// redacted; the result must be valid JSON (encoding/json is the oracle)
// and RestoreJSON must give the input back byte for byte.
func TestRedactJSONKeepsTheJSONValidAndRestoresExactly(t *testing.T) {
	s, err := NewScanner(Config{Patterns: map[string][]string{"FLAG": {`\btrue\b`}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, raw := range []string{
		`{"card": 4111111111111111, "notify": true}`,
		`{"mario.rossi@example.it": {"ssn": 536221234}, "to": "anna\u0040example.org"}`,
		`[4111111111111111, "4111 1111 1111 1111", -1, null]`,
	} {
		fs := s.Scan(raw)
		if len(fs) == 0 {
			t.Fatalf("no findings in %s", raw)
		}
		v := NewVault()
		types := map[string]bool{TypeCreditCard: true, TypeEmail: true, TypeUSSSN: true, "FLAG": true}
		red := v.RedactJSON(raw, fs, types)
		if !json.Valid([]byte(red)) {
			t.Fatalf("RedactJSON(%s) = %s: not JSON", raw, red)
		}
		if strings.Contains(red, "4111111111111111") || strings.Contains(red, "536221234") {
			t.Fatalf("value left in %s", red)
		}
		back := string(v.RestoreJSON([]byte(red)))
		var a, b any
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(back), &b); err != nil {
			t.Fatalf("restored %s is not JSON: %v", back, err)
		}
		if ja, _ := json.Marshal(a); string(ja) != mustJSON(t, b) {
			t.Fatalf("restore changed the document:\n in  %s\n red %s\n out %s", raw, red, back)
		}
		if !strings.Contains(raw, `\u0040`) && back != raw {
			t.Fatalf("restore not byte-exact:\n in  %s\n out %s", raw, back)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestJSONStreamRestorerUnquotesLiteralPlaceholders: a quoted placeholder
// standing for a number comes back as the number under every chunking.
func TestJSONStreamRestorerUnquotesLiteralPlaceholders(t *testing.T) {
	s := mustScanner(t)
	raw := `{"card": 4111111111111111, "n": 2}`
	v := NewVault()
	red := v.RedactJSON(raw, s.Scan(raw), allTypes)
	if red != `{"card": "[CREDIT_CARD_1]", "n": 2}` {
		t.Fatalf("RedactJSON = %s", red)
	}
	for size := 1; size <= len(red); size++ {
		r := v.NewJSONStreamRestorer()
		var got strings.Builder
		for i := 0; i < len(red); i += size {
			got.WriteString(r.Write(red[i:min(i+size, len(red))]))
		}
		got.WriteString(r.Flush())
		if got.String() != raw {
			t.Fatalf("chunks of %d: %s, want %s", size, got.String(), raw)
		}
	}
	if got := v.Restore("card [CREDIT_CARD_1]"); got != "card 4111111111111111" {
		t.Fatalf("plain Restore = %q", got)
	}
}

func guardFixture(t *testing.T) *Guard {
	t.Helper()
	return mustScanner(t).NewGuard(GuardPolicy{
		Actions: map[string]GuardAction{TypeEmail: GuardMask, TypeCreditCard: GuardBlock, TypePhone: GuardMask},
		Default: GuardPass,
	}, "mario.rossi@example.it")
}

func TestGuardMasksBlocksAndLeavesRestoredValues(t *testing.T) {
	g := guardFixture(t)
	out, fs, err := g.Check("Write to mario.rossi@example.it or anna.verdi@example.org, call +39 347 123 4567; server 10.0.0.1.")
	if err != nil {
		t.Fatal(err)
	}
	if want := "Write to mario.rossi@example.it or [EMAIL], call [PHONE]; server 10.0.0.1."; out != want {
		t.Fatalf("Check = %q (findings %v)\nwant %q", out, fs, want)
	}
	_, _, err = g.Check("your card 4111 1111 1111 1111 is on file")
	var be *BlockedError
	if !errors.As(err, &be) || be.Type != TypeCreditCard || !errors.Is(err, ErrAnswerBlocked) {
		t.Fatalf("Check of a card = %v, want a CREDIT_CARD BlockedError", err)
	}
	if strings.Contains(err.Error(), "4111") {
		t.Fatalf("the error names the value: %v", err)
	}
}

// TestStreamGuardMatchesCheckUnderRandomChunking: whatever the chunking,
// the stream guard emits what Check returns for the whole answer, never
// splits a UTF-8 character and holds back a bounded tail.
func TestStreamGuardMatchesCheckUnderRandomChunking(t *testing.T) {
	g := guardFixture(t)
	para := "Ciao è già tutto pronto: scrivi a anna.verdi@example.org o a mario.rossi@example.it, oppure chiama il +39 347 123 4567. "
	answer := strings.Repeat(para, 12)
	want, _, err := g.Check(answer)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for round := 0; round < 30; round++ {
		sg := g.NewStream()
		var got strings.Builder
		for i := 0; i < len(answer); {
			n := 1 + r.IntN(40)
			out, err := sg.Write(answer[i:min(i+n, len(answer))])
			if err != nil {
				t.Fatal(err)
			}
			if !utf8.ValidString(out) {
				t.Fatalf("emitted invalid UTF-8 %q", out)
			}
			if sg.Pending() > GuardHoldBytes+len(para) {
				t.Fatalf("holding %d bytes", sg.Pending())
			}
			got.WriteString(out)
			i += n
		}
		out, err := sg.Flush()
		if err != nil {
			t.Fatal(err)
		}
		got.WriteString(out)
		if got.String() != want {
			t.Fatalf("round %d: stream differs from Check:\n got %q\nwant %q", round, got.String(), want)
		}
	}
}

func TestStreamGuardBlocksACardSplitAcrossChunks(t *testing.T) {
	g := guardFixture(t)
	sg := g.NewStream()
	text := strings.Repeat("nothing to see here. ", 40) + "the card is 4111 1111 " + "1111 1111, thanks. " + strings.Repeat("more text. ", 60)
	var emitted strings.Builder
	var err error
	for i := 0; i < len(text) && err == nil; i += 7 {
		var out string
		out, err = sg.Write(text[i:min(i+7, len(text))])
		emitted.WriteString(out)
	}
	if err == nil {
		_, err = sg.Flush()
	}
	if !errors.Is(err, ErrAnswerBlocked) {
		t.Fatalf("stream not blocked: %v", err)
	}
	if strings.Contains(emitted.String(), "4111") {
		t.Fatalf("part of the card left before the block: %q", emitted.String())
	}
}

func TestScanBoundedFailsClosed(t *testing.T) {
	s, err := NewScanner(Config{MaxScanBytes: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ScanBounded(strings.Repeat("a", 2<<10)); !errors.Is(err, ErrScanBudget) {
		t.Fatalf("2 KiB over a 1 KiB limit: %v, want ErrScanBudget", err)
	}
	s, err = NewScanner(Config{ScanTimeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ScanBounded(strings.Repeat("mario.rossi@example.it key=abcdefghijklmnop 4111 1111 1111 1111 ", 1<<12)); !errors.Is(err, ErrScanBudget) {
		t.Fatalf("a 1 ns budget: %v, want ErrScanBudget", err)
	}
	if fs, err := mustScanner(t).ScanBounded("mail mario.rossi@example.it"); err != nil || len(fs) != 1 {
		t.Fatalf("default budget: %v %v", fs, err)
	}
}

// TestRedactJSONRedactsTextThatIsNotJSON: tool-call arguments need not be
// JSON; a value in a bare word (outside every string literal) must still
// be replaced, as plain Redact would. The oracle is the values' own text.
func TestRedactJSONRedactsTextThatIsNotJSON(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]bool{TypeCreditCard: true, TypeEmail: true}
	for _, raw := range []string{
		`to: mario.rossi@example.com`,
		`{to: mario.rossi@example.com, "x": 1}`,
		`{"a": 1} mario.rossi@example.com`,
		`card 4111 1111 1111 1111 please`,
		`[4111111111111111,`,
	} {
		v := NewVault()
		red := v.RedactJSON(raw, s.Scan(raw), types)
		if strings.Contains(red, "mario.rossi@example.com") || strings.Contains(red, "4111") {
			t.Errorf("RedactJSON(%q) = %q: the value is left", raw, red)
		}
		if back := v.Restore(red); back != raw {
			t.Errorf("Restore(%q) = %q, want %q", red, back, raw)
		}
	}
}

// TestGuardLeavesASplitValueRestoredWhole: a value the client split across
// two messages is two restored values; the model writing both placeholders
// together gets the whole value back, which the guard does not flag. A
// value that only starts with a restored part is still flagged.
func TestGuardLeavesASplitValueRestoredWhole(t *testing.T) {
	g := mustScanner(t).NewGuard(GuardPolicy{Actions: map[string]GuardAction{TypeEmail: GuardMask, TypeCreditCard: GuardMask}, Default: GuardPass},
		"mario.rossi@exam", "ple.com", "4111 1111", "1111 1111")
	for _, tc := range []struct{ in, want string }{
		{"write to mario.rossi@example.com", "write to mario.rossi@example.com"},
		{"card 4111 1111 1111 1111 on file", "card 4111 1111 1111 1111 on file"},
		{"card 4111 11111111 1111 on file", "card 4111 11111111 1111 on file"},
		{"write to mario.rossi@example.org", "write to [EMAIL]"},
		{"write to anna@example.com", "write to [EMAIL]"},
	} {
		out, _, err := g.Check(tc.in)
		if err != nil || out != tc.want {
			t.Errorf("Check(%q) = %q, %v; want %q", tc.in, out, err, tc.want)
		}
	}
	// Streamed in chunks of every size, the same.
	for size := 1; size < 40; size++ {
		sg := g.NewStream()
		in := "write to mario.rossi@example.com today"
		var b strings.Builder
		for i := 0; i < len(in); i += size {
			out, err := sg.Write(in[i:min(i+size, len(in))])
			if err != nil {
				t.Fatal(err)
			}
			b.WriteString(out)
		}
		out, err := sg.Flush()
		if err != nil {
			t.Fatal(err)
		}
		if b.WriteString(out); b.String() != in {
			t.Fatalf("chunks of %d: %q", size, b.String())
		}
	}
}
