package redaction

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// view is a normalised copy of a text with, for every byte of the copy, the
// byte span of the original rune (or escape) it came from.
type view struct {
	text   string
	starts []int32 // starts[i]: original offset of the source of text[i]
	ends   []int32 // ends[i]: original end offset of the source of text[i]
}

// span maps the byte range [s, e) of the view back to the original text.
func (v *view) span(s, e int) (int, int) {
	return int(v.starts[s]), int(v.ends[e-1])
}

// confusables maps letters that render like ASCII letters to those letters:
// the Cyrillic and Greek homoglyphs of Unicode TR #39's confusables.txt that
// map to a single ASCII letter, plus a few Latin look-alikes.
var confusables = map[rune]rune{
	// Cyrillic
	'а': 'a', 'в': 'b', 'е': 'e', 'о': 'o', 'р': 'p', 'с': 'c', 'у': 'y', 'х': 'x', 'і': 'i', 'ј': 'j',
	'ѕ': 's', 'ԁ': 'd', 'ԛ': 'q', 'ԝ': 'w', 'һ': 'h', 'ӏ': 'l', 'ո': 'n', 'ս': 'u',
	'А': 'A', 'В': 'B', 'Е': 'E', 'К': 'K', 'М': 'M', 'Н': 'H', 'О': 'O', 'Р': 'P', 'С': 'C', 'Т': 'T',
	'Х': 'X', 'У': 'Y', 'І': 'I', 'Ј': 'J', 'Ѕ': 'S', 'Ԛ': 'Q', 'Ԝ': 'W', 'Ζ': 'Z',
	// Greek
	'Α': 'A', 'Β': 'B', 'Ε': 'E', 'Η': 'H', 'Ι': 'I', 'Κ': 'K', 'Μ': 'M', 'Ν': 'N', 'Ο': 'O', 'Ρ': 'P',
	'Τ': 'T', 'Υ': 'Y', 'Χ': 'X', 'ο': 'o', 'α': 'a', 'ν': 'v', 'ρ': 'p',
	// Latin look-alikes
	'ɡ': 'g', 'ı': 'i', 'ȷ': 'j', 'ℓ': 'l',
}

// dropRune reports runes removed from the view: format characters (Unicode
// category Cf: zero-width space/joiners, word joiner, BOM, soft hyphen,
// bidi controls), variation selectors and the combining grapheme joiner.
func dropRune(r rune) bool {
	return unicode.Is(unicode.Cf, r) || r >= 0xFE00 && r <= 0xFE0F || r == 0x034F || r >= 0xE0100 && r <= 0xE01EF
}

// mapRune returns the ASCII stand-in for dashes and spaces that NFKC leaves
// alone (or maps inconsistently), or -1.
func mapRune(r rune) rune {
	switch {
	case r >= 0x2010 && r <= 0x2015, r == 0x2212, r == 0xFE58, r == 0xFE63, r == 0xFF0D, r == 0x2043:
		return '-'
	case r == 0x2024, r == 0xFF0E, r == 0x3002:
		return '.'
	case r == 0x2800, r == 0x3164, r == 0xFFA0:
		return ' '
	case unicode.IsSpace(r):
		if r == '\n' || r == '\r' || r == 0x2028 || r == 0x2029 || r == 0x85 {
			return '\n'
		}
		return ' '
	}
	if c, ok := confusables[r]; ok {
		return c
	}
	return -1
}

// percentDecoded lists the %XX escapes the view decodes: the characters
// that shape e-mail addresses, URLs and keys (RFC 3986 §2.1).
var percentDecoded = map[string]byte{
	"40": '@', "2B": '+', "2b": '+', "2E": '.', "2e": '.', "2D": '-', "2d": '-',
	"5F": '_', "5f": '_', "3A": ':', "3a": ':', "2F": '/', "2f": '/', "3D": '=', "3d": '=',
}

// jsonEscape decodes a JSON \uXXXX escape (RFC 8259 §7) at the start of s,
// returning -1 when s does not start with one or it encodes a surrogate or
// a control character.
func jsonEscape(s string) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, h := range []byte(s[2:6]) {
		switch {
		case h >= '0' && h <= '9':
			r = r<<4 | rune(h-'0')
		case h >= 'a' && h <= 'f':
			r = r<<4 | rune(h-'a'+10)
		case h >= 'A' && h <= 'F':
			r = r<<4 | rune(h-'A'+10)
		default:
			return -1
		}
	}
	if r < 0x20 || r >= 0xD800 && r <= 0xDFFF {
		return -1
	}
	return r
}

// normalise builds the normalised view of text: NFKC per rune (fullwidth
// digits and letters, ligatures, mathematical alphanumerics become ASCII),
// format characters dropped, homoglyphs, dashes and spaces mapped,
// percent-escapes of address characters and JSON \uXXXX escapes decoded. It returns ok=false when
// the view would equal text, so callers can skip a second scan.
func normalise(text string) (v view, ok bool) {
	first := -1
	for i := 0; i < len(text); i++ {
		if c := text[i]; c >= 0x80 || c == '%' && i+2 < len(text) && percentDecoded[text[i+1:i+3]] != 0 || c == '\\' && jsonEscape(text[i:]) >= 0 {
			first = i
			break
		}
	}
	if first < 0 {
		return view{}, false
	}
	var b strings.Builder
	b.Grow(len(text))
	v.starts = make([]int32, 0, len(text))
	v.ends = make([]int32, 0, len(text))
	emit := func(s []byte, from, to int) {
		b.Write(s)
		for range s {
			v.starts = append(v.starts, int32(from))
			v.ends = append(v.ends, int32(to))
		}
	}
	changed := false
	var tmp [4]byte
	var nfkc []byte
	// Copy the ASCII prefix as is.
	b.WriteString(text[:first])
	for i := 0; i < first; i++ {
		v.starts = append(v.starts, int32(i))
		v.ends = append(v.ends, int32(i+1))
	}
	for i := first; i < len(text); {
		c := text[i]
		if c < 0x80 {
			if c == '\\' {
				// A JSON \uXXXX escape left in text (tool-call arguments are JSON
				// inside a JSON string, so "\u0040" there is an '@').
				if r := jsonEscape(text[i:]); r >= 0 {
					if m := mapRune(r); m >= 0 {
						r = m
					}
					nfkc = norm.NFKC.AppendString(nfkc[:0], string(r))
					emit(nfkc, i, i+6)
					i += 6
					changed = true
					continue
				}
			}
			if c == '%' && i+2 < len(text) {
				if d := percentDecoded[text[i+1:i+3]]; d != 0 {
					tmp[0] = d
					emit(tmp[:1], i, i+3)
					i += 3
					changed = true
					continue
				}
			}
			tmp[0] = c
			emit(tmp[:1], i, i+1)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			tmp[0] = c
			emit(tmp[:1], i, i+1)
		case dropRune(r):
			changed = true
		default:
			if m := mapRune(r); m >= 0 {
				n := utf8.EncodeRune(tmp[:], m)
				emit(tmp[:n], i, i+size)
				changed = true
				break
			}
			nfkc = norm.NFKC.AppendString(nfkc[:0], text[i:i+size])
			if string(nfkc) != text[i:i+size] {
				changed = true
			}
			emit(nfkc, i, i+size)
		}
		i += size
	}
	if !changed {
		return view{}, false
	}
	v.text = b.String()
	return v, true
}
