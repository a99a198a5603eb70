package redaction

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/net/publicsuffix"
)

// E-mail addresses: a practical subset of the RFC 5322 §3.4.1 addr-spec,
// i.e. a dot-atom local part of RFC 5322 atext (at most 64 bytes, RFC 5321
// §4.5.3.1.1) and a DNS host name of at least two labels (RFC 1035: 1–63
// letters, digits and inner hyphens each, at most 253 bytes) whose
// top-level label is alphabetic (or an A-label, "xn--p1ai"). Both sides
// also take the letters, digits and marks of every script, as RFC 6531
// §3.3 (internationalised local parts, "josé@example.com") and IDNA 2008
// (domain labels, "anna@exämple.de") allow. Quoted local parts and address literals
// are left out on purpose: they are rare in prose and make a pattern match
// far too much. A match glued to a longer word is rejected, and so is the
// "password@host" part of a URL's userinfo (URL_CREDENTIALS covers that).
// The local part stops at a '=', '/' or '?' ("user=mario@…", a URL path
// before the address), which atext allows but which in practice delimit a
// key or a path, and leaves out Markdown emphasis around the address (a
// leading run of '*' or '~', a pair of '_' runs: "**mario@example.it**",
// "_anna@example.org_"). The "git" account of a git remote
// ("git@github.com:org/repo.git", "ssh://git@host/…") is no address.
//
// Addresses written out for humans ("maria dot rossi at example dot org",
// "anna[at]example.it", "jean point martin arobase example point fr",
// "anna @ example.it")
// are found from their at-word (see atWords), with the domain's top-level
// label checked against the ICANN section of the Public Suffix List
// (golang.org/x/net/publicsuffix). The obfuscations of the bytes
// themselves (HTML references, percent-encoding, homoglyphs, combining
// marks, fullwidth forms, zero-width characters) are undone by the
// normalised view before this runs.

// atext per RFC 5322 §3.2.3, minus the apostrophe, backquote, '{' and '|',
// which in prose quote or delimit an address far more often than they
// belong to it.
func isAtext(c byte) bool { return atextTable[c] }

var atextTable = func() (t [256]bool) {
	for c := range t {
		t[c] = isAlnum(byte(c)) || strings.IndexByte("!#$%&*+/=?^_}~-", byte(c)) >= 0
	}
	return t
}()

// emailRune reports the non-ASCII characters of an internationalised
// address: letters, digits and marks, which RFC 6531 §3.3 admits in the
// local part (UTF8-non-ascii) and IDNA 2008 (RFC 5892) in domain labels.
func emailRune(r rune) bool {
	return r >= 0x80 && r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r))
}

// gluedBefore and gluedAfter report whether the text around [s, e) goes on
// with a letter or digit of any script: the match is then part of a
// longer word. Chinese, Japanese and Korean text is written without
// spaces, so a CJK character next to an ASCII end of the match is a word
// boundary, not glue ("请联系bob@example.com谢谢").
func gluedBefore(text string, s int) bool {
	if s <= 0 || text[s-1] < 0x80 {
		return false // no character, or an ASCII one: not emailRune
	}
	r, _ := utf8.DecodeLastRuneInString(text[:s])
	if cjk(r) && s < len(text) && text[s] < 0x80 {
		return false
	}
	return emailRune(r)
}

func gluedAfter(text string, e int) bool {
	if e >= len(text) || text[e] < 0x80 {
		return false // no character, or an ASCII one: not emailRune
	}
	r, _ := utf8.DecodeRuneInString(text[e:])
	if cjk(r) && e > 0 && text[e-1] < 0x80 {
		return false
	}
	return emailRune(r)
}

// emailRuneAt reports whether the character at i is a non-ASCII address
// character (emailRune).
func emailRuneAt(text string, i int) bool {
	r, _ := utf8.DecodeRuneInString(text[min(i, len(text)):])
	return emailRune(r)
}

