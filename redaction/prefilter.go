package redaction

import (
	"math/bits"
	"slices"
	"strings"
)

// The prefilter is the one pass over a text that every built-in detector
// starts from: it collects the literal anchors of all of them (digit runs,
// '@', ':' next to hex digits, runs of base64 and hex, 16-character
// tokens, capitalised words, and every occurrence of a keyword of the
// keyword index: gitleaks' rule keywords, "://", the words that write an
// e-mail address out). Validators (Luhn, MOD 97-10, phone metadata,
// regular expressions) then only look at those candidates, so the cost of
// a scan is one linear pass plus work proportional to the candidates.
// Where the CPU has AVX2, the byte classes the anchors are made of are
// computed 32 bytes per instruction (classMasksAVX2, prefilterBlocks) and
// the keywords found in a pass of their own; elsewhere one pass reads
// eight bytes at a time in a 64-bit word (prefilterSWAR). Both find the
// same anchors, which the tests check against their definitions.

// lowerByte lower-cases ASCII letters.
var lowerByte = func() (t [256]byte) {
	for i := range t {
		t[i] = byte(i)
		if i >= 'A' && i <= 'Z' {
			t[i] = byte(i) + 'a' - 'A'
		}
	}
	return t
}()

// kwHit is one keyword occurrence: the keyword's id and its offset.
type kwHit struct{ id, pos int32 }

// cmpHit orders hits by offset, then by keyword id.
func cmpHit(a, b kwHit) int {
	if a.pos != b.pos {
		return int(a.pos - b.pos)
	}
	return int(a.id - b.id)
}

// anchors are the candidates of one text.
type anchors struct {
	digits []int32    // start of every maximal run of ASCII digits
	ats    []int32    // every '@'
	colons []int32    // every ':' with a hex digit or ':' on one side (IPv6)
	runs   [][2]int32 // maximal runs of base64 characters of ≥ minEncodedLen bytes
	tok16  []int32    // alphanumeric tokens of exactly 16 bytes (fiscal codes)
	caps   []int32    // word starts with an upper-case ASCII letter or a non-ASCII byte
	kw     []kwHit    // keyword occurrences, by offset
	kwOut  bool       // kw was appended out of order (prefilter sorts it)
	hex2   []int32    // two hex digits followed by ' ' or ':' and another hex digit (spaced hex)
}

func (a *anchors) reset() {
	a.digits, a.ats, a.colons, a.runs, a.tok16, a.caps, a.kw, a.hex2 = a.digits[:0], a.ats[:0], a.colons[:0], a.runs[:0], a.tok16[:0], a.caps[:0], a.kw[:0], a.hex2[:0]
	a.kwOut = false
}

// keywordIndex finds every occurrence of a set of lower-case keywords (at
// least two bytes each) in one pass, ASCII case-insensitively. It is a
// hashed q-gram filter, the HASH table of Wu and Manber's multi-pattern
// search (S. Wu, U. Manber, "A fast algorithm for multi-pattern
// searching", 1994) without its SHIFT table, which keywords of two bytes
// would leave with nothing to skip: the three bytes at every offset are
// read as a key (see kwKey) that folds ASCII case and says whether the
// offset starts a word, and a bitmap holds the hashes of the keys of each
// keyword's least likely three bytes (see gramOffset; a two-byte keyword
// with each byte that may follow it, see thirds). One multiply and one
// bit test reject almost every offset; at the few left, the keywords of
// the key are compared in full where they would start.
//
// Keywords added with addWord only match at word starts (after a byte
// that is not an ASCII letter).
type keywordIndex struct {
	filter   [1 << kwFilterBits / 64]uint64 // hashes of keyword keys
	buckets  [][]kwEntry                    // by hash >> kwBucketShift, by id
	words    []string
	wordOnly []bool
	gramOff  []int32 // by id: the offset in the keyword of the bytes the filter keys on
	// thirds, when set for a two-byte keyword, are the bytes that may
	// follow it in a hit that matters (end: its hit may end the text),
	// a necessary condition read off keep; the filter lets only those
	// through.
	thirds []*thirdBytes
	// keep, when set for a keyword id, is a necessary condition for a hit
	// of that keyword to matter (every consumer of the keyword rejects a
	// hit it fails), checked before the hit is recorded.
	keep []func(text string, p int) bool
}

