package redaction

import (
	"regexp"
	"strings"

	"github.com/nyaruka/phonenumbers"
)

// validRegion reports whether region is a region the phone metadata knows.
func validRegion(region string) bool {
	return phonenumbers.GetCountryCodeForRegion(region) != 0
}

// phoneDetector finds phone numbers in two steps: a permissive candidate
// scan (digits with the separators people type: space . - / and
// parentheses, optionally led by + or the 00 international prefix), then
// context rules that reject the usual look-alikes (dates, times, decimals,
// amounts, version strings, order and reference numbers), then
// phonenumbers.Parse with the configured default region and IsValidNumber,
// which checks the number against libphonenumber's per-country metadata.
type phoneDetector struct{ region string }

func (phoneDetector) Type() string { return TypePhone }

// Numbers written as dates: 2024-03-15, 15/03/2024, 15.03.24.
var phoneDateRe = regexp.MustCompile(`^(?:\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4})(?:\D|$)`)

func isPhoneSep(c byte) bool {
	return c == ' ' || c == '.' || c == '-' || c == '/' || c == '(' || c == ')'
}

// phoneContext are words that, shortly before a run of digits without any
// separator or international prefix, make it a phone number rather than an
// order, customer or reference number (English and Italian).
var phoneContext = []string{"tel", "phone", "call", "cell", "mobile", "whatsapp", "fax", "sms", "text me", "chiam", "telef", "cellulare", "numero di telefono", "contatt"}

func (d phoneDetector) Detect(text string, dst []Finding) []Finding {
	n := len(text)
	for i := 0; i < n; i++ {
		c := text[i]
		if !(isDigit(c) || ((c == '+' || c == '(') && i+1 < n && (isDigit(text[i+1]) || text[i+1] == ' '))) {
			continue
		}
		start := i
		// Extend over digits and separators; at most 3 separators in a row.
		j, seps, digits := i, 0, 0
		for j < n {
			c := text[j]
			if isDigit(c) {
				digits++
				seps = 0
			} else if isPhoneSep(c) || (c == '+' && j == start) {
				seps++
				if seps > 3 {
					break
				}
			} else {
				break
			}
			j++
		}
		// Trim trailing separators and an unbalanced ')'.
		end := j
		for end > start && !isDigit(text[end-1]) && text[end-1] != ')' {
			end--
		}
		if end > start && text[end-1] == ')' && strings.Count(text[start:end], "(") < strings.Count(text[start:end], ")") {
			end--
		}
		for end > start && !isDigit(text[end-1]) && text[end-1] != ')' {
			end--
		}
		// Parentheses around the whole number are punctuation, not an
		// area code: "(333 123 4567)" → "333 123 4567".
		if end > start && text[start] == '(' {
			if k := strings.IndexByte(text[start:end], ')'); k < 0 || start+k == end-1 {
				start++
				if k >= 0 {
					end--
				}
			}
		}
		i = j // skip the whole run whatever happens
		if digits < 7 || digits > 17 || end <= start {
			continue
		}
		if f, ok := d.check(text, start, end); ok {
			dst = append(dst, f)
		}
	}
	return dst
}

func (d phoneDetector) check(text string, start, end int) (Finding, bool) {
	cand := text[start:end]
	// Left: not glued to an identifier, an amount or a longer number.
	switch p := before(text, start); {
	case wordByte(p), p == '-', p == '.', p == '/', p == '#', p == '$', p == '+', p == '=', p == ':' && isDigit(before(text, start-1)):
		return Finding{}, false
	}
	// Right: not glued to a word, a time, a decimal part or a unit.
	nx, nx2 := at(text, end), at(text, end+1)
	switch {
	case wordByte(nx), nx == '%', nx == '_', nx == '$':
		return Finding{}, false
	case (nx == ':' || nx == ',' || nx == '.' || nx == '-' || nx == '/') && isDigit(nx2):
		return Finding{}, false
	}
	if strings.HasPrefix(text[end:], "€") {
		return Finding{}, false
	}
	if phoneDateRe.MatchString(cand) {
		return Finding{}, false
	}
	// Dotted runs of 4+ groups are IP addresses or version numbers.
	if strings.Count(cand, ".") >= 3 && !strings.ContainsAny(cand, " -/()+") {
		return Finding{}, false
	}
	num := cand
	intl := false
	switch {
	case strings.HasPrefix(num, "+"):
		intl = true
	case strings.HasPrefix(num, "00"):
		num, intl = "+"+num[2:], true
	}
	// E.164 numbers have at most 15 digits, country code included (ITU-T
	// E.164 §6); a longer run is a card, an account or an id.
	if digits := countDigits(num); digits > 15 || digits < 7 {
		return Finding{}, false
	}
	if !intl && !strings.ContainsAny(cand, " .-/()") && !hasPhoneContext(text, start) {
		// A bare run of digits is an order, invoice or customer number far
		// more often than a phone number.
		return Finding{}, false
	}
	pn, err := phonenumbers.Parse(num, d.region)
	if err != nil || !phonenumbers.IsValidNumber(pn) {
		return Finding{}, false
	}
	return Finding{Type: TypePhone, Start: start, End: end}, true
}

// hasPhoneContext reports whether one of phoneContext occurs in the 40 bytes
// before i (case-insensitive).
func hasPhoneContext(text string, i int) bool {
	lo := max(0, i-40)
	w := strings.ToLower(text[lo:i])
	for _, k := range phoneContext {
		if strings.Contains(w, k) {
			return true
		}
	}
	return false
}

func countDigits(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if isDigit(s[i]) {
			n++
		}
	}
	return n
}
