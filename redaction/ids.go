package redaction

import (
	"math"
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

// fiscalMonthBits has bit c-'A' set for each letter c of fiscalMonths.
var fiscalMonthBits = func() (m uint32) {
	for i := range len(fiscalMonths) {
		m |= 1 << (fiscalMonths[i] - 'A')
	}
	return m
}()

// isFiscalMonth reports whether c is an upper-case month letter of
// fiscalMonths (a test on every digit run's next letter: no call).
func isFiscalMonth(c byte) bool { return c-'A' < 26 && fiscalMonthBits>>(c-'A')&1 != 0 }

// detectFiscal checks the 16-byte tokens the prefilter found.
func detectFiscal(text string, toks []int32, dst []Finding) []Finding {
	var up [16]byte
	for _, t := range toks {
		i := int(t)
		if !isAlpha(text[i]) || (wordByte(before(text, i)) || wordByte(at(text, i+16))) && !underscored(text, i, i+16) {
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
				ok = isFiscalMonth(c)
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

// fiscalSep reports the bytes that may separate the groups of a fiscal
// code written grouped ("RSS MRA 80A01 H501U", "RSS-MRA-80A01-H501U",
// "RSS.MRA.80A01.H501U", "RSS_MRA_80A01_H501U", "RSS/MRA/80A01/H501U");
// the view maps every dash and space to '-' and ' '.
func fiscalSep(c byte) bool { return c == ' ' || c == '-' || c == '.' || c == '_' || c == '/' }

// fiscalSeps are the bytes fiscalSep reports.
const fiscalSeps = " -._/"

// detectFiscalGrouped finds fiscal codes written in groups: 16 characters
// with single separators (fiscalSep) between some of them, read from the
// digit runs of the prefilter. Every fiscal code but a fully omocodic one
// holds a digit run of one to three digits (year, day, place) no more than
// 14 characters after its start, and every code with at most six
// omocodic letters holds its year's run (fiscalYearAt), so each such run
// is walked back over to the group starts before it, and from each a code
// is read and checked as detectFiscal checks one: structure, day and check
// letter. The letters are all upper or all lower case. A code without any
// separator is left to detectFiscal. The starts read and turned down are
// appended to rejected, in increasing order (detectFiscalOmocodic does not
// read them again).
func detectFiscalGrouped(text string, digits []int32, dst []Finding, rejected []int32) ([]Finding, []int32) {
	var up [16]byte
	tried := -1                   // the last start tried (starts are tried in increasing order)
	sep := -1                     // the first separator at or after the last window's start (math.MaxInt: none)
	var next [len(fiscalSeps)]int // by byte of fiscalSeps: its next occurrence (math.MaxInt: none), -1 before any search
	for q := range next {
		next[q] = -1
	}
	for _, d := range digits {
		i := int(d)
		n := i
		for n < len(text) && isDigit(text[n]) {
			n++
		}
		// fiscalYearAt's cheap conditions first, the most selective one
		// (a month letter after the run) before the others: a year is
		// one or two digits after three letters of the name of the
		// code's one case (fiscalCaseBefore; in base64 and hashes
		// mostly not), and a separator near (below).
		if n-i > 2 || !fiscalYearMaybe(text, i, n) || !fiscalCaseBefore(text, i, n) {
			continue
		}
		// A grouped code holds a separator, and its year's run lies at its
		// 7th and 8th characters: the code starts at most 14 bytes before
		// the run (six letters, six separators, the year's first digit and
		// a separator when the run is its second) and ends at most 18
		// after it (nine characters, nine separators, when the run is one
		// digit). Runs with no separator that near (base64, hashes) are
		// not read further; the separators are found by one forward
		// search over the text, as the runs come in order.
		// Each separator's next occurrence is kept and searched for
		// again (strings.IndexByte, vectorised) only once passed.
		if lo := max(0, i-14); sep < lo {
			sep = math.MaxInt // none
			for q := range next {
				if next[q] < lo {
					next[q] = math.MaxInt
					if k := strings.IndexByte(text[lo:], fiscalSeps[q]); k >= 0 {
						next[q] = lo + k
					}
				}
				sep = min(sep, next[q])
			}
		}
		if sep > n+18 {
			continue
		}
		if y := readFiscalYear(text, i, n); !fiscalYearOf(text, &y) || fiscalEndsInWordOf(text, &y) {
			continue
		}
		// Group starts behind the run: at most 14 characters back.
		var starts [16]int
		ns := 0
		chars, k := 0, i
		for k > 0 && chars < 14 {
			c := text[k-1]
			if isAlnum(c) {
				k--
				chars++
				if !isAlnum(before(text, k)) && ns < len(starts) {
					starts[ns] = k
					ns++
				}
				continue
			}
			if fiscalSep(c) && isAlnum(before(text, k-1)) {
				k--
				continue
			}
			break
		}
		for q := ns - 1; q >= 0; q-- {
			st := starts[q]
			if st <= tried {
				continue
			}
			tried = st
			if !isAlpha(text[st]) || wordByte(before(text, st)) || before(text, st) == '-' && isAlnum(before(text, st-1)) {
				continue
			}
			if e, ok := fiscalGroupedAt(text, st, &up); ok {
				dst = append(dst, Finding{Type: TypeITFiscalCode, Start: st, End: e})
				tried = e
				break
			}
			rejected = append(rejected, int32(st))
		}
	}
	return dst, rejected
}

// detectFiscalOmocodic finds the fiscal codes detectFiscalGrouped cannot:
// fully omocodic ones (all seven digits replaced, no digit left) written
// in groups, "RSS MRA ULALM HRLMD". They are read from the upper-case
// word starts of the prefilter (caps), as detectFiscalGrouped reads a
// code (fiscalGroupedAt: structure, day, check letter), and kept only
// when no digit is left and every separator lies between two of the
// code's fields (surname 3, name 3, year 2, month 1, day 2, place 4,
// check 1: after the 3rd, 6th, 8th, 9th, 11th or 15th character), the
// way people group a code: against capitals in prose ("THE CAT SAT …")
// seven omocodic letters, a month letter, a valid day and the check
// letter must fall in field-shaped words. Written in lower case, or in
// groups that cut a field ("RSSM RAUL ALMH RLMD"), a fully omocodic code
// is found only unbroken (detectFiscal). Starts in rejected (increasing,
// detectFiscalGrouped's) are not read again: fiscalGroupedAt turned them
// down already.
func detectFiscalOmocodic(text string, caps []int32, dst []Finding, rejected []int32) []Finding {
	var up [16]byte
	end := -1
	for _, c := range caps {
		st := int(c)
		if st < end || len(text)-st < 17 || !isUpper(text[st]) || !isUpper(text[st+1]) || !isUpper(text[st+2]) {
			continue
		}
		if !fiscalOmocodicMaybe(text, st) {
			continue
		}
		for len(rejected) > 0 && int(rejected[0]) < st {
			rejected = rejected[1:]
		}
		if len(rejected) > 0 && int(rejected[0]) == st {
			continue
		}
		if wordByte(before(text, st)) || before(text, st) == '-' && isAlnum(before(text, st-1)) {
			continue
		}
		if !fiscalOmocodicHead(text, st) {
			continue
		}
		e, ok := fiscalGroupedAt(text, st, &up)
		if !ok || !fiscalFieldGroups(text, st, e) {
			continue
		}
		digit := false
		for _, b := range up {
			digit = digit || isDigit(b)
		}
		if digit {
			continue // detectFiscalGrouped's
		}
		dst = append(dst, Finding{Type: TypeITFiscalCode, Start: st, End: e})
		end = e
	}
	return dst
}

// fiscalOmocodicMaybe is a necessary condition for detectFiscalOmocodic
// to read a code at st (len(text)-st ≥ 17), which ends most capitals of
// prose and keys in a few loads ("BEGIN RSA", "PRIVATE KEY"): the 7th and
// 8th characters are adjacent omocodic letters, in text[st+6:st+10] (each
// of the two separators may come before them), and no separator comes
// before the 5th or 6th character (at text[st+4] or text[st+5]; one
// after the 3rd puts the 4th at text[st+4]).
func fiscalOmocodicMaybe(text string, st int) bool {
	c := &fiscalClass
	w := text[st : st+10]
	om := c[w[6]]&c[w[7]] | c[w[7]]&c[w[8]] | c[w[8]]&c[w[9]]
	return om&fcOmocodic != 0 && !(c[w[4]]&fcSep != 0 && c[w[5]]&fcAlnum != 0) && !(c[w[5]]&fcSep != 0 && c[w[6]]&fcAlnum != 0)
}

// fiscalOmocodicHead reports, for an upper-case start st with 17 bytes or
// more from it, that the first eight characters as fiscalGroupedAt reads
// them could begin a fully omocodic code: the first six are capitals (the
// code's case is its first letter's), the 7th and 8th (the year, no digit
// left) are omocodic letters, and a separator among them lies after the
// 3rd or the 6th (fiscalFieldGroups). Capitals in prose and keys ("BEGIN
// RSA PRIVATE", "AKIA IOSF ODNN") and a grouped code's digits ("RSS MRA
// 8LALM" read from MRA) end here. The bytes read lie within
// text[st:st+16] (two a step at most).
func fiscalOmocodicHead(text string, st int) bool {
	j, ok := st, true
	for k := 1; k < 8 && ok; k++ {
		j++
		if fiscalClass[text[j]]&fcSep != 0 && fiscalClass[text[j+1]]&fcAlnum != 0 {
			ok = k == 3 || k == 6
			j++
		}
		if k < 6 {
			ok = ok && isUpper(text[j])
		} else {
			ok = ok && fiscalClass[text[j]]&fcOmocodic != 0
		}
	}
	return ok
}

// fiscalClass holds, by byte, the classes detectFiscalOmocodic reads at
// every byte of a candidate (fiscalSep, isAlnum, isOmocodic): one load
// where the tests are chains of comparisons.
var fiscalClass = func() (t [256]uint8) {
	for c := range t {
		b := byte(c)
		if fiscalSep(b) {
			t[c] |= fcSep
		}
		if isAlnum(b) {
			t[c] |= fcAlnum
		}
		if isOmocodic(b) {
			t[c] |= fcOmocodic
		}
	}
	return t
}()

const (
	fcSep = 1 << iota
	fcAlnum
	fcOmocodic
)

// fiscalFieldGroups reports whether every separator of the grouped code
// text[st:e] lies between two of its fields (after its 3rd, 6th, 8th,
// 9th, 11th or 15th character).
func fiscalFieldGroups(text string, st, e int) bool {
	k := 0
	for j := st; j < e; j++ {
		if isAlnum(text[j]) {
			k++
			continue
		}
		switch k {
		case 3, 6, 8, 9, 11, 15:
		default:
			return false
		}
	}
	return true
}

// fiscalYearAt reports whether the digit run text[i:n] may be a fiscal
// code's year: one or two digits (one when a separator splits the year)
// after six letters (single separators between them), followed by a
// month letter and the day's first character (fiscalMonthEnd), or one
// digit followed by an omocodic letter and then the month (the year's
// second digit replaced); the six letters are all upper or all lower
// case. Omocodic codes replace digits from the right
// (positions 14, 13, 12, 10, 9, 7, 6), so every code with at most six
// replaced digits holds this shape; it is the cheap test that keeps
// detectFiscalGrouped off the digit runs of prose, hashes and
// identifiers. A fully omocodic code (no digit at all) is found unbroken
// (detectFiscal) or, in groups, from its upper-case word starts
// (detectFiscalOmocodic).
func fiscalYearAt(text string, i, n int) bool {
	if n-i > 2 {
		return false
	}
	y := readFiscalYear(text, i, n)
	return fiscalYearOf(text, &y)
}

// fiscalYear holds fiscalMonthEnd's two readings of a digit run text[i:n]
// as a year, each read at most once for fiscalYearOf and
// fiscalEndsInWordOf: ok1 and e1 with the month right after the run, ok2
// and e2 (only for a one-digit run, read when first needed: most runs
// are turned down before) after an omocodic letter that replaces the
// year's second digit.
type fiscalYear struct {
	i, n     int
	ok1, ok2 bool
	e1, e2   int
	read2    bool
}

// readFiscalYear returns the readings of the digit run text[i:n] with the
// first one read.
func readFiscalYear(text string, i, n int) fiscalYear {
	y := fiscalYear{i: i, n: n, e2: -1}
	y.ok1, y.e1 = fiscalMonthEnd(text, n)
	return y
}

// second reads (once) and returns ok2.
func (y *fiscalYear) second(text string) bool {
	if !y.read2 {
		y.read2 = true
		if y.n-y.i == 1 {
			y.ok2, y.e2 = fiscalMonthEnd(text, omocodicAfter(text, y.n))
		}
	}
	return y.ok2
}

// fiscalYearOf is fiscalYearAt with the readings y of the run (at most
// two digits).
func fiscalYearOf(text string, y *fiscalYear) bool {
	i, n, k := y.i, y.n, y.i
	switch {
	case y.ok1:
		if n-i == 1 && fiscalSep(before(text, k)) && isDigit(before(text, k-1)) {
			k -= 2 // "8 0": the year's first digit
		}
	case y.second(text):
		// "8L": the year's second digit replaced (six omocodic letters).
	default:
		return false
	}
	// The six letters are of one case, as fiscalGroupedAt reads a code:
	// in base64 and hashes six letters in a row mostly are not.
	cases := 0 // bit 0: an upper-case letter seen; bit 1: a lower-case one
	for range 6 {
		if k > 1 && fiscalSep(text[k-1]) && isAlpha(text[k-2]) {
			k--
		}
		c := before(text, k)
		if !isAlpha(c) {
			return false
		}
		cases |= 1 << boolInt(isLower(c))
		k--
	}
	return cases != 3
}

// fiscalEndsInWordOf reports, for a digit run fiscalYearAt accepts (y its
// readings), that every code holding it as its year ends where
// fiscalGroupedAt turns a code down (inside a word, or before '-' and more
// of one): each reading of the run as a year (fiscalYearAt's two) that
// holds has its day's first digit replaced, so the code's end is known
// from the run on, whichever start it has.
func fiscalEndsInWordOf(text string, y *fiscalYear) bool {
	bad := func(ok bool, e int) bool {
		return !ok || e >= 0 && (wordByte(at(text, e)) || at(text, e) == '-' && isAlnum(at(text, e+1)))
	}
	ok2 := y.second(text)
	return (y.ok1 || ok2) && bad(y.ok1, y.e1) && bad(ok2, y.e2)
}

// fiscalCaseBefore reports, for a digit run text[i:n] that
// fiscalYearMaybe admits, that the three characters before the year it
// may be (single separators between them) are letters of the case of the
// letter after the run (at most one separator on): every code that
// fiscalGroupedAt reads holds its year after six letters, and its letters
// are of one case, the month's (or the omocodic letter's that replaces
// the year's second digit) with them. The year is the run, or, for a
// one-digit run after a separator and a digit ("8 0"), that digit and the
// run, as fiscalYearOf reads it.
func fiscalCaseBefore(text string, i, n int) bool {
	m := n
	if fiscalSep(at(text, m)) {
		m++
	}
	if m >= len(text) {
		return false // no letter after the run: no year (fiscalYearMaybe)
	}
	want := text[m] & 0x20
	k := i
	if n-i == 1 && fiscalSep(before(text, k)) && isDigit(before(text, k-1)) {
		k -= 2
	}
	for range 3 {
		if k > 1 && fiscalSep(text[k-1]) && isAlpha(text[k-2]) {
			k--
		}
		c := before(text, k)
		if !isAlpha(c) || c&0x20 != want {
			return false
		}
		k--
	}
	return true
}

// fiscalYearMaybe is fiscalYearAt's first condition, cheap enough to
// inline: after the digit run text[i:n] (and at most one separator), a
// month letter, or an omocodic letter after a single digit.
func fiscalYearMaybe(text string, i, n int) bool {
	letters := fiscalMonthBits
	if n-i == 1 {
		letters |= omocodicBits
	}
	if n < len(text) && fiscalSep(text[n]) {
		n++
	}
	if n >= len(text) {
		return false
	}
	u := text[n]&^0x20 - 'A'
	return u < 26 && letters>>u&1 != 0
}

// omocodicBits has bit c-'A' set for each omocodic letter c (see
// isOmocodic).
const omocodicBits = 1<<('L'-'A') | 1<<('M'-'A') | 1<<('N'-'A') | 1<<('P'-'A') | 1<<('Q'-'A') | 1<<('R'-'A') |
	1<<('S'-'A') | 1<<('T'-'A') | 1<<('U'-'A') | 1<<('V'-'A')

// isOmocodic reports whether c is a letter that replaces a digit in an
// omocodic fiscal code (LMNPQRSTUV for 0-9), either case.
func isOmocodic(c byte) bool {
	if isLower(c) {
		c -= 'a' - 'A'
	}
	return c >= 'L' && c <= 'V' && c != 'O'
}

// omocodicAfter returns the end of the omocodic letter after the digit
// run ending at n (after at most one separator), or -1.
func omocodicAfter(text string, n int) int {
	j := n
	if fiscalSep(at(text, j)) {
		j++
	}
	if !isOmocodic(at(text, j)) {
		return -1
	}
	return j + 1
}

// fiscalMonthEnd reports whether the digit run ending at n may be a
// fiscal code's year: it is followed (after at most one separator) by a
// month letter (fiscalMonths, either case) and then (after at most one
// separator) by the day's first character: a digit, or an omocodic letter
// followed by the rest of a code whose digits are all replaced from there
// on. n < 0 reports false. end is the end of the code when its day's
// first digit is replaced (the code's last character is then read), -1
// when the day starts with a digit.
func fiscalMonthEnd(text string, n int) (ok bool, end int) {
	if n < 0 {
		return false, -1
	}
	j := n
	if fiscalSep(at(text, j)) {
		j++
	}
	c := at(text, j)
	if isLower(c) {
		c -= 'a' - 'A'
	}
	if !isFiscalMonth(c) {
		return false, -1
	}
	j++
	if fiscalSep(at(text, j)) {
		j++
	}
	if isDigit(at(text, j)) {
		return true, -1
	}
	// The day's first digit is replaced only when every digit after it
	// is: omocodic letters for the day's second digit and the place's
	// three, a letter between them and the check letter at the end.
	for k := 9; k < 16; k++ {
		if k > 9 && fiscalSep(at(text, j)) {
			j++
		}
		c := at(text, j)
		if k == 11 || k == 15 {
			if !isAlpha(c) {
				return false, -1
			}
		} else if !isOmocodic(c) {
			return false, -1
		}
		j++
	}
	return true, j
}

// fiscalGroupedAt reads a grouped fiscal code starting at st into up and
// returns its end.
func fiscalGroupedAt(text string, st int, up *[16]byte) (int, bool) {
	j, seps, lower, upper := st, 0, false, false
	for k := 0; k < 16; k++ {
		if k > 0 && fiscalSep(at(text, j)) && isAlnum(at(text, j+1)) {
			j++
			seps++
		}
		c := at(text, j)
		switch {
		case isLower(c):
			lower = true
			c -= 'a' - 'A'
		case isUpper(c):
			upper = true
		case !isDigit(c):
			return 0, false
		}
		var ok bool
		switch k {
		case 0, 1, 2, 3, 4, 5, 11, 15:
			ok = isUpper(c)
		case 8:
			ok = isFiscalMonth(c)
		default:
			ok = isDigit(c) || strings.IndexByte("LMNPQRSTUV", c) >= 0
		}
		if !ok {
			return 0, false
		}
		up[k] = c
		j++
	}
	if seps == 0 || lower && upper || wordByte(at(text, j)) || at(text, j) == '-' && isAlnum(at(text, j+1)) ||
		!fiscalDayOK(up[9], up[10]) || !fiscalCheck(up[:]) {
		return 0, false
	}
	return j, true
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
