package redaction

import "testing"

// TestTopLevelDomainsOfAddresses: the top-level domain of an address must
// be an ICANN one of the Public Suffix List ("cromulent" and one-letter
// labels are not), whatever was looked up before it in the same text, for
// plain and written-out addresses; upper case, A-labels and IDN letters
// count as they are.
func TestTopLevelDomainsOfAddresses(t *testing.T) {
	runScanCases(t, []scanCase{
		{"a written-out address, then one under no TLD", "", "write to john . doe @ example . com or anna . bi @ mail . cromulent today",
			[]string{"EMAIL/written:john . doe @ example . com"}},
		{"an address under no TLD, then a written-out one", "", "write to anna . bi @ mail . cromulent or john . doe @ example . com today",
			[]string{"EMAIL/written:john . doe @ example . com"}},
		{"written-out addresses under two TLDs", "", "john . doe @ example . com and anna . bi @ mail . it",
			[]string{"EMAIL/written:john . doe @ example . com", "EMAIL/written:anna . bi @ mail . it"}},
		{"a one-letter top-level label is not a TLD", "", "mail a@b.c or x . y @ z . q now", nil},
		{"an upper-case TLD", "", "mail MARIO@EXAMPLE.COM now", []string{"EMAIL:MARIO@EXAMPLE.COM"}},
		{"an A-label TLD", "", "mail ivan@example.xn--p1ai now", []string{"EMAIL:ivan@example.xn--p1ai"}},
		{"an IDN TLD", "", "mail ivan@пример.рф now", []string{"EMAIL:ivan@пример.рф"}},
		{"a TLD with a digit is none", "", "mail ivan@example.c0m now", nil},
	})
}