// thirdBytes is a set of bytes, and whether the end of the text is in it.
type thirdBytes struct {
	in  [256]bool
	end bool
}

// kwEntry is one key of one keyword in a bucket: the key of the
// keyword's bytes at offset off (see gramOffset), with what hitsAt
// compares of the keyword: its first eight bytes (fewer when it is
// shorter) as le64 reads them, mask selecting them, and its length.
type kwEntry struct {
	key      uint32
	id       int32
	off      int32
	n        int32
	wordOnly bool
	pre      uint64
	mask     uint64
}

// newKWEntry is the entry of the key k of keyword kw (lower case), of id
// id, at offset off.
func newKWEntry(k uint32, id int32, off int, kw string, wordOnly bool) kwEntry {
	e := kwEntry{key: k, id: id, off: int32(off), n: int32(len(kw)), wordOnly: wordOnly}
	for i := 0; i < 8 && i < len(kw); i++ {
		e.pre |= uint64(kw[i]) << (8 * i)
		e.mask |= 0xFF << (8 * i)
	}
	return e
}

// lower8 lower-cases the ASCII letters among the eight bytes of w
// (lowerByte on each byte): bit 5 is set on the bytes in 'A'..'Z', found
// on their low seven bits, less the bytes with the high bit set.
func lower8(w uint64) uint64 {
	return w | (inRange(w&^msb, 'A', 'Z')&^w)>>2
}

// Sizes of the keyword filter: a 2^16-bit bitmap (8 KB, it stays in the
// first-level cache) for a few hundred keywords, in buckets of 64 hashes.
const (
	kwFilterBits  = 16
	kwBucketShift = 6
)

// kwKey is the filter's key of an offset whose next three bytes are b0,
// b1, b2: the bytes with bit 5 set (which lower-cases ASCII letters and
// merges a few pairs of other bytes, so it can only let more through),
// then bit 5 cleared on each byte that starts a word (b0 when wordStart,
// b1 and b2 when the byte before them is not an ASCII letter). It is a
// function of (wordStart, b0|0x20, b1|0x20, b2|0x20) that tells apart
// offsets that do and do not start a word, and prefilter computes it for
// eight offsets at once.
func kwKey(b0, b1, b2 byte, wordStart bool) uint32 {
	k := uint32(b0|0x20) | uint32(b1|0x20)<<8 | uint32(b2|0x20)<<16
	if wordStart {
		k ^= 0x20
	}
	if !isAlpha(b0) {
		k ^= 0x20 << 8
	}
	if !isAlpha(b1) {
		k ^= 0x20 << 16
	}
	return k
}

// kwHash hashes a 24-bit key into kwFilterBits bits: Fibonacci hashing
// (Knuth, TAOCP vol. 3, §6.4), a multiply by 2^32/φ modulo 2^32 keeping
// the top bits (32-bit lanes, so that kwCandAVX2 computes it eight keys
// at a time).
func kwHash(k uint32) uint32 { return k * 0x9E3779B1 >> (32 - kwFilterBits) }

// add registers kw (lower case) and returns its id; adding a keyword twice
// returns the first id (and makes it match anywhere if either call did).
func (ix *keywordIndex) add(kw string) int32 { return ix.addKW(kw, false) }

// addWord registers kw to be matched at word starts only.
func (ix *keywordIndex) addWord(kw string) int32 { return ix.addKW(kw, true) }

func (ix *keywordIndex) addKW(kw string, wordOnly bool) int32 {
	kw = strings.ToLower(kw)
	for i, w := range ix.words {
		if w == kw {
			ix.wordOnly[i] = ix.wordOnly[i] && wordOnly
			return int32(i)
		}
	}
	ix.words = append(ix.words, kw)
	ix.wordOnly = append(ix.wordOnly, wordOnly)
	return int32(len(ix.words) - 1)
}

// build computes the filter and the buckets of the keywords: call it once
// all are added and keep and thirds are set (before it, prefilter finds
// no keyword).
func (ix *keywordIndex) build() {
	clear(ix.filter[:])
	ix.buckets = make([][]kwEntry, 1<<(kwFilterBits-kwBucketShift))
	ix.gramOff = ix.gramOff[:0]
	for id, kw := range ix.words {
		ix.gramOff = append(ix.gramOff, gramOffset(kw, ix.wordOnly[id], ix.inner(kw)))
		ix.addKeys(kw, int32(id), true)
		if !ix.wordOnly[id] {
			ix.addKeys(kw, int32(id), false)
		}
	}
}

