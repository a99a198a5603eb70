package redaction

import "testing"

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
