package redaction

import (
	"fmt"
	"slices"
	"testing"
)

func TestScanAcrossFindsValuesSplitBetweenSegments(t *testing.T) {
	s := mustScanner(t)
	cases := []struct {
		name     string
		segments []string
		want     []string // "segment:TYPE:part", in order
	}{
		{"card digits split between groups over two messages",
			[]string{"my card is 4111 1111", "1111 1111, thanks"},
			[]string{"0:CREDIT_CARD:4111 1111", "1:CREDIT_CARD:1111 1111"}},
		{"card digits split inside a group",
			[]string{"carta 41111111111", "11111 grazie"},
			[]string{"0:CREDIT_CARD:41111111111", "1:CREDIT_CARD:11111"}},
		{"an e-mail address cut after the at sign",
			[]string{"write to mario.rossi@", "example.it please"},
			[]string{"0:EMAIL:mario.rossi@", "1:EMAIL:example.it"}},
		{"an e-mail address split across two tool arguments",
			[]string{"mario.rossi", "@example.it"},
			[]string{"0:EMAIL:mario.rossi", "1:EMAIL:@example.it"}},
		{"a card spread over four messages",
			[]string{"4111", "1111", "1111", "1111"},
			[]string{"0:CREDIT_CARD:4111", "1:CREDIT_CARD:1111", "2:CREDIT_CARD:1111", "3:CREDIT_CARD:1111"}},
		{"an IBAN cut in two with fullwidth digits",
			[]string{"IBAN IT60 X054 2811 １０１０", "0000 0123 456 ok"},
			[]string{"0:IBAN:IT60 X054 2811 １０１０", "1:IBAN:0000 0123 456"}},
		{"an API key cut in the middle",
			[]string{"key sk-proj-Zx8kQ2mP9vLr4T", "fW7yBn3HcJ5dGs1aE6 ok"},
			[]string{"0:SECRET:sk-proj-Zx8kQ2mP9vLr4T", "1:SECRET:fW7yBn3HcJ5dGs1aE6"}},
		{"an IBAN cut at a line break",
			[]string{"My IBAN is DE89 3704 0044\n", "0532 0130 00"},
			[]string{"0:IBAN:DE89 3704 0044\n", "1:IBAN:0532 0130 00"}},
		{"an AWS key id cut at a line break",
			[]string{"my key is AKIAIOSFOD\n", "NN7EXAMPLE, thanks"},
			[]string{"0:SECRET:AKIAIOSFOD", "1:SECRET:NN7EXAMPLE"}},
		{"an AWS key id in groups cut at a CRLF between groups",
			[]string{"key AKIA IOSF ODNN\r\n", "7EXA MPLE ok"},
			[]string{"0:SECRET:AKIA IOSF ODNN", "1:SECRET:7EXA MPLE"}},
		{"an AWS key id in groups over two messages",
			[]string{"key AKIA IOSF ODNN", "7EXA MPLE ok"},
			[]string{"0:SECRET:AKIA IOSF ODNN", "1:SECRET:7EXA MPLE"}},
		{"an address cut after the at sign and a line break",
			[]string{"write to mario.rossi@\n", "example.it please"},
			[]string{"0:EMAIL:mario.rossi@", "1:EMAIL:example.it"}},
		{"a fiscal code cut at a line break, the next part indented",
			[]string{"codice RSSMRA80A01\n", "  H501U grazie"},
			[]string{"0:IT_FISCAL_CODE:RSSMRA80A01", "1:IT_FISCAL_CODE:H501U"}},
		{"a line ending in a word and a line starting with an address are two lines",
			[]string{"Thanks\n", "alice@example.com is mine"},
			nil},
		{"a whole key id and a word on the next line are not a split value",
			[]string{"key AKIAIOSFODNN7EXAMPLE\n", "NEXT steps"},
			nil},
		{"numbers on two lines that only look like a card when joined are not one",
			[]string{"order 2024\n", "1234 shipped"},
			nil},
		{"a whole address glued to the next message is not a split value",
			[]string{"reply to alice@example.com", "cc bob"},
			nil},
		{"a whole card followed by a number is not a split value",
			[]string{"card 4111111111111111", "2024 was the year"},
			nil},
		{"numbers that only look like a card when joined are not one",
			[]string{"order 2024", "1234 shipped"},
			nil},
		{"a single segment has nothing across",
			[]string{"mario@example.it"},
			nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []string
			for _, f := range s.ScanAcross(c.segments) {
				got = append(got, fmt.Sprintf("%d:%s:%s", f.Segment, f.Type, c.segments[f.Segment][f.Start:f.End]))
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("ScanAcross(%q)\n got %q\nwant %q", c.segments, got, c.want)
			}
		})
	}
}

func TestScanAcrossNumbersValuesInOrder(t *testing.T) {
	s := mustScanner(t)
	segs := []string{"a@exa", "mple.it and 4111 1111", "1111 1111 and b@", "example.org"}
	var got []string
	for _, f := range s.ScanAcross(segs) {
		got = append(got, fmt.Sprintf("%d/%d:%s", f.Value, f.Segment, segs[f.Segment][f.Start:f.End]))
	}
	want := []string{"0/0:a@exa", "0/1:mple.it", "1/1:4111 1111", "1/2:1111 1111", "2/2:b@", "2/3:example.org"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

// TestScanAcrossJoinsAroundAnotherTurn: an IBAN split over two user
// messages with the assistant's reply between them is one value.
func TestScanAcrossJoinsAroundAnotherTurn(t *testing.T) {
	s := mustScanner(t)
	segs := []string{"My IBAN is IT60 X054 2811 1010", "Thanks, please send the rest.", "0000 0123 456"}
	var got []string
	for _, f := range s.ScanAcross(segs) {
		got = append(got, fmt.Sprintf("%s/%d:%s", f.Type, f.Segment, segs[f.Segment][f.Start:f.End]))
	}
	want := []string{"IBAN/0:IT60 X054 2811 1010", "IBAN/2:0000 0123 456"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if _, err := s.ScanAcrossBounded(segs); err != nil {
		t.Fatal(err)
	}
}