// gramOffset returns the offset of the three bytes of kw that the filter
// keys on: the ones least likely in text, so that fewer offsets of text
// pass the filter for kw than with its first three (the first bytes of
// "token", "confluence", "codecov" are common in any text, "flu" and
// "cov" much less). A byte's likelihood is its frequency in English
// letters (R. Lewand, "Cryptological Mathematics", 2000), with fixed
// shares for spaces, digits and punctuation ('=' of assignments as
// common as '-' or ':'); three bytes are as likely as the product of
// theirs, but one byte three times 25 times more (floods and rules of
// one byte repeat it: "-----BEGIN"), and so are three bytes inside
// another keyword (inner: bit d set for the bytes at offset d). At offset 0 the key also says whether the
// offset starts a word, which rules out four in five offsets of text
// for a keyword matched at word starts only.
func gramOffset(kw string, wordOnly bool, inner uint64) int32 {
	best, off := 0.0, int32(0)
	for d := 0; d+3 <= len(kw); d++ {
		p := byteShare(kw[d]) * byteShare(kw[d+1]) * byteShare(kw[d+2])
		if d < 64 && inner>>d&7 != 0 {
			p *= 25 // found wherever the other keyword is, in its context
		}
		if kw[d] == kw[d+1] && kw[d+1] == kw[d+2] {
			// One byte three times ("---" of "-----begin") is found at
			// every offset but the last two of a longer run of it.
			p *= 25
		}
		if d == 0 && wordOnly {
			p /= 5
		}
		if d == 0 || p < best {
			best, off = p, int32(d)
		}
	}
	return off
}

// inner returns the bytes of kw inside an occurrence of another keyword
// of three bytes or more ("api" and "key" in "co_api_key"), as a bit set
// by offset (the first 64): gramOffset counts three bytes that hold one
// as 25 times as likely, since a text that holds kw's neighbours
// ("api_key = …") holds the other keyword's.
func (ix *keywordIndex) inner(kw string) uint64 {
	var in uint64
	for _, w := range ix.words {
		if len(w) < 3 || len(w) >= len(kw) {
			continue
		}
		for i := 0; i+len(w) <= len(kw) && i < 64; i++ {
			if kw[i:i+len(w)] == w {
				for k := i; k < i+len(w) && k < 64; k++ {
					in |= 1 << k
				}
			}
		}
	}
	return in
}

// byteShare is the share of byte c in text, in percent (see gramOffset).
func byteShare(c byte) float64 {
	const letters = "etaoinshrdlcumwfgypbvkjxqz" // by frequency
	shares := [...]float64{12.7, 9.1, 8.2, 7.5, 7.0, 6.7, 6.3, 6.1, 6.0, 4.3, 4.0, 2.8, 2.8, 2.4, 2.4, 2.2, 2.0, 2.0, 1.9, 1.5, 1.0, 0.8, 0.15, 0.15, 0.1, 0.07}
	if k := strings.IndexByte(letters, lowerByte[c]); k >= 0 {
		return shares[k]
	}
	switch {
	case c == ' ':
		return 15
	case isDigit(c):
		return 1
	case c == '.' || c == ',':
		return 1.5
	case c == '-' || c == '_' || c == '/' || c == ':' || c == '\'' || c == '"' || c == '=':
		return 0.5
	}
	return 0.2
}

// addKeys enters into the filter and the buckets the keys of kw at
// offsets of text that do (wordStart) or do not start a word.
func (ix *keywordIndex) addKeys(kw string, id int32, wordStart bool) {
	d := int(ix.gramOff[id])
	if d > 0 {
		// Whether the bytes at d start a word is kw's own: one key.
		wordStart = !isAlpha(kw[d-1])
	}
	thirds := []byte{at(kw, d+2)}
	if len(kw) == 2 {
		// Every byte that may follow (the end of the text reads as 0).
		thirds = thirds[:0]
		var t *thirdBytes
		if int(id) < len(ix.thirds) {
			t = ix.thirds[id]
		}
		for c := range 256 {
			if t == nil || t.in[c] || c == 0 && t.end {
				thirds = append(thirds, byte(c))
			}
		}
	}
	for _, c := range thirds {
		k := kwKey(kw[d], kw[d+1], c, wordStart)
		h := kwHash(k)
		ix.filter[h/64] |= 1 << (h % 64)
		e := newKWEntry(k, id, d, kw, ix.wordOnly[id])
		b := &ix.buckets[h>>kwBucketShift]
		if !slices.Contains(*b, e) {
			*b = append(*b, e)
		}
	}
}

