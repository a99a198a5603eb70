package redaction

import (
	"net/netip"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// Numbers (cards, IBANs, SSNs, phone numbers, IPv4 addresses) are found
// from digit clusters: runs of ASCII digits (the view has already mapped
// the digits of other scripts, fullwidth forms and %20) joined by gaps of
// one to three separator bytes (space, tab, newline, . / + _ - ( )). Every
// way people (or evasions) space a number out is one cluster: "4111 1111
// 1111 1111", "4 1 1 1 …", "4111-1111 1111.1111", "4111  1111--1111".
// Each type's validator looks at sub-ranges of a cluster's atoms whose
// edges are natural: the whole cluster, or edges whose gap differs from
// every gap inside the sub-range ("4111 1111 1111 1111, 12/27"), or, for
// cards, a printed card layout.

// maxGap is the longest separator run inside a number.
const maxGap = 3

func isNumSep(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '.', '/', '+', '_', '-', '(', ')':
		return true
	}
	return false
}

// numAtom is a run of digits text[s:e] and the gap text[e:next start)
// after it.
type numAtom struct{ s, e int }

// cluster is the atoms of one digit cluster.
type cluster struct {
	atoms []numAtom
}

// gap returns the separator bytes between atoms k-1 and k.
func (c *cluster) gap(text string, k int) string { return text[c.atoms[k-1].e:c.atoms[k].s] }

// digitsOf returns the digits of atoms [i, j), from the cluster's digit
// string (ds, with off[k] the offset of atom k's digits in it).
func (ns *numScan) digitsOf(i, j int) string { return ns.ds[ns.off[i]:ns.off[j]] }

// allSingle reports whether every atom of [i, j) is one digit: a number
// written with a separator between every digit.
func (c *cluster) allSingle(i, j int) bool {
	for k := i; k < j; k++ {
		if c.atoms[k].e-c.atoms[k].s != 1 {
			return false
		}
	}
	return true
}

// gapsAre reports whether every gap inside [i, j) is exactly g.
func (c *cluster) gapsAre(text string, i, j int, g string) bool {
	for k := i + 1; k < j; k++ {
		if c.gap(text, k) != g {
			return false
		}
	}
	return true
}

// lens returns the atom lengths of [i, j).
func (c *cluster) lens(i, j int, dst []int) []int {
	for k := i; k < j; k++ {
		dst = append(dst, c.atoms[k].e-c.atoms[k].s)
	}
	return dst
}

// readCluster reads the cluster starting at the digit text[s] into c and
// returns the offset after its last digit.
func readCluster(text string, s int, c *cluster) int {
	c.atoms = c.atoms[:0]
	i := s
	for {
		e := i
		for e < len(text) && isDigit(text[e]) {
			e++
		}
		c.atoms = append(c.atoms, numAtom{i, e})
		g := e
		for g < len(text) && g-e < maxGap && isNumSep(text[g]) {
			g++
		}
		if g == e || g >= len(text) || !isDigit(text[g]) || len(c.atoms) >= 4096 {
			return e
		}
		i = g
	}
}

// numScan runs the numeric validators over every digit cluster.
type numScan struct {
	s      *Scanner
	text   string
	c      cluster
	digits []byte
	lens   []int
	dst    []Finding
	gid    []uint8  // gid[k]: id of the gap before atom k (k ≥ 1), ids < 64
	ds     string   // the cluster's digits
	off    []int    // off[k]: offset of atom k's digits in ds; off[len(atoms)] = len(ds)
	gaps   []string // distinct gaps of the cluster, by id
	mask   uint64   // ids of the gaps inside the sub-range being checked
}

