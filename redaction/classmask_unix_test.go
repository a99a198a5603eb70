//go:build unix

package redaction

import (
	"syscall"
	"testing"
	"unsafe"
)

// TestPrefilterReadsNothingOutsideTheText runs prefilter on texts that
// start right after and end right before a page that may not be read (a
// read there faults): the AVX2 passes read whole blocks and the bytes
// around them, and must read copies at the edges.
func TestPrefilterReadsNothingOutsideTheText(t *testing.T) {
	s, err := NewScanner(Config{})
	if err != nil {
		t.Fatal(err)
	}
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[:page], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(mem[2*page:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	body := mem[page : 2*page]
	unit := "api_key=sk-proj-QUJDREVGR0hJSktM Mr. Rossi 4111 1111 de:ad ey "
	for i := range body {
		body[i] = unit[i%len(unit)]
	}
	var a anchors
	for _, n := range []int{0, 1, 2, 3, 7, 8, 63, 64, 65, 71, 72, 73, 127, 128, 136, 200, 1000, page} {
		for _, text := range []string{unsafe.String(&body[0], n), unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(&body[0]), page-n)), n)} {
			s.index.prefilter(text, &a) // faults on a read outside the text
			want := refAnchors(&s.index, text)
			checkAnchorsOf(t, "prefilter", text, &a, &want)
		}
	}
}
