package redaction

import (
	"math/bits"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

// view is a normalised copy of a text and the map from its bytes back to
// the original. The map is sparse: marks lists the pieces of the view that
// differ from the original, in order; every byte between two marks is the
// original byte at a constant offset, so building the view of a mostly
// ASCII text costs one copy.
type view struct {
	text  string
	marks []viewMark
}

// viewMark says that view[v:ve) came from original[o:oe).
type viewMark struct{ v, ve, o, oe int32 }

// orig returns the original span of view byte i.
func (v *view) orig(i int) (int, int) {
	return v.origOf(i, v.markAt(i))
}

// markAt returns the index of the last mark starting at or before view
// byte i, or -1.
func (v *view) markAt(i int) int {
	return sort.Search(len(v.marks), func(k int) bool { return int(v.marks[k].v) > i }) - 1
}

// origOf is orig given markAt(i), k.
func (v *view) origOf(i, k int) (int, int) {
	if k < 0 {
		return i, i + 1
	}
	m := v.marks[k]
	if i < int(m.ve) {
		return int(m.o), int(m.oe)
	}
	o := int(m.oe) + i - int(m.ve)
	return o, o + 1
}

// span maps the byte range [s, e) of the view back to the original text.
func (v *view) span(s, e int) (int, int) {
	k := -1
	return v.spanFrom(s, e, &k)
}

// spanFrom is span with a cursor: *k is the mark index of an earlier call
// (-1 at first). Ranges mapped in increasing order (as detectors find
// them) then cost a step or two of the cursor each, not two searches.
func (v *view) spanFrom(s, e int, k *int) (int, int) {
	a, _ := v.origOf(s, v.markFrom(s, k))
	_, b := v.origOf(e-1, v.markFrom(e-1, k))
	return a, b
}

// markFrom is markAt(i) from the cursor *k, which it moves there.
func (v *view) markFrom(i int, k *int) int {
	j := *k
	if j < 0 || j >= len(v.marks) || int(v.marks[j].v) > i {
		j = v.markAt(i)
	} else {
		for steps := 0; j+1 < len(v.marks) && int(v.marks[j+1].v) <= i; j++ {
			if steps++; steps > 8 {
				j = v.markAt(i)
				break
			}
		}
	}
	*k = j
	return j
}

// confusables maps letters that render like ASCII letters to those letters:
// the Cyrillic, Greek and Latin homoglyphs of Unicode TR #39's
// confusables.txt (https://www.unicode.org/Public/security/latest/confusables.txt)
// that map to a single ASCII letter and that NFKC leaves alone.
var confusables = map[rune]rune{
	// Cyrillic
	'а': 'a', 'в': 'b', 'е': 'e', 'о': 'o', 'р': 'p', 'с': 'c', 'у': 'y', 'х': 'x', 'і': 'i', 'ј': 'j',
	'ѕ': 's', 'ԁ': 'd', 'ԛ': 'q', 'ԝ': 'w', 'һ': 'h', 'ӏ': 'l', 'ո': 'n', 'ս': 'u', 'ɡ': 'g',
	'А': 'A', 'В': 'B', 'Е': 'E', 'К': 'K', 'М': 'M', 'Н': 'H', 'О': 'O', 'Р': 'P', 'С': 'C', 'Т': 'T',
	'Х': 'X', 'У': 'Y', 'І': 'I', 'Ј': 'J', 'Ѕ': 'S', 'Ԛ': 'Q', 'Ԝ': 'W', 'ԍ': 'G',
	// Greek
	'Α': 'A', 'Β': 'B', 'Ε': 'E', 'Ζ': 'Z', 'Η': 'H', 'Ι': 'I', 'Κ': 'K', 'Μ': 'M', 'Ν': 'N', 'Ο': 'O',
	'Ρ': 'P', 'Τ': 'T', 'Υ': 'Y', 'Χ': 'X', 'ο': 'o', 'α': 'a', 'ν': 'v', 'ρ': 'p', 'ι': 'i', 'κ': 'k',
	'τ': 't', 'υ': 'u', 'χ': 'x', 'ε': 'e', 'ϲ': 'c', 'ϳ': 'j',
	// Latin look-alikes (IPA and others)
	'ɑ': 'a', 'ɒ': 'a', 'ɐ': 'a', 'ı': 'i', 'ɩ': 'i', 'ȷ': 'j', 'ℓ': 'l', 'ɵ': 'o', 'ɔ': 'c',
	'ʀ': 'R', 'ʏ': 'Y', 'ɴ': 'N', 'ʜ': 'H', 'ʟ': 'L', 'ɪ': 'I', 'ᴀ': 'A', 'ᴄ': 'C', 'ᴅ': 'D', 'ᴇ': 'E',
	'ᴋ': 'K', 'ᴍ': 'M', 'ᴏ': 'O', 'ᴘ': 'P', 'ᴛ': 'T', 'ᴜ': 'U', 'ᴠ': 'V', 'ᴡ': 'W', 'ᴢ': 'Z', 'ꜱ': 'S',
	'ǀ': 'l', 'ꓲ': 'I', 'ꓳ': 'O', 'ꓴ': 'U',
}

// dropRune reports runes removed from the view: format characters (Unicode
// category Cf: zero-width space/joiners, word joiner, BOM, soft hyphen,
// bidi controls), variation selectors, the combining grapheme joiner and
// combining marks (Mn, Me), which evasions stack on letters ("má̱rio").
func dropRune(r rune) bool {
	return unicode.Is(unicode.Cf, r) || r >= 0xFE00 && r <= 0xFE0F || r >= 0xE0100 && r <= 0xE01EF ||
		unicode.Is(unicode.Mn, r) || unicode.Is(unicode.Me, r) ||
		// C1 controls (NEL is a line break: mapRune) and U+FFFD, what a
		// JSON decoder makes of a lone surrogate escape (\ud800).
		r >= 0x80 && r <= 0x9F && r != 0x85 || r == utf8.RuneError
}

// dropASCII marks the C0 controls other than the white space ones (tab,
// line feed, vertical tab, form feed, carriage return), and DEL:
// invisible, so "bob@exam\u0000ple.com" reads as the address it shows.
var dropASCII = func() (t [128]bool) {
	for c := range 0x20 {
		t[c] = c < '\t' || c > '\r'
	}
	t[0x7F] = true
	return t
}()

// mapRune returns the ASCII stand-in for dashes, spaces, dots, decimal
// digits of other scripts and homoglyphs, or -1.
func mapRune(r rune) rune {
	switch {
	case r >= 0x2010 && r <= 0x2015, r == 0x2212, r == 0xFE58, r == 0xFE63, r == 0xFF0D, r == 0x2043:
		return '-'
	case r == 0x2024, r == 0xFF0E, r == 0x3002, r == 0x00B7, r == 0x2219, r == 0x30FB, r == 0x2027:
		// One dot leader, fullwidth and ideographic full stops, and the
		// middle dots (Latin, bullet operator, katakana, hyphenation
		// point) that separate digit groups ("4111·1111·…").
		return '.'
	case r == 0x2800, r == 0x3164, r == 0xFFA0:
		return ' '
	case unicode.IsSpace(r):
		if r == '\n' || r == '\r' || r == 0x2028 || r == 0x2029 || r == 0x85 {
			return '\n'
		}
		return ' '
	case unicode.IsDigit(r):
		// Decimal digits (Nd) come in runs of ten starting at zero
		// (Unicode §4.6), so the value is the distance to the run's start.
		v := 0
		for v < 9 && unicode.IsDigit(r-rune(v)-1) {
			v++
		}
		if c := r - rune(v); unicode.IsDigit(c - 1) {
			// A longer run (mathematical digits): count in tens.
			n := 0
			for unicode.IsDigit(r - rune(n) - 1) {
				n++
			}
			v = n % 10
		}
		return '0' + rune(v)
	}
	if c, ok := confusables[r]; ok {
		return c
	}
	return -1
}

// htmlEntities are the named character references (HTML Living Standard
// §13.5) of the characters that shape addresses and numbers.
var htmlEntities = map[string]byte{
	"commat": '@', "period": '.', "lowbar": '_', "hyphen": '-', "dash": '-', "plus": '+', "colon": ':',
	"sol": '/', "equals": '=', "nbsp": ' ', "amp": '&', "num": '#', "percnt": '%', "quest": '?',
}

// specialASCII marks the ASCII bytes that may start a rewrite in the view:
// '%' (percent-encoding), '\\' (JSON \uXXXX escapes), '&' (HTML
// character references) and '=' (quoted-printable soft line breaks).
var specialASCII = func() (t [256]bool) {
	t['%'], t['\\'], t['&'], t['='] = true, true, true, true
	for c := range 128 {
		t[c] = t[c] || dropASCII[c]
	}
	return t
}()

// special8 flags (bit 7 of each byte, see inRange) the bytes of w (see
// le64) that are >= 0x80 or marked in specialASCII, an '=' only when the
// next byte is a line feed or carriage return or lies in the next word:
// a SWAR test of the eight bytes at once, on their low seven bits (so no
// carry crosses a byte).
func special8(w uint64) uint64 {
	high := w & msb
	x := w &^ msb
	controls := inRange(x, 0, 0x1F) &^ inRange(x, '\t', '\r')
	m := high | controls | eqByte(x, 0x7F) | inRange(x, '%', '&') | eqByte(x, '\\')
	// '=' only where a line break follows it (or may, in the next word);
	// most words hold no '=' at all.
	if eq := eqByte(x, '='); eq != 0 {
		nl := (eqByte(x, '\n') | eqByte(x, '\r')) &^ high
		m |= eq & (nl>>8 | 0x80<<56)
	}
	return m
}

// hexVal returns the value of a hex digit, or -1.
func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// percentByte decodes a %XX escape (RFC 3986 §2.1) at s[0] of a printable
// ASCII byte or a space, else -1.
func percentByte(s string) int {
	if len(s) < 3 {
		return -1
	}
	return printableHex(s[1], s[2])
}

// printableHex is the byte the hex digits h and l write when it is
// printable ASCII or a space, else -1.
func printableHex(h, l byte) int {
	hi, lo := hexVal(h), hexVal(l)
	if hi < 0 || lo < 0 {
		return -1
	}
	b := hi<<4 | lo
	if b < 0x20 || b > 0x7e {
		return -1
	}
	return b
}

// softBreak returns the length of a quoted-printable soft line break
// ("=" then LF or CRLF) at the start of s, or 0.
func softBreak(s string) int {
	switch {
	case len(s) >= 2 && s[1] == '\n':
		return 2
	case len(s) >= 3 && s[1] == '\r' && s[2] == '\n':
		return 3
	}
	return 0
}

// qpByte decodes a quoted-printable escape ("=" and two upper-case hex
// digits, RFC 2045 §6.7 rule 1) at the start of s, or returns -1.
func qpByte(s string) int {
	if len(s) < 3 || s[0] != '=' || isLower(s[1]) || isLower(s[2]) {
		return -1
	}
	hi, lo := hexVal(s[1]), hexVal(s[2])
	if hi < 0 || lo < 0 {
		return -1
	}
	return hi<<4 | lo
}

// qpRune decodes the quoted-printable escapes at the start of s: one of a
// printable ASCII byte, or the two to four of one UTF-8 character. It
// returns the rune and the escapes' length, or 0.
func qpRune(s string) (rune, int) {
	b := qpByte(s)
	switch {
	case b < 0:
		return -1, 0
	case b >= 0x20 && b <= 0x7e:
		return rune(b), 3
	case b < 0xC2:
		return -1, 0
	}
	var enc [utf8.UTFMax]byte
	n := 0
	for n < len(enc) && n*3 < len(s) {
		c := qpByte(s[n*3:])
		if c < 0 || n > 0 && c&0xC0 != 0x80 {
			break
		}
		enc[n] = byte(c)
		n++
		if utf8.FullRune(enc[:n]) {
			break
		}
	}
	r, size := utf8.DecodeRune(enc[:n])
	if r == utf8.RuneError || size != n {
		return -1, 0
	}
	return r, 3 * n
}

// qpEscaped reports whether text holds a quoted-printable escape of the
// bytes that shape addresses and assignments ("=40" '@', "=3D" '=', "=2E"
// '.') or two escapes of UTF-8 bytes in a row: the sign that it is quoted-printable, which Scan then also reads
// decoded.
func qpEscaped(text string) bool {
	for i := strings.IndexByte(text, '='); i >= 0 && i+2 < len(text); {
		// Every escape below starts with a digit or A-F: one test skips
		// the '=' of code and of base64 padding ("key=value").
		if c := text[i+1]; isDigit(c) || c >= 'A' && c <= 'F' {
			switch text[i+1 : i+3] {
			case "40", "3D", "2E":
				return true
			}
			if qpByte(text[i:]) >= 0x80 && qpByte(text[i+3:]) >= 0x80 {
				return true // the escapes of a UTF-8 character ("=C3=A9")
			}
		}
		i = nextEquals(text, i+1)
	}
	return false
}

// nextEquals returns the offset of the first '=' at or after i, or -1:
// the next few bytes are read one by one, so that a text dense with '='
// (a flood of "key=") does not pay a call of strings.IndexByte per '=',
// and the rest by strings.IndexByte (vectorised), as in prose.
func nextEquals(text string, i int) int {
	for end := min(len(text), i+16); i < end; i++ {
		if text[i] == '=' {
			return i
		}
	}
	if i >= len(text) {
		return -1
	}
	if k := strings.IndexByte(text[i:], '='); k >= 0 {
		return i + k
	}
	return -1
}

// hasQPEscape reports whether s holds any quoted-printable escape.
func hasQPEscape(s string) bool {
	for i := strings.IndexByte(s, '='); i >= 0; {
		if qpByte(s[i:]) >= 0 {
			return true
		}
		k := strings.IndexByte(s[i+1:], '=')
		if k < 0 {
			break
		}
		i += 1 + k
	}
	return false
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
		v := hexVal(h)
		if v < 0 {
			return -1
		}
		r = r<<4 | rune(v)
	}
	if r < 0x20 || r >= 0xD800 && r <= 0xDFFF {
		return -1
	}
	return r
}