// gapIDs numbers the distinct gaps of the current cluster (the 64th and
// later share id 63, which only makes edges look less natural).
func (ns *numScan) gapIDs() {
	c := &ns.c
	ns.gid = ns.gid[:0]
	ns.gaps = ns.gaps[:0]
	ns.gid = append(ns.gid, 0)
	prev := -1 // the byte of the gap before when it is one byte, else -1
	for k := 1; k < len(c.atoms); k++ {
		g := c.gap(ns.text, k)
		if len(g) == 1 {
			// The gap before is most often the same byte.
			if int(g[0]) == prev {
				ns.gid = append(ns.gid, ns.gid[k-1])
				continue
			}
			prev = int(g[0])
		} else {
			prev = -1
		}
		id := -1
		for q, h := range ns.gaps {
			if h == g {
				id = q
				break
			}
		}
		if id < 0 {
			id = min(len(ns.gaps), 63)
			if len(ns.gaps) < 64 {
				ns.gaps = append(ns.gaps, g)
			}
		}
		ns.gid = append(ns.gid, uint8(id))
	}
}

// detectNumbers runs the numeric validators over the digit clusters of
// text, with ns's buffers (kept for the next scan).
func (s *Scanner) detectNumbers(text string, a *anchors, dst []Finding, b *budget, ns *numScan) []Finding {
	*ns = numScan{s: s, text: text, dst: dst, c: cluster{atoms: ns.c.atoms[:0]}, digits: ns.digits[:0],
		lens: ns.lens[:0], gid: ns.gid[:0], off: ns.off[:0], gaps: ns.gaps[:0]}
	defer func() {
		// Nothing in the pool keeps the text or the findings.
		clear(ns.gaps)
		ns.text, ns.dst, ns.ds = "", nil, ""
	}()
	end := -1
	for _, d := range a.digits {
		i := int(d)
		if i < end {
			continue
		}
		// A digit run inside a word ("7f3c9a2e", "ORD2024") that no
		// separator continues is a cluster of one glued atom: nothing
		// but an IBAN can start there.
		if p := before(text, i); isAlnum(p) || p == '_' {
			e := i
			for e < len(text) && isDigit(text[e]) {
				e++
			}
			g := e
			for g < len(text) && g-e < maxGap && isNumSep(text[g]) {
				g++
			}
			if g == e || g >= len(text) || !isDigit(text[g]) {
				end = e
				// A whole card number glued to an identifier ("call_4111…",
				// "ref4111…") is still a card: 13–19 digits that end the
				// word, pass Luhn and carry an issuer's prefix are too rare
				// by chance (one in ~10^13 digit strings per scheme) to be
				// anything else, and ids are where values get smuggled.
				if s.en.CreditCard && e-i >= 13 && e-i <= 19 && (!rightGlued(text, e) || underscored(text, i, e)) {
					if sub, ok := validPAN(text[i:e]); ok {
						ns.add(TypeCreditCard, sub, i, e)
					}
				}
				if s.en.IBAN && isAlpha(p) && !ibanInWord(text, i) {
					ns.c.atoms = append(ns.c.atoms[:0], numAtom{i, e})
					ns.iban()
				}
				continue
			}
		}
		end = readCluster(text, i, &ns.c)
		if !b.spend(1 + len(ns.c.atoms)) {
			break
		}
		ns.cluster()
		if s.en.IBAN {
			ns.iban()
		}
	}
	return ns.dst
}

// leftGlued reports whether the cluster starting at s continues an
// identifier: a word byte right before it, or a '-', '.', '/', '_' or '#'
// after a word byte ("ORD-2024-…", "v1.2", "#4155…").
func leftGlued(text string, s int) bool {
	p := before(text, s)
	if p >= 0x80 {
		return numGlueBefore(text, s)
	}
	if wordByte(p) || p == '$' || p == '#' && !isNumSSNHash(text, s) {
		return true
	}
	if p == '-' || p == '.' || p == '/' || p == '_' {
		return wordByte(before(text, s-1))
	}
	return false
}

// numGlueBefore and numGlueAt report whether the non-ASCII character
// before s (at e) glues a number to a word: a letter, digit or mark of a
// script written with spaces. Chinese, Japanese and Korean are written
// without spaces between words, so a number right after "卡号" or before
// "です" stands alone (see cjk); so does one next to a symbol.
func numGlueBefore(text string, s int) bool {
	r, _ := utf8.DecodeLastRuneInString(text[:s])
	return numGlueRune(r)
}

