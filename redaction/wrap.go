package redaction

import (
	"slices"
	"strings"
	"unsafe"
)

// Secrets wrapped over lines: a long key or token that an editor, a
// terminal or a config file broke over two or more lines ("ghp_0123…\n
// ABCD…"), also as string literals joined by their language (Python's
// adjacent literals, "…" + "…" in JavaScript, Java and Go, a shell's
// trailing backslash). The gitleaks rules match the token whole, so the
// lines are read joined: from every base64 run of the prefilter that
// looks like key material (maxWrapLines lines at most), the pieces are
// joined without their line breaks, indentation and quotes, the joined
// text is scanned, and a secret that crosses a join becomes one finding
// covering every line it spans.

const (
	maxWrapLines   = 64   // lines of one wrapped value
	maxWrapBytes   = 4096 // bytes of one joined text
	wrapContext    = 80   // bytes before the first line's run kept for the keyword
	wrapMinRun     = 20   // a run at least this long may be wrapped, whatever it holds
	wrapMinKeyLike = 12   // a shorter one must hold a digit and a letter
)

// wrapGap returns where the token continuing the run that ends at e
// starts, after the line break between them (with an optional closing
// quote, concatenation operator or backslash before it and indentation
// and an opening quote after it), or -1.
func wrapGap(text string, e int) int {
	j := e
	quoted := false // '+' and '.' join string literals, not bare words ("the end.\n2024 …")
	if c := at(text, j); c == '"' || c == '\'' {
		j++
		quoted = true
	}
	for k := 0; k < 8 && (at(text, j) == ' ' || at(text, j) == '\t'); k++ {
		j++
	}
	if c := at(text, j); c == '\\' || quoted && (c == '+' || c == '.') {
		j++
		for k := 0; k < 8 && (at(text, j) == ' ' || at(text, j) == '\t'); k++ {
			j++
		}
	}
	if at(text, j) == '\r' {
		j++
	}
	if at(text, j) != '\n' {
		return -1
	}
	j++
	for k := 0; k < 32 && (at(text, j) == ' ' || at(text, j) == '\t'); k++ {
		j++
	}
	if c := at(text, j); c == '+' || c == '.' {
		j++
		for k := 0; k < 8 && at(text, j) == ' '; k++ {
			j++
		}
		if c := at(text, j); c != '"' && c != '\'' {
			return -1
		}
	}
	if c := at(text, j); c == '"' || c == '\'' {
		j++
	}
	if !isB64Byte(at(text, j)) {
		return -1
	}
	return j
}

// tokenBefore returns the token (base64 bytes) ending the line before the
// one that starts at s (after its indentation and quote), when a wrap
// joins the two (see wrapGap), else s, s.
func tokenBefore(text string, s int) (int, int) {
	j := s
	if c := before(text, j); c == '"' || c == '\'' {
		j--
	}
	for k := 0; k < 32 && (before(text, j) == ' ' || before(text, j) == '\t'); k++ {
		j--
	}
	if before(text, j) != '\n' {
		return s, s
	}
	for k := 0; k < 16 && j > 0 && !isB64Byte(text[j-1]); k++ {
		j--
	}
	e := j
	for j > 0 && e-j < maxWrapBytes && isB64Byte(text[j-1]) {
		j--
	}
	if j == e || wrapGap(text, e) != s {
		return s, s
	}
	return j, e
}

// keyLike reports whether the run text[s:e] may be the first line of a
// wrapped key (see wrapMinRun).
func keyLike(text string, s, e int) bool {
	if e-s >= wrapMinRun {
		return true
	}
	if e-s < wrapMinKeyLike {
		return false
	}
	digit, letter := false, false
	for k := s; k < e; k++ {
		digit = digit || isDigit(text[k])
		letter = letter || isAlpha(text[k])
	}
	return digit && letter
}

// continuation reports whether the token text[s:e] at the start of a
// line may continue a wrapped key: it holds a digit, is long, or is all
// its line holds (a closing quote or bracket and punctuation aside), as
// the last piece of a wrapped key is; a plain word followed by more words
// is the next line of prose.
func continuation(text string, s, e int) bool {
	if e-s >= wrapMinRun {
		return true
	}
	for k := s; k < e; k++ {
		if isDigit(text[k]) {
			return true
		}
	}
	if wrapGap(text, e) >= 0 {
		return true // wrapped again
	}
	j := e
	for j < len(text) && j-e < 4 && strings.IndexByte("\"'`,;)]} \t", text[j]) >= 0 {
		j++
	}
	return j == len(text) || text[j] == '\n' || text[j] == '\r'
}

