package redaction

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestScanAcrossFindsValuesSplitBetweenSegments(t *testing.T) {
	s := mustScanner(t)
	cases := []struct {
		name     string
		segments []string
		want     []string // "segment:TYPE:part", in order
	}{
		{"card digits split between groups over two messages",
			[]string{"my card is 4111 1111", "1111 1111, thanks"},
			[]string{"0:CREDIT_CARD:4111 1111", "1:CREDIT_CARD:1111 1111"}},
		{"card digits split inside a group",
			[]string{"carta 41111111111", "11111 grazie"},
			[]string{"0:CREDIT_CARD:41111111111", "1:CREDIT_CARD:11111"}},
		{"an e-mail address cut after the at sign",
			[]string{"write to mario.rossi@", "example.it please"},
			[]string{"0:EMAIL:mario.rossi@", "1:EMAIL:example.it"}},
		{"an e-mail address split across two tool arguments",
			[]string{"mario.rossi", "@example.it"},
			[]string{"0:EMAIL:mario.rossi", "1:EMAIL:@example.it"}},
		{"a card spread over four messages",
			[]string{"4111", "1111", "1111", "1111"},
			[]string{"0:CREDIT_CARD:4111", "1:CREDIT_CARD:1111", "2:CREDIT_CARD:1111", "3:CREDIT_CARD:1111"}},
		{"an IBAN cut in two with fullwidth digits",
			[]string{"IBAN IT60 X054 2811 １０１０", "0000 0123 456 ok"},
			[]string{"0:IBAN:IT60 X054 2811 １０１０", "1:IBAN:0000 0123 456"}},
		{"an API key cut in the middle",
			[]string{"key sk-proj-Zx8kQ2mP9vLr4T", "fW7yBn3HcJ5dGs1aE6 ok"},
			[]string{"0:SECRET:sk-proj-Zx8kQ2mP9vLr4T", "1:SECRET:fW7yBn3HcJ5dGs1aE6"}},
		{"a whole address glued to the next message is not a split value",
			[]string{"reply to alice@example.com", "cc bob"},
			nil},
		{"a whole card followed by a number is not a split value",
			[]string{"card 4111111111111111", "2024 was the year"},
			nil},
		{"numbers that only look like a card when joined are not one",
			[]string{"order 2024", "1234 shipped"},
			nil},
		{"a single segment has nothing across",
			[]string{"mario@example.it"},
			nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, f := range s.ScanAcross(c.segments) {
				got = append(got, fmt.Sprintf("%d:%s:%s", f.Segment, f.Type, c.segments[f.Segment][f.Start:f.End]))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("ScanAcross(%q)\n got %q\nwant %q", c.segments, got, c.want)
			}
		})
	}
}

