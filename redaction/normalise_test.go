package redaction

import (
	"testing"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// TestPlainRunesAreKeptAsTheyAre checks the fast path of normaliseInto
// against Unicode's own tables: every BMP rune it keeps unchanged is its
// own NFKC form, is no format character, mark, space or decimal digit,
// and the view of a text of it is the text itself.
func TestPlainRunesAreKeptAsTheyAre(t *testing.T) {
	kept := 0
	for r := rune(0x80); r < 0x10000; r++ {
		if !plainRune(r) {
			continue
		}
		kept++
		s := string(r)
		if norm.NFKC.String(s) != s || unicode.In(r, unicode.Cf, unicode.Mn, unicode.Me, unicode.Nd) || unicode.IsSpace(r) {
			t.Fatalf("U+%04X is kept as it is, but Unicode changes or hides it", r)
		}
		if v, ok := normalise("a" + s + "b"); ok && v.text != "a"+s+"b" {
			t.Fatalf("U+%04X: the view of a%sb is %q", r, s, v.text)
		}
	}
	// CJK ideographs, kana and Hangul syllables are the bulk of them.
	for _, r := range []rune{'中', '文', 'か', 'カ', '한', 'Ж', 'λ'} {
		if !plainRune(r) {
			t.Errorf("%c (U+%04X) takes the slow path", r, r)
		}
	}
	if kept < 40000 {
		t.Errorf("only %d BMP runes are kept as they are", kept)
	}
}
