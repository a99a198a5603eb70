package redaction

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// TestStreamGuardHoldsLongValuesWhole: values longer than GuardHoldBytes
// whose text holds white space (a key wrapped over many lines, an address
// written as spaced hex, an address written out with escapes and spaced
// dots) are masked whole in a stream, whatever the chunk size: the oracle
// is the value's own lines and byte groups, none of which may reach the
// output.
func TestStreamGuardHoldsLongValuesWhole(t *testing.T) {
	s := mustScanner(t)
	g := s.NewGuard(GuardPolicy{Default: GuardMask})
	// A JWT-shaped token of 700 bytes wrapped at 64 columns.
	tok := "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9." + "eyJ" + strings.Repeat("aBcD3fGh1JkLmN0pQrStUvWxYz", 24) + ".Sfl4KxwRJSMeKKF2QT4fwpMeJf36POk6yJVadQssw5c"
	var wrapped []string
	for i := 0; i < len(tok); i += 64 {
		wrapped = append(wrapped, tok[i:min(i+64, len(tok))])
	}
	var prefixed []string // the same token with its first line cut after "eyJ"
	for i := 3; i < len(tok); i += 64 {
		prefixed = append(prefixed, tok[i:min(i+64, len(tok))])
	}
	long := strings.Repeat("a", 60) + ".rossi@" + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 60) + ".example.com"
	var hx []string
	for _, c := range []byte(long) {
		hx = append(hx, hex.EncodeToString([]byte{c}))
	}
	var esc []string
	for _, c := range []byte("mario.rossi.bianchi.verdi.neri.gialli.bruni@posta.aziendale.esempio.example.com") {
		if c == '.' {
			esc = append(esc, " . ")
			continue
		}
		esc = append(esc, "&#"+strings.Repeat("0", 3)+itoa(int(c))+";")
	}
	cases := []struct {
		name, value string
		parts       []string // pieces of the value that must not be emitted
	}{
		{"a token wrapped over eleven lines", "token = " + strings.Join(wrapped, "\n        "), wrapped},
		{"a token wrapped after its first three bytes", "jwt: eyJ\n    " + strings.Join(prefixed, "\n    "), append([]string{"jwt: eyJ\n"}, prefixed...)},
		{"an address in spaced hex", strings.Join(hx, " "), splitEvery(strings.Join(hx, " "), 48)},
		{"an address in numeric references with spaced dots", strings.Join(esc, ""), esc[:len(esc)-1]},
	}
	for _, tc := range cases {
		text := strings.Repeat("Some words of an answer before the value. ", 20) + tc.value + "\nand more words after it, " + strings.Repeat("to fill a few more chunks. ", 30)
		if len(tc.value) <= GuardHoldBytes {
			t.Fatalf("%s: the value is %d bytes, not longer than the hold", tc.name, len(tc.value))
		}
		for _, size := range []int{1, 7, 64, 300, 1000} {
			sg := g.NewStream()
			var out strings.Builder
			for i := 0; i < len(text); i += size {
				o, err := sg.Write(text[i:min(i+size, len(text))])
				if err != nil {
					t.Fatalf("%s/%d: %v", tc.name, size, err)
				}
				out.WriteString(o)
			}
			o, err := sg.Flush()
			if err != nil {
				t.Fatalf("%s/%d: %v", tc.name, size, err)
			}
			out.WriteString(o)
			for _, p := range tc.parts {
				if len(p) >= 6 && strings.Contains(out.String(), p) {
					t.Errorf("%s, chunks of %d: %q of the value reached the output", tc.name, size, p)
					break
				}
			}
		}
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func splitEvery(s string, n int) []string {
	var out []string
	for i := 0; i < len(s); i += n {
		out = append(out, s[i:min(i+n, len(s))])
	}
	return out
}

// TestStreamGuardEmitsNoPartOfAKeyAtAnyCut: a stream cut at every byte
// position of a key (and one written a byte at a time) never emits any
// part of the key, "sk-" included, before the rest has come: under a mask
// policy everything emitted is a prefix of the answer with the key
// masked, under a block policy everything emitted before the block is a
// prefix of the text before the key. The oracle is the hand-written text
// around each key.
func TestStreamGuardEmitsNoPartOfAKeyAtAnyCut(t *testing.T) {
	s := mustScanner(t)
	mask := s.NewGuard(GuardPolicy{Actions: map[string]GuardAction{TypeSecret: GuardMask}})
	block := s.NewGuard(GuardPolicy{Actions: map[string]GuardAction{TypeSecret: GuardBlock}})
	pre := strings.Repeat("Here is the configuration you asked for. ", 16) + "export API_KEY="
	post := " and then restart the service. " + strings.Repeat("Nothing else needs to change. ", 20)
	for _, key := range []string{
		"sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6",
		"sk-ant-api03-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6",
		"AKIAIOSFODNN7EXAMPLE",
		"AKIA IOSF ODNN 7EXA MPLE",
		"ghp_0123456789abcdefghijABCDEFGHIJ012345",
		"xoxb-1234567890-abcdefghijKLMNOP",
		"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.Sfl4KxwRJSMeKKF2QT4fwpMeJf36POk6yJVadQssw5c",
	} {
		text := pre + key + post
		masked := pre + "[SECRET]" + post
		feed := func(g *Guard, chunks []string) (string, error) {
			sg := g.NewStream()
			var out strings.Builder
			for _, c := range chunks {
				o, err := sg.Write(c)
				out.WriteString(o)
				if err != nil {
					return out.String(), err
				}
				if g == mask && !strings.HasPrefix(masked, out.String()) {
					return out.String(), nil
				}
			}
			o, err := sg.Flush()
			out.WriteString(o)
			return out.String(), err
		}
		var bytewise []string
		for i := range len(text) {
			bytewise = append(bytewise, text[i:i+1])
		}
		cuts := [][]string{bytewise}
		for p := len(pre) - 2; p <= len(pre)+len(key)+1; p++ {
			cuts = append(cuts, []string{text[:p], text[p:]}, []string{text[:p-len(pre)+GuardHoldBytes/2], text[p-len(pre)+GuardHoldBytes/2 : p], text[p:]})
		}
		for _, chunks := range cuts {
			if out, err := feed(mask, chunks); err != nil || out != masked {
				t.Fatalf("key %.8s…, chunks of %d and %d bytes…: mask emitted %q (%v), want %q", key, len(chunks[0]), len(chunks[1]), out, err, masked)
			}
			out, err := feed(block, chunks)
			if !errors.Is(err, ErrAnswerBlocked) || !strings.HasPrefix(pre, out) {
				t.Fatalf("key %.8s…, chunks of %d and %d bytes…: block emitted %q before %v", key, len(chunks[0]), len(chunks[1]), out[max(0, len(out)-40):], err)
			}
		}
	}
}

// TestStreamGuardReadsEmittedTextAsWritten: a key whose rule needs the
// words before it ("token for 10.0.0.12: …", gitleaks' generic rule:
// a key word, up to 20 identifier bytes, an operator) is masked in a
// stream cut anywhere, also when those words hold a value masked in an
// earlier chunk: the context read again is the text as written, not the
// output, where "[IP_ADDRESS]" breaks the rule's shape. The oracle is the
// hand-written answer with both values masked.
func TestStreamGuardReadsEmittedTextAsWritten(t *testing.T) {
	g := mustScanner(t).NewGuard(GuardPolicy{Default: GuardMask})
	pre := strings.Repeat("Some words of an answer. ", 30)
	post := " " + strings.Repeat("More words after it. ", 30)
	for _, tc := range []struct{ value, masked string }{
		{"the api token for 10.0.0.12: Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6", "the api token for [IP_ADDRESS]: [SECRET]"},
		{"auth key for host 10.1.2.3 = Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6", "auth key for host [IP_ADDRESS] = [SECRET]"},
	} {
		text, want := pre+tc.value+post, pre+tc.masked+post
		for p := 1; p < len(text); p++ {
			sg := g.NewStream()
			a, err1 := sg.Write(text[:p])
			b, err2 := sg.Write(text[p:])
			c, err3 := sg.Flush()
			if got := a + b + c; got != want || err1 != nil || err2 != nil || err3 != nil {
				t.Fatalf("cut at %d: got %q (%v %v %v), want %q", p, got[len(pre)-10:], err1, err2, err3, want[len(pre)-10:])
			}
		}
	}
}