func numGlueAt(text string, e int) bool {
	r, _ := utf8.DecodeRuneInString(text[e:])
	return numGlueRune(r)
}

func numGlueRune(r rune) bool {
	if r == utf8.RuneError {
		return true // part of a non-UTF-8 run: keep the old reading
	}
	return (unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r)) && !cjk(r)
}

// isNumSSNHash reports whether the '#' before s is "SS#" / "SSN#".
func isNumSSNHash(text string, s int) bool {
	return hasContext(text, s, ssnHash, 5)
}

var ssnHash = newCtxWords("ss#", "ssn#")

// rightGlued reports whether a number ending at e runs on into a word, a
// decimal or thousands part, a percentage or a currency.
func rightGlued(text string, e int) bool {
	nx := at(text, e)
	switch {
	case nx >= 0x80 && !strings.HasPrefix(text[e:], "€"):
		return numGlueAt(text, e)
	case wordByte(nx):
		return true
	case nx == ',' && isDigit(at(text, e+1)), nx == ':' && isDigit(at(text, e+1)), nx == '%':
		return true
	}
	return strings.HasPrefix(text[e:], "€") || strings.HasPrefix(text[e:], " €") || strings.HasPrefix(text[e:], " %")
}

func (ns *numScan) add(typ, sub string, s, e int) {
	if ns.dst == nil {
		// Room for a few findings at once, not one by one.
		ns.dst = make([]Finding, 0, 8)
	}
	ns.dst = append(ns.dst, Finding{Type: typ, Subtype: sub, Start: s, End: e})
}

// cluster tries every type on the sub-ranges of the current cluster with
// natural edges (each edge is the cluster's edge or a gap that differs
// from every gap inside the sub-range), and cards on printed layouts. The
// gap ids make each edge test O(1); a sub-range whose right edge is
// already one of its inner gaps cannot grow to the left into a natural
// one, so each end stops early: the whole walk is O(atoms × 19).
func (ns *numScan) cluster() {
	text, c := ns.text, &ns.c
	n := len(c.atoms)
	if n == 1 && c.atoms[0].e-c.atoms[0].s > 34 {
		return // a run of digits longer than any value
	}
	total := 0
	for _, a := range c.atoms {
		total += a.e - a.s
	}
	if total < 4 || total < 7 && n != 4 {
		return // shorter than any value but an IPv4 address
	}
	ns.gapIDs()
	ns.digits, ns.off = ns.digits[:0], ns.off[:0]
	for _, a := range c.atoms {
		ns.off = append(ns.off, len(ns.digits))
		if a.e-a.s == 1 {
			ns.digits = append(ns.digits, text[a.s]) // no copy call for one digit ("4 1 4 1 …")
		} else {
			ns.digits = append(ns.digits, text[a.s:a.e]...)
		}
	}
	ns.off = append(ns.off, len(ns.digits))
	// A view of the reused buffer, valid while this cluster is checked
	// (nothing keeps it: validators only read it).
	ns.ds = unsafe.String(unsafe.SliceData(ns.digits), len(ns.digits))
	lglued := leftGlued(text, c.atoms[0].s)
	rglued := rightGlued(text, c.atoms[n-1].e)
	if s0 := c.atoms[0].s; (lglued || rglued) && (underscored(text, s0, c.atoms[n-1].e) || before(text, s0) == '+' && underscored(text, s0-1, c.atoms[n-1].e)) {
		lglued, rglued = false, false // "_4111 1111 1111 1111_": emphasis
	}
	// A whole card glued to an identifier ("call_4111-1111-1111-1111"):
	// the cluster in a printed card layout, ending the word, passing Luhn.
	if lglued && !rglued && ns.s.en.CreditCard && n > 1 {
		if nd := len(ns.ds); nd >= 13 && nd <= 19 {
			if g := c.gap(text, 1); len(g) == 1 && c.gapsAre(text, 0, n, g) && cardLayout(c.lens(0, n, ns.lens[:0])) {
				if sub, ok := validPAN(ns.ds); ok {
					ns.add(TypeCreditCard, sub, c.atoms[0].s, c.atoms[n-1].e)
				}
			}
		}
	}
	cardFloor := n + 1 // a card found at [i, ·) makes later layouts ending after i moot
	// One gap throughout ("4 1 4 1 …", "4111 1111 …"): the gap at an
	// inner edge j is every inner gap, so the one sub-range ending there
	// with natural edges is atom j-1 alone (the walk below stops at the
	// atom before it).
	uniform := len(ns.gaps) == 1
	for j := n; j >= 1; j-- {
		if j == n && rglued {
			continue
		}
		if uniform && j < n {
			i := j - 1
			if d := c.atoms[i].e - c.atoms[i].s; d >= minValueDigits && d <= 19 && !(i == 0 && lglued) {
				ns.mask = 0
				ns.subrange(i, j, d, true)
			}
		} else {
			ns.naturalEndingAt(j, lglued)
		}
		// Cards printed 4-4-4-4(-x) or 4-6-5 inside a cluster of a few
		// more groups with one separator ("4111 1111 1111 1111 2027"); a
		// longer run of groups is a table of numbers.
		if ns.s.en.CreditCard && j <= cardFloor && n <= 8 {
			for _, k := range []int{4, 5, 3} {
				i := j - k
				if i < 0 || i == 0 && lglued || j == n && rglued {
					continue
				}
				nd := 0
				for q := i; q < j; q++ {
					nd += c.atoms[q].e - c.atoms[q].s
				}
				if nd >= 13 && nd <= 19 && (i > 0 || j < n) {
					before := len(ns.dst)
					ns.subrange(i, j, nd, false)
					if len(ns.dst) > before {
						cardFloor = i
						break
					}
				}
			}
		}
	}
}

