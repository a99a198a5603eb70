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
