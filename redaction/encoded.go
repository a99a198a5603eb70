package redaction

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// minEncodedLen is the shortest base64 or hex run worth decoding: 12
// characters carry 9 (base64) or 6 (hex) bytes; no value worth finding is
// shorter.
const minEncodedLen = 12

// maxEncodedDepth bounds nested encodings (base64 of base64 of …): each
// level decodes to at most 3/4 of its input, so the total work of all
// levels stays under 4× the text.
const maxEncodedDepth = 3

// encodedSegment is a run of base64 or hex in the scanned text and the
// text it decodes to.
type encodedSegment struct {
	start, end int
	decoded    string
}

func isB64Byte(c byte) bool {
	return isAlnum(c) || c == '+' || c == '/' || c == '-' || c == '_'
}

// encodedSegments returns the runs of text that decode, as hex (RFC 4648
// §8, also written as byte pairs separated by spaces or colons) or base64
// (standard or URL-safe alphabet, padded or not, RFC 4648 §4 and §5; also
// wrapped over lines of equal length as MIME and PEM do, RFC 2045 §6.8),
// to mostly printable UTF-8 text: the hiding places of values pasted as
// "bWFyaW9AZXhhbXBsZS5pdA==". Binary payloads (images, hashes, ciphertext)
// fail the printable test and are skipped. runs are the prefilter's base64
// runs of text.
func encodedSegments(text string, runs [][2]int32, hex2 []int32, b *budget) []encodedSegment {
	var out []encodedSegment
	for k := 0; k < len(runs); k++ {
		s, e := int(runs[k][0]), int(runs[k][1])
		if before(text, s) >= 0x80 || at(text, e) >= 0x80 {
			continue // part of a non-ASCII word
		}
		if !b.spend(1 + (e-s)/64) {
			return out
		}
		// Base64 wrapped over lines: runs of one length, each ending at a
		// newline, the last no longer.
		if w := e - s; w >= 16 && at(text, e) == '\n' {
			j, end := k, e
			var joined strings.Builder
			lines := 1
			for {
				nl := end
				if at(text, nl) == '\r' {
					nl++
				}
				if at(text, nl) != '\n' {
					break
				}
				ns, ne := nl+1, nl+1
				for ne < len(text) && ne-ns <= w && isB64Byte(text[ne]) {
					ne++
				}
				for q := 0; q < 2 && at(text, ne) == '='; q++ {
					ne++
				}
				if ne == ns || ne-ns > w || at(text, ne) != '\n' && at(text, ne) != '\r' && isB64Byte(at(text, ne)) {
					break
				}
				if joined.Len() == 0 {
					joined.WriteString(text[s:end])
				}
				joined.WriteString(text[ns:ne])
				end, lines = ne, lines+1
				for j+1 < len(runs) && int(runs[j+1][0]) < ne {
					j++
				}
				if ne-ns < w {
					break
				}
			}
			if lines > 1 {
				if d, ok := decodeRun(joined.String()); ok {
					out = append(out, encodedSegment{s, end, d})
					k = j
					continue
				}
			}
		}
		if d, ok := decodeRun(text[s:e]); ok {
			out = append(out, encodedSegment{s, e, d})
			continue
		}
	}
	return append(out, spacedHex(text, hex2, b)...)
}

// spacedHex finds hex written as at least six byte pairs separated by
// single spaces or colons, decoding to printable text.
// pairs are the prefilter's candidate first pairs.
func spacedHex(text string, pairsAt []int32, b *budget) []encodedSegment {
	var out []encodedSegment
	i := 0
	for _, ps := range pairsAt {
		if int(ps) < i {
			continue
		}
		p := int(ps) + 2 // the separator after the first pair
		if isB64Byte(before(text, p-2)) && before(text, p-2) != '_' {
			continue
		}
		sep := text[p]
		s, j, pairs := p-2, p-2, 0
		for j+2 <= len(text) && isHex(text[j]) && isHex(text[j+1]) && (j+2 == len(text) || text[j+2] == sep || !isB64Byte(text[j+2])) {
			pairs++
			j += 2
			if j < len(text) && text[j] == sep && j+3 <= len(text) && isHex(text[j+1]) && isHex(text[j+2]) {
				j++
				continue
			}
			break
		}
		if pairs < 6 {
			continue
		}
		if !b.spend(1 + pairs/32) {
			return out
		}
		raw := make([]byte, 0, pairs)
		for q := s; q < j; q += 3 {
			raw = append(raw, byte(hexVal(text[q])<<4|hexVal(text[q+1])))
		}
		if len(raw) >= 6 && printableText(raw) {
			out = append(out, encodedSegment{s, j, string(raw)})
		}
		i = j
	}
	return out
}

// maybeText reports whether a decoded prefix can start printable UTF-8
// text: not a control byte other than white space, not DEL, not a UTF-8
// continuation byte or an invalid lead byte.
func maybeText(c byte) bool {
	switch {
	case c < 0x20:
		return c == '\t' || c == '\n' || c == '\r'
	case c == 0x7f, c >= 0x80 && c < 0xc2, c >= 0xf5:
		return false
	}
	return true
}

// decodeRun decodes a run of hex or base64 (RFC 4648 §4 or §5 alphabet,
// padding optional) and returns the decoded text when it reads as text
// (see printableText).
func decodeRun(run string) (string, bool) {
	// Decoded into a buffer on the stack (the run itself is read in
	// place): only a decoded text that is kept is allocated.
	var buf [256]byte
	src := unsafe.Slice(unsafe.StringData(run), len(run))
	var raw []byte
	var err error
	switch {
	case len(run)%2 == 0 && isHexString(run):
		if !maybeText(byte(hexVal(run[0])<<4 | hexVal(run[1]))) {
			return "", false
		}
		raw, err = hex.AppendDecode(buf[:0], src)
	default:
		body := strings.TrimRight(run, "=")
		if strings.IndexByte(body, '=') >= 0 {
			return "", false
		}
		enc := base64.RawStdEncoding
		if strings.ContainsAny(body, "-_") {
			if strings.ContainsAny(body, "+/") {
				return "", false
			}
			enc = base64.RawURLEncoding
		}
		if len(body)%4 == 1 {
			return "", false
		}
		var first [3]byte
		if n, _ := enc.Decode(first[:], []byte(body[:4])); n < 1 || !maybeText(first[0]) {
			return "", false
		}
		raw, err = enc.AppendDecode(buf[:0], src[:len(body)])
	}
	if err != nil || len(raw) < 6 || !printableText(raw) {
		return "", false
	}
	return string(raw), true
}

func isHexString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

// printableText reports whether b is valid UTF-8 of which at least 95% of
// the runes are printable or white space.
func printableText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	n, bad := 0, 0
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		n++
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			bad++
		}
	}
	return bad*20 <= n
}
