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

// TestEscapeFloodsCostNoAllocationPerEscape scans floods of each escape
// that decodes to one rune (quoted-printable, JSON \u, HTML references,
// to ASCII and to a homoglyph mapped to ASCII) at two lengths: the longer
// holds ten times the escapes, and may allocate only a few more times
// (buffers growing), not once per escape. The decoded view must still
// read the escapes (the e-mail address they spell is found).
func TestEscapeFloodsCostNoAllocationPerEscape(t *testing.T) {
	sc := mustScanner(t)
	for _, c := range []struct{ name, unit, addr string }{
		{"qp-equals", "width=40 height=3D ", "mario=40example.it"},
		{"json-u", `x\u0041y `, `mario\u0040example.it`},
		{"html-ref", "x&#65;y ", "mario&#64;example.it"},
		{"fullwidth-ref", "x&#xFF21;y ", "mario&#xFF20;example.it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			allocs := func(units int) float64 {
				text := "Content-Transfer-Encoding: quoted-printable\n" + strings.Repeat(c.unit, units) + " " + c.addr + " end"
				at := strings.Index(text, c.addr)
				if fs := sc.Scan(text); !covered(fs, at, at+len(c.addr)) {
					t.Fatalf("the address the escapes spell, %q, is not found: %v", c.addr, fs)
				}
				return testing.AllocsPerRun(5, func() { sc.Scan(text) })
			}
			small, large := allocs(500), allocs(5000)
			if large > small+20 {
				t.Errorf("%d allocations for 500 escapes, %d for 5,000", int(small), int(large))
			}
		})
	}
}

// TestFullwidthFormsAreTheirNFKC checks normRune's shortcut for the
// fullwidth forms of ASCII against Unicode's NFKC and the slow path.
func TestFullwidthFormsAreTheirNFKC(t *testing.T) {
	var buf []byte
	for r := rune(fullwidthFirst); r <= fullwidthLast; r++ {
		want := norm.NFKC.String(string(r))
		if mapRune(r) < 0 && !dropRune(r) && normRune(r, &buf) != mapString([]byte(want)) {
			t.Errorf("U+%04X: normRune %q, NFKC %q", r, normRune(r, &buf), want)
		}
		if len(want) != 1 || rune(want[0]) != r-fullwidthOffset {
			t.Errorf("U+%04X: NFKC %q is not %q", r, want, string(r-fullwidthOffset))
		}
	}
	if norm.NFKC.String(string(rune(fullwidthFirst-1))) == string(rune(fullwidthFirst-1-fullwidthOffset)) ||
		norm.NFKC.String(string(rune(fullwidthLast+1))) == string(rune(fullwidthLast+1-fullwidthOffset)) {
		t.Error("the fullwidth range is wider than fullwidthFirst..fullwidthLast")
	}
}
