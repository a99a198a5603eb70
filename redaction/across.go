package redaction

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// acrossWindow is how many bytes on each side of a boundary between two
// segments ScanAcross looks at: more than any value worth finding except
// PEM blocks, which are not typed across messages.
const acrossWindow = 256

// SegmentFinding is one part of a value split across segments: it lies at
// segments[Segment][Start:End]. Parts of the same value share Value.
type SegmentFinding struct {
	Segment int // index into the segments given to ScanAcross
	Value   int // groups the parts of one value; 0, 1, ... in order of the first part
	Finding     // Type, Subtype and the byte span inside the segment
}

// piece maps window[at:at+len) to segments[seg][off:off+len).
type piece struct{ seg, off, at, n int }

// ScanAcross finds values that are split across consecutive segments (for
// example the digits of a card number spread over two chat messages, or an
// e-mail address cut between two tool-call arguments): for every boundary it
// scans the last and first 256 bytes around it, the segments joined
// directly (a value cut anywhere: "mario.rossi@" + "example.it") or with
// one space (a grouped number cut between groups: "4111 1111" + "1111
// 1111"; not after a part ending in '.', '!' or '?'), and, where white
// space lies at the boundary (any run of unicode.IsSpace: a line break,
// a tab, several spaces, a no-break space, the next segment's indent),
// once more without that white space (a value cut where its writer broke
// the line or left a gap: "AKIAIOSFOD\n" + "NN7EXAMPLE", "sk-proj-Zx8k\t"
// + "Q2mP…"), and keeps the findings that cover bytes of two or more
// segments. A candidate is dropped when one of its parts holds a whole
// value of the same type on its own (a complete value glued to the next
// segment, such as "alice@example.com" + "cc"; across white space also a
// part ending in a plain word before a whole value, "Thanks\n" +
// "alice@example.com"). Each part is reported in
// its own segment's byte offsets, so every segment can be redacted on its
// own. Values inside one segment are not reported (Scan finds them). Overlapping candidates resolve as in
// Scan, longest first. The result is sorted by Segment, then Start. Safe
// for concurrent use.
//
// Segments may be every message of a conversation, whatever its role: a
// value is also joined across one segment in between (the tail of segment
// k with the head of segment k+2), so an IBAN split over two user messages
// with the assistant's reply between them is found.
func (s *Scanner) ScanAcross(segments []string) []SegmentFinding {
	return s.scanAcross(segments, nil)
}

// ScanAcrossBounded is ScanAcross under the scan budget of Config (see
// ScanBounded), counted over the bytes of all segments. When the budget is
// exceeded it returns the parts found so far and an error wrapping
// ErrScanBudget: the caller must then treat the segments as opaque.
func (s *Scanner) ScanAcrossBounded(segments []string) ([]SegmentFinding, error) {
	n := 0
	for _, seg := range segments {
		n += len(seg)
	}
	// Each boundary scans a few windows of 2 × acrossWindow bytes (one
	// per choice of separators), twice as many at white space.
	b, err := s.newBudget(n + 16*acrossWindow*len(segments))
	if err != nil {
		return nil, err
	}
	out := s.scanAcross(segments, b)
	if b.exceeded {
		return out, fmt.Errorf("scanning %d segments: %w", len(segments), ErrScanBudget)
	}
	return out, nil
}