// cjk reports the characters of scripts written without spaces between
// words: Han, Hiragana, Katakana, Hangul. Where one meets ASCII inside a
// run of address characters, the address ends (or starts) there: a
// mixed-script local part or top-level label is far rarer than an
// address written in a CJK sentence ("メールはtaro@example.co.jpです").
func cjk(r rune) bool {
	return r >= 0x1100 && (unicode.Is(unicode.Han, r) || unicode.Is(unicode.Hiragana, r) ||
		unicode.Is(unicode.Katakana, r) || unicode.Is(unicode.Hangul, r))
}

// emailAt checks the address around the '@' at a and returns its span.
// breaks are the (sorted) view offsets where an invisible character was
// dropped, and last is where the previous address found ended (or -1):
// "hans@example.de\u200bgreta@example.de" reads as one glued run in the
// view, and is cut at the dropped character into the two addresses it
// shows. A local part glued to an '@' that made no address is grown over
// it ("a@b.com@c.org" is one finding), so that no part of a run of
// address characters is left out.
// sc holds what the addresses of one text share (see emailScratch).
func emailAt(text string, a int, breaks []int32, last int, sc *emailScratch) (int, int, bool) {
	// The domain first: it is the cheaper test, and what fails most often
	// ("@" in code, mentions, floods of them); both tests only read text.
	e, ok := domainAt(text, a+1)
	if !ok {
		return 0, 0, false
	}
	// A quoted local part (RFC 5321 §4.1.2 Quoted-string: "mario
	// rossi"@example.com), read as the address it is.
	if a > 0 && text[a-1] == '"' {
		if q := quotedLocalStart(text, a-1); q >= 0 && !gluedBefore(text, q) {
			if c := at(text, e); c != '_' && c != '@' && !gluedAfter(text, e) {
				return q, e, true
			}
		}
	}
	// Local part: atext runs (and non-ASCII letters) separated by single
	// dots, ≤ 64 bytes.
	s := localStart(text, a)
	// Cut at the last '=', '/' or '?': a key or a path before the address.
	for k := a - 1; k >= s; k-- {
		if localCut[text[k]] {
			s = k + 1
			break
		}
	}
	if last > s && last < a {
		s = last // the previous address ended at a dropped character
	}
	for s < a && text[s] == '.' {
		s++
	}
	// Markdown emphasis around the address ("**mario@example.it**",
	// "~~anna@example.org~~", "_bob@example.com_"): a run of '*' or '~'
	// at the start of the local part is markup, not address (no one's
	// address starts with one), and so is a run of '_' the same run closes
	// after the domain.
	emph := 0
	for s < a && (text[s] == '*' || text[s] == '~') {
		s++
	}
	if n := underscoreRun(text, s, a); n > 0 && s+n < a && underscoreRun(text, e, len(text)) == n && !wordByte(at(text, e+n)) &&
		!wordByte(before(text, s)) {
		s += n
		emph = n
	}
	if s == a || text[a-1] == '.' {
		return 0, 0, false
	}
	if before(text, s) == '@' && s-1 != last {
		// Glued to an '@' that made no address: take its local part too.
		if g := localStart(text, s-1); g < s-1 {
			s = g
		}
	}
	if gluedBefore(text, s) || before(text, s) == '.' && isAtext(before(text, s-1)) {
		return 0, 0, false // glued to a longer word, or a dot run
	}
	// Prefer the address that ends at a dropped character: "x@acme.com" of
	// "x@acme.com\x00more".
	// From the first break after a+1 (breaks are sorted; a text with
	// many dropped characters has many '@'s to test, so never from the
	// first break).
	k := sc.breakFrom(breaks, a+2)
	for _, b := range breaks[k:] {
		if int(b) >= e {
			break
		}
		if tld, ok := domainEndsAt(text, a+1, int(b)); ok && sc.icannTLD(tld) {
			e = int(b)
			break
		}
	}
	if c := at(text, e); c == '_' && emph == 0 || c == '@' && !splitAt(breaks[k:], e) || gluedAfter(text, e) && !splitAt(breaks[k:], e) {
		return 0, 0, false
	}
	if sc.inURLUserinfo(text, s) {
		return 0, 0, false
	}
	if gitRemote(text, s, a, e) {
		return 0, 0, false
	}
	return s, e, true
}