// naturalEndingAt tries every type on the sub-ranges of the current
// cluster that end at atom j with natural edges (see cluster); lglued says
// the cluster continues an identifier on its left.
func (ns *numScan) naturalEndingAt(j int, lglued bool) {
	c, n := &ns.c, len(ns.c.atoms)
	digits := 0
	var mask, right uint64 // right: the gap at j, the sub-range's right edge
	if j < n {
		right = 1 << ns.gid[j]
	}
	for i := j - 1; i >= 0; i-- {
		digits += c.atoms[i].e - c.atoms[i].s
		if digits > 19 {
			break
		}
		if i < j-1 {
			mask |= 1 << ns.gid[i+1]
		}
		if mask&right != 0 {
			break
		}
		if i == 0 && lglued || i > 0 && mask&(1<<ns.gid[i]) != 0 {
			continue
		}
		if digits < minValueDigits {
			continue // subrange would find nothing
		}
		ns.mask = mask
		ns.subrange(i, j, digits, true)
	}
}

// minValueDigits is the fewest digits of a value subrange looks for: an
// IPv4 address's four (cards have 13, SSNs 9, phone numbers 7).
const minValueDigits = 4

func (ns *numScan) subrange(i, j, nd int, natural bool) {
	text, c, s := ns.text, &ns.c, ns.s
	start, end := c.atoms[i].s, c.atoms[j-1].e
	if !natural && !s.en.CreditCard {
		return
	}
	if s.en.CreditCard && nd >= 13 && nd <= 19 {
		ns.lens = c.lens(i, j, ns.lens[:0])
		sep := byte(0)
		if j-i > 1 {
			if g := c.gap(text, i+1); len(g) == 1 && c.gapsAre(text, i, j, g) {
				sep = g[0]
			} else {
				sep = 1 // mixed
			}
		}
		if natural || sep > 1 && cardLayout(ns.lens) && (i == 0 || len(c.gap(text, i)) > 0) {
			if sub, ok := validPAN(ns.digitsOf(i, j)); ok && !ibanTail(text, start) {
				ns.add(TypeCreditCard, sub, start, end)
			}
		}
	}
	if !natural {
		return
	}
	if s.en.USSSN && nd == 9 {
		ns.lens = c.lens(i, j, ns.lens[:0])
		// 3-2-4 with any separators, one digit at a time, mixed
		// separators or groups of four (evasions), or any shape after a
		// word such as "SSN".
		ok := len(ns.lens) == 3 && ns.lens[0] == 3 && ns.lens[1] == 2 && ns.lens[2] == 4 ||
			j-i == 9 || j-i > 1 && !c.gapsAre(text, i, j, c.gap(text, i+1)) ||
			len(ns.lens) == 3 && ns.lens[0] == 4 && ns.lens[1] == 4 ||
			hasContext(text, start, ssnContext, 40)
		if ok {
			d := ns.digitsOf(i, j)
			ctx := hasContext(text, start, ssnContext, 40)
			// Nine digits one at a time are a phone number when they are one.
			if j-i == 9 && !ctx && d[0] == '0' && ns.nationalPhone(d) {
				ok = false
			}
			if ok && validSSN(d) && !(i == 0 && before(text, start) == '#' && !ctx) {
				ns.add(TypeUSSSN, "", start, end)
			}
		}
	}
	if s.en.IPAddress && j-i == 4 && nd <= 12 && c.gapsAre(text, i, j, ".") {
		if a, err := netip.ParseAddr(text[start:end]); err == nil && a.Is4() && !hasContext(text, start, versionContext, 24) &&
			before(text, start) != '.' && !(at(text, end) == '.' && isDigit(at(text, end+1))) && !(at(text, end) == '/' && isDigit(at(text, end+1))) {
			ns.add(TypeIPAddress, ipClass(a), start, end)
		}
	}
	if s.en.Phone && nd >= 7 && nd <= 17 {
		ns.phone(i, j)
	}
}

