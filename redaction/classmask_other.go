//go:build !amd64 || purego

package redaction

// useBlocks is false where there is no classMasksAVX2: prefilter reads
// eight bytes at a time (prefilterSWAR).
const useBlocks = false

func classMasksAVX2(p *byte, n int, out *blockMasks) { panic("redaction: classMasksAVX2 without AVX2") }

func kwCandAVX2(p *byte, n int, filter *uint64, out *uint64) {
	panic("redaction: kwCandAVX2 without AVX2")
}
