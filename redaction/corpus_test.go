package redaction

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The labelled corpus lives in testdata/ and was made without the
// detectors (see testdata/README.md): its labels are the oracle.

// heldoutSHA256 pins testdata/corpus/heldout.jsonl, which is never looked
// at while tuning (only its aggregate scores are printed).
const heldoutSHA256 = "0fe7cb618c52c5542b5cbea2c4e1b8f52781a3862e6ef38e19f1ef22f6f98b7a"

// corpusLabel is one labelled value (or one part of a split value).
type corpusLabel struct {
	typ, evasion, group string
	seg, start, end     int
}

// corpusItem is one prompt (one segment) or one conversation (several).
type corpusItem struct {
	id       string
	segments []string
	labels   []corpusLabel
}

const markOpen, markClose = "⟦", "⟧"

// parseMarked strips ⟦TYPE:evasion|value⟧ markup from s and returns the
// plain text and the byte spans of the values.
func parseMarked(s string, seg int) (string, []corpusLabel, error) {
	var b strings.Builder
	var labels []corpusLabel
	for {
		i := strings.Index(s, markOpen)
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s = s[i+len(markOpen):]
		j := strings.Index(s, markClose)
		bar := strings.IndexByte(s, '|')
		colon := strings.IndexByte(s, ':')
		if j < 0 || bar < 0 || bar > j || colon < 0 || colon > bar {
			return "", nil, fmt.Errorf("bad markup near %q", s[:min(len(s), 40)])
		}
		l := corpusLabel{typ: s[:colon], evasion: s[colon+1 : bar], seg: seg}
		if k := strings.IndexByte(l.evasion, '#'); k >= 0 {
			l.evasion, l.group = l.evasion[:k], l.evasion[k+1:]
		}
		l.start = b.Len()
		b.WriteString(s[bar+1 : j])
		l.end = b.Len()
		labels = append(labels, l)
		s = s[j+len(markClose):]
	}
	return b.String(), labels, nil
}

func (it *corpusItem) addSegment(marked string) error {
	text, labels, err := parseMarked(marked, len(it.segments))
	if err != nil {
		return fmt.Errorf("%s: %w", it.id, err)
	}
	it.segments = append(it.segments, text)
	it.labels = append(it.labels, labels...)
	return nil
}

