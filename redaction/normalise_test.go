package redaction

import (
	"math/rand/v2"
	"strings"
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

// TestSpanFromMatchesMarks checks the cursor of spanFrom against the
// definition of the view's map (the last mark at or before a view byte,
// found by reading every mark) on views with many marks (dropped,
// widened and narrowed characters), for ranges asked in increasing order
// (as detectors find them), with jumps ahead and back.
func TestSpanFromMatchesMarks(t *testing.T) {
	origOf := func(v view, i int) (int, int) {
		k := -1
		for j, m := range v.marks {
			if int(m.v) <= i {
				k = j
			}
		}
		if k < 0 {
			return i, i + 1
		}
		m := v.marks[k]
		if i < int(m.ve) {
			return int(m.o), int(m.oe)
		}
		o := int(m.oe) + i - int(m.ve)
		return o, o + 1
	}
	r := rand.New(rand.NewPCG(3, 5))
	pieces := []string{"a", "bc", "\u200b", "１", "ｆｕｌｌ", "%40", "&amp;", "é", "e\u0301", " ", "\x00", strings.Repeat("x", 40)}
	for range 200 {
		var b strings.Builder
		for b.Len() < 600 {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		v, ok := normalise(b.String())
		if !ok || len(v.marks) == 0 {
			continue
		}
		k := -1
		for s := 0; s < len(v.text); {
			e := s + 1 + r.IntN(min(20, len(v.text)-s))
			gs, ge := v.spanFrom(s, e, &k)
			ws, _ := origOf(v, s)
			_, we := origOf(v, e-1)
			if gs != ws || ge != we {
				t.Fatalf("view range [%d,%d) of %q: got [%d,%d), want [%d,%d)", s, e, b.String(), gs, ge, ws, we)
			}
			s += r.IntN(30) - 5 // mostly ahead, at times back
			s = max(s, 0)
		}
	}
}
