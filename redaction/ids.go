package redaction

import (
	"net/netip"
	"regexp"
	"strings"
)

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

// fiscalCodeDetector finds Italian fiscal codes (codice fiscale of a
// natural person, DM 23 December 1976 and DPR 605/1973): six letters, year
// (2), month letter, day (2, +40 for women), a letter and three digits for
// the place, and a check letter. Digits may be replaced by the letters
// LMNPQRSTUV ("omocodia", used by the Agenzia delle Entrate to resolve
// collisions). The check letter is verified; upper or lower case.
// Odd-position (1st, 3rd, …) values of the check-character algorithm, for
// 0–9 and A–Z; even positions use 0–9 and A=0 … Z=25.
var fiscalOdd = [36]int{
	1, 0, 5, 7, 9, 13, 15, 17, 19, 21, // 0-9
	1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23, // A-Z
}

const fiscalMonths = "ABCDEHLMPRST"

// detectFiscal checks the 16-byte tokens the prefilter found.
func detectFiscal(text string, toks []int32, dst []Finding) []Finding {
	var up [16]byte
	for _, t := range toks {
		i := int(t)
		if !isAlpha(text[i]) || wordByte(before(text, i)) || wordByte(at(text, i+16)) {
			continue
		}
		ok := true
		for k := 0; k < 16 && ok; k++ {
			c := text[i+k]
			if isLower(c) {
				c -= 'a' - 'A'
			}
			up[k] = c
			switch k {
			case 0, 1, 2, 3, 4, 5, 11, 15:
				ok = isUpper(c)
			case 8:
				ok = strings.IndexByte(fiscalMonths, c) >= 0
			default: // 6, 7, 9, 10, 12, 13, 14: digit or omocodia letter
				ok = isDigit(c) || strings.IndexByte("LMNPQRSTUV", c) >= 0
			}
		}
		if !ok || !fiscalDayOK(up[9], up[10]) || !fiscalCheck(up[:]) {
			continue
		}
		dst = append(dst, Finding{Type: TypeITFiscalCode, Start: i, End: i + 16})
	}
	return dst
}

func fiscalDigit(c byte) int {
	if isDigit(c) {
		return int(c - '0')
	}
	return strings.IndexByte("LMNPQRSTUV", c)
}

func fiscalDayOK(a, b byte) bool {
	d := fiscalDigit(a)*10 + fiscalDigit(b)
	return d >= 1 && d <= 31 || d >= 41 && d <= 71
}

func fiscalCheck(c []byte) bool {
	sum := 0
	for k := 0; k < 15; k++ {
		idx := 0
		if isDigit(c[k]) {
			idx = int(c[k] - '0')
		} else {
			idx = 10 + int(c[k]-'A')
		}
		if k%2 == 0 { // 1st, 3rd, … character
			sum += fiscalOdd[idx]
		} else if idx >= 10 {
			sum += idx - 10
		} else {
			sum += idx
		}
	}
	return c[15] == byte('A'+sum%26)
}

// IPv4 addresses are dotted quads of decimal octets 0–255 without leading
// zeros (RFC 791 / inet_pton), found among the digit clusters (see
// numeric.go): exactly four atoms joined by single dots, not part of a
// longer dotted run (a version string such as 1.2.3.4.5) and not after a
// word such as "version" or "build". IPv6 addresses (RFC 4291 §2.2 text
// forms, checked with net/netip) are found from the ':' the prefilter saw.
// Subtype classifies the address: "loopback", "private" (RFC 1918 / RFC
// 4193), "link_local", "multicast", "unspecified" or "public".

// detectIPv6 checks the address around each candidate ':'.
func detectIPv6(text string, colons []int32, dst []Finding) []Finding {
	done := -1
	for _, c := range colons {
		i := int(c)
		if i < done {
			continue
		}
		s := i
		for s > 0 && i-s < 45 && (isHex(text[s-1]) || text[s-1] == ':') {
			s--
		}
		for s < i && !isHex(text[s]) && text[s] != ':' {
			s++
		}
		e, ok := ipv6At(text, s)
		if !ok && s < i {
			// The run may start inside a word ("ab:..."): try at the colon.
			e, ok = ipv6At(text, i)
			s = i
		}
		if !ok {
			done = i + 1
			continue
		}
		a, _ := netip.ParseAddr(text[s:e])
		dst = append(dst, Finding{Type: TypeIPAddress, Subtype: ipClass(a), Start: s, End: e})
		done = e
	}
	return dst
}

func isHex(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// ipv6At reports whether an IPv6 address starts at i and where it ends.
func ipv6At(text string, i int) (int, bool) {
	if wordByte(before(text, i)) || before(text, i) == ':' {
		return 0, false
	}
	j, colons, digit := i, 0, false
	for j < len(text) && j-i < 45 {
		c := text[j]
		if c == ':' {
			colons++
		} else if isDigit(c) {
			digit = true
		} else if !(isHex(c) || c == '.' && colons >= 2) {
			break
		}
		j++
	}
	for j > i && (text[j-1] == '.' || text[j-1] == ':' && !strings.HasSuffix(text[i:j], "::")) {
		j--
	}
	if colons < 2 || !digit || wordByte(at(text, j)) {
		return 0, false
	}
	s := text[i:j]
	if !strings.Contains(s, "::") && strings.Count(s, ":") < 7 && !strings.Contains(s, ".") {
		return 0, false
	}
	if strings.Contains(s, "::") && s != "::1" && len(strings.FieldsFunc(s, func(r rune) bool { return r == ':' })) < 2 {
		return 0, false
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is6() {
		return 0, false
	}
	return j, true
}

func ipClass(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "link_local"
	case a.IsMulticast():
		return "multicast"
	case a.IsUnspecified():
		return "unspecified"
	}
	return "public"
}

// urlCredRe matches "scheme://user:password@host"; the password may contain
// '@' (the last '@' before the host delimits userinfo, RFC 3986 §3.2).
var urlCredRe = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]{1,31})://([^\s:/?#@"'<>\[\]]+):([^\s/?"'<>]+)@[A-Za-z0-9\[]`)

// detectURLCredentials finds the userinfo "user:password" of URLs
// (RFC 3986 §3.2.1, whose use the RFC deprecates precisely because it puts
// a secret in the URL) at each "://" the prefilter saw. The finding covers
// "user:password"; Subtype is the lower-case scheme.
func detectURLCredentials(text string, hits []int32, dst []Finding) []Finding {
	last := -1
	for _, h := range hits {
		p := int(h)
		if p < last {
			continue
		}
		// The scheme: [A-Za-z][A-Za-z0-9+.-]{1,31} right before "://".
		s := p
		for s > 0 && p-s < 32 && (isAlnum(text[s-1]) || text[s-1] == '+' || text[s-1] == '.' || text[s-1] == '-') {
			s--
		}
		for s < p && !isAlpha(text[s]) {
			s++
		}
		if p-s < 2 || wordASCII(before(text, s)) {
			continue
		}
		w := text[s:min(len(text), p+1024)]
		m := urlCredRe.FindStringSubmatchIndex(w)
		if m == nil || m[0] != 0 {
			continue
		}
		dst = append(dst, Finding{Type: TypeURLCredentials, Subtype: strings.ToLower(w[m[2]:m[3]]), Start: s + m[4], End: s + m[7]})
		last = s + m[1]
	}
	return dst
}
