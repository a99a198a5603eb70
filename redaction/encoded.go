package redaction

import (
	"encoding/hex"
	"slices"
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

// encodedSegment is a run of base64 or hex in the scanned text,
// text[start:end], and where the text it decodes to lies in the decoded
// buffer of encodedSegments, buf[ds:de].
type encodedSegment struct {
	start, end int
	ds, de     int
}

// encScratch is the memory of encodedSegments, kept with a scan's state.
type encScratch struct {
	buf    []byte
	segs   []encodedSegment
	joined []byte
}

// encodedSep separates the decoded texts in the buffer of
// encodedSegments, so that all of them are scanned at once: no detector
// reads through it (semicolons around a blank line: not a number gap of
// maxGap or less, not address, word or base64 characters, no escape the
// normaliser decodes), and it holds nothing the normaliser changes, so a
// buffer of plain decoded texts needs no view. It starts with a space: a
// decoded text ending in '=' (base64 padding, when base64 is encoded
// again) would read as a quoted-printable soft line break before a line
// feed.
const encodedSep = " ;;\n\n;; "

// addDecoded appends to buf the text run decodes to (see decodeRun), after
// encodedSep when buf is not empty, and to segs its segment text[s:e];
// it returns both unchanged when run does not decode to text.
func addDecoded(segs []encodedSegment, buf []byte, s, e int, run string) ([]encodedSegment, []byte) {
	mark := len(buf)
	if mark > 0 {
		buf = append(buf, encodedSep...)
	}
	ds := len(buf)
	buf, ok := decodeRun(buf, run)
	if !ok {
		return segs, buf[:mark]
	}
	return append(segs, encodedSegment{s, e, ds, len(buf)}), buf
}

// isB64Byte reports whether c is a base64 character of either alphabet
// (letters, digits, '+', '/', '-', '_'): one table load.
func isB64Byte(c byte) bool { return b64Value[c] < 64 }

// encodedSegments returns the runs of text that decode, as hex (RFC 4648
// §8, also written as byte pairs separated by spaces or colons) or base64
// (standard or URL-safe alphabet, padded or not, RFC 4648 §4 and §5; also
// wrapped over lines of equal length, LF or CRLF, as MIME and PEM do, RFC
// 2045 §6.8),
// to mostly printable UTF-8 text: the hiding places of values pasted as
// "bWFyaW9AZXhhbXBsZS5pdA==". Binary payloads (images, hashes, ciphertext)
// fail the printable test and are skipped. runs are the prefilter's base64
// runs of text. The decoded texts are returned in one buffer, in the order
// of the segments and separated by encodedSep: each run is decoded once,
// into that buffer, and nothing is allocated per run. The buffer, the
// segments and the joined lines of wrapped blocks are sc's memory, grown
// as needed and left in sc for the next call (the caller keeps nothing
// that points into them).
func encodedSegments(text string, runs [][2]int32, hex2 []int32, b *budget, sc *encScratch) ([]encodedSegment, []byte) {
	out := sc.segs[:0]
	buf := sc.buf[:0]
	if cap(buf) < 256 {
		buf = make([]byte, 0, 256) // until a run decodes to text
	}
	sized := false
	noBlock := 0            // runs before this offset start no wrapped block
	joined := sc.joined[:0] // a wrapped block's lines, joined
	defer func() { sc.joined = joined[:0] }()
	for k := 0; k < len(runs); k++ {
		if !sized && len(out) > 0 {
			// The first run that decodes to text: the buffer is sized once,
			// for every run left decoding (3 bytes per 4), and so are the
			// segments.
			size := len(buf)
			for _, r := range runs[k:] {
				size += int(r[1]-r[0])*3/4 + len(encodedSep)
			}
			if cap(buf) < size {
				buf = append(make([]byte, 0, size), buf...)
			}
			if n := len(out) + len(runs) - k; cap(out) < n {
				out = append(make([]encodedSegment, 0, n), out...)
			}
			sized = true
		}
		s, e := int(runs[k][0]), int(runs[k][1])
		if before(text, s) >= 0x80 || at(text, e) >= 0x80 {
			continue // part of a non-ASCII word
		}
		if !b.spend(1 + (e-s)/64) {
			return out, buf
		}
		// Base64 wrapped over lines: runs of one length, each ending at a
		// line break (LF, or CRLF as MIME writes it), the last no longer.
		if w := e - s; s >= noBlock && w >= 16 && (at(text, e) == '\n' || at(text, e) == '\r' && at(text, e+1) == '\n') {
			j, end := k, e
			joined = joined[:0]
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
				if j+1 < len(runs) && int(runs[j+1][0]) == ns {
					// The line's run (the prefilter's): its base64 bytes,
					// read up to one past w as below.
					re := int(runs[j+1][1])
					for re > ns && text[re-1] == '=' {
						re--
					}
					ne = min(re, ns+w+1)
				} else {
					for ne < len(text) && ne-ns <= w && isB64Byte(text[ne]) {
						ne++
					}
				}
				for q := 0; q < 2 && at(text, ne) == '='; q++ {
					ne++
				}
				if ne == ns || ne-ns > w || at(text, ne) != '\n' && at(text, ne) != '\r' && isB64Byte(at(text, ne)) {
					break
				}
				if len(joined) == 0 {
					if cap(joined) < len(text)-s {
						// Once, for every block of the text: the block may
						// run to the end of the text.
						joined = make([]byte, 0, len(text)-s)
					}
					joined = append(joined, text[s:end]...)
				}
				joined = append(joined, text[ns:ne]...)
				end, lines = ne, lines+1
				for j+1 < len(runs) && int(runs[j+1][0]) < ne {
					j++
				}
				if ne-ns < w {
					break
				}
			}
			if lines > 1 {
				if !b.spend(len(joined) / 16) {
					return out, buf
				}
				n := len(out)
				if out, buf = addDecoded(out, buf, s, end, unsafe.String(unsafe.SliceData(joined), len(joined))); len(out) > n {
					k = j
					continue
				}
				// Not text (binary, or cut short): its lines are decoded
				// one by one below, and none starts a block again, which
				// would read the rest of this one again (a body of n lines
				// would cost n²).
				noBlock = end
			}
		}
		out, buf = addDecoded(out, buf, s, e, text[s:e])
	}
	return spacedHex(text, hex2, b, out, buf)
}

