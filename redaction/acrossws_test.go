package redaction

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestScanAcrossJoinsAtAnyWhiteSpace: a value split across two messages
// is one value whatever white space lies at the cut (a tab, several
// spaces, a no-break space, a space before the line break, white space
// at the head of the next message), as at a line break. The oracle is
// the parts by hand; the card passes Luhn and the IBAN mod 97 (both
// checked in TestScanAcrossOraclesAreValid).
func TestScanAcrossJoinsAtAnyWhiteSpace(t *testing.T) {
	s := mustScanner(t)
	values := []struct {
		typ, left, right string
	}{
		{"CREDIT_CARD", "4111 1111", "1111 1111"},
		{"IBAN", "DE89 3704 0044", "0532 0130 00"},
		{"SECRET", "sk-proj-Zx8kQ2mP9vLr4T", "fW7yBn3HcJ5dGs1aE6"},
		{"SECRET", "AKIA IOSF ODNN", "7EXA MPLE"},
		{"EMAIL", "mario.rossi@", "example.it"},
	}
	gaps := []struct{ name, tail, head string }{
		{"a tab", "\t", ""},
		{"two spaces", "  ", ""},
		{"a no-break space", "\u00a0", ""},
		{"a space and a line break", " \n", ""},
		{"a tab and a CRLF", "\t\r\n", ""},
		{"spaces at the head of the next message", "", "   "},
		{"a space on both sides", " ", " "},
		{"an ideographic space", "\u3000", ""},
	}
	for _, v := range values {
		for _, g := range gaps {
			t.Run(v.typ+" "+v.left+" / "+g.name, func(t *testing.T) {
				segs := []string{"here: " + v.left + g.tail, g.head + v.right + " ok"}
				var got []string
				for _, f := range s.ScanAcross(segs) {
					// Number detectors read through white space: a part
					// may hold the gap's white space, never more.
					got = append(got, fmt.Sprintf("%d:%s:%s", f.Segment, f.Type, strings.TrimFunc(segs[f.Segment][f.Start:f.End], unicode.IsSpace)))
				}
				want := []string{"0:" + v.typ + ":" + v.left, "1:" + v.typ + ":" + v.right}
				if !slices.Equal(got, want) {
					t.Errorf("ScanAcross(%q)\n got %q\nwant %q", segs, got, want)
				}
			})
		}
	}
}

// TestScanAcrossWhiteSpaceMakesNoFalseJoins: what is not one value
// stays apart when white space lies at the cut.
func TestScanAcrossWhiteSpaceMakesNoFalseJoins(t *testing.T) {
	s := mustScanner(t)
	for _, segs := range [][]string{
		{"Thanks\t", "alice@example.com is mine"},
		{"Thanks  ", "alice@example.com is mine"},
		{"reply to alice@example.com\u00a0", "cc bob"},
		{"order 2024\t", "1234 shipped"},
		{"order 2024  ", "1234 shipped"},
		{"card 4111111111111111\t", "2024 was the year"},
		{"key AKIAIOSFODNN7EXAMPLE  ", "NEXT steps"},
		{"Please continue.\t", "example.com is the site"},
	} {
		if fs := s.ScanAcross(segs); len(fs) != 0 {
			t.Errorf("ScanAcross(%q) = %v, want nothing", segs, fs)
		}
	}
}
