package redaction

import (
	"math/rand/v2"
	"testing"
)

// TestWrapGapJoinsLiteralsNotSentences checks where a line may continue a
// wrapped key: after a backslash, after a string literal closed and
// concatenated with + or . (JavaScript, Java, Go, PHP, Perl), or with
// nothing after the token; never after a sentence's full stop or a bare
// operator, which are prose and expressions.
func TestWrapGapJoinsLiteralsNotSentences(t *testing.T) {
	cases := []struct {
		text string
		e    int // end of the first line's token
		want int // start of the next line's token, or -1
	}{
		{"ghp_0123\n  ABCD", 8, 11},
		{"ghp_0123\\\nABCD", 8, 10},
		{"\"ghp_0123\" +\n  \"ABCD\"", 9, 16},
		{"'ghp_0123' .\n'ABCD'", 9, 14},
		{"\"ghp_0123\"\n  + \"ABCD\"", 9, 16},
		{"supporta gli adattatori.\n2024-03-15T10:30", 23, -1},
		{"total = base +\nextra", 12, -1},
		{"ghp_0123\n  + ABCD", 8, -1},
	}
	for _, c := range cases {
		if got := wrapGap(c.text, c.e); got != c.want {
			t.Errorf("wrapGap(%q, %d) = %d, want %d", c.text, c.e, got, c.want)
		}
	}
}

// TestJoinedPiecesAreTheirOwnView: a joined text as detectWrapped builds
// it (a keyword context plainView accepts, then pieces of base64 bytes of
// either alphabet, dots between them and up to two '=' at a piece's end,
// and a closing quote) is left as it is by normaliseInto, with and
// without a context, so scanning it with plain set finds what a scan that
// builds the view finds. The oracle is normaliseInto itself.
func TestJoinedPiecesAreTheirOwnView(t *testing.T) {
	const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_"
	rng := rand.New(rand.NewPCG(7, 8))
	contexts := []string{"", "token = ", `"key": "`, "export GITHUB_TOKEN=", "aws_secret_access_key: ", "x"}
	tested := 0
	for range 20000 {
		ctx := contexts[rng.IntN(len(contexts))]
		if !plainView(ctx) {
			continue
		}
		b := []byte(ctx)
		for range 1 + rng.IntN(6) {
			for range 1 + rng.IntN(80) {
				b = append(b, b64[rng.IntN(len(b64))])
				if rng.IntN(30) == 0 {
					b = append(b, '.')
					b = append(b, b64[rng.IntN(len(b64))])
				}
			}
			for range rng.IntN(3) {
				b = append(b, '=')
			}
		}
		if rng.IntN(2) == 0 {
			b = append(b, "\"'`"[rng.IntN(3)])
		}
		if _, ok := normalise(string(b)); ok {
			t.Fatalf("normaliseInto changes the joined text %q", b)
		}
		tested++
	}
	if tested == 0 {
		t.Fatal("no context passed plainView")
	}
	for _, c := range []string{"é", "%40", "&amp;", `\u0040`, "a=\n"} {
		if plainView(c) {
			t.Errorf("plainView(%q) = true, want false", c)
		}
	}
}
