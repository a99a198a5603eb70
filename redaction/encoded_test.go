package redaction

import (
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
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

// printableRef is printableText's definition: valid UTF-8 of which at
// least 95% of the runes are printable or white space.
func printableRef(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	n, bad := 0, 0
	for _, r := range string(b) {
		n++
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			bad++
		}
	}
	return bad*20 <= n
}

// TestPrintableTextMatchesDefinition checks printableText against its
// definition on texts of printable ASCII with a few other bytes (control
// bytes, DEL, invalid and valid UTF-8) at every offset.
func TestPrintableTextMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	odd := []string{"\x00", "\x1f", "\x7f", "\n", "\t", "\x80", "\xc3", "é", "\u200b", "\U0001F600", "\xff", "~", " "}
	for range 20000 {
		var b []byte
		for n := rng.IntN(40); len(b) < n; {
			if rng.IntN(8) == 0 {
				b = append(b, odd[rng.IntN(len(odd))]...)
			} else {
				b = append(b, byte(' '+rng.IntN(95)))
			}
		}
		if got, want := printableText(b), printableRef(b); got != want {
			t.Fatalf("printableText(%q) = %v, want %v", b, got, want)
		}
	}
}

// TestB64ValueMatchesEncodingBase64 checks decodeRun's table of base64
// values against the alphabets of RFC 4648 (Table 1 and Table 2), and the
// first byte it computes from two characters against encoding/base64's
// decoding of "XY==", for every pair of characters of one alphabet.
func TestB64ValueMatchesEncodingBase64(t *testing.T) {
	const std = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	const url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for c := range 256 {
		want := byte(0xff)
		if i := strings.IndexByte(std, byte(c)); i >= 0 {
			want = byte(i)
		} else if i := strings.IndexByte(url, byte(c)); i >= 0 {
			want = byte(i)
		}
		if b64Value[c] != want {
			t.Errorf("b64Value[%q] = %d, want %d", byte(c), b64Value[c], want)
		}
		if isB64Byte(byte(c)) != (want != 0xff) {
			t.Errorf("isB64Byte(%q) = %v", byte(c), isB64Byte(byte(c)))
		}
	}
	for _, alpha := range []struct {
		chars string
		enc   *base64.Encoding
	}{{std, base64.StdEncoding}, {url, base64.URLEncoding}} {
		for _, x := range []byte(alpha.chars) {
			for _, y := range []byte(alpha.chars) {
				var out [3]byte
				if _, err := alpha.enc.Decode(out[:], []byte{x, y, '=', '='}); err != nil {
					t.Fatal(err)
				}
				if got := b64Value[x]<<2 | b64Value[y]>>4; got != out[0] {
					t.Fatalf("%q: first byte %#x from the table, %#x from encoding/base64", []byte{x, y}, got, out[0])
				}
			}
		}
	}
}

// TestAppendBase64MatchesEncodingBase64 checks appendBase64 against
// encoding/base64's unpadded standard decoder on strings of base64
// characters of both alphabets (the URL-safe ones read as '+' and '/'), of
// every length up to 40, with a byte outside both put in now and then.
func TestAppendBase64MatchesEncodingBase64(t *testing.T) {
	const chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
	rng := rand.New(rand.NewPCG(3, 4))
	for range 50000 {
		b := make([]byte, rng.IntN(41))
		for k := range b {
			b[k] = chars[rng.IntN(len(chars))]
			if rng.IntN(60) == 0 {
				b[k] = ".=@ \x00\xff"[rng.IntN(6)]
			}
		}
		want, err := base64.RawStdEncoding.DecodeString(strings.NewReplacer("-", "+", "_", "/").Replace(string(b)))
		got, ok := appendBase64([]byte("pre"), string(b))
		if ok != (err == nil) || ok && string(got) != "pre"+string(want) {
			t.Fatalf("appendBase64(%q) = %q, %v; encoding/base64: %q, %v", b, got, ok, want, err)
		}
	}
}

// TestDecodeRunTakesOneAlphabet: base64 of "mario.rossi@example.it?>"
// written in the standard alphabet (it ends in '+'), in the
// URL-safe one, and with one character of each, which no decoder of RFC
// 4648 reads.
func TestDecodeRunTakesOneAlphabet(t *testing.T) {
	const want = "mario.rossi@example.it?>"
	for _, c := range []struct {
		run string
		ok  bool
	}{
		{"bWFyaW8ucm9zc2lAZXhhbXBsZS5pdD8+", true},
		{"bWFyaW8ucm9zc2lAZXhhbXBsZS5pdD8-", true},
		{"bWFyaW8ucm9zc2lAZXhhbXBsZS5pdD8+" + "Pz8_", false},
	} {
		got, ok := decodeRun(nil, c.run)
		if ok != c.ok || ok && string(got) != want {
			t.Errorf("decodeRun(%q) = %q, %v; want %q, %v", c.run, got, ok, want, c.ok)
		}
	}
}

// TestWrappedBinaryBodyIsLinear: a MIME-style body of 512 KB of binary
// data (a pasted attachment: lines of one length that decode, but not to
// text) fits ScanBounded's work budget, which is linear in the text (it
// did not: each of its 7,000 lines started a block that read the rest of
// the body again), and holds no finding.
func TestWrappedBinaryBodyIsLinear(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	raw := make([]byte, 384<<10)
	for i := range raw {
		raw[i] = byte(rng.IntN(256))
	}
	enc := base64.StdEncoding.EncodeToString(raw)
	var sb strings.Builder
	for i := 0; i < len(enc); i += 76 {
		sb.WriteString(enc[i:min(i+76, len(enc))])
		sb.WriteString("\r\n")
	}
	fs, err := s.ScanBounded(sb.String())
	if err != nil {
		t.Fatalf("ScanBounded of a %d-byte binary body: %v", sb.Len(), err)
	}
	if len(fs) > 0 {
		t.Errorf("findings in random binary: %v", fs)
	}
}

// TestUTF8StartIsNecessary: wherever the decoded bytes of a base64 run
// read as text (printableText over encoding/base64's decoding, the
// oracle), utf8Start admits the run, for texts of every script cut at
// any byte (so a multi-byte character straddles the first six bytes) and
// for random bytes, in both alphabets; and it turns down most random
// bytes, which is what it is for.
func TestUTF8StartIsNecessary(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	texts := []string{
		"mario.rossi@example.it and more text, ",
		"Grüße aus München, straße ü ö ä ß — “quotes” … ",
		"卡号 4111 1111 1111 1111 订单号 2024-118734。バージョン 1.4.2 주문번호 ",
		"😀 emoji 🇮🇹 and \u200b zero width, tab\tnewline\n",
		"Ελληνικά κείμενο, русский текст, עברית, العربية ",
	}
	admitted, rejected := 0, 0
	check := func(raw []byte) {
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			s := enc.EncodeToString(raw)
			if len(raw) >= 6 && printableText(raw) {
				admitted++
				if !utf8Start(s) {
					t.Fatalf("utf8Start(%q) = false for the text %q", s, raw)
				}
			}
			if !utf8Start(s) {
				rejected++
			}
		}
	}
	for _, txt := range texts {
		for cut := range len(txt) {
			check([]byte(txt[cut:] + txt[:cut]))
		}
	}
	for range 20000 {
		raw := make([]byte, 6+rng.IntN(60))
		for i := range raw {
			raw[i] = byte(rng.Uint32())
		}
		check(raw)
	}
	if admitted == 0 || rejected < 20000 {
		t.Fatalf("%d texts admitted, %d runs turned down: the inputs do not test the condition", admitted, rejected)
	}
}
