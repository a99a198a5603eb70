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