func TestScanAcrossNumbersValuesInOrder(t *testing.T) {
	s := mustScanner(t)
	segs := []string{"a@exa", "mple.it and 4111 1111", "1111 1111 and b@", "example.org"}
	var got []string
	for _, f := range s.ScanAcross(segs) {
		got = append(got, fmt.Sprintf("%d/%d:%s", f.Value, f.Segment, segs[f.Segment][f.Start:f.End]))
	}
	want := []string{"0/0:a@exa", "0/1:mple.it", "1/1:4111 1111", "1/2:1111 1111", "2/2:b@", "2/3:example.org"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// splitLabel is a planted value cut into parts: parts[i] is a byte span in
// segment seg[i].
type splitLabel struct {
	typ   string
	seg   []int
	start []int
	end   []int
}

// splitPrompt plants one value of a random type and cuts it into two or
// three consecutive segments (chat messages or tool arguments), with a
// near-miss or a whole value around it now and then; or, one time in four,
// plants whole values and near-misses at segment edges and no split value
// (where every finding is a false positive).
func (g *corpusGen) splitPrompt() ([]string, []splitLabel) {
	lead := g.pick("Please use ", "Ecco: ", "the value is ", "", "Per favore usa ")
	tail := g.pick(" thanks.", ", grazie.", " ok?", "", ". Fammi sapere.")
	if g.r.IntN(4) == 0 {
		// Controls: whole values and near-misses that touch the boundary.
		a := g.pick(g.email(), g.card(true), g.nearMiss(), g.iban(true), g.phone(), "version 2024")
		b := g.pick("cc bob", "2024 was fine", g.nearMiss(), "Order 1234 shipped", "thanks")
		if g.r.IntN(2) == 0 {
			return []string{lead + a, b + tail}, nil
		}
		return []string{g.pick("my email is", "scrivi a", "il mio numero è", "card"), a + tail}, nil
	}
	types := []string{TypeEmail, TypePhone, TypeCreditCard, TypeIBAN, TypeUSSSN, TypeITFiscalCode, TypeIPAddress, TypeSecret}
	typ := types[g.r.IntN(len(types))]
	var v string
	switch typ {
	case TypeEmail:
		v = g.email()
	case TypePhone:
		v = g.phone()
	case TypeCreditCard:
		v = g.card(true)
	case TypeIBAN:
		v = g.iban(true)
	case TypeUSSSN:
		v = g.ssn(true)
	case TypeITFiscalCode:
		v = g.fiscalCode(true)
	case TypeIPAddress:
		v = g.ip()
	default:
		v = g.secret()
	}
	// Cut points at rune boundaries, never leaving an empty part.
	n := 1 + g.r.IntN(2)
	var cuts []int
	for len(cuts) < n {
		k := 1 + g.r.IntN(len(v)-1)
		if utf8.RuneStart(v[k]) && !slices.Contains(cuts, k) {
			cuts = append(cuts, k)
		}
	}
	sort.Ints(cuts)
	cuts = append([]int{0}, append(cuts, len(v))...)
	var segs []string
	l := splitLabel{typ: typ}
	for i := 0; i+1 < len(cuts); i++ {
		part := v[cuts[i]:cuts[i+1]]
		// A cut next to a space drops it, as people do when they paste
		// a number in pieces.
		part = strings.Trim(part, " ")
		if part == "" {
			continue
		}
		seg := ""
		if i == 0 {
			seg = lead
		}
		l.seg = append(l.seg, len(segs))
		l.start = append(l.start, len(seg))
		l.end = append(l.end, len(seg)+len(part))
		seg += part
		if i+2 == len(cuts) {
			seg += tail
		}
		segs = append(segs, seg)
	}
	if len(segs) < 2 {
		return segs, nil
	}
	return segs, []splitLabel{l}
}

// TestCorpusSplitAcrossSegments measures ScanAcross on values cut across
// two or three consecutive messages or tool arguments: per type, recall
// (the planted value's parts all covered by one found value of its type)
// and precision (found values that are planted ones). It fails below
// recall 0.97 and precision 0.97, except EMAIL precision, bounded at 0.75:
// the controls include a message ending in a word followed by one that is
// an address ("my email is" + "anna@example.it"), which ScanAcross
// redacts as one value on purpose (see glued in ScanAcross). Recall misses
// are a whole value followed by a fragment that is a plain word
// ("...@example.or" + "g"): only that fragment stays visible. The table is
// printed with -v.
func TestCorpusSplitAcrossSegments(t *testing.T) {
	s := mustScanner(t)
	g := &corpusGen{r: rand.New(rand.NewPCG(2026, 12))}
	type counts struct{ tp, fp, fn int }
	per := map[string]*counts{}
	var misses []string
	for n := 0; n < 2000; n++ {
		segs, labels := g.splitPrompt()
		found := s.ScanAcross(segs)
		byValue := map[int][]SegmentFinding{}
		for _, f := range found {
			byValue[f.Value] = append(byValue[f.Value], f)
		}
		used := map[int]bool{}
		for _, l := range labels {
			if per[l.typ] == nil {
				per[l.typ] = &counts{}
			}
			hit := false
			for id, parts := range byValue {
				if used[id] || parts[0].Type != l.typ {
					continue
				}
				covers := true
				for i := range l.seg {
					ok := false
					for _, p := range parts {
						ok = ok || p.Segment == l.seg[i] && p.Start <= l.start[i] && p.End >= l.end[i]
					}
					covers = covers && ok
				}
				if covers {
					used[id], hit = true, true
					break
				}
			}
			if hit {
				per[l.typ].tp++
			} else {
				per[l.typ].fn++
				if len(misses) < 20 {
					misses = append(misses, fmt.Sprintf("missed %s in %q", l.typ, segs))
				}
			}
		}
		for id, parts := range byValue {
			if used[id] {
				continue
			}
			if per[parts[0].Type] == nil {
				per[parts[0].Type] = &counts{}
			}
			per[parts[0].Type].fp++
			if len(misses) < 20 {
				misses = append(misses, fmt.Sprintf("false %s in %q", parts[0].Type, segs))
			}
		}
	}
	var types []string
	for typ := range per {
		types = append(types, typ)
	}
	sort.Strings(types)
	var table strings.Builder
	fmt.Fprintf(&table, "%-16s %6s %6s %6s %9s %7s\n", "type (split)", "tp", "fp", "fn", "precision", "recall")
	fail := false
	for _, typ := range types {
		c := per[typ]
		p, r := ratio(c.tp, c.tp+c.fp), ratio(c.tp, c.tp+c.fn)
		fmt.Fprintf(&table, "%-16s %6d %6d %6d %9.4f %7.4f\n", typ, c.tp, c.fp, c.fn, p, r)
		minP := 0.97
		if typ == TypeEmail {
			minP = 0.75
		}
		if p < minP || r < 0.97 || c.tp == 0 {
			fail = true
		}
	}
	t.Logf("\n%s", table.String())
	if fail {
		t.Errorf("precision/recall below the bounds:\n%s\n%s", table.String(), strings.Join(misses, "\n"))
	}
}
