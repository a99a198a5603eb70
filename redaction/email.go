package redaction

import (
	"strings"

	"golang.org/x/net/publicsuffix"
)

// E-mail addresses: a practical subset of the RFC 5322 §3.4.1 addr-spec,
// i.e. a dot-atom local part of RFC 5322 atext (at most 64 bytes, RFC 5321
// §4.5.3.1.1) and a DNS host name of at least two labels (RFC 1035: 1–63
// letters, digits and inner hyphens each, at most 253 bytes) whose
// top-level label is alphabetic. Quoted local parts and address literals
// are left out on purpose: they are rare in prose and make a pattern match
// far too much. A match glued to a longer word is rejected, and so is the
// "password@host" part of a URL's userinfo (URL_CREDENTIALS covers that).
// The local part stops at a '=', '/' or '?' ("user=mario@…", a URL path
// before the address), which atext allows but which in practice delimit a
// key or a path.
//
// Addresses written out for humans ("maria dot rossi at example dot org",
// "anna[at]example.it", "jean point martin arobase example point fr")
// are found from their at-word (see atWords), with the domain's top-level
// label checked against the ICANN section of the Public Suffix List
// (golang.org/x/net/publicsuffix). The obfuscations of the bytes
// themselves (HTML references, percent-encoding, homoglyphs, combining
// marks, fullwidth forms, zero-width characters) are undone by the
// normalised view before this runs.

// atext per RFC 5322 §3.2.3, minus the apostrophe, backquote, '{' and '|',
// which in prose quote or delimit an address far more often than they
// belong to it.
func isAtext(c byte) bool {
	return isAlnum(c) || strings.IndexByte("!#$%&*+/=?^_}~-", c) >= 0
}

// emailAt checks the address around the '@' at a and returns its span.
func emailAt(text string, a int) (int, int, bool) {
	// Local part: atext runs separated by single dots, ≤ 64 bytes.
	s := a
	for s > 0 && a-s < 64 && (isAtext(text[s-1]) || text[s-1] == '.' && s < a && text[s] != '.') {
		s--
	}
	// Cut at the last '=', '/' or '?': a key or a path before the address.
	for k := a - 1; k >= s; k-- {
		if c := text[k]; c == '=' || c == '/' || c == '?' {
			s = k + 1
			break
		}
	}
	for s < a && text[s] == '.' {
		s++
	}
	if s == a || text[a-1] == '.' {
		return 0, 0, false
	}
	if c := before(text, s); c >= 0x80 || c == '.' && isAtext(before(text, s-1)) {
		return 0, 0, false // glued to a non-ASCII word, or a dot run
	}
	e, ok := domainAt(text, a+1)
	if !ok {
		return 0, 0, false
	}
	if c := at(text, e); c == '_' || c >= 0x80 || c == '@' {
		return 0, 0, false
	}
	if inURLUserinfo(text, s) {
		return 0, 0, false
	}
	return s, e, true
}

// domainAt reads a host name of two or more labels starting at i and
// returns its end.
func domainAt(text string, i int) (int, bool) {
	e, labels, labelStart := i, 0, i
	for e <= len(text) {
		c := at(text, e)
		if isAlnum(c) || c == '-' {
			e++
			continue
		}
		l := text[labelStart:e]
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			break
		}
		labels++
		if c == '.' && isAlnum(at(text, e+1)) {
			e++
			labelStart = e
			continue
		}
		break
	}
	if labels < 2 || e-i > 253 {
		return 0, false
	}
	if tld := text[labelStart:e]; len(tld) < 2 || !isAllAlpha(tld) {
		return 0, false
	}
	return e, true
}

func isAllAlpha(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isAlpha(s[i]) {
			return false
		}
	}
	return true
}

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
}

// dotWords write '.' out.
var dotWords = []string{"[dot]", "(dot)", "{dot}", "<dot>", " dot ", " punto ", " point ", " punkt ", " pt ", "[.]", "(.)"}

// dotWordAt returns the length of a '.' or a dot-word (with the spaces
// around it) at s[i:], 0 if there is none, and whether it was a word.
func dotWordAt(s string, i int) (int, bool) {
	if at(s, i) == '.' {
		return 1, false
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

// writtenEmail checks a written-out address around the at-word text[p:q]
// (without the spaces of a spaced word) and returns its span.
func writtenEmail(text string, p, q int, strong bool) (int, int, bool) {
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
		return 0, 0, false
	}
	if _, icann := publicsuffix.PublicSuffix(strings.ToLower(last)); !icann {
		return 0, 0, false
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
		return 0, 0, false
	}
	if !strong && !written && !joined {
		return 0, 0, false // "meet at example.com"
	}
	return s, e, true
}

// detectEmails finds the addresses around the '@'s and at-words of text.
func (s *Scanner) detectEmails(text string, a *anchors, dst []Finding) []Finding {
	last := -1
	for _, p := range a.ats {
		if int(p) < last {
			continue
		}
		if st, e, ok := emailAt(text, int(p)); ok {
			dst = append(dst, Finding{Type: TypeEmail, Start: st, End: e})
			last = e
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
		if st, e, ok := writtenEmail(text, p, q, w.strong); ok {
			dst = append(dst, Finding{Type: TypeEmail, Subtype: "written", Start: st, End: e})
		}
	}
	return dst
}
