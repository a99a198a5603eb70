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