// spacedHex finds hex written as at least six byte pairs separated by
// single spaces or colons, decoding to printable text, and appends them to
// out and their decoded texts to buf (as encodedSegments does).
// pairs are the prefilter's candidate first pairs.
func spacedHex(text string, pairsAt []int32, b *budget, out []encodedSegment, buf []byte) ([]encodedSegment, []byte) {
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
			return out, buf
		}
		mark := len(buf)
		if mark > 0 {
			buf = append(buf, encodedSep...)
		}
		ds := len(buf)
		for q := s; q < j; q += 3 {
			buf = append(buf, byte(hexVal(text[q])<<4|hexVal(text[q+1])))
		}
		if len(buf)-ds >= 6 && printableText(buf[ds:]) {
			out = append(out, encodedSegment{s, j, ds, len(buf)})
		} else {
			buf = buf[:mark]
		}
		i = j
	}
	return out, buf
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
// padding optional), appending to dst, and reports whether the decoded
// text reads as text (see printableText); when it does not, dst may have
// grown past its length (the caller cuts it back).
func decodeRun(dst []byte, run string) ([]byte, bool) {
	// The run is read in place.
	src := unsafe.Slice(unsafe.StringData(run), len(run))
	from := len(dst)
	var raw []byte
	var err error
	switch {
	case len(run)%2 == 0 && isHexString(run):
		if !maybeText(byte(hexVal(run[0])<<4 | hexVal(run[1]))) {
			return dst, false
		}
		raw, err = hex.AppendDecode(dst, src)
	default:
		body := strings.TrimRight(run, "=")
		// The first six decoded bytes, from the first eight characters:
		// printableText wants valid UTF-8, which random bytes (a pasted
		// binary attachment) mostly are not from their first bytes on.
		if !utf8Start(body) {
			return dst, false
		}
		if strings.IndexByte(body, '=') >= 0 {
			return dst, false
		}
		// One alphabet: "-_" (URL-safe) or "+/", not both.
		if (strings.IndexByte(body, '-') >= 0 || strings.IndexByte(body, '_') >= 0) &&
			(strings.IndexByte(body, '+') >= 0 || strings.IndexByte(body, '/') >= 0) {
			return dst, false
		}
		if len(body)%4 == 1 {
			return dst, false
		}
		// The first decoded byte, from the first two characters.
		if v0, v1 := b64Value[run[0]], b64Value[run[1]]; v0 > 63 || v1 > 63 || !maybeText(v0<<2|v1>>4) {
			return dst, false
		}
		var ok bool
		if raw, ok = appendBase64(dst, body); !ok {
			return raw, false
		}
	}
	if err != nil || len(raw)-from < 6 || !printableText(raw[from:]) {
		return raw, false
	}
	return raw, true
}

