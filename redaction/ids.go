package redaction

import (
	"net/netip"
	"regexp"
	"strings"
)

// ssnDetector finds US Social Security numbers written AAA-GG-SSSS or
// AAA GG SSSS (one kind of separator). Per the SSA's numbering rules
// (Social Security Administration, "The SSN Numbering Scheme" and the 2011
// randomisation notice) area 000, 666 and 900–999, group 00 and serial 0000
// are never issued; numbers the SSA lists as voided because they were
// published in advertising (078-05-1120, 219-09-9999) and the stock example
// 123-45-6789 are rejected too.
type ssnDetector struct{}

func (ssnDetector) Type() string { return TypeUSSSN }

var ssnVoid = map[string]bool{"078051120": true, "219099999": true, "123456789": true}

func (ssnDetector) Detect(text string, dst []Finding) []Finding {
	n := len(text)
	for i := 0; i+11 <= n; i++ {
		if !isDigit(text[i]) {
			continue
		}
		if p := before(text, i); wordByte(p) || p == '-' || p == '.' || p == '+' || p == '/' {
			for i < n && isDigit(text[i]) {
				i++
			}
			continue
		}
		s := text[i : i+11]
		sep := s[3]
		if (sep != '-' && sep != ' ') || s[6] != sep ||
			!allDigits(s[0:3]) || !allDigits(s[4:6]) || !allDigits(s[7:11]) {
			continue
		}
		if nx := at(text, i+11); wordByte(nx) || (nx == '-' || nx == '.' || nx == sep) && isDigit(at(text, i+12)) {
			continue
		}
		area, group, serial := s[0:3], s[4:6], s[7:11]
		if area == "000" || area == "666" || area[0] == '9' || group == "00" || serial == "0000" || ssnVoid[area+group+serial] {
			continue
		}
		dst = append(dst, Finding{Type: TypeUSSSN, Start: i, End: i + 11})
		i += 10
	}
	return dst
}

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
type fiscalCodeDetector struct{}

func (fiscalCodeDetector) Type() string { return TypeITFiscalCode }

// Odd-position (1st, 3rd, …) values of the check-character algorithm, for
// 0–9 and A–Z; even positions use 0–9 and A=0 … Z=25.
var fiscalOdd = [36]int{
	1, 0, 5, 7, 9, 13, 15, 17, 19, 21, // 0-9
	1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23, // A-Z
}

const fiscalMonths = "ABCDEHLMPRST"

func (fiscalCodeDetector) Detect(text string, dst []Finding) []Finding {
	n := len(text)
	var up [16]byte
	for i := 0; i+16 <= n; i++ {
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
		i += 15
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

// ipDetector finds IPv4 addresses in dotted-quad form (four decimal octets
// 0–255 without leading zeros, RFC 791 / inet_pton) and IPv6 addresses
// (RFC 4291 §2.2 text forms, checked with net/netip). Longer dotted runs
// such as version strings (1.2.3.4.5) are rejected. Subtype classifies the
// address: "loopback", "private" (RFC 1918 / RFC 4193), "link_local",
// "multicast", "unspecified" or "public".
type ipDetector struct{}

func (ipDetector) Type() string { return TypeIPAddress }

func (ipDetector) Detect(text string, dst []Finding) []Finding {
	n := len(text)
	for i := 0; i < n; i++ {
		c := text[i]
		if c == ':' || isHex(c) {
			if e, ok := ipv6At(text, i); ok {
				a, _ := netip.ParseAddr(text[i:e])
				dst = append(dst, Finding{Type: TypeIPAddress, Subtype: ipClass(a), Start: i, End: e})
				i = e - 1
				continue
			}
		}
		if !isDigit(c) {
			continue
		}
		if p := before(text, i); wordByte(p) || p == '.' || p == '-' {
			for i < n && isDigit(text[i]) {
				i++
			}
			continue
		}
		j, ok := i, true
		for part := 0; part < 4 && ok; part++ {
			if part > 0 {
				if at(text, j) != '.' {
					ok = false
					break
				}
				j++
			}
			k := j
			v := 0
			for k < n && isDigit(text[k]) && k-j < 4 {
				v = v*10 + int(text[k]-'0')
				k++
			}
			ok = k > j && k-j <= 3 && v <= 255 && !(k-j > 1 && text[j] == '0')
			j = k
		}
		if !ok || wordByte(at(text, j)) || (at(text, j) == '.' || at(text, j) == '-') && isAlnum(at(text, j+1)) {
			for i+1 < n && (isDigit(text[i+1]) || text[i+1] == '.') {
				i++
			}
			continue
		}
		a, err := netip.ParseAddr(text[i:j])
		if err != nil {
			continue
		}
		dst = append(dst, Finding{Type: TypeIPAddress, Subtype: ipClass(a), Start: i, End: j})
		i = j - 1
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
var urlCredRe = regexp.MustCompile(`\b([A-Za-z][A-Za-z0-9+.-]{1,31})://([^\s:/?#@"'<>\[\]]+):([^\s/?#"'<>]+)@[A-Za-z0-9\[]`)

// urlCredentialsDetector finds the userinfo "user:password" of URLs
// (RFC 3986 §3.2.1, whose use the RFC deprecates precisely because it puts a
// secret in the URL). The finding covers "user:password"; Subtype is the
// lower-case scheme.
type urlCredentialsDetector struct{}

func (urlCredentialsDetector) Type() string { return TypeURLCredentials }

func (urlCredentialsDetector) Detect(text string, dst []Finding) []Finding {
	if !strings.Contains(text, "://") {
		return dst
	}
	for _, m := range urlCredRe.FindAllStringSubmatchIndex(text, -1) {
		dst = append(dst, Finding{Type: TypeURLCredentials, Subtype: strings.ToLower(text[m[2]:m[3]]), Start: m[4], End: m[7]})
	}
	return dst
}