// detectWrapped appends the secrets of text wrapped over lines (see
// above), found from the base64 runs of the prefilter. enc are the
// findings of text's encoded runs (detectEncoded's): the lines that lie
// inside one of them (a MIME or PEM body of base64 lines that decodes to
// text holding a value) are not joined and scanned, as a secret found
// there would lie inside that finding, which is longer (see coveredBy).
func (s *Scanner) detectWrapped(text string, runs [][2]int32, dst []Finding, b *budget, depth int, enc []Finding) []Finding {
	done := 0
	var spans [][2]int // enc's spans, by start, once lines join
	cover := 0         // spans[:cover] end before the current lines
	var pieces []piece
	var joined []byte
	for ri, r := range runs {
		rs, re := int(r[0]), int(r[1])
		if rs < done || !keyLike(text, rs, re) {
			continue
		}
		ns := wrapGap(text, re)
		if ns < 0 {
			// The run may be the second line of a key whose first line is
			// short ("sk-\n  proj-…"): start from that line's token.
			ps, pe := tokenBefore(text, rs)
			if ps < done || ps == pe {
				continue
			}
			rs, re, ns = ps, pe, rs
		}
		// The first piece, with the keyword context before it on its line.
		cs := rs
		for cs > 0 && rs-cs < wrapContext && text[cs-1] != '\n' {
			cs--
		}
		pieces = append(pieces[:0], piece{off: cs, n: re - cs})
		joined = append(joined[:0], text[cs:re]...)
		end := re
		nr := ri // runs[nr:] start at or after the current line's token
		for ns >= 0 && len(pieces) < maxWrapLines && len(joined) < maxWrapBytes {
			ne := ns
			for nr < len(runs) && int(runs[nr][0]) < ns {
				nr++
			}
			if nr < len(runs) && int(runs[nr][0]) == ns && int(runs[nr][1])-ns < maxWrapBytes {
				// The token starts with the prefilter's run there: its
				// base64 bytes are read off it.
				for ne = int(runs[nr][1]); ne > ns && text[ne-1] == '='; ne-- {
				}
			}
			// The line's token: base64 bytes and dots (a JWT's parts).
			for ne < len(text) && (isB64Byte(text[ne]) || text[ne] == '.' && isB64Byte(at(text, ne+1))) && ne-ns < maxWrapBytes {
				ne++
			}
			for q := 0; q < 2 && at(text, ne) == '='; q++ {
				ne++
			}
			if !continuation(text, ns, ne) {
				break
			}
			pieces = append(pieces, piece{off: ns, at: len(joined), n: ne - ns})
			joined = append(joined, text[ns:ne]...)
			end = ne
			ns = wrapGap(text, ne)
		}
		done = end
		if len(pieces) < 2 {
			continue // the next line does not continue it
		}
		if spans == nil && len(enc) > 0 {
			spans = make([][2]int, len(enc))
			for k, f := range enc {
				spans[k] = [2]int{f.Start, f.End}
			}
			slices.SortFunc(spans, func(x, y [2]int) int { return x[0] - y[0] })
		}
		if coveredBy(spans, &cover, cs, end) {
			continue
		}
		// A closing quote or bracket after the last piece, for the
		// rules that read one.
		if c := at(text, end); c == '"' || c == '\'' || c == '`' {
			joined = append(joined, c)
		}
		if !b.spend(len(joined) / 16) {
			return dst
		}
		// Only secrets are kept, so only the secret rules run (the other
		// detectors read the lines where they are), on the joined text as
		// it is: its base64 is decoded line by line by detectEncoded, so a
		// block of encoded lines (a MIME body, a PEM) costs one more read,
		// not a second decoding.
		// The pieces after the keyword context are base64 bytes, dots and
		// '=' before another piece's byte: the joined text is its own
		// normalised view unless the context needs one.
		plain := plainView(text[cs:rs])
		for _, f := range s.secretsOnly.scanAs(unsafe.String(unsafe.SliceData(joined), len(joined)), b, maxEncodedDepth, plain) {
			if f.Type != TypeSecret {
				continue
			}
			first, last := -1, -1
			for k, p := range pieces {
				if f.Start < p.at+p.n && f.End > p.at {
					if first < 0 {
						first = k
					}
					last = k
				}
			}
			if first < 0 || first == last {
				continue // within one line: the plain scan finds it
			}
			st := pieces[first].off + max(0, f.Start-pieces[first].at)
			en := pieces[last].off + min(pieces[last].n, f.End-pieces[last].at)
			dst = append(dst, Finding{Type: f.Type, Subtype: f.Subtype, Start: st, End: en})
		}
	}
	return dst
}

// plainView reports whether normaliseInto leaves s as it is for a byte
// test alone: no byte of s is >= 0x80 or in specialASCII.
func plainView(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x80 || specialASCII[c] {
			return false
		}
	}
	return true
}

// coveredBy reports whether [s, e) lies inside one of spans (sorted by
// start, each ending after spans[:*from]) and is not all of it; it moves
// *from past the spans that end by s (calls come with s growing). A
// secret found in the joined lines of text[s:e] lies inside text[s:e]
// (a finding is cut to the lines it spans), so it is shorter than the
// span around it, which overlaps it: resolve would keep the span's
// finding and drop the secret, unless a longer finding overlapping the
// span displaced it. The span is then redacted whole all the same.
func coveredBy(spans [][2]int, from *int, s, e int) bool {
	for *from < len(spans) && spans[*from][1] <= s {
		*from++
	}
	for k := *from; k < len(spans) && spans[k][0] <= s; k++ {
		if e <= spans[k][1] && e-s < spans[k][1]-spans[k][0] {
			return true
		}
	}
	return false
}
