package redaction

// Payment card numbers (PANs, ISO/IEC 7812-1): 13 to 19 digits, found
// among the digit clusters (numeric.go) written plain, in groups or with
// any separators, whose issuer identification number belongs to a known
// scheme with that length, and whose last digit is the Luhn check digit
// (ISO/IEC 7812-1 Annex B). Subtype is the scheme.

// validPAN checks a card number written with optional separators and returns
// its scheme name.
func validPAN(s string) (string, bool) {
	var d [19]byte
	n := 0
	for i := 0; i < len(s); i++ {
		if isDigit(s[i]) {
			if n == len(d) {
				return "", false
			}
			d[n] = s[i] - '0'
			n++
		}
	}
	if n < 13 {
		return "", false
	}
	scheme := cardScheme(d[:n])
	if scheme == "" || !luhn(d[:n]) {
		return "", false
	}
	return scheme, true
}

// luhn reports whether the last digit of d is the Luhn (mod 10) check digit
// of the others (ISO/IEC 7812-1 Annex B).
func luhn(d []byte) bool {
	sum := 0
	for i := len(d) - 1; i >= 0; i-- {
		v := int(d[i])
		if (len(d)-1-i)%2 == 1 {
			v *= 2
			if v > 9 {
				v -= 9
			}
		}
		sum += v
	}
	return sum%10 == 0
}

// cardScheme returns the scheme for the issuer identification number of d if
// d's length is one that scheme issues, or "". Ranges are the published IIN
// ranges of the schemes (Visa, Mastercard incl. the 2-series, American
// Express, Discover, Diners Club, JCB, UnionPay, Maestro, Mir).
func cardScheme(d []byte) string {
	prefix := func(k int) int {
		v := 0
		for i := 0; i < k && i < len(d); i++ {
			v = v*10 + int(d[i])
		}
		return v
	}
	n := len(d)
	in := func(lo, hi int) bool { return n >= lo && n <= hi }
	p1, p2, p3, p4, p6 := prefix(1), prefix(2), prefix(3), prefix(4), prefix(6)
	switch {
	case p1 == 4 && (n == 13 || n == 16 || n == 19):
		return "visa"
	case (p2 >= 51 && p2 <= 55 || p4 >= 2221 && p4 <= 2720) && n == 16:
		return "mastercard"
	case (p2 == 34 || p2 == 37) && n == 15:
		return "amex"
	case (p4 == 6011 || p3 >= 644 && p3 <= 649 || p2 == 65 || p6 >= 622126 && p6 <= 622925) && in(16, 19):
		return "discover"
	case (p3 >= 300 && p3 <= 305 || p4 == 3095 || p2 == 36 || p2 == 38 || p2 == 39) && in(14, 19):
		return "diners"
	case p4 >= 3528 && p4 <= 3589 && in(16, 19):
		return "jcb"
	case p2 == 62 && in(16, 19):
		return "unionpay"
	case p4 >= 2200 && p4 <= 2204 && in(16, 19):
		return "mir"
	case (p2 == 50 || p2 >= 56 && p2 <= 69) && in(13, 19):
		return "maestro"
	}
	return ""
}