// utf8Start reports whether the bytes the first eight characters of the
// base64 s decode to (six bytes; all of s when it is shorter) may begin
// valid UTF-8: every rune in them is valid, the last one possibly cut
// short. It reports true for an s too short or holding a byte outside
// both alphabets (decoding turns those down).
func utf8Start(s string) bool {
	if len(s) < 8 {
		return true
	}
	var v uint64
	for i := range 8 {
		c := b64Value[s[i]]
		if c > 63 {
			return true
		}
		v = v<<6 | uint64(c)
	}
	b := [6]byte{byte(v >> 40), byte(v >> 32), byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}
	p := b[:]
	for len(p) > 0 {
		if p[0] < utf8.RuneSelf {
			p = p[1:]
			continue
		}
		r, size := utf8.DecodeRune(p)
		if r == utf8.RuneError && size == 1 {
			return !utf8.FullRune(p) // cut short, or invalid
		}
		p = p[size:]
	}
	return true
}

// appendBase64 appends to dst the bytes that s, unpadded base64, decodes
// to, as encoding/base64's RawStdEncoding or RawURLEncoding would (the
// unused bits of a last partial group may be set), and reports whether s
// is such base64; when it is not, dst may have grown past its length.
// Characters of both alphabets are read (see b64Value): decodeRun turns
// down a run that mixes them.
func appendBase64(dst []byte, s string) ([]byte, bool) {
	n := len(s) / 4 * 3
	switch len(s) % 4 {
	case 1:
		return dst, false
	case 2:
		n++
	case 3:
		n += 2
	}
	from := len(dst)
	dst = slices.Grow(dst, n)[:from+n]
	out := dst[from:]
	i, o := 0, 0
	// Eight characters (six bytes) at a time, then four.
	for ; i+8 <= len(s) && o+6 <= len(out); i, o = i+8, o+6 {
		q := s[i : i+8]
		a, b, c, d := b64Value[q[0]], b64Value[q[1]], b64Value[q[2]], b64Value[q[3]]
		e, f, g, h := b64Value[q[4]], b64Value[q[5]], b64Value[q[6]], b64Value[q[7]]
		if (a|b|c|d|e|f|g|h)&0xc0 != 0 {
			return dst, false
		}
		v := uint64(a)<<42 | uint64(b)<<36 | uint64(c)<<30 | uint64(d)<<24 | uint64(e)<<18 | uint64(f)<<12 | uint64(g)<<6 | uint64(h)
		w := out[o : o+6]
		w[0], w[1], w[2], w[3], w[4], w[5] = byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
	for ; i+4 <= len(s) && o+3 <= len(out); i, o = i+4, o+3 {
		a, b, c, d := b64Value[s[i]], b64Value[s[i+1]], b64Value[s[i+2]], b64Value[s[i+3]]
		if (a|b|c|d)&0xc0 != 0 {
			return dst, false
		}
		v := uint32(a)<<18 | uint32(b)<<12 | uint32(c)<<6 | uint32(d)
		out[o], out[o+1], out[o+2] = byte(v>>16), byte(v>>8), byte(v)
	}
	switch len(s) - i {
	case 2:
		a, b := b64Value[s[i]], b64Value[s[i+1]]
		if (a|b)&0xc0 != 0 {
			return dst, false
		}
		out[o] = a<<2 | b>>4
	case 3:
		a, b, c := b64Value[s[i]], b64Value[s[i+1]], b64Value[s[i+2]]
		if (a|b|c)&0xc0 != 0 {
			return dst, false
		}
		out[o], out[o+1] = a<<2|b>>4, b<<4|c>>2
	}
	return dst, true
}

// b64Value is the value of a base64 character of either alphabet (RFC
// 4648 §4 and §5), 0xff for any other byte.
var b64Value = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for i, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/" {
		t[c] = byte(i)
	}
	t['-'], t['_'] = 62, 63
	return t
}()

func isHexString(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHex(s[i]) {
			return false
		}
	}
	return true
}

// asciiNotText is 1 for the ASCII bytes that are neither printable (' '
// to '~') nor white space ('\t' to '\r').
var asciiNotText = func() (t [utf8.RuneSelf]uint8) {
	for c := range utf8.RuneSelf {
		if !unicode.IsPrint(rune(c)) && !unicode.IsSpace(rune(c)) {
			t[c] = 1
		}
	}
	return t
}()

// printableText reports whether b is valid UTF-8 of which at least 95% of
// the runes are printable or white space.
func printableText(b []byte) bool {
	// A prefix of printable ASCII (' ' to '~'), eight bytes at a time: for
	// decoded text, usually all of it, which is then valid UTF-8 too.
	n := 0
	for n+8 <= len(b) {
		if x := le64(unsafe.String(unsafe.SliceData(b[n:]), 8)); x&msb != 0 || inRange(x, ' ', '~') != msb {
			break
		}
		n += 8
	}
	b = b[n:]
	if !utf8.Valid(b) {
		return false
	}
	bad := 0
	for len(b) > 0 {
		if c := b[0]; c < utf8.RuneSelf {
			n++
			bad += int(asciiNotText[c])
			b = b[1:]
			continue
		}
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		n++
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			bad++
		}
	}
	return bad*20 <= n
}
