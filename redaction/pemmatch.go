package redaction

import (
	"strings"
	"unicode/utf8"
)

// privateKeyGitleaks is gitleaks' private-key rule as its default rule set
// has it; a different text (a newer gitleaks) runs as a regular expression.
const privateKeyGitleaks = `(?i)-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----[\s\S-]{64,}?KEY(?: BLOCK)?-----`

// gitleaks' private-key rule,
//
//	(?i)-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----[\s\S-]{64,}?KEY(?: BLOCK)?-----
//
// matched by hand: on a text of PEM headers Go's backtracker spends ~20 ns
// a byte on what is a few literal comparisons. matchPrivateKeyGitleaks
// returns the end of the match the anchored expression finds at p (its
// leftmost-first choice: the longest header, " BLOCK" before none, the
// shortest body), or -1; TestPrivateKeyMatcherIsTheExpression checks it
// against the expression. (?i) folds ASCII letters and also matches U+212A
// (Kelvin sign) for k and U+017F (long s) for s; counts are of runes, an
// invalid UTF-8 byte being one (as regexp decodes it).
func matchPrivateKeyGitleaks(text string, p, lastLandmark int) int {
	if foldAt(text, p, "-----begin") < 0 {
		return -1
	}
	var ends [101]int // ends[c]: after c header runes
	ends[0] = p + len("-----begin")
	n := 1
	for n <= 100 {
		w := pemHeaderRune(text, ends[n-1])
		if w == 0 {
			break
		}
		ends[n] = ends[n-1] + w
		n++
	}
	for c := n - 1; c >= 0; c-- {
		if lowerByte[at(text, ends[c])] != 'p' {
			continue
		}
		j := foldAt(text, ends[c], "private key")
		if j < 0 {
			continue
		}
		if b := foldAt(text, j, " block"); b >= 0 && strings.HasPrefix(text[b:], "-----") {
			if e := privateKeyBody(text, b+5, lastLandmark); e >= 0 {
				return e
			}
		}
		if strings.HasPrefix(text[j:], "-----") {
			if e := privateKeyBody(text, j+5, lastLandmark); e >= 0 {
				return e
			}
		}
	}
	return -1
}

// privateKeyBody matches "[\s\S-]{64,}?KEY(?: BLOCK)?-----" at e: 64 runes,
// then the first landmark; -1 when none starts by lastLandmark (the start
// of the text's last one, lastPrivateKeyLandmark).
func privateKeyBody(text string, e, lastLandmark int) int {
	q := e
	for n := 0; n < 64; n++ {
		if q >= len(text) {
			return -1
		}
		if text[q] < utf8.RuneSelf {
			q++
		} else {
			q += runeWidth(text, q)
		}
	}
	for q <= lastLandmark {
		c := text[q]
		if c == 'k' || c == 'K' || c == 0xE2 { // k, K or U+212A's first byte
			if end := privateKeyLandmark(text, q); end >= 0 {
				return end
			}
		}
		if c < utf8.RuneSelf {
			q++
		} else {
			q += runeWidth(text, q)
		}
	}
	return -1
}

// privateKeyLandmark matches "KEY(?: BLOCK)?-----" (with (?i)) at q and
// returns its end, " BLOCK" tried first, or -1.
func privateKeyLandmark(text string, q int) int {
	k := foldAt(text, q, "key")
	if k < 0 {
		return -1
	}
	if b := foldAt(text, k, " block"); b >= 0 && strings.HasPrefix(text[b:], "-----") {
		return b + 5
	}
	if strings.HasPrefix(text[k:], "-----") {
		return k + 5
	}
	return -1
}

// lastPrivateKeyLandmark returns where the last "KEY-----" or "KEY
// BLOCK-----" (with (?i)) of text starts, or -1: every landmark ends with
// five dashes, so only the dashes strings.LastIndex finds are looked at.
func lastPrivateKeyLandmark(text string) int {
	for d := len(text); ; {
		d = strings.LastIndex(text[:d], "-----")
		if d < 0 {
			return -1
		}
		// The landmark's bytes before the dashes: "key" or "key block",
		// each k one byte or three (U+212A).
		for _, n := range [...]int{3, 5, 9, 11, 13} {
			if s := d - n; s >= 0 && privateKeyLandmark(text, s) == d+5 {
				return s
			}
		}
		d += 4 // overlapping runs of dashes: the next candidate ends one byte earlier
	}
}

// foldAt matches the lower-case ASCII word w at text[i:] as (?i) does and
// returns its end, or -1.
func foldAt(text string, i int, w string) int {
	for k := 0; k < len(w); k++ {
		c := w[k]
		switch {
		case i < len(text) && lowerByte[text[i]] == c:
			i++
		case c == 'k' && strings.HasPrefix(text[i:], "\u212a"):
			i += len("\u212a")
		case c == 's' && strings.HasPrefix(text[i:], "\u017f"):
			i += len("\u017f")
		default:
			return -1
		}
	}
	return i
}

// pemHeaderRune returns the width of the rune at i when (?i)[ A-Z0-9_-]
// matches it, else 0.
func pemHeaderRune(text string, i int) int {
	if i >= len(text) {
		return 0
	}
	if c := text[i]; c < 0x80 {
		if isAlnum(c) || c == ' ' || c == '_' || c == '-' {
			return 1
		}
		return 0
	}
	switch {
	case strings.HasPrefix(text[i:], "\u017f"):
		return len("\u017f")
	case strings.HasPrefix(text[i:], "\u212a"):
		return len("\u212a")
	}
	return 0
}

// runeWidth is the width regexp gives the rune at i (1 for invalid UTF-8).
func runeWidth(text string, i int) int {
	if text[i] < utf8.RuneSelf {
		return 1
	}
	_, w := utf8.DecodeRuneInString(text[i:])
	return w
}
