package redaction

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestDomainEndsAt checks domainEndsAt against its definition, a read of
// the text cut at b (domainAt(text[:b], i) ending at b, and the label
// after the cut host's last dot), for every i that starts a host name and
// every character boundary b inside it, on random texts of host-name
// pieces: ASCII and non-ASCII letters, digits, '-', '.', "xn--", long
// labels.
func TestDomainEndsAt(t *testing.T) {
	pieces := []string{"a", "b", "z", "q", "1", "9", "-", ".", ".", "xn--", "é", "中", "ä", "@", " ", strings.Repeat("k", 40)}
	r := rand.New(rand.NewPCG(1, 2))
	checked := 0
	for n := 0; n < 20000; n++ {
		var sb strings.Builder
		for range 1 + r.IntN(24) {
			sb.WriteString(pieces[r.IntN(len(pieces))])
		}
		text := sb.String()
		for i := 0; i < len(text); i++ {
			e, ok := domainAt(text, i)
			if !ok {
				continue
			}
			for b := i + 1; b < e; b++ {
				if !utf8.RuneStart(text[b]) {
					continue
				}
				be, wok := domainAt(text[:b], i)
				wok = wok && be == b
				want := ""
				if wok {
					want = text[i:b][strings.LastIndexByte(text[i:b], '.')+1:]
				}
				got, gok := domainEndsAt(text, i, b)
				if gok != wok || gok && got != want {
					t.Fatalf("domainEndsAt(%q, %d, %d) = %q, %v; the cut read: %q, %v", text, i, b, got, gok, want, wok)
				}
				checked++
			}
		}
	}
	if checked < 10000 {
		t.Fatalf("only %d cases checked", checked)
	}
}

// TestDropRuneBMP checks the bitmap answer against dropRune, rune by
// rune, over all of Unicode.
func TestDropRuneBMP(t *testing.T) {
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if got, want := dropRuneBMP(r), dropRune(r); got != want {
			t.Fatalf("dropRuneBMP(%U) = %v, dropRune: %v", r, got, want)
		}
	}
}
