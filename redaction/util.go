package redaction

import "slices"

// addFinding appends f to dst, doubling dst's capacity when it is full
// (append grows a long slice by about a quarter, so a text with many
// findings of one detector would copy them several times over).
func addFinding(dst []Finding, f Finding) []Finding {
	if len(dst) == cap(dst) {
		dst = slices.Grow(dst, max(len(dst), 8))
	}
	return append(dst, f)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isUpper(c byte) bool { return c >= 'A' && c <= 'Z' }
func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool { return isUpper(c) || isLower(c) }
func isAlnum(c byte) bool { return isDigit(c) || isAlpha(c) }

// wordByte reports whether c continues a word or identifier, so that a
// match next to it is part of something longer (an order id, a hash).
// Bytes >= 0x80 count as word bytes: they start or continue a non-ASCII
// letter in UTF-8.
func wordByte(c byte) bool { return isAlnum(c) || c == '_' || c >= 0x80 }

// underscored reports whether text[s:e] is set in Markdown emphasis by
// underscores ("_4111 1111 1111 1111_", "__RSSMRA80A01H501U__"): one or
// two '_' right before s, as many right after e, and no word byte outside
// them. The underscores then delimit the value, not glue it to an
// identifier.
func underscored(text string, s, e int) bool {
	n := 0
	for n < 3 && before(text, s-n) == '_' {
		n++
	}
	if n == 0 || n > 2 || wordByte(before(text, s-n)) {
		return false
	}
	for k := 0; k < n; k++ {
		if at(text, e+k) != '_' {
			return false
		}
	}
	return !wordByte(at(text, e+n))
}

// emphasisOpens reports whether a run of one or two '_' that no word
// byte precedes ends at p: the opening of Markdown emphasis by
// underscores ("_x", "__x"), not glue to an identifier ("id_x").
func emphasisOpens(text string, p int) bool {
	n := 0
	for n < 3 && before(text, p-n) == '_' {
		n++
	}
	return n > 0 && n < 3 && !wordByte(before(text, p-n))
}

// unemphasise returns the bounds of a value text[s:e] found by a pattern
// whose alphabet has '_', without the Markdown emphasis by underscores
// around it, which the pattern may have taken in or stopped at: the
// opening run (one or two '_', the bytes before s and those at the start
// of text[s:e] together, no word byte before it) and a closing run at
// least as long (the '_' at the end of text[s:e] and at most as many
// after e as the opening run has, no word byte after it). The closing
// run's last bytes mirror the opening run; any '_' before them ends the
// value ("__sk-proj-…x___" holds a key ending in "x_"). o and c are where
// the runs start and end (the bytes the value must not be glued to); ok
// is false, and s and e are returned unchanged, when no such emphasis
// surrounds the value. In "__AKIA…__", a value read as "AKIA…",
// "__AKIA…__" or "AKIA…__" has the bounds of "AKIA…".
func unemphasise(text string, s, e int) (vs, ve, o, c int, ok bool) {
	o = s
	for s-o < 3 && before(text, o) == '_' {
		o--
	}
	i := s
	for i < e && i-o < 3 && text[i] == '_' {
		i++
	}
	open := i - o
	if open == 0 || open > 2 || wordByte(before(text, o)) {
		return s, e, s, e, false
	}
	t := e
	for t > i && text[t-1] == '_' {
		t--
	}
	c = e
	for c < len(text) && c-e < 3 && text[c] == '_' {
		c++
	}
	// The value ends where the pattern ended it, or before: a '_' after
	// it that the mirror does not take is glue.
	if c-t < open || c-e > open || wordByte(at(text, c)) || c-open <= i {
		return s, e, s, e, false
	}
	return i, c - open, o, c, true
}

// before returns text[i-1], or 0 at the start.
func before(text string, i int) byte {
	if i <= 0 {
		return 0
	}
	return text[i-1]
}

// at returns text[i], or 0 past the end.
func at(text string, i int) byte {
	if i >= len(text) {
		return 0
	}
	return text[i]
}
