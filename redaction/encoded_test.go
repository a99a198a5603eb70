package redaction

import (
	"testing"
)

// mimeBody is base64 of a text holding an address and a phone number
// (encoded by hand with `base64`), wrapped at 40 columns as MIME and PEM
// wrap theirs.
const mimeBody = "V3JpdGUgdG8gbWFyaW8ucm9zc2lAZXhhbXBsZS5p\n" +
	"dCBvciBjYWxsICszOSAzMzMgMTIzIDQ1NjcgYWJv\n" +
	"dXQgdGhlIGludm9pY2UsIHRoYW5rcyBhIGxvdA=="

// harmlessBody is base64 of "nothing to see here, just a harmless
// sentence that is long enough to wrap over lines", wrapped at 40 columns.
const harmlessBody = "bm90aGluZyB0byBzZWUgaGVyZSwganVzdCBhIGhh\n" +
	"cm1sZXNzIHNlbnRlbmNlIHRoYXQgaXMgbG9uZyBl\n" +
	"bm91Z2ggdG8gd3JhcCBvdmVyIGxpbmVz"

// TestWrappedBase64Blocks: a base64 body wrapped over lines is decoded
// whole and found as one finding of the value inside it (the address: of
// an address and a phone number, the type first in BuiltinTypes); a key
// wrapped over lines next to it is still found, and so is one after a
// body that holds nothing.
func TestWrappedBase64Blocks(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a wrapped body hiding an address is found whole", "", "body:\n" + mimeBody + "\n", []string{"EMAIL:" + mimeBody}},
		{"a wrapped body with CRLF line breaks", "", "body:\r\n" + crlf(mimeBody) + "\r\n", []string{"EMAIL:" + crlf(mimeBody)}},
		{"a wrapped body of harmless text is no finding", "", "body:\n" + harmlessBody + "\n", nil},
		{"a wrapped key after a body hiding an address", "", "body:\n" + mimeBody + "\n\ntoken: ghp_0123456789abcdefghij\n  ABCDEFGHIJ012345 end",
			[]string{"EMAIL:" + mimeBody, "SECRET/github:ghp_0123456789abcdefghij\n  ABCDEFGHIJ012345"}},
		{"a wrapped key after a harmless body", "", harmlessBody + "\n\ntoken: ghp_0123456789abcdefghij\n  ABCDEFGHIJ012345 end",
			[]string{"SECRET/github:ghp_0123456789abcdefghij\n  ABCDEFGHIJ012345"}},
		{"a key wrapped at 40 columns, lines of one length", "", "key: ghp_0123456789abcdefghijABCDEFGHIJ012345\n6789abcdefghijABCDEFGHIJ0123456789abcdef\nthanks, bye",
			[]string{"SECRET/github:ghp_0123456789abcdefghijABCDEFGHIJ012345\n6789abcdefghijABCDEFGHIJ0123456789abcdef"}},
	})
}

func crlf(s string) string {
	out := ""
	for _, c := range s {
		if c == '\n' {
			out += "\r"
		}
		out += string(c)
	}
	return out
}

// TestCoveredBy checks coveredBy on spans written out by hand: a range
// is covered when it lies inside a span and is not all of it.
func TestCoveredBy(t *testing.T) {
	spans := [][2]int{{0, 10}, {5, 50}, {60, 70}}
	cases := []struct {
		s, e int
		want bool
	}{
		{0, 9, true},    // inside the first
		{0, 10, false},  // all of the first (the second starts later)
		{6, 40, true},   // inside the second
		{5, 50, false},  // all of the second
		{45, 55, false}, // across the end of the second
		{55, 58, false}, // between spans
		{61, 70, true},  // inside the third
		{65, 80, false}, // past the end of the third
	}
	from := 0
	for _, c := range cases {
		if got := coveredBy(spans, &from, c.s, c.e); got != c.want {
			t.Errorf("coveredBy(%v, [%d, %d)) = %v, want %v", spans, c.s, c.e, got, c.want)
		}
	}
}