// localCut marks the bytes at which emailAt cuts a local part: '=', '/'
// and '?'.
var localCut = [256]bool{'=': true, '/': true, '?': true}

// gitRemote reports whether the address text[s:e] (its '@' at a) is the
// user and host of a git remote, "git@github.com:org/repo.git" (scp-like
// syntax) or "ssh://git@gitlab.example.com/org/repo": the shared "git"
// account of a code host, no one's address.
func gitRemote(text string, s, a, e int) bool {
	if text[s:a] != "git" {
		return false
	}
	return at(text, e) == ':' && (isAlnum(at(text, e+1)) || at(text, e+1) == '/' || at(text, e+1) == '~') ||
		strings.HasSuffix(text[:s], "ssh://") || strings.HasSuffix(text[:s], "git+ssh://")
}

// underscoreRun returns the number of '_' from text[i] on, before end.
func underscoreRun(text string, i, end int) int {
	n := 0
	for i+n < end && text[i+n] == '_' {
		n++
	}
	return n
}

// quotedLocalStart returns where the quoted string whose closing quote is
// text[c] starts (its opening quote), or -1: 1 to 64 bytes between the
// quotes, no quote, backslash or line break among them.
func quotedLocalStart(text string, c int) int {
	for k := c - 1; k >= 0 && c-k <= 65; k-- {
		switch text[k] {
		case '"':
			if k == c-1 {
				return -1
			}
			return k
		case '\\', '\n', '\r':
			return -1
		}
	}
	return -1
}

// localStart returns where the local part ending at a starts.
func localStart(text string, a int) int {
	s := a
	for s > 0 && a-s < 64 {
		c := text[s-1]
		if c >= 0x80 {
			r, n := utf8.DecodeLastRuneInString(text[:s])
			if !emailRune(r) || cjk(r) && s < a && text[s] < 0x80 {
				break // not an address character, or CJK before ASCII (cjk)
			}
			s -= n
			continue
		}
		if !isAtext(c) && (c != '.' || s == a || text[s] == '.') {
			break
		}
		s--
	}
	return s
}

// splitAt reports whether offset i is one of breaks.
func splitAt(breaks []int32, i int) bool {
	_, ok := slices.BinarySearch(breaks, int32(i))
	return ok
}

// icannTLD reports whether the last label of host is a top-level domain
// of the ICANN section of the Public Suffix List.
func icannTLD(host string) bool {
	tld := host[strings.LastIndexByte(host, '.')+1:]
	_, icann := publicsuffix.PublicSuffix(strings.ToLower(tld))
	return icann
}

// domainAt reads a host name of two or more labels starting at i and
// returns its end. Labels may hold non-ASCII letters and digits (IDNs);
// the top-level label is letters only, or an A-label ("xn--p1ai").
func domainAt(text string, i int) (int, bool) {
	e, labels, labelStart := i, 0, i
	for e <= len(text) {
		c := at(text, e)
		if isAlnum(c) || c == '-' {
			e++
			continue
		}
		if c >= 0x80 {
			if r, n := utf8.DecodeRuneInString(text[e:]); emailRune(r) && !(cjk(r) && e > labelStart && text[e-1] < 0x80) {
				e += n
				continue
			}
		}
		l := text[labelStart:e]
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			break
		}
		labels++
		if c == '.' && (isAlnum(at(text, e+1)) || emailRuneAt(text, e+1)) {
			e++
			labelStart = e
			continue
		}
		break
	}
	if labels < 2 || e-i > 253 {
		return 0, false
	}
	tld := text[labelStart:e]
	if len(tld) > 4 && hasPrefixFold(tld, 0, "xn--") {
		return e, true
	}
	if isAllAlpha(tld) {
		// ASCII letters (the common case): no rune to decode.
		return e, len(tld) >= 2
	}
	if utf8.RuneCountInString(tld) < 2 || !isAllLetters(tld) {
		return 0, false
	}
	return e, true
}

