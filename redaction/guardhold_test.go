package redaction

import (
	"encoding/hex"
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