// nationalPhone reports whether digits are a valid national number of one
// of the scanner's phone regions.
func (ns *numScan) nationalPhone(digits string) bool {
	for _, r := range ns.s.phoneRegions {
		if validNational(digits, r) {
			return true
		}
	}
	return false
}

// cardLayout reports whether atom lengths follow a layout printed on
// cards: groups of four with a shorter last group, or 4-6-5 / 4-6-4.
func cardLayout(lens []int) bool {
	if len(lens) == 3 && lens[0] == 4 && lens[1] == 6 && (lens[2] == 5 || lens[2] == 4) {
		return true
	}
	for k, l := range lens {
		if l != 4 && (k != len(lens)-1 || l > 4) {
			return false
		}
	}
	return true
}

// validSSN checks nine digits against the SSA's never-issued numbers:
// area 000, 666 or 900–999, group 00, serial 0000, and the numbers voided
// after appearing in advertising (078-05-1120, 219-09-9999) plus the
// stock example 123-45-6789.
func validSSN(d string) bool {
	area, group, serial := d[0:3], d[3:5], d[5:9]
	return !(area == "000" || area == "666" || area[0] == '9' || group == "00" || serial == "0000" || ssnVoid[d])
}

var ssnVoid = map[string]bool{"078051120": true, "219099999": true, "123456789": true}

// ssnContext are the words that make a bare run of nine digits an SSN.
var ssnContext = newCtxWords("ssn", "social security", "soc. sec", "soc sec", "ss#", "ss #", "ss no", "taxpayer", "tin:")

// versionContext are words after which a dotted quad is a version, not an
// address.
var versionContext = newCtxWords("version", "versione", "versión", "ver.", "ver ", "build", "release", "firmware", "fw ", "kernel", "revision", "rev.", "patch", "sdk ", "v.", "rilascio", "versao", "versão")

// ctxWords is a list of context words (lower case) with a table of their
// first bytes, so that looking for them in a window mostly costs one
// look-up per byte.
type ctxWords struct {
	words []string
	first [256]bool
}