func (s *Scanner) scanAcross(segments []string, bud *budget) []SegmentFinding {
	type group struct {
		typ, sub string
		parts    []piece // seg, off=start, n=length
		size     int
	}
	var groups []group
	seen := map[string]bool{}
	var w strings.Builder
	var pieces []piece
	// within caches the findings of each segment scanned alone.
	within := map[[3]int][]Finding{}
	// glued reports a joined candidate one of whose parts already holds a
	// whole value of its type when its segment is scanned alone, followed
	// by a part that is a plain word: a complete value glued to the next
	// message's first word ("alice@example.com" + "cc bob"), not a split
	// one. The mirror case ("my email is" + "mario@example.it") is kept as
	// one value on purpose: it cannot be told from a local part cut after
	// a word ("jo" + "hn.smith@example.com"), and redacting the word "is"
	// costs less than leaking "jo". A part that holds a whole value of a
	// type earlier in the tie-break order is that value, not part of a
	// weaker one.
	glued := func(typ string, parts []piece, broken bool) bool {
		for qi, q := range parts {
			// A message ending a sentence ("Please continue.") does not
			// continue into the next one's address.
			if typ == TypeEmail && qi+1 < len(parts) && strings.HasSuffix(segments[q.seg][q.off:q.off+q.n], ".") {
				return true
			}
			k := [3]int{q.seg, 0, len(segments[q.seg])}
			fs, ok := within[k]
			if !ok {
				fs = s.scan(segments[q.seg], bud, 0)
				within[k] = fs
			}
			for _, f := range fs {
				if f.End <= q.off || f.Start >= q.off+q.n {
					continue
				}
				// A part that cuts through a whole value would break it up.
				if f.Start < q.off || f.End > q.off+q.n {
					return true
				}
				// A part that is a whole value of a stronger type on its
				// own ("4111111111111111" + "alice@example.com") is that
				// value, not the start of a weaker one.
				if f.Type != typ {
					if s.prio[f.Type] < s.prio[typ] && f.Start <= q.off && f.End >= q.off+q.n {
						return true
					}
					continue
				}
				// A whole value ending where the next part, a plain
				// word, begins.
				if f.End == q.off+q.n && qi+1 < len(parts) && plainWord(segments, parts[qi+1]) {
					return true
				}
				// Across white space, also the mirror: a part ending in
				// a plain word, then one starting with a whole value
				// ("Thanks\n" + "alice@example.com", "my email is " +
				// "mario@example.it"), are two words.
				if broken && f.Start == q.off && qi > 0 && plainWord(segments, parts[qi-1]) {
					return true
				}
			}
		}
		return false
	}
	process := func(spans []piece, broken bool) {
		// Every choice of separator per inner boundary when there are at
		// most three (a value cut in four), else all-nothing and all-space.
		inner := len(spans) - 1
		masks := []int{0, 1<<inner - 1}
		if inner <= 3 {
			masks = masks[:0]
			for m := 0; m < 1<<inner; m++ {
				masks = append(masks, m)
			}
		}
		// A space adds nothing after a part ending a sentence: no value
		// holds ". ", "! " or "? " (a grouped number is cut between
		// groups, a name between words), and the join without it is
		// scanned anyway.
		ends := 0
		for i, p := range spans[:inner] {
			if p.n > 0 && strings.IndexByte(".!?", segments[p.seg][p.off+p.n-1]) >= 0 {
				ends |= 1 << i
			}
		}
		for _, mask := range masks {
			if m := mask &^ ends; m != mask {
				if inner <= 3 || m == 0 {
					continue // m is among the masks
				}
				mask = m
			}
			w.Reset()
			pieces = pieces[:0]
			for i, p := range spans {
				if i > 0 && mask&(1<<(i-1)) != 0 {
					w.WriteByte(' ')
				}
				p.at = w.Len()
				w.WriteString(segments[p.seg][p.off : p.off+p.n])
				pieces = append(pieces, p)
			}
			window := w.String()
			for _, f := range s.scan(window, bud, 0) {
				var parts []piece
				for _, p := range pieces {
					st, en := max(f.Start, p.at), min(f.End, p.at+p.n)
					if st < en {
						parts = append(parts, piece{seg: p.seg, off: p.off + st - p.at, n: en - st})
					}
				}
				if len(parts) < 2 || glued(f.Type, parts, broken) {
					continue
				}
				var key strings.Builder
				key.WriteString(f.Type)
				size := 0
				for _, p := range parts {
					key.WriteString(":" + strconv.Itoa(p.seg) + "," + strconv.Itoa(p.off) + "," + strconv.Itoa(p.n))
					size += p.n
				}
				if seen[key.String()] {
					continue
				}
				seen[key.String()] = true
				groups = append(groups, group{typ: f.Type, sub: f.Subtype, parts: parts, size: size})
			}
		}
	}
	// run processes the pieces around a boundary as they are and, when
	// white space lies at one of their boundaries (a line break, a tab,
	// several spaces, a no-break space, the next message's indent), once
	// more without it: a value cut where its writer broke the line or
	// left white space ("My IBAN is DE89 3704 0044\n" + "0532 0130 00",
	// "AKIAIOSFOD\t" + "NN7EXAMPLE") is read as if cut there without
	// any (and, by process, with one space). Only the detectors that read
	// across white space (numbers) see through the white space itself.
	var trimmed []piece
	run := func(spans []piece) {
		process(spans, false)
		var ok bool
		if trimmed, ok = gapTrimmed(segments, spans, trimmed[:0]); ok {
			process(trimmed, true)
		}
	}
	var spans []piece
	for b := 1; b < len(segments); b++ {
		// The pieces around boundary b: tails of segments b-1, b-2, ... and
		// heads of b, b+1, ..., up to acrossWindow bytes on each side.
		spans = spans[:0]
		need := acrossWindow
		for k := b - 1; k >= 0 && need > 0; k-- {
			seg := segments[k]
			off := max(0, len(seg)-need)
			for off > 0 && off < len(seg) && !utf8.RuneStart(seg[off]) {
				off++
			}
			spans = append(spans, piece{seg: k, off: off, n: len(seg) - off})
			need -= len(seg) - off + 1
		}
		slices.Reverse(spans)
		need = acrossWindow
		for k := b; k < len(segments) && need > 0; k++ {
			seg := segments[k]
			end := min(len(seg), need)
			for end < len(seg) && !utf8.RuneStart(seg[end]) {
				end--
			}
			spans = append(spans, piece{seg: k, n: end})
			need -= end + 1
		}
		run(spans)
	}
	// A value split around another turn: the tail of segment k joined
	// with the head of segment k+2 (an IBAN in two user messages
	// with the assistant's reply between them).
	for d := 2; d <= 2; d++ {
		for k := 0; k+d < len(segments); k++ {
			tail, head := segments[k], segments[k+d]
			off := max(0, len(tail)-acrossWindow)
			for off > 0 && off < len(tail) && !utf8.RuneStart(tail[off]) {
				off++
			}
			end := min(len(head), acrossWindow)
			for end < len(head) && !utf8.RuneStart(head[end]) {
				end--
			}
			spans = append(spans[:0], piece{seg: k, off: off, n: len(tail) - off}, piece{seg: k + d, n: end})
			run(spans)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	sort.SliceStable(groups, func(i, j int) bool {
		if groups[i].size != groups[j].size {
			return groups[i].size > groups[j].size
		}
		return s.prio[groups[i].typ] < s.prio[groups[j].typ]
	})
	var out []SegmentFinding
	overlaps := func(p piece) bool {
		for _, o := range out {
			if o.Segment == p.seg && o.Start < p.off+p.n && p.off < o.End {
				return true
			}
		}
		return false
	}
	for gid, g := range groups {
		clash := false
		for _, p := range g.parts {
			clash = clash || overlaps(p)
		}
		if clash {
			continue
		}
		for _, p := range g.parts {
			out = append(out, SegmentFinding{Segment: p.seg, Value: gid, Finding: Finding{Type: g.typ, Subtype: g.sub, Start: p.off, End: p.off + p.n}})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Segment != out[j].Segment {
			return out[i].Segment < out[j].Segment
		}
		return out[i].Start < out[j].Start
	})
	ids := map[int]int{}
	for i := range out {
		id, ok := ids[out[i].Value]
		if !ok {
			id = len(ids)
			ids[out[i].Value] = id
		}
		out[i].Value = id
	}
	return out
}

// gapTrimmed appends to dst the pieces of spans with the white space
// (unicode.IsSpace: spaces, tabs, CR, LF, no-break and other Unicode
// spaces) around each boundary between two of them removed, dropping the
// pieces left empty, and reports whether it removed any.
func gapTrimmed(segments []string, spans []piece, dst []piece) ([]piece, bool) {
	dst = append(dst, spans...)
	changed := false
	for i := 0; i+1 < len(dst); i++ {
		l, r := &dst[i], &dst[i+1]
		lt, rt := segments[l.seg][l.off:l.off+l.n], segments[r.seg][r.off:r.off+r.n]
		tl := strings.TrimRightFunc(lt, unicode.IsSpace)
		tr := strings.TrimLeftFunc(rt, unicode.IsSpace)
		if len(tl) == len(lt) && len(tr) == len(rt) {
			continue
		}
		changed = true
		l.n = len(tl)
		r.off += len(rt) - len(tr)
		r.n = len(tr)
	}
	if !changed {
		return dst, false
	}
	out := dst[:0]
	for _, p := range dst {
		if p.n > 0 {
			out = append(out, p)
		}
	}
	return out, len(out) > 1
}

// plainWord reports whether part p is a plain word: letters only, and
// bounded in its segment by white space, punctuation or the segment's ends.
func plainWord(segments []string, p piece) bool {
	seg := segments[p.seg]
	word := seg[p.off : p.off+p.n]
	for _, r := range word {
		if !unicode.IsLetter(r) {
			return false
		}
	}
	before, _ := utf8.DecodeLastRuneInString(seg[:p.off])
	after, _ := utf8.DecodeRuneInString(seg[p.off+p.n:])
	isWord := func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }
	return (p.off == 0 || !isWord(before)) && (p.off+p.n == len(seg) || !isWord(after))
}