// hexEscape decodes a \xHH escape at the start of s of a printable ASCII
// byte or a space, else -1.
func hexEscape(s string) int {
	if len(s) < 4 || s[0] != '\\' || s[1] != 'x' {
		return -1
	}
	return printableHex(s[2], s[3])
}

// jsonShortEscape decodes a JSON two-character escape (\n \t \r \" \\
// \/ \b \f) at the start of s into its byte, or returns -1.
func jsonShortEscape(s string) int {
	if len(s) < 2 || s[0] != '\\' {
		return -1
	}
	switch s[1] {
	case 'n':
		return '\n'
	case 't':
		return '\t'
	case 'r':
		return '\r'
	case '"', '\\', '/':
		return int(s[1])
	case 'b', 'f':
		return ' '
	}
	return -1
}

// htmlRef decodes an HTML character reference at s[0] == '&': "&#64;",
// "&#x40;" (the ';' of a numeric one may be missing) or a name of
// htmlEntities with its ';'. It returns the rune and the reference's
// length, or -1.
func htmlRef(s string) (rune, int) {
	if len(s) < 4 {
		return -1, 0
	}
	if s[1] == '#' {
		i, base := 2, 10
		if s[2] == 'x' || s[2] == 'X' {
			i, base = 3, 16
		}
		var r rune
		j := i
		for ; j < len(s) && j-i < 7; j++ {
			v := hexVal(s[j])
			if v < 0 || base == 10 && v > 9 {
				break
			}
			r = r*rune(base) + rune(v)
		}
		if j == i || r < 0x20 || r > unicode.MaxRune || r >= 0xD800 && r <= 0xDFFF {
			return -1, 0
		}
		if j < len(s) && s[j] == ';' {
			return r, j + 1
		}
		// Without its ';' a numeric reference still decodes (HTML
		// Living Standard §13.2.5.80, a parse error browsers forgive):
		// "mario&#64example.com" shows the address.
		return r, j
	}
	j := 1
	for j < len(s) && j < 10 && isAlpha(s[j]) {
		j++
	}
	if j >= len(s) || s[j] != ';' {
		return -1, 0
	}
	if b, ok := htmlEntities[s[1:j]]; ok {
		return rune(b), j + 1
	}
	return -1, 0
}