// hasPrefixFold reports whether s[i:] starts with the lower-case word w,
// ASCII case-insensitively.
func hasPrefixFold(s string, i int, w string) bool {
	if len(s)-i < len(w) {
		return false
	}
	for k := 0; k < len(w); k++ {
		if lowerByte[s[i+k]] != w[k] {
			return false
		}
	}
	return true
}

// pass returns 1 when the key k (its low 24 bits) passes the filter, else
// 0.
func (ix *keywordIndex) pass(k uint32) uint64 {
	h := kwHash(k & 0xFFFFFF)
	return ix.filter[h/64] >> (h % 64) & 1
}

// verify records the keywords whose filter bytes (see gramOffset) are at
// the offsets i+j whose bit j of cand is set, given the keys of the block
// at i and of the next one.
func (ix *keywordIndex) verify(text string, i int, cand, cKey, nKey uint64, a *anchors) {
	for ; cand != 0; cand &= cand - 1 {
		j := bits.TrailingZeros64(cand)
		q := i + j
		// The key of offset q: three bytes of the 16 of both blocks.
		k := uint32(cKey>>(8*j)) & 0xFFFFFF
		if j > 5 {
			k = uint32(cKey>>(8*j)|nKey<<(64-8*j)) & 0xFFFFFF
		}
		ix.hitsAt(text, q, k, a)
	}
}

// hitsAt records the keywords whose filter bytes are at offset q, whose
// key (kwKey) is k. A keyword's first eight bytes are compared in one
// load (lower8), the rest, if any, byte by byte.
func (ix *keywordIndex) hitsAt(text string, q int, k uint32, a *anchors) {
	b := ix.buckets[kwHash(k)>>kwBucketShift]
	for i := range b {
		e := &b[i]
		p := q - int(e.off)
		if e.key != k || p < 0 || len(text)-p < int(e.n) {
			continue
		}
		var w uint64
		if len(text)-p >= 8 {
			w = le64(text[p:])
		} else {
			w = le64Tail(text, p)
		}
		if lower8(w)&e.mask != e.pre || e.n > 8 && !hasPrefixFold(text, p+8, ix.words[e.id][8:]) || e.wordOnly && p > 0 && isAlpha(text[p-1]) {
			continue
		}
		id := e.id
		if int(id) < len(ix.keep) && ix.keep[id] != nil && !ix.keep[id](text, p) {
			continue
		}
		h := kwHit{id, int32(p)}
		if n := len(a.kw); n > 0 && cmpHit(a.kw[n-1], h) > 0 {
			a.kwOut = true
		}
		a.kw = append(a.kw, h)
	}
}

// le64 returns s[0:8] as a little-endian uint64 (one load: the compiler
// merges the byte loads, as for encoding/binary).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// le64Tail is le64 of text[i:] padded with zero bytes past the end of
// text.
func le64Tail(text string, i int) uint64 {
	var w uint64
	for k := 0; k < 8 && i+k < len(text); k++ {
		w |= uint64(text[i+k]) << (8 * k)
	}
	return w
}

// SWAR ("SIMD within a register") byte masks: a uint64 holds eight bytes
// of text, byte k in bits 8k..8k+7, and a mask has bit 8k+7 set where
// byte k has a property. The tests are exact per byte (no carry crosses
// a byte) when every byte is below 0x80; callers clear the high bit first
// and mask out the bytes that had it (the zero-byte and byte-range tests
// of H. S. Warren, "Hacker's Delight", 2nd ed., §6-1).
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// inRange flags the bytes of x (each below 0x80) in [lo, hi].
func inRange(x uint64, lo, hi byte) uint64 {
	return (x + (0x80-uint64(lo))*lsb) &^ (x + (0x7F-uint64(hi))*lsb) & msb
}

// eqByte flags the bytes of x (each below 0x80) equal to c.
func eqByte(x uint64, c byte) uint64 { return ^((x ^ uint64(c)*lsb) + 0x7F*lsb) & msb }

