package redaction

import (
	"math/bits"
	"slices"
	"unsafe"
)

// blockMasks are the byte classes of one 64-byte block of text as
// bitmaps: bit k of a field is set when byte k of the block has the
// class. classMasksAVX2 computes them 32 bytes per instruction; their
// definitions (the oracle of the tests) are in refBlockMasks. The field
// order is the assembly's.
type blockMasks struct {
	high   uint64 // ≥ 0x80
	bit6   uint64 // bit 6 set (with high: ≥ 0xC0, a UTF-8 lead byte)
	digit  uint64 // '0'–'9'
	letter uint64 // ASCII letters, either case
	hexAF  uint64 // 'a'–'f', 'A'–'F'
	upper  uint64 // 'A'–'Z'
	colon  uint64 // ':'
	space  uint64 // ' '
	at     uint64 // '@'
	runp   uint64 // '+', '-', '/', '_' (base64's and base64url's extra bytes)
}

// blockChunk is how many blocks classMasksAVX2 classifies per call.
const blockChunk = 16

// The run test of blockScan.block is written for minEncodedLen 12.
const _ = uint(minEncodedLen-12) + uint(12-minEncodedLen)

// blockScan carries the state of prefilterBlocks from one block to the
// next: the masks of the block before (its bit 63 is the previous byte of
// bit 0) and the lengths of the alphanumeric token and of the base64 run
// that reach the end of the blocks done.
type blockScan struct {
	base                int // offset of the block to process
	pD, pH, pA, pXC, pR uint64
	tok, run            int
	cur                 blockMasks
	has                 bool
}

// prefilterBlocks is prefilter with the byte classes read 64 bytes at a
// time (classMasksAVX2) and the anchors computed on bitmaps, where bit
// k+1 of a class is the byte after bit k's: the same anchors as
// prefilterSWAR, in the same order (TestPrefilterMatchesReference checks
// both against their definitions). The keyword hits come from the
// keyword pass of prefilterKeywords.
func (ix *keywordIndex) prefilterBlocks(text string, a *anchors) {
	a.reset()
	ix.keywords(text, a)
	n := len(text)
	full := n / 64
	var st blockScan
	var buf [blockChunk]blockMasks
	for off := 0; off < full; off += blockChunk {
		k := min(blockChunk, full-off)
		classMasksAVX2(unsafe.StringData(text[off*64:]), k, &buf[0])
		for j := range k {
			st.push(text, &buf[j], a)
		}
	}
	if n%64 != 0 {
		// The last bytes, followed by zero bytes: no class, as past the
		// end of the text.
		var pad [64]byte
		copy(pad[:], text[full*64:])
		classMasksAVX2(&pad[0], 1, &buf[0])
		st.push(text, &buf[0], a)
	}
	st.push(text, &blockMasks{}, a) // the last block, before the zero bytes past the end
	if st.tok == 16 {
		a.tok16 = append(a.tok16, int32(n-16))
	}
	if st.run >= minEncodedLen {
		a.runs = append(a.runs, [2]int32{int32(n - st.run), int32(n)})
	}
}

// push takes the masks of the next block and processes the current one.
func (st *blockScan) push(text string, next *blockMasks, a *anchors) {
	if st.has {
		st.block(text, &st.cur, next, a)
	}
	st.cur, st.has = *next, true
}

// appendBits appends base plus the index of every set bit of mask.
func appendBits(dst []int32, mask uint64, base int) []int32 {
	for ; mask != 0; mask &= mask - 1 {
		dst = append(dst, int32(base+bits.TrailingZeros64(mask)))
	}
	return dst
}