// nfkcSame caches, for runes below 0x3000, whether NFKC leaves the rune
// alone (true for all but a few hundred), so that common accented letters
// cost a table look-up.
var (
	nfkcOnce sync.Once
	nfkcSame [0x3000 / 64]uint64
)

func nfkcIdentity(r rune, s string) bool {
	if r >= 0x3000 {
		return norm.NFKC.IsNormalString(s)
	}
	nfkcOnce.Do(func() {
		var buf [4]byte
		for c := rune(0x80); c < 0x3000; c++ {
			n := utf8.EncodeRune(buf[:], c)
			if norm.NFKC.IsNormal(buf[:n]) && norm.NFKC.String(string(buf[:n])) == string(buf[:n]) {
				nfkcSame[c/64] |= 1 << (c % 64)
			}
		}
	})
	return nfkcSame[r/64]&(1<<(r%64)) != 0
}

// plainBMP has bit r set for each rune r of the Basic Multilingual Plane
// that normaliseInto keeps as it is: not fullwidth ASCII, no script
// digit, not dropped (dropRune), not mapped (mapRune) and its own NFKC
// form (nfkcIdentity). Every one of those is a function of the rune
// alone, so the bitmap (8 KB, built on first use) answers them in one
// test: CJK, Cyrillic or Greek text costs a lookup per rune instead of
// Unicode table searches.
var (
	plainBMP  [0x10000 / 64]uint64
	plainOnce sync.Once

	// dropBMP has bit r set for each rune r of the BMP that dropRune
	// drops (8 KB, built with plainBMP): a text full of zero-width
	// characters costs a lookup per one.
	dropBMP [0x10000 / 64]uint64
)