// hostByte marks the ASCII bytes of a host name label: letters, digits
// and '-' (RFC 1035 §2.3.1).
var hostByte = func() (t [256]bool) {
	for c := range t {
		t[c] = isAlnum(byte(c)) || c == '-'
	}
	return t
}()

// domainEndsAt reports whether domainAt(text[:b], i) reads a host name
// that ends at b, and returns its top-level label, for an i < b that is
// inside the host name domainAt(text, i) reads (so that each '.' before b
// is between two labels and each label before the last one is
// well-formed). Then only the last label is read, back from b; a
// non-ASCII one is left to domainAt.
func domainEndsAt(text string, i, b int) (string, bool) {
	k := b
	for k > i && hostByte[text[k-1]] {
		k--
	}
	switch {
	case k == i:
		return "", false // one label
	case text[k-1] != '.':
		// A non-ASCII letter in the last label.
		if e, ok := domainAt(text[:b], i); ok && e == b {
			return text[i:b][strings.LastIndexByte(text[i:b], '.')+1:], true
		}
		return "", false
	}
	tld := text[k:b]
	if tld == "" {
		return "", false // b is just after a '.': the read ends before it
	}
	if len(tld) > 63 || tld[0] == '-' || tld[len(tld)-1] == '-' {
		// domainAt counts a malformed last label out but still reads it
		// as the top-level one: two labels must come before it.
		if strings.IndexByte(text[i:k-1], '.') < 0 {
			return "", false
		}
	}
	if len(tld) > 4 && hasPrefixFold(tld, 0, "xn--") {
		return tld, true
	}
	return tld, len(tld) >= 2 && isAllAlpha(tld)
}

// isAllLetters reports whether s is letters (of any script) only.
func isAllLetters(s string) bool {
	for _, r := range s {
		if !unicode.IsLetter(r) && !unicode.IsMark(r) {
			return false
		}
	}
	return true
}

func isAllAlpha(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isAlpha(s[i]) {
			return false
		}
	}
	return true
}

// emailScratch is what emailAt remembers between the addresses of one
// text, so that addresses glued into one run ("a@x.it,b@x.it,…", or
// joined by dropped characters) cost what spaced ones do: the state of
// a forward read for inURLUserinfo, and the last top-level domain looked
// up. The zero value is ready; it serves one text.
type emailScratch struct {
	pos   int // the last position asked about (0: none yet)
	stop  int // the last of ' ', '\t', '\n', '\r', '"', '<', '(' or '/' before pos within 255 bytes, or -1
	colon int // the last ':' after stop and before pos, or -1

	bk int // the first break at or after the last '@' asked about (see breakFrom)

	tld         string // the last top-level domain looked up, and its answer
	tldICANN    bool
	tldLookedUp bool
}

// breakFrom returns the index of the first of breaks at or after x, as
// slices.BinarySearch does, from the index it returned last: the '@'s
// of a text come in increasing order, so it is a step or two.
func (sc *emailScratch) breakFrom(breaks []int32, x int) int {
	k := sc.bk
	if k > len(breaks) || k > 0 && int(breaks[k-1]) >= x {
		k, _ = slices.BinarySearch(breaks, int32(x))
	} else {
		for steps := 0; k < len(breaks) && int(breaks[k]) < x; k++ {
			if steps++; steps > 8 {
				k, _ = slices.BinarySearch(breaks, int32(x))
				break
			}
		}
	}
	sc.bk = k
	return k
}

// icannTLD is icannTLD remembering the last answer.
func (sc *emailScratch) icannTLD(host string) bool {
	tld := host[strings.LastIndexByte(host, '.')+1:]
	if !sc.tldLookedUp || tld != sc.tld {
		sc.tld, sc.tldICANN, sc.tldLookedUp = tld, icannTLD(tld), true
	}
	return sc.tldICANN
}