// block records the anchors of the block b at st.base, whose next block
// is nb.
func (st *blockScan) block(text string, b, nb *blockMasks, a *anchors) {
	i := st.base
	H, D := b.high, b.digit
	A := b.letter | D
	X := b.hexAF | D
	R := A | b.runp
	C := b.colon
	S := C | b.space
	XC := X | C
	nX := nb.hexAF | nb.digit
	nXC := nX | nb.colon
	nS := nb.colon | nb.space

	digits := D &^ (D<<1 | st.pD>>63)
	caps := (b.upper | H&b.bit6&^(H<<1|st.pH>>63)) &^ (A<<1 | st.pA>>63)
	colons := C & (XC<<1 | st.pXC>>63 | XC>>1 | nXC<<63)
	hex2 := X &^ (R<<1 | st.pR>>63) & (X>>1 | nX<<63) & (S>>2 | nS<<62) & (X>>3 | nX<<61)
	if digits|caps|colons|hex2|b.at != 0 {
		a.digits = appendBits(a.digits, digits, i)
		a.caps = appendBits(a.caps, caps, i)
		a.colons = appendBits(a.colons, colons, i)
		a.hex2 = appendBits(a.hex2, hex2, i)
		a.ats = appendBits(a.ats, b.at, i)
	}

	// Tokens of exactly 16 alphanumeric bytes: the one that reaches the
	// block from before ends at its first non-alphanumeric byte k; the
	// ones inside it start at a start s > k whose 16 bytes are
	// alphanumeric and whose 17th is not, within the block; the last one
	// may reach the next.
	if A == ^uint64(0) {
		st.tok += 64
	} else {
		k := bits.TrailingZeros64(^A)
		if st.tok+k == 16 {
			a.tok16 = append(a.tok16, int32(i+k-16))
		}
		t := A & (A >> 1)
		t &= t >> 2
		t &= t >> 4
		t &= t >> 8 // bit s: bytes s..s+15 alphanumeric
		if exact := A &^ (A << 1) & t &^ (A >> 16) & (1<<48 - 1) &^ (2<<k - 1); exact != 0 {
			a.tok16 = appendBits(a.tok16, exact, i)
		}
		st.tok = bits.LeadingZeros64(^A)
	}

	// Base64 runs of at least minEncodedLen-2 bytes ('=' padding may add
	// two), likewise.
	if R == ^uint64(0) {
		st.run += 64
	} else {
		k := bits.TrailingZeros64(^R)
		if st.run+k >= minEncodedLen-2 {
			a.closeRun(text, i-st.run, i+k)
		}
		t := R & (R >> 1)
		t &= t >> 2
		t &= t >> 4
		t &= t >> 2 // bit s: bytes s..s+9 in the run's alphabet (minEncodedLen-2 = 10)
		for cand := R &^ (R << 1) & t &^ (2<<k - 1); cand != 0; cand &= cand - 1 {
			s := bits.TrailingZeros64(cand)
			e := s + bits.TrailingZeros64(^(R >> s))
			if e >= 64 {
				break // the last run, which may reach the next block
			}
			a.closeRun(text, i+s, i+e)
		}
		st.run = bits.LeadingZeros64(^R)
	}

	st.pD, st.pH, st.pA, st.pXC, st.pR = D, H, A, XC, R
	st.base += 64
}

// kwReach is how far kwCandAVX2 reads past a block: its last group of
// eight offsets loads 16 bytes.
const kwReach = 8

// keywordsBlocks is keywords with the filter tested eight offsets per
// AVX2 gather (kwCandAVX2) over 64-byte blocks; the blocks at the text's
// edges, whose reads would leave the text, are read from a copy padded
// with zero bytes (no letter before the text, zero bytes past its end, as
// keywordsSWAR reads it). The hits are keywordsSWAR's, in its order.
func (ix *keywordIndex) keywordsBlocks(text string, a *anchors) {
	n := len(text)
	nb := (n + 63) / 64
	last := (n - 64 - kwReach) / 64 // the last block read in place (when ≥ 1)
	var cand [blockChunk]uint64
	for b := 0; b < nb; {
		k := 1
		if b >= 1 && b <= last {
			k = min(blockChunk, last-b+1)
			kwCandAVX2(unsafe.StringData(text[64*b:]), k, &ix.filter[0], &cand[0])
		} else {
			var pad [1 + 64 + kwReach]byte
			if b > 0 {
				pad[0] = text[64*b-1]
			}
			copy(pad[1:], text[64*b:])
			kwCandAVX2(&pad[1], 1, &ix.filter[0], &cand[0])
		}
		for j := range k {
			base := 64 * (b + j)
			for c := cand[j]; c != 0; c &= c - 1 {
				q := base + bits.TrailingZeros64(c)
				ix.hitsAt(text, q, kwKey(at(text, q), at(text, q+1), at(text, q+2), q == 0 || !isAlpha(text[q-1])), a)
			}
		}
		b += k
	}
	if a.kwOut {
		slices.SortFunc(a.kw, cmpHit)
	}
}
