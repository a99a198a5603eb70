//go:build amd64 && !purego

package redaction

import "golang.org/x/sys/cpu"

// useBlocks says whether prefilter reads its anchors' byte classes with
// classMasksAVX2 (prefilterBlocks) instead of eight bytes at a time
// (prefilterSWAR).
var useBlocks = cpu.X86.HasAVX2

// classMasksAVX2 writes the blockMasks of the n 64-byte blocks at p into
// out[0:n], 32 bytes per AVX2 compare (classmask_amd64.s). The caller
// checks useBlocks first.
//
//go:noescape
func classMasksAVX2(p *byte, n int, out *blockMasks)

// kwCandAVX2 writes to out[b], for each of the n 64-byte blocks at p,
// the offsets j whose key (kwKey) passes the keyword filter (bit j),
// eight keys per gather. It reads p[-1] up to p[64n+7]: the byte before
// each offset and the two after it.
//
//go:noescape
func kwCandAVX2(p *byte, n int, filter *uint64, out *uint64)
