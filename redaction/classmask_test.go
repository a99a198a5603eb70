package redaction

import (
	"math/rand/v2"
	"testing"
)

// refBlockMasks is blockMasks by its definitions, one byte at a time.
func refBlockMasks(block []byte) blockMasks {
	var m blockMasks
	for k, c := range block {
		bit := uint64(1) << k
		set := func(f *uint64, ok bool) {
			if ok {
				*f |= bit
			}
		}
		set(&m.high, c >= 0x80)
		set(&m.bit6, c&0x40 != 0)
		set(&m.digit, '0' <= c && c <= '9')
		set(&m.letter, 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z')
		set(&m.hexAF, 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F')
		set(&m.upper, 'A' <= c && c <= 'Z')
		set(&m.colon, c == ':')
		set(&m.space, c == ' ')
		set(&m.at, c == '@')
		set(&m.runp, c == '+' || c == '-' || c == '/' || c == '_')
	}
	return m
}

// TestClassMasksMatchDefinitions checks classMasksAVX2 against
// refBlockMasks: every byte value at every offset of a block (byte k of
// block b is b+k, over 256 blocks), and random blocks, several per
// call (the loop's pointers advance by a block and a blockMasks).
func TestClassMasksMatchDefinitions(t *testing.T) {
	if !useBlocks {
		t.Log("no AVX2 here: prefilter reads eight bytes at a time, and TestPrefilterMatchesReference checks that")
		return
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const n = 256 + 24
	buf := make([]byte, 64*n)
	for i := range buf {
		if b, k := i/64, i%64; b < 256 {
			buf[i] = byte(b + k)
		} else {
			buf[i] = byte(rng.IntN(256))
		}
	}
	got := make([]blockMasks, n)
	for _, k := range []int{1, 3, n} {
		clear(got)
		classMasksAVX2(&buf[0], k, &got[0])
		for b := range k {
			if want := refBlockMasks(buf[64*b : 64*b+64]); got[b] != want {
				t.Fatalf("block %d of %d: classMasksAVX2 = %+v, want %+v", b, k, got[b], want)
			}
		}
		for b := k; b < n; b++ {
			if got[b] != (blockMasks{}) {
				t.Fatalf("classMasksAVX2 of %d blocks wrote block %d", k, b)
			}
		}
	}
}