// inURLUserinfo is inURLUserinfo(text, i) for positions that (mostly)
// increase: it reads back from i as inURLUserinfo does, but no further than
// the previous position, whose reading it remembers, so that each byte is
// read once, not up to 256 times.
func (sc *emailScratch) inURLUserinfo(text string, i int) bool {
	if i < sc.pos {
		return inURLUserinfo(text, i)
	}
	lo := i - 255 // inURLUserinfo reads no further back
	known := sc.pos > 0 && sc.pos >= lo
	if known {
		lo = sc.pos
	}
	lo = max(lo, 0)
	stop, colon := -1, -1
	for j := i - 1; j >= lo; j-- {
		k := userinfoClass[text[j]]
		if k == 0 {
			continue
		}
		if k == uiStop {
			stop = j
			break
		}
		if colon < 0 {
			colon = j
		}
	}
	if stop < 0 && known {
		// No stop since the previous position: its reading goes on.
		stop = sc.stop
		if colon < 0 {
			colon = sc.colon
		}
	}
	sc.pos, sc.stop, sc.colon = i, stop, colon
	// The nearest stop within reach is the second '/' of "://", with a
	// ':' after it.
	return stop >= 0 && i-stop < 256 && text[stop] == '/' && stop >= 2 && text[stop-1] == '/' && text[stop-2] == ':' && colon > stop
}

// userinfoClass sorts the bytes emailScratch.inURLUserinfo reads back
// over: uiStop for ' ', '\t', '\n', '\r', '"', '<', '(' and '/', uiColon
// for ':', 0 for the rest.
var userinfoClass = [256]uint8{
	' ': uiStop, '\t': uiStop, '\n': uiStop, '\r': uiStop, '"': uiStop, '<': uiStop, '(': uiStop, '/': uiStop,
	':': uiColon,
}

const (
	uiStop  = 1
	uiColon = 2
)

// inURLUserinfo reports whether position i sits after "scheme://user:" in
// the same token, i.e. inside the password of a URL's userinfo.
func inURLUserinfo(text string, i int) bool {
	colon := false
	for j := i - 1; j >= 0 && i-j < 256; j-- {
		switch c := text[j]; c {
		case ' ', '\t', '\n', '\r', '"', '<', '(':
			return false
		case ':':
			colon = true
		case '/':
			return colon && j >= 2 && text[j-1] == '/' && text[j-2] == ':'
		}
	}
	return false
}

// atWords write '@' out: bracketed forms and the word for it in the five
// languages. Strong ones make an address on their own; " at " (also the
// English preposition) needs a written-out dot on one side too.
var atWords = []struct {
	word   string
	strong bool
}{
	{"[at]", true}, {"(at)", true}, {"{at}", true}, {"<at>", true}, {" at ", false},
	{" chiocciola ", true}, {" arobase ", true}, {" arroba ", true}, {" klammeraffe ", true},
	{"[@]", true}, {"(@)", true},
	// An '@' set apart by spaces ("mario.rossi @ example.com"): the
	// domain's TLD and a local part glued to the space still decide.
	{" @ ", true},
}

// dotWords write '.' out.
var dotWords = []string{"[dot]", "(dot)", "{dot}", "<dot>", " dot ", " punto ", " point ", " punkt ", " pt ", "[.]", "(.)"}

// dotWordAt returns the length of a '.' or a dot-word (with the spaces
// around it) at s[i:], 0 if there is none, and whether it was a word.
func dotWordAt(s string, i int) (int, bool) {
	if at(s, i) == '.' {
		return 1, false
	}
	if n := spacedDotAt(s, i); n > 0 {
		return n, true
	}
	for _, w := range dotWords {
		if w[0] == ' ' {
			if hasPrefixFold(s, i, w) {
				return len(w), true
			}
			continue
		}
		n := 0
		if at(s, i) == ' ' {
			n = 1
		}
		if hasPrefixFold(s, i+n, w) {
			n += len(w)
			if at(s, i+n) == ' ' {
				n++
			}
			return n, true
		}
	}
	return 0, false
}

