package redaction

// cardDetector finds payment card numbers (PANs, ISO/IEC 7812-1): 13 to 19
// digits, written plain or in groups separated by single spaces or single
// hyphens (one kind of separator per number), whose issuer identification
// number belongs to a known scheme with that length, and whose last digit is
// the Luhn check digit (ISO/IEC 7812-1 Annex B).
type cardDetector struct{}

func (cardDetector) Type() string { return TypeCreditCard }

func (cardDetector) Detect(text string, dst []Finding) []Finding {
	n := len(text)
	var groups [24]int // end offset of each digit group
	for i := 0; i < n; i++ {
		if !isDigit(text[i]) {
			continue
		}
		start := i
		if p := before(text, start); wordByte(p) || p == '-' || p == '.' || p == '/' || p == '+' || p == ',' && isDigit(before(text, start-1)) {
			for i < n && isDigit(text[i]) {
				i++
			}
			continue
		}
		// Collect groups of digits separated by one consistent separator.
		ng, digits := 0, 0
		var sep byte
		j := i
		for j < n && ng < len(groups) {
			k := j
			for k < n && isDigit(text[k]) {
				k++
			}
			digits += k - j
			groups[ng] = k
			ng++
			j = k
			if digits > 19 || j+1 >= n || !isDigit(text[j+1]) {
				break
			}
			if c := text[j]; (c == ' ' || c == '-') && (sep == 0 || sep == c) {
				sep = c
				j++
				continue
			}
			break
		}
		i = j
		// Try the number as grouped, then without a trailing group (a
		// year or a count written after the card).
		for g := ng; g >= 1; g-- {
			end := groups[g-1]
			if nx := at(text, end); wordByte(nx) || (nx == '.' || nx == ',') && isDigit(at(text, end+1)) {
				if g == ng {
					continue
				}
			}
			if g < ng-1 || !cardGrouping(groups[:g], start, sep) || ibanTail(text, start) {
				continue
			}
			if sub, ok := validPAN(text[start:end]); ok {
				dst = append(dst, Finding{Type: TypeCreditCard, Subtype: sub, Start: start, End: end})
				i = end
				break
			}
		}
	}
	return dst
}

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

// cardGrouping reports whether digit groups ending at ends (the first
// starting at start) follow a layout printed on cards: unseparated, groups
// of four with a shorter last group (Visa, Mastercard, Discover, JCB,
// 19-digit 4-4-4-4-3), or 4-6-5 / 4-6-4 (American Express, Diners Club).
func cardGrouping(ends []int, start int, sep byte) bool {
	if len(ends) == 1 || sep == 0 {
		return true
	}
	lens := make([]int, len(ends))
	prev := start
	for i, e := range ends {
		lens[i] = e - prev
		prev = e + 1
	}
	if len(lens) == 3 && lens[0] == 4 && lens[1] == 6 && (lens[2] == 5 || lens[2] == 4) {
		return true
	}
	for i, l := range lens {
		if l != 4 && (i != len(lens)-1 || l > 4) {
			return false
		}
	}
	return true
}

// ibanTail reports whether the digits at start follow an IBAN's country
// code and check digits ("DE23 6644 …"): the rest of an IBAN (valid or not)
// is not a card number.
func ibanTail(text string, start int) bool {
	if start < 5 {
		return false
	}
	p := text[start-5 : start]
	return isUpper(p[0]) && isUpper(p[1]) && isDigit(p[2]) && isDigit(p[3]) && (p[4] == ' ' || p[4] == '-') && !wordByte(before(text, start-5))
}