// appendOffsets appends base plus the byte index of every flag of mask.
func appendOffsets(dst []int32, mask uint64, base int) []int32 {
	for ; mask != 0; mask &= mask - 1 {
		dst = append(dst, int32(base+bits.TrailingZeros64(mask)>>3))
	}
	return dst
}

// closeRun records the base64 run text[s:e] (with up to two '=' after it)
// when it is long enough to decode.
func (a *anchors) closeRun(text string, s, e int) {
	for k := 0; k < 2 && at(text, e) == '='; k++ {
		e++
	}
	if e-s >= minEncodedLen {
		a.runs = append(a.runs, [2]int32{int32(s), int32(e)})
	}
}

// prefilter fills a with the anchors of text in one pass that reads text
// eight bytes at a time: every anchor but the long ones is a property of
// a byte and its neighbours (a digit after a non-digit, a ':' next to a
// hex digit, ...), computed for the eight bytes at once on byte masks
// (the masks of the block before and after give the neighbours across
// block edges); tokens and base64 runs are measured by two counters, the
// lengths of the token and of the run that reach the current block: only
// the first of them to end in a block can be as long as the anchors need
// (16 and 12 bytes, more than a block). The keyword filter's keys (see
// kwKey) of the block's eight offsets come from the same masks. The text
// is read as if followed by zero bytes: they are no anchor and end every
// token and run, as the end of the text does.
func (ix *keywordIndex) prefilter(text string, a *anchors) {
	if useBlocks { // faster from texts of one byte (a 40-byte text: 240 ns against 300)
		ix.prefilterBlocks(text, a)
		return
	}
	ix.prefilterSWAR(text, a)
}

// prefilterSWAR is prefilter on eight bytes at a time, in one pass.
func (ix *keywordIndex) prefilterSWAR(text string, a *anchors) {
	a.reset()
	n := len(text)
	// Masks of the current block (c...) and the last byte of the block
	// before (p..., in bit 63): none before the text.
	var cw, cHigh, cDigit, cLetter, cAlnum, cHex, cRun, cColon, cSpcol, cKey uint64
	var pDigit, pHigh, pAlnum, pHexCol, pRun uint64
	tok, run := 0, 0 // lengths of the token and the run ending at i-1
	for i := -8; i < n; i += 8 {
		// Masks of the next block.
		var w uint64
		if i+16 <= n {
			w = le64(text[i+8:])
		} else {
			w = le64Tail(text, i+8)
		}
		nHigh := w & msb
		ascii := nHigh ^ msb
		x := w &^ msb
		y := x | 0x20*lsb // ASCII letters lower-cased (and some punctuation moved)
		nDigit := inRange(x, '0', '9') & ascii
		nLetter := inRange(y, 'a', 'z') & ascii
		nAlnum := nLetter | nDigit
		nHex := inRange(y, 'a', 'f')&ascii | nDigit
		// '+', '-' and '/' are the odd bytes of 0x2B–0x2F: bit 0 moved to bit 7.
		nRun := nAlnum | (inRange(x, '+', '/')&(x<<7)|eqByte(x, '_'))&ascii
		nColon := eqByte(x, ':') & ascii
		nSpcol := nColon | eqByte(x, ' ')&ascii
		nKey := (w | 0x20*lsb) ^ (^(nLetter<<8|cLetter>>56)&msb)>>2 // kwKey's bytes
		if i >= 0 {
			// The keyword filter at the block's eight offsets (the last
			// two read the next block).
			// The keyword filter at the block's eight offsets (the last
			// two read the next block), without branches: bit j of cand
			// says that offset i+j passed.
			cand := ix.pass(uint32(cKey)) | ix.pass(uint32(cKey>>8))<<1 | ix.pass(uint32(cKey>>16))<<2 |
				ix.pass(uint32(cKey>>24))<<3 | ix.pass(uint32(cKey>>32))<<4 | ix.pass(uint32(cKey>>40))<<5 |
				ix.pass(uint32(cKey>>48|nKey<<16))<<6 | ix.pass(uint32(cKey>>56|nKey<<8))<<7
			if cand != 0 {
				ix.verify(text, i, cand, cKey, nKey, a)
			}
			cx := cw &^ msb
			upper := inRange(cx, 'A', 'Z') &^ cHigh
			lead := cHigh & (cw << 1) // >= 0xC0
			at := eqByte(cx, '@') &^ cHigh
			digits := cDigit &^ (cDigit<<8 | pDigit>>56)
			caps := (upper | lead&^(cHigh<<8|pHigh>>56)) &^ (cAlnum<<8 | pAlnum>>56)
			hexCol := cHex | cColon
			colons := cColon & (hexCol<<8 | pHexCol>>56 | hexCol>>8 | (nHex|nColon)<<56)
			hex2 := cHex &^ (cRun<<8 | pRun>>56) & (cHex>>8 | nHex<<56) & (cSpcol>>16 | nSpcol<<48) & (cHex>>24 | nHex<<40)
			if digits|caps|colons|hex2|at != 0 {
				a.digits = appendOffsets(a.digits, digits, i)
				a.caps = appendOffsets(a.caps, caps, i)
				a.colons = appendOffsets(a.colons, colons, i)
				a.hex2 = appendOffsets(a.hex2, hex2, i)
				a.ats = appendOffsets(a.ats, at, i)
			}
			if ends := ^cAlnum & msb; ends == 0 {
				tok += 8
			} else {
				if k := bits.TrailingZeros64(ends) >> 3; tok+k == 16 {
					a.tok16 = append(a.tok16, int32(i+k-16))
				}
				tok = bits.LeadingZeros64(ends) >> 3
			}
			if ends := ^cRun & msb; ends == 0 {
				run += 8
			} else {
				// '=' padding can add two bytes to the run.
				if k := bits.TrailingZeros64(ends) >> 3; run+k >= minEncodedLen-2 {
					a.closeRun(text, i-run, i+k)
				}
				run = bits.LeadingZeros64(ends) >> 3
			}
		}
		pDigit, pHigh, pAlnum, pHexCol, pRun = cDigit, cHigh, cAlnum, cHex|cColon, cRun
		cw, cHigh, cDigit, cLetter, cAlnum, cHex, cRun, cColon, cSpcol, cKey = w, nHigh, nDigit, nLetter, nAlnum, nHex, nRun, nColon, nSpcol, nKey
	}
	// A keyword is found where its filter bytes are, up to a few bytes
	// after its start: the hits come nearly in order.
	if a.kwOut {
		slices.SortFunc(a.kw, cmpHit)
	}
	if tok == 16 {
		a.tok16 = append(a.tok16, int32(n-16))
	}
	if run >= minEncodedLen {
		a.runs = append(a.runs, [2]int32{int32(n - run), int32(n)})
	}
}

