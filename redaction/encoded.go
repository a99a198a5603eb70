package redaction

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"unicode"
	"unicode/utf8"
)

// minEncodedLen is the shortest base64 or hex run worth decoding: 12
// characters carry 9 (base64) or 6 (hex) bytes; no value worth finding is
// shorter.
const minEncodedLen = 12

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
// §8) or base64 (standard or URL-safe alphabet, padded or not, RFC 4648 §4
// and §5), to mostly printable UTF-8 text: the hiding places of values
// pasted as "bWFyaW9AZXhhbXBsZS5pdA==". Binary payloads (images, hashes,
// ciphertext) fail the printable test and are skipped.
func encodedSegments(text string) []encodedSegment {
	var out []encodedSegment
	for i := 0; i < len(text); {
		if !isB64Byte(text[i]) {
			i++
			continue
		}
		j := i
		for j < len(text) && isB64Byte(text[j]) {
			j++
		}
		s, e := i, j
		for k := 0; k < 2 && at(text, e) == '='; k++ {
			e++ // padding
		}
		i = j
		// A run glued to a word character outside ASCII is part of a word.
		if e-s < minEncodedLen || before(text, s) >= 0x80 || at(text, e) >= 0x80 {
			continue
		}
		if d, ok := decodeRun(text[s:e]); ok {
			out = append(out, encodedSegment{s, e, d})
		}
	}
	return out
}

func decodeRun(run string) (string, bool) {
	var raw []byte
	var err error
	switch {
	case len(run)%2 == 0 && isHexString(run):
		raw, err = hex.DecodeString(run)
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
		raw, err = enc.DecodeString(body)
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
