// Package adversarial holds the adversarial input shapes of the detector
// benchmarks, one list for redaction's BenchmarkScan and
// BenchmarkScanGateway and for the gateway table's detect.adversarial.<name>
// rows (cmd/molly/bench_test.go, `make bench`, docs/benchmarks.md): each
// shape is a unit repeated to the benchmark's size.
package adversarial

import (
	"encoding/base64"
	"math/rand/v2"
	"strings"
)

// Shape is one adversarial input: Name (used in benchmark and metric
// names: no white space) and Unit, the text repeated (and cut) to size.
type Shape struct{ Name, Unit string }

// Shapes are inputs built to make detectors work hard: keyword and
// assignment floods, key=key=…, unterminated PEM headers, long digit runs
// and spaced digits, '@' floods, placeholder-like brackets, nested
// encodings, random base64.
var Shapes = []Shape{
	{"key=key", "key="},
	{"assignment-flood", `api_key = "`},
	{"pem-headers", "-----BEGIN RSA PRIVATE KEY-----\n"},
	{"digit-run", "4111"},
	{"digit-groups", "4111 "},
	{"spaced-digits", "4 1 "},
	{"fullwidth-digits", "１"},
	{"at-signs", "a@"},
	{"written-at", "mario at example dot "},
	{"brackets", "[EMAIL_"},
	{"base64-text", "bWFyaW8ucm9zc2lAZXhhbXBsZS5pdCBhbmQgbW9yZSB0ZXh0IA"},
	{"nested-base64", base64.StdEncoding.EncodeToString([]byte(base64.StdEncoding.EncodeToString([]byte("mario.rossi@example.it and more text, ")))) + " "},
	{"capitalised", "Dear Mr. Maria Rossi "},
	// Shapes of the wrapped-key, quoted-printable, spaced-dot, grouped
	// fiscal code, grouped key and CJK boundary readers: MIME/PEM base64 bodies (every
	// line ends in a key-like run), "=40" in code, spaced dots, short
	// digit groups between capitals, digits glued to CJK text.
	{"wrapped-base64", "TWFyaW8gUm9zc2kgbGl2ZXMgaW4gUm9tZSBhbmQgd29ya3MgYXQgdGhlIGJhbmsgb2YgSXRhbHkg\n"},
	{"qp-equals", "width=40 height=3D "},
	{"spaced-dots", "a . b @ c . "},
	{"fiscal-groups", "RSS MRA 80A "},
	{"cjk-digits", "卡号41 "},
	// Grouped AWS key ids (every prefix starts a read of four groups that
	// fails at the last) and grouped omocodic fiscal codes (a one-digit
	// year followed by omocodic letters).
	{"aws-groups", "AKIA IOSF ODNN 7EXA "},
	{"fiscal-omocodic", "RSS MRA 8LALM "},
	// Addresses glued by a dropped invisible character (every '@' tests
	// the dropped characters' offsets after it).
	{"dropped-chars", "ab@example.it\u200b"},
	// A pasted binary attachment: base64 of pseudo-random bytes wrapped
	// at 76 columns as MIME writes it, where every rule keyword of four
	// letters or fewer turns up by chance ("pwd", "xoxs", "eaam").
	{"random-base64", randomBase64(256 << 10)},
}

// randomBase64 returns n bytes of MIME-wrapped base64 (RFC 2045 §6.8:
// lines of 76 characters ending in "\n") of bytes from a fixed-seed PCG,
// the same on every run.
func randomBase64(n int) string {
	r := rand.New(rand.NewPCG(2045, 76))
	raw := make([]byte, n)
	for i := range raw {
		raw[i] = byte(r.Uint32())
	}
	enc := base64.StdEncoding.EncodeToString(raw)
	var b strings.Builder
	for i := 0; b.Len() < n; i += 76 {
		b.WriteString(enc[i : i+76])
		b.WriteByte('\n')
	}
	return b.String()[:n]
}