// prefilterKeywords fills a with the keyword hits of text only (see
// prefilter), its other anchors left empty: the anchors of a scan that runs
// the secret rules alone, which read nothing else.
func (ix *keywordIndex) prefilterKeywords(text string, a *anchors) {
	a.reset()
	ix.keywords(text, a)
}

// keywords appends the keyword hits of text to a.kw, in order.
func (ix *keywordIndex) keywords(text string, a *anchors) {
	if useBlocks {
		ix.keywordsBlocks(text, a)
		return
	}
	ix.keywordsSWAR(text, a)
}

// keywordsSWAR is keywords on eight offsets at a time in a 64-bit word.
func (ix *keywordIndex) keywordsSWAR(text string, a *anchors) {
	n := len(text)
	var cLetter, cKey uint64
	for i := -8; i < n; i += 8 {
		var w uint64
		if i+16 <= n {
			w = le64(text[i+8:])
		} else {
			w = le64Tail(text, i+8)
		}
		ascii := w&msb ^ msb
		nLetter := inRange(w&^msb|0x20*lsb, 'a', 'z') & ascii
		nKey := (w | 0x20*lsb) ^ (^(nLetter<<8|cLetter>>56)&msb)>>2
		if i >= 0 {
			cand := ix.pass(uint32(cKey)) | ix.pass(uint32(cKey>>8))<<1 | ix.pass(uint32(cKey>>16))<<2 |
				ix.pass(uint32(cKey>>24))<<3 | ix.pass(uint32(cKey>>32))<<4 | ix.pass(uint32(cKey>>40))<<5 |
				ix.pass(uint32(cKey>>48|nKey<<16))<<6 | ix.pass(uint32(cKey>>56|nKey<<8))<<7
			if cand != 0 {
				ix.verify(text, i, cand, cKey, nKey, a)
			}
		}
		cLetter, cKey = nLetter, nKey
	}
	if a.kwOut {
		slices.SortFunc(a.kw, cmpHit)
	}
}