// loadJSONL reads a generated corpus file: one JSON object a line with
// "id" and either "text" or "segments".
func loadJSONL(t *testing.T, path string) []corpusItem {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var items []corpusItem
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct {
			ID       string   `json:"id"`
			Text     *string  `json:"text"`
			Segments []string `json:"segments"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		it := corpusItem{id: rec.ID}
		segs := rec.Segments
		if rec.Text != nil {
			segs = []string{*rec.Text}
		}
		for _, s := range segs {
			if err := it.addSegment(s); err != nil {
				t.Fatal(err)
			}
		}
		items = append(items, it)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return items
}

// loadHandwritten reads testdata/corpus/handwritten.txt (format in its
// header).
func loadHandwritten(t *testing.T, path string) []corpusItem {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var items []corpusItem
	var cur *corpusItem
	var segmented bool
	var buf []string
	flush := func() {
		if cur == nil {
			return
		}
		text := strings.Join(buf, "\n")
		var parts []string
		if segmented {
			parts = strings.Split(text, "\n--\n")
		} else {
			parts = []string{text}
		}
		for _, p := range parts {
			if err := cur.addSegment(p); err != nil {
				t.Fatal(err)
			}
		}
		items = append(items, *cur)
		cur, buf = nil, nil
	}
	for _, line := range strings.Split(strings.TrimRight(string(raw), "\n"), "\n") {
		if strings.HasPrefix(line, "== ") {
			flush()
			f := strings.Fields(line[3:])
			cur = &corpusItem{id: f[0]}
			segmented = len(f) > 2 && f[2] == "segments"
			continue
		}
		if cur == nil {
			continue // header comments
		}
		buf = append(buf, line)
	}
	flush()
	return items
}

// corpusScanner is the configuration the corpus is scored with: the
// gateway's defaults plus Italy as the home region for national phone
// formats and the US as a second one.
func corpusScanner(t testing.TB) *Scanner {
	s, err := NewScanner(Config{DefaultRegion: "IT", PhoneRegions: []string{"US"}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// scanItem returns the findings per segment as the gateway would: each
// segment scanned alone, plus ScanAcross's parts of split values, which
// replace the findings they overlap.
func scanItem(s *Scanner, it corpusItem) [][]Finding {
	out := make([][]Finding, len(it.segments))
	for i, seg := range it.segments {
		out[i] = s.Scan(seg)
	}
	if len(it.segments) > 1 {
		for _, sf := range s.ScanAcross(it.segments) {
			kept := out[sf.Segment][:0]
			for _, f := range out[sf.Segment] {
				if f.End <= sf.Start || f.Start >= sf.End {
					kept = append(kept, f)
				}
			}
			out[sf.Segment] = append(kept, sf.Finding)
		}
	}
	return out
}

type prCounts struct{ tp, fp, fn int }

func (c prCounts) precision() float64 { return ratio(c.tp, c.tp+c.fp) }
func (c prCounts) recall() float64    { return ratio(c.tp, c.tp+c.fn) }

// corpusScore is the outcome of one corpus part.
type corpusScore struct {
	all       prCounts
	perType   map[string]*prCounts
	perEv     map[string]*prCounts // recall per evasion class (fp unused)
	overreach int                  // matched findings that took in alphanumeric bytes outside the value
	misses    []string
}

func (sc *corpusScore) typ(t string) *prCounts {
	if sc.perType[t] == nil {
		sc.perType[t] = &prCounts{}
	}
	return sc.perType[t]
}

func (sc *corpusScore) ev(e string) *prCounts {
	if sc.perEv[e] == nil {
		sc.perEv[e] = &prCounts{}
	}
	return sc.perEv[e]
}

// score scans every item and matches findings to labels: a label (or every
// part of a split value) is found when a finding of its type covers all of
// its bytes; a finding is a false positive when it covers no label of its
// type, or when it covers one but also takes in letters or digits outside
// it (a placeholder swallowing "user=" or a URL path).
func score(s *Scanner, items []corpusItem) *corpusScore {
	sc := &corpusScore{perType: map[string]*prCounts{}, perEv: map[string]*prCounts{}}
	for _, it := range items {
		found := scanItem(s, it)
		used := make([][]bool, len(found))
		for i := range found {
			used[i] = make([]bool, len(found[i]))
		}
		covered := func(l corpusLabel) bool {
			for i, f := range found[l.seg] {
				if f.Type == l.typ && f.Start <= l.start && f.End >= l.end {
					used[l.seg][i] = true
					return true
				}
			}
			return false
		}
		// Group the parts of split values.
		groups := map[string][]corpusLabel{}
		var order []string
		for _, l := range it.labels {
			key := l.group
			if key == "" {
				key = fmt.Sprintf("@%d:%d", l.seg, l.start)
			}
			if _, ok := groups[key]; !ok {
				order = append(order, key)
			}
			groups[key] = append(groups[key], l)
		}
		for _, key := range order {
			ls := groups[key]
			ok := true
			for _, l := range ls {
				ok = covered(l) && ok
			}
			l := ls[0]
			if ok {
				sc.all.tp++
				sc.typ(l.typ).tp++
				sc.ev(l.evasion).tp++
			} else {
				sc.all.fn++
				sc.typ(l.typ).fn++
				sc.ev(l.evasion).fn++
				sc.misses = append(sc.misses, fmt.Sprintf("%s: missed %s/%s %q in %q", it.id, l.typ, l.evasion, it.segments[l.seg][l.start:l.end], it.segments[l.seg]))
			}
		}
		for segI, fs := range found {
			seg := it.segments[segI]
			for i, f := range fs {
				if !used[segI][i] {
					sc.all.fp++
					sc.typ(f.Type).fp++
					sc.misses = append(sc.misses, fmt.Sprintf("%s: false %s %q in %q", it.id, f.Type, seg[f.Start:f.End], seg))
					continue
				}
				// Bytes outside every label it covers.
				in := make([]bool, f.End-f.Start)
				for _, l := range it.labels {
					if l.seg == segI && l.typ == f.Type && l.start >= f.Start && l.end <= f.End {
						for k := l.start; k < l.end; k++ {
							in[k-f.Start] = true
						}
					}
				}
				for k, ok := range in {
					if !ok && isAlnum(seg[f.Start+k]) {
						sc.overreach++
						sc.all.fp++
						sc.typ(f.Type).fp++
						sc.misses = append(sc.misses, fmt.Sprintf("%s: %s overreaches: %q in %q", it.id, f.Type, seg[f.Start:f.End], seg))
						break
					}
				}
			}
		}
	}
	return sc
}

func (sc *corpusScore) table() string {
	var b strings.Builder
	types := make([]string, 0, len(sc.perType))
	for t := range sc.perType {
		types = append(types, t)
	}
	sort.Strings(types)
	fmt.Fprintf(&b, "%-16s %6s %5s %5s %9s %7s\n", "type", "tp", "fp", "fn", "precision", "recall")
	for _, t := range types {
		c := sc.perType[t]
		fmt.Fprintf(&b, "%-16s %6d %5d %5d %9.4f %7.4f\n", t, c.tp, c.fp, c.fn, c.precision(), c.recall())
	}
	fmt.Fprintf(&b, "%-16s %6d %5d %5d %9.4f %7.4f  (overreaching findings: %d)\n", "ALL", sc.all.tp, sc.all.fp, sc.all.fn, sc.all.precision(), sc.all.recall(), sc.overreach)
	evs := make([]string, 0, len(sc.perEv))
	for e := range sc.perEv {
		evs = append(evs, e)
	}
	sort.Strings(evs)
	fmt.Fprintf(&b, "%-16s %6s %5s %7s\n", "evasion", "found", "miss", "recall")
	for _, e := range evs {
		c := sc.perEv[e]
		fmt.Fprintf(&b, "%-16s %6d %5d %7.4f\n", e, c.tp, c.fn, c.recall())
	}
	return b.String()
}

// check fails t when the score is under the bar: recall 0.995
// and precision 0.98 overall, perType for each type (0.98 for the tuning
// part; the held-out part, never tuned on, is held to the overall bar and
// to 0.97 per type, and its per-type shortfalls against 0.98 are logged).
func (sc *corpusScore) check(t *testing.T, name string, showMisses bool, perType float64) {
	t.Helper()
	t.Logf("%s:\n%s", name, sc.table())
	if showMisses && testing.Verbose() {
		t.Logf("%s misses:\n%s", name, strings.Join(sc.misses, "\n"))
	}
	var bad []string
	if sc.all.recall() < 0.995 || sc.all.precision() < 0.98 {
		bad = append(bad, fmt.Sprintf("overall recall %.4f / precision %.4f", sc.all.recall(), sc.all.precision()))
	}
	for typ, c := range sc.perType {
		if c.recall() < perType || c.precision() < perType {
			bad = append(bad, fmt.Sprintf("%s recall %.4f / precision %.4f", typ, c.recall(), c.precision()))
		} else if c.recall() < 0.98 || c.precision() < 0.98 {
			t.Logf("%s: %s under 0.98: recall %.4f / precision %.4f", name, typ, c.recall(), c.precision())
		}
	}
	if len(bad) == 0 {
		return
	}
	sort.Strings(bad)
	msg := fmt.Sprintf("%s under the bar (recall 0.995 / precision 0.98 overall, 0.98 per type): %s", name, strings.Join(bad, "; "))
	if showMisses {
		n := min(len(sc.misses), 60)
		msg += "\n" + strings.Join(sc.misses[:n], "\n")
	} else {
		msg += " (held-out: individual misses are not printed, see testdata/README.md)"
	}
	t.Error(msg)
}

// TestCorpusRecallAndPrecision scores the detectors on the hand-written
// and generated tuning corpus, printing every miss, and on the held-out
// part, printing only the aggregates.
func TestCorpusRecallAndPrecision(t *testing.T) {
	s := corpusScanner(t)
	dir := filepath.Join("testdata", "corpus")
	tuning := append(loadHandwritten(t, filepath.Join(dir, "handwritten.txt")), loadJSONL(t, filepath.Join(dir, "tuning.jsonl"))...)
	if len(tuning) < 1000 {
		t.Fatalf("tuning corpus has %d items, want ≥ 1000", len(tuning))
	}
	score(s, tuning).check(t, "tuning (hand-written + generated)", true, 0.98)

	raw, err := os.ReadFile(filepath.Join(dir, "heldout.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != heldoutSHA256 {
		t.Fatalf("heldout.jsonl changed (sha256 %x): the held-out part must stay as committed", sum)
	}
	score(s, loadJSONL(t, filepath.Join(dir, "heldout.jsonl"))).check(t, "held-out", false, 0.97)
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 1
	}
	return float64(a) / float64(b)
}

// TestCorpusMarkupParses checks the corpus reader on a small input whose
// spans are written out by hand.
func TestCorpusMarkupParses(t *testing.T) {
	text, ls, err := parseMarked("a ⟦EMAIL:plain|x@y.it⟧ b ⟦IBAN:split_turns#2|IT60⟧", 0)
	if err != nil {
		t.Fatal(err)
	}
	if text != "a x@y.it b IT60" || len(ls) != 2 || ls[0].start != 2 || ls[0].end != 8 || ls[1].typ != "IBAN" || ls[1].evasion != "split_turns" || ls[1].group != "2" || ls[1].start != 11 || ls[1].end != 15 {
		t.Fatalf("parseMarked = %q %+v", text, ls)
	}
}