// dotWordBefore returns where a '.'-word (with its spaces) ending at s
// starts, or -1.
func dotWordBefore(s string, e int) int {
	if k := spacedDotBefore(s, e); k >= 0 {
		return k
	}
	for _, w := range dotWords {
		if w[0] == ' ' {
			if e >= len(w) && hasPrefixFold(s, e-len(w), w) {
				return e - len(w)
			}
			continue
		}
		k := e
		if before(s, k) == ' ' {
			k--
		}
		if k >= len(w) && hasPrefixFold(s, k-len(w), w) {
			k -= len(w)
			if before(s, k) == ' ' {
				k--
			}
			return k
		}
	}
	return -1
}

// spacedDotAt returns the length of a '.' set apart by one or two spaces
// on each side (" . ", the spaced dot of "john . doe @ example . com") at
// s[i:], or 0. A dot with a space on one side only ends a sentence far
// more often than it joins labels ("write to me @ home. It …").
func spacedDotAt(s string, i int) int {
	j := i
	for j < len(s) && s[j] == ' ' && j-i < 2 {
		j++
	}
	if j == i || at(s, j) != '.' {
		return 0
	}
	k := j + 1
	for k < len(s) && s[k] == ' ' && k-j <= 2 {
		k++
	}
	if k == j+1 {
		return 0
	}
	return k - i
}

// spacedDotNear reports whether a spaced dot follows (after) the label
// starting at i, or precedes (!after) the word ending at i: the labels
// and words of an address are at most 64 bytes.
func spacedDotNear(s string, i int, after bool) bool {
	if after {
		j := i
		for j < len(s) && j-i < 64 && (isAlnum(s[j]) || s[j] == '-') {
			j++
		}
		return j > i && spacedDotAt(s, j) > 0
	}
	j := i
	for j > 0 && i-j < 64 && (isAlnum(s[j-1]) || s[j-1] == '_' || s[j-1] == '-' || s[j-1] == '+') {
		j--
	}
	return j < i && spacedDotBefore(s, j) >= 0
}

// spacedDotBefore returns where a spaced dot (see spacedDotAt) ending at
// e starts, or -1.
func spacedDotBefore(s string, e int) int {
	k := e
	for k > 0 && s[k-1] == ' ' && e-k < 2 {
		k--
	}
	if k == e || before(s, k) != '.' {
		return -1
	}
	j := k - 1
	for j > 0 && s[j-1] == ' ' && k-1-j < 2 {
		j--
	}
	if j == k-1 {
		return -1
	}
	return j
}

// maxWrittenEmail bounds the bytes of a written-out address (in the
// view): the longest addr-spec, 318 bytes (RFC 5321 §4.5.3.1), with room
// for dot-words and spaced dots, and under GuardHoldBytes less the
// context a stream guard needs.
const maxWrittenEmail = 440

// writtenEmail checks a written-out address around the at-word text[p:q]
// (without the spaces of a spaced word) and returns its span; sc is the
// scan's scratch (its top-level domain looked up last).
func writtenEmail(text string, p, q int, strong bool, sc *emailScratch) (int, int, bool) {
	s, e, _, ok := writtenEmailW(text, p, q, strong, sc)
	return s, e, ok
}

// writtenEmailW is writtenEmail, also reporting whether a dot of the
// address is written out (a dot-word or a spaced dot).
func writtenEmailW(text string, p, q int, strong bool, sc *emailScratch) (int, int, bool, bool) {
	// Domain: labels joined by '.' or dot-words, the last one a TLD.
	i := q
	for at(text, i) == ' ' && i-q < 2 {
		i++
	}
	labels, written := 0, false
	var last string
	e := i
	for {
		ls := i
		for i < len(text) && (isAlnum(text[i]) || text[i] == '-') {
			i++
		}
		if i == ls || i-ls > 63 {
			break
		}
		labels++
		last = text[ls:i]
		e = i
		n, w := dotWordAt(text, i)
		if n == 0 || !isAlnum(at(text, i+n)) {
			break
		}
		written = written || w
		i += n
	}
	if labels < 2 || !isAllAlpha(last) {
		return 0, 0, false, false
	}
	if !sc.icannTLD(last) {
		return 0, 0, false, false
	}
	// Local part: atext words joined by '.', '_', '-' or dot-words, ending
	// right before the at-word (spaces allowed between).
	k := p
	for k > 0 && text[k-1] == ' ' && p-k < 2 {
		k--
	}
	s := k
	joined := false
	for {
		ws := s
		for ws > 0 && s-ws < 64 && (isAlnum(text[ws-1]) || text[ws-1] == '_' || text[ws-1] == '-' || text[ws-1] == '+' || text[ws-1] == '.' && isAlnum(before(text, ws-1))) {
			ws--
		}
		if ws == s {
			break
		}
		joined = joined || strings.ContainsAny(text[ws:s], "._-")
		s = ws
		d := dotWordBefore(text, s)
		if d < 0 || !isAlnum(before(text, d)) {
			break
		}
		s, joined, written = d, true, true
	}
	if s == k || wordByte(before(text, s)) {
		return 0, 0, false, false
	}
	if !strong && !written && !joined {
		return 0, 0, false, false // "meet at example.com"
	}
	if e-s > maxWrittenEmail {
		return 0, 0, false, false
	}
	return s, e, written, true
}