// dropRuneBMP is dropRune answered from dropBMP in the BMP.
func dropRuneBMP(r rune) bool {
	if r >= 0x10000 || r < 0 {
		return dropRune(r)
	}
	plainRune(0x80) // builds the bitmaps
	return dropBMP[r/64]&(1<<(r%64)) != 0
}

// plainRune reports whether normaliseInto keeps r (in the BMP) as it is.
func plainRune(r rune) bool {
	if r >= 0x10000 {
		return false
	}
	plainOnce.Do(func() {
		var buf [4]byte
		for c := rune(0x80); c < 0x10000; c++ {
			// Surrogates, fullwidth forms and script digits are not
			// dropped (no Cf, Mn or Me): ASCII neither, left at 0.
			if c >= 0xD800 && c <= 0xDFFF || c >= 0xFF01 && c <= 0xFF5E || scriptDigit(c) >= 0 {
				continue
			}
			if dropRune(c) {
				dropBMP[c/64] |= 1 << (c % 64)
				continue
			}
			if mapRune(c) >= 0 {
				continue
			}
			if n := utf8.EncodeRune(buf[:], c); nfkcIdentity(c, string(buf[:n])) {
				plainBMP[c/64] |= 1 << (c % 64)
			}
		}
	})
	return plainBMP[r/64]&(1<<(r%64)) != 0
}