func newCtxWords(words ...string) *ctxWords {
	c := &ctxWords{words: words}
	for _, w := range words {
		c.first[w[0]] = true
		c.first[w[0]&^0x20] = true
	}
	return c
}

// hasContext reports whether one of words occurs, starting at a word
// edge, in the window bytes before i, ASCII case-insensitively.
func hasContext(text string, i int, words *ctxWords, window int) bool {
	lo := max(0, i-window)
	w := text[lo:i]
	for k := 0; k < len(w); k++ {
		if !words.first[w[k]] {
			continue
		}
		c := lowerByte[w[k]]
		if isAlpha(c) && k > 0 && isAlpha(w[k-1]) {
			continue // words start at a word edge
		}
		for _, word := range words.words {
			if word[0] == c && hasPrefixFold(w, k, word) {
				return true
			}
		}
	}
	return false
}

// ibanTail reports whether the digits at start follow an IBAN's country
// code and check digits ("DE23 6644 …"): the rest of an IBAN (valid or not)
// is not a card number.
func ibanTail(text string, start int) bool {
	if start < 5 {
		return false
	}
	p := text[start-5 : start]
	return isAlpha(p[0]) && isAlpha(p[1]) && isDigit(p[2]) && isDigit(p[3]) && (p[4] == ' ' || p[4] == '-') && !wordByte(before(text, start-5))
}

// iban looks for an IBAN whose check digits start the current cluster:
// two letters before it (a registry country code, any case, with or
// without separators) and then letters and digits, separators allowed
// between them, up to the country's IBAN length, verified by MOD 97-10.
func (ns *numScan) iban() {
	text := ns.text
	s := ns.c.atoms[0].s
	// The two letters before, skipping gaps.
	k := s
	var cc [2]byte
	for n := 1; n >= 0; n-- {
		g := 0
		for k > 0 && g < maxGap && isNumSep(text[k-1]) {
			k--
			g++
		}
		if k == 0 || !isAlpha(text[k-1]) {
			return
		}
		k--
		cc[n] = text[k] &^ 0x20
	}
	p := before(text, k)
	if p >= 0x80 && numGlueBefore(text, k) || p < 0x80 && wordByte(p) && p != '_' {
		return
	}
	want := int(ibanLengthOf[cc[0]-'A'][cc[1]-'A'])
	if want == 0 {
		return
	}
	var buf [34]byte
	got, j := 0, k
	for j < len(text) && got < want {
		c := text[j]
		if isAlnum(c) {
			buf[got] = c &^ (0x20 * byte(boolInt(isLower(c))))
			got++
			j++
			continue
		}
		g := j
		for g < len(text) && g-j < maxGap && isNumSep(text[g]) {
			g++
		}
		if g == j || g >= len(text) || !isAlnum(text[g]) {
			return
		}
		j = g
	}
	if got != want || isAlnum(at(text, j)) || at(text, j) >= 0x80 && numGlueAt(text, j) {
		return
	}
	if p == '_' && !underscored(text, k, j) {
		return // glued to an identifier, not set in emphasis
	}
	if ibanValid(buf[:got]) {
		ns.add(TypeIBAN, string(cc[:]), k, j)
	}
}

// ibanInWord reports whether the digit run at i follows two ASCII letters
// inside a longer word ("xYZ12", as in base64): iban turns it down (an
// IBAN's country code stands apart from the word before it), so
// detectNumbers does not call it. A '_' before the letters is a word
// byte unless it opens Markdown emphasis ("__IT60 X054 …__", which iban
// reads).
func ibanInWord(text string, i int) bool {
	if i < 3 {
		return false
	}
	b, c := text[i-2], text[i-3] // a letter, then a word byte (ASCII)
	return (b|0x20)-'a' < 26 && ((c|0x20)-'a' < 26 || c-'0' < 10 || c == '_' && !emphasisOpens(text, i-2))
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