// growAddresses makes room in the full dst for the addresses of the '@'s
// from p on (a.ats holds p) when detectEmails has found 8 or more, from
// most of the '@'s before p, that make most of dst (n0 findings came
// before): one per '@' left (two where spaced dots are read too), at
// most one per 8 bytes of a text of n bytes, instead of doubling (and
// copying) again and again in a text of glued addresses or a list.
// Otherwise it returns dst as it is.
func growAddresses(dst []Finding, n0 int, ats []int32, p int32, spaced bool, n int) []Finding {
	found := len(dst) - n0
	i, _ := slices.BinarySearch(ats, p)
	if 2*found < i || 2*found < len(dst) {
		return dst
	}
	perAt := 1
	if spaced {
		perAt = 2
	}
	return slices.Grow(dst, max(min((len(ats)-i)*perAt, n/8), 8))
}

// detectEmails finds the addresses around the '@'s and at-words of text.
// breaks are the view offsets of dropped invisible characters (see
// emailAt).
func (s *Scanner) detectEmails(text string, a *anchors, breaks []int32, dst []Finding) []Finding {
	last := -1
	var sc emailScratch
	// Every spaced dot holds " . " (spacedDotAt): a text without one, as
	// a flood of '@'s, skips the tests below at each '@'.
	spaced := len(a.ats) > 0 && strings.Contains(text, " . ")
	n0 := len(dst)
	for _, p := range a.ats {
		if int(p) < last {
			continue
		}
		st, e, ok := emailAt(text, int(p), breaks, last, &sc)
		if ok {
			if len(dst) == cap(dst) && len(dst)-n0 >= 8 {
				dst = growAddresses(dst, n0, a.ats, p, spaced, len(text))
			}
			dst = addFinding(dst, Finding{Type: TypeEmail, Start: st, End: e})
			last = e
		}
		// An address whose dots are set apart by spaces around a plain
		// '@' ("john.doe@example . com", "john . doe@example.com"): read
		// as a written-out one when a spaced dot is next to the '@''s
		// parts (cheap tests first: most '@'s have none).
		if spaced && (!ok && spacedDotNear(text, int(p)+1, true) || ok && (spacedDotBefore(text, st) >= 0 || spacedDotAt(text, e) > 0) || !ok && spacedDotNear(text, int(p), false)) {
			if ws, we, written, wok := writtenEmailW(text, int(p), int(p)+1, true, &sc); wok && written && (!ok || ws < st || we > e) {
				dst = addFinding(dst, Finding{Type: TypeEmail, Subtype: "written", Start: ws, End: we})
				last = max(last, we)
			}
		}
	}
	for _, h := range a.kw {
		w := s.atWord[h.id]
		if w.word == "" {
			continue
		}
		p, q := int(h.pos), int(h.pos)+len(w.word)
		if w.word[0] == ' ' {
			p, q = p+1, q-1
		}
		if st, e, ok := writtenEmail(text, p, q, w.strong, &sc); ok {
			dst = addFinding(dst, Finding{Type: TypeEmail, Subtype: "written", Start: st, End: e})
		}
	}
	return dst
}