// viewBuilder writes a view lazily: until the first change nothing is
// copied.
type viewBuilder struct {
	src     string
	b       []byte
	marks   []viewMark
	last    int // src[last:] not yet copied
	started bool
}

func (w *viewBuilder) replace(from, to int, repl string) {
	if !w.started {
		w.started = true
		if cap(w.b) < len(w.src)+16 {
			w.b = make([]byte, 0, len(w.src)+len(w.src)/8+16)
		}
	}
	w.b = append(w.b, w.src[w.last:from]...)
	v := len(w.b)
	w.b = append(w.b, repl...)
	w.marks = append(w.marks, viewMark{v: int32(v), ve: int32(len(w.b)), o: int32(from), oe: int32(to)})
	w.last = to
}

func (w *viewBuilder) replaceByte(from, to int, c byte) {
	if c < 0x80 {
		w.replace(from, to, asciiString[c])
		return
	}
	w.replace(from, to, string(rune(c)))
}

// asciiString holds the one-byte strings, so that rewrites to ASCII
// allocate nothing.
var asciiString = func() (t [128]string) {
	for i := range t {
		t[i] = string(rune(i))
	}
	return t
}()

// scriptDigit returns the value of a decimal digit of the scripts the
// fast path knows, or -1.
func scriptDigit(r rune) rune {
	for _, zero := range [...]rune{0x0660, 0x06F0, 0x0966, 0x09E6} {
		if r >= zero && r <= zero+9 {
			return r - zero
		}
	}
	return -1
}

// normalise builds the normalised view of text: NFKC per rune (fullwidth
// digits and letters, ligatures, mathematical alphanumerics become ASCII),
// decimal digits of every script mapped to ASCII, format characters and
// combining marks dropped, homoglyphs, dashes and spaces mapped,
// percent-escapes of printable ASCII, JSON \uXXXX escapes, \xHH escapes and HTML
// character references decoded. It returns ok=false when the view would
// equal text, so callers can skip it. Texts over 2 GiB are not normalised
// (offsets are 32-bit).
func normalise(text string) (v view, ok bool) {
	v, ok, _, _ = normaliseInto(text, nil, nil, false)
	return v, ok
}

// normaliseInto is normalise writing the view into buf and its marks into
// marks (both reused by the caller across scans). The view's text aliases
// buf: it is valid until buf is reused. It returns the buffers for reuse.
// With qp set, quoted-printable escapes ("=40", RFC 2045 §6.7 rule 1: '='
// and two upper-case hex digits) of printable ASCII are decoded too, and
// runs of them that spell one UTF-8 character ("=EF=BC=A0").
func normaliseInto(text string, buf []byte, marks []viewMark, qp bool) (v view, ok bool, _ []byte, _ []viewMark) {
	if len(text) >= 1<<31-1 {
		return view{}, false, buf, marks
	}
	w := viewBuilder{src: text, b: buf[:0], marks: marks[:0]}
	var tmp [utf8.UTFMax]byte
	var nfkc []byte
	for i := 0; i < len(text); {
		c := text[i]
		if c < 0x80 {
			if !specialASCII[c] {
				i++
				// Most text is plain ASCII: skip it eight bytes at a time,
				// up to the first byte that is not.
				for i+8 <= len(text) {
					w := le64(text[i:])
					m := special8(w)
					if qp {
						m |= eqByte(w&^msb, '=') &^ (w & msb)
					}
					if m != 0 {
						i += bits.TrailingZeros64(m) >> 3
						break
					}
					i += 8
				}
				continue
			}
			switch c {
			case '%':
				if b := percentByte(text[i:]); b >= 0 {
					// Encoded again ("%2540" is "%40" once decoded, '@'
					// twice): decode while the result is a '%' before two
					// hex digits.
					n := 3
					for b == '%' && i+n+2 <= len(text) {
						c := printableHex(text[i+n], text[i+n+1])
						if c < 0 {
							break
						}
						b, n = c, n+2
					}
					w.replaceByte(i, i+n, byte(b))
					i += n
					continue
				}
			case '\\':
				if r := jsonEscape(text[i:]); r >= 0 {
					w.replace(i, i+6, normRune(r, &nfkc))
					i += 6
					continue
				}
				// A \xHH escape of C, JavaScript and Python strings (ISO C
				// §6.4.4.4, ECMA-262 §12.9.4): "mario\x40example.com" is
				// the address it shows to a reader (and to a model).
				if b := hexEscape(text[i:]); b >= 0 {
					w.replaceByte(i, i+4, byte(b))
					i += 4
					continue
				}
				// The two-character escapes of JSON strings (RFC 8259 §7):
				// tool results and arguments are JSON inside a JSON string,
				// so "a\n4111 …" must read as a line break before the number.
				if b := jsonShortEscape(text[i:]); b >= 0 {
					// An escaped backslash before an escape is that
					// escape escaped again (JSON in a JSON string:
					// "\\u0040" reads "\u0040" once decoded, '@' twice).
					if b == '\\' {
						if r := jsonEscape(text[i+1:]); r >= 0 {
							w.replace(i, i+7, normRune(r, &nfkc))
							i += 7
							continue
						}
						if c := hexEscape(text[i+1:]); c >= 0 {
							w.replaceByte(i, i+5, byte(c))
							i += 5
							continue
						}
					}
					w.replaceByte(i, i+2, byte(b))
					i += 2
					continue
				}
			case '=':
				// A quoted-printable soft line break (RFC 2045 §6.7 rule
				// 5): "=" ending a line joins it to the next, so an
				// address or a number pasted from a raw e-mail reads whole.
				// Not after another '=': "==" ends base64 padding.
				if n := softBreak(text[i:]); n > 0 && (i == 0 || text[i-1] != '=') {
					w.replace(i, i+n, "")
					i += n
					continue
				}
				if qp {
					if r, n := qpRune(text[i:]); n > 0 {
						w.replace(i, i+n, normRune(r, &nfkc))
						i += n
						continue
					}
				}
			case '&':
				if r, n := htmlRef(text[i:]); n > 0 {
					// A reference escaped again ("&amp;#64;"): the '&' it
					// decodes to starts the next one (htmlRef does not
					// read the byte at its start, here the first one's
					// last).
					for k := 0; r == '&' && k < 4; k++ {
						r2, n2 := htmlRef(text[i+n-1:])
						if n2 == 0 {
							break
						}
						r, n = r2, n+n2-1
					}
					w.replace(i, i+n, normRune(r, &nfkc))
					i += n
					continue
				}
			default:
				if dropASCII[c] {
					w.replace(i, i+1, "")
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(text[i:])
		if plainRune(r) {
			// The view keeps it (most of the text of non-Latin scripts).
			i += size
			continue
		}
		// Fast paths for the common rewrites: fullwidth ASCII (NFKC maps
		// U+FF01–U+FF5E to U+0021–U+007E) and the decimal digits of the
		// Arabic-Indic, extended Arabic-Indic, Devanagari and Bengali
		// scripts.
		if r >= 0xFF01 && r <= 0xFF5E {
			w.replace(i, i+size, asciiString[r-0xFEE0])
			i += size
			continue
		}
		if d := scriptDigit(r); d >= 0 {
			w.replace(i, i+size, asciiString['0'+d])
			i += size
			continue
		}
		switch {
		case r == utf8.RuneError && size == 1:
		case dropRuneBMP(r):
			w.replace(i, i+size, "")
		default:
			if m := mapRune(r); m >= 0 {
				if m < 0x80 {
					w.replace(i, i+size, asciiString[m])
					break
				}
				n := utf8.EncodeRune(tmp[:], m)
				w.replace(i, i+size, string(tmp[:n]))
				break
			}
			if !nfkcIdentity(r, text[i:i+size]) {
				nfkc = norm.NFKC.AppendString(nfkc[:0], text[i:i+size])
				w.replace(i, i+size, mapString(nfkc))
			}
		}
		i += size
	}
	if !w.started {
		return view{}, false, w.b, w.marks
	}
	w.b = append(w.b, text[w.last:]...)
	if buf == nil {
		return view{text: string(w.b), marks: w.marks}, true, nil, nil
	}
	return view{text: unsafe.String(unsafe.SliceData(w.b), len(w.b)), marks: w.marks}, true, w.b, w.marks
}

// dropBreaks appends to dst the view offsets where the view dropped an
// invisible character of text (a format character, a control, a variation
// selector or U+FFFD, also written as an escape), in order. Dropped
// combining marks are left out: they belong to the letter before them.
func dropBreaks(text string, marks []viewMark, dst []int32) []int32 {
	// A text with many dropped characters drops the same one again and
	// again ("\u200b"): the last rune's answer is kept.
	lastR, lastMark := rune(-1), false
	for _, m := range marks {
		if m.v != m.ve {
			continue
		}
		r, _ := utf8.DecodeRuneInString(text[m.o:m.oe])
		if r != lastR {
			lastR, lastMark = r, unicode.IsMark(r)
		}
		if lastMark {
			continue
		}
		if n := len(dst); n > 0 && dst[n-1] == m.v {
			continue
		}
		dst = append(dst, m.v)
	}
	return dst
}

// normRune returns the view text of a decoded rune (from an escape).
// An ASCII result is a slice of asciiBytes, not a new string: a flood of
// escapes ("=3D" after "=3D") costs no allocation per escape.
func normRune(r rune, buf *[]byte) string {
	if r < 0x80 {
		if dropASCII[r] {
			return ""
		}
		return asciiBytes[r : r+1]
	}
	if dropRune(r) {
		return ""
	}
	if m := mapRune(r); m >= 0 {
		if m < 0x80 {
			return asciiBytes[m : m+1]
		}
		return string(m)
	}
	if r >= fullwidthFirst && r <= fullwidthLast {
		// The fullwidth forms of ASCII, whose NFKC form is the ASCII
		// character (TestFullwidthFormsAreTheirNFKC).
		c := r - fullwidthOffset
		return asciiBytes[c : c+1]
	}
	*buf = norm.NFKC.AppendString((*buf)[:0], string(r))
	return mapString(*buf)
}

// The fullwidth forms of ASCII's '!' to '~': U+FF01 to U+FF5E, each
// fullwidthOffset above its ASCII character.
const (
	fullwidthFirst, fullwidthLast = 0xFF01, 0xFF5E
	fullwidthOffset               = 0xFEE0
)

// asciiBytes is every ASCII byte at its own offset: asciiBytes[c:c+1] is
// the one-byte string of c.
var asciiBytes = func() string {
	b := make([]byte, 0x80)
	for i := range b {
		b[i] = byte(i)
	}
	return string(b)
}()

// mapString applies mapRune to the runes of an NFKC result (fullwidth
// forms decompose to ASCII, others may decompose to homoglyphs).
func mapString(b []byte) string {
	s := string(b)
	if !strings.ContainsFunc(s, func(r rune) bool { return r >= 0x80 }) {
		return s
	}
	return strings.Map(func(r rune) rune {
		if r < 0x80 {
			return r
		}
		if dropRune(r) {
			return -1
		}
		if m := mapRune(r); m >= 0 {
			return m
		}
		return r
	}, s)
}
