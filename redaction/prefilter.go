package redaction

import "strings"

// The prefilter is the one pass over a text that every built-in detector
// starts from: it collects the literal anchors of all of them (digit runs,
// '@', ':' next to hex digits, runs of base64 and hex, 16-character
// tokens, capitalised words, and every occurrence of a keyword of the
// keyword index: gitleaks' rule keywords, "://", the words that write an
// e-mail address out). Validators (Luhn, MOD 97-10, phone metadata,
// regular expressions) then only look at those candidates, so the cost of
// a scan is one linear pass plus work proportional to the candidates.

// byte classes of the prefilter.
const (
	clsOther  = iota
	clsLower  // a-z
	clsUpper  // A-Z
	clsDigit  // 0-9
	clsB64    // + / - _ (base64 alphabets, not alphanumeric)
	clsAt     // @
	clsColon  // :
	clsHigh   // >= 0x80
	clsEquals // = (base64 padding)
)

var byteClass = func() (t [256]uint8) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = clsLower
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = clsUpper
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = clsDigit
	}
	for _, c := range "+/-_" {
		t[c] = clsB64
	}
	t['@'] = clsAt
	t[':'] = clsColon
	t['='] = clsEquals
	for c := 0x80; c < 256; c++ {
		t[c] = clsHigh
	}
	return t
}()

// lowerByte lower-cases ASCII letters.
var lowerByte = func() (t [256]byte) {
	for i := range t {
		t[i] = byte(i)
		if i >= 'A' && i <= 'Z' {
			t[i] = byte(i) + 'a' - 'A'
		}
	}
	return t
}()

// kwHit is one keyword occurrence: the keyword's id and its offset.
type kwHit struct{ id, pos int32 }

// anchors are the candidates of one text.
type anchors struct {
	digits []int32    // start of every maximal run of ASCII digits
	ats    []int32    // every '@'
	colons []int32    // every ':' with a hex digit or ':' on one side (IPv6)
	runs   [][2]int32 // maximal runs of base64 characters of ≥ minEncodedLen bytes
	tok16  []int32    // alphanumeric tokens of exactly 16 bytes (fiscal codes)
	caps   []int32    // word starts with an upper-case ASCII letter or a non-ASCII byte
	kw     []kwHit    // keyword occurrences, by offset
	hex2   []int32    // two hex digits followed by ' ' or ':' and another hex digit (spaced hex)
}

func (a *anchors) reset() {
	a.digits, a.ats, a.colons, a.runs, a.tok16, a.caps, a.kw, a.hex2 = a.digits[:0], a.ats[:0], a.colons[:0], a.runs[:0], a.tok16[:0], a.caps[:0], a.kw[:0], a.hex2[:0]
}

// keywordIndex finds every occurrence of a set of lower-case ASCII keywords
// (at least two bytes each) in one pass, case-insensitively: a bitmap of
// the keywords' first two bytes rejects almost every position with one
// look-up, and the few left are compared with the keywords sharing that
// prefix.
//
// Keywords added with addWord only match at word starts (after a byte
// that is not an ASCII letter): they have a bitmap of their own, looked
// at only there.
type keywordIndex struct {
	bits     [1 << 16 / 64]uint64 // keywords matched anywhere
	wordBits [1 << 16 / 64]uint64 // keywords matched at word starts
	both     [1 << 16 / 64]uint64 // bits | wordBits
	tri      [1 << 16 / 64]uint64 // hashes of the first three bytes of keywords of three or more
	short    [1 << 16 / 64]uint64 // prefixes that are whole two-byte keywords
	lists    map[uint16]int       // prefix -> index into byPfx (build time)
	byPfx    [][]int32            // keyword ids per prefix
	pfxOf    []uint16             // dense: prefix -> 1 + index into byPfx, 0 = none
	words    []string
	third    []byte // each keyword's third byte, 0 for a two-byte one
	wordOnly []bool
	// keep, when set for a keyword id, is a necessary condition for a hit
	// of that keyword to matter (every consumer of the keyword rejects a
	// hit it fails), checked before the hit is recorded.
	keep []func(text string, p int) bool
}

// add registers kw (lower case) and returns its id; adding a keyword twice
// returns the first id (and makes it match anywhere if either call did).
func (ix *keywordIndex) add(kw string) int32 { return ix.addKW(kw, false) }

// addWord registers kw to be matched at word starts only.
func (ix *keywordIndex) addWord(kw string) int32 { return ix.addKW(kw, true) }

func (ix *keywordIndex) addKW(kw string, wordOnly bool) int32 {
	kw = strings.ToLower(kw)
	p := uint16(kw[0])<<8 | uint16(kw[1])
	for i, w := range ix.words {
		if w == kw {
			if !wordOnly && ix.wordOnly[i] {
				ix.wordOnly[i] = false
				ix.bits[p/64] |= 1 << (p % 64)
			}
			return int32(i)
		}
	}
	if ix.lists == nil {
		ix.lists = map[uint16]int{}
		ix.pfxOf = make([]uint16, 1<<16)
	}
	id := int32(len(ix.words))
	ix.words = append(ix.words, kw)
	ix.third = append(ix.third, at(kw, 2))
	ix.wordOnly = append(ix.wordOnly, wordOnly)
	if wordOnly {
		ix.wordBits[p/64] |= 1 << (p % 64)
	} else {
		ix.bits[p/64] |= 1 << (p % 64)
	}
	ix.both[p/64] |= 1 << (p % 64)
	if len(kw) == 2 {
		ix.short[p/64] |= 1 << (p % 64)
	} else {
		h := tri3(kw[0], kw[1], kw[2])
		ix.tri[h/64] |= 1 << (h % 64)
	}
	k, ok := ix.lists[p]
	if !ok {
		k = len(ix.byPfx)
		ix.lists[p] = k
		ix.byPfx = append(ix.byPfx, nil)
		ix.pfxOf[p] = uint16(k + 1)
	}
	ix.byPfx[k] = append(ix.byPfx[k], id)
	return id
}

// hasPrefixFold reports whether s[i:] starts with the lower-case word w,
// ASCII case-insensitively.
func hasPrefixFold(s string, i int, w string) bool {
	if len(s)-i < len(w) {
		return false
	}
	for k := 0; k < len(w); k++ {
		if lowerByte[s[i+k]] != w[k] {
			return false
		}
	}
	return true
}

// tri3 hashes three lower-case bytes into 16 bits.
func tri3(a, b, c byte) uint16 { return uint16(a)*961 + uint16(b)*31 + uint16(c) }

// keywords appends every keyword occurrence in text to a.kw, by offset.
func (ix *keywordIndex) keywords(text string, a *anchors) {
	if len(text) < 2 {
		return
	}
	prev := uint16(lowerByte[text[0]])
	for i := 1; i < len(text); i++ {
		cl := uint16(lowerByte[text[i]])
		p := prev<<8 | cl
		prev = cl
		if ix.both[p>>6]&(1<<(p&63)) == 0 {
			continue
		}
		// A third byte rules out most prefixes without a two-byte keyword.
		if ix.short[p>>6]&(1<<(p&63)) == 0 {
			if i+1 >= len(text) {
				continue
			}
			h := tri3(byte(p>>8), byte(p), lowerByte[text[i+1]])
			if ix.tri[h>>6]&(1<<(h&63)) == 0 {
				continue
			}
		}
		any := ix.bits[p>>6]&(1<<(p&63)) != 0
		word := ix.wordBits[p>>6]&(1<<(p&63)) != 0 && (i < 2 || !isAlpha(text[i-2]))
		if !any && !word {
			continue
		}
		third := lowerByte[at(text, i+1)]
		for _, id := range ix.byPfx[ix.pfxOf[p]-1] {
			if t := ix.third[id]; t != 0 && t != third {
				continue
			}
			if (any && !ix.wordOnly[id] || word) && hasPrefixFold(text, i-1, ix.words[id]) {
				if int(id) < len(ix.keep) && ix.keep[id] != nil && !ix.keep[id](text, i-1) {
					continue
				}
				a.kw = append(a.kw, kwHit{id, int32(i - 1)})
			}
		}
	}
}

// prefilter fills a with the anchors of text.
func (ix *keywordIndex) prefilter(text string, a *anchors) {
	a.reset()
	n := len(text)
	runStart := -1 // start of the current base64 run
	tokStart := -1 // start of the current alphanumeric token
	ix.keywords(text, a)
	var prev byte
	for i := 0; i < n; i++ {
		c := text[i]
		cls := byteClass[c]
		switch cls {
		case clsLower, clsUpper, clsDigit:
			if runStart < 0 {
				runStart = i
			}
			if tokStart < 0 {
				tokStart = i
				if cls == clsUpper && !isAlnum(prev) {
					a.caps = append(a.caps, int32(i))
				}
			}
			// The rest of the alphanumeric token in one tight loop.
			wasDigit := isDigit(prev)
			j := i
			for ; j < n; j++ {
				k := byteClass[text[j]]
				if k == clsDigit {
					if !wasDigit {
						a.digits = append(a.digits, int32(j))
					}
					wasDigit = true
					continue
				}
				if k != clsLower && k != clsUpper {
					break
				}
				wasDigit = false
			}
			i = j - 1
			prev = text[i]
			continue
		case clsB64:
			if runStart < 0 {
				runStart = i
			}
			if tokStart >= 0 {
				if i-tokStart == 16 {
					a.tok16 = append(a.tok16, int32(tokStart))
				}
				tokStart = -1
			}
			prev = c
			continue
		}
		// Not an alphanumeric or base64 byte: close the runs.
		if tokStart >= 0 {
			if i-tokStart == 16 {
				a.tok16 = append(a.tok16, int32(tokStart))
			}
			tokStart = -1
		}
		if runStart >= 0 {
			e := i
			for k := 0; k < 2 && at(text, e) == '='; k++ {
				e++
			}
			if e-runStart >= minEncodedLen {
				a.runs = append(a.runs, [2]int32{int32(runStart), int32(e)})
			} else if i-runStart == 2 && (c == ' ' || c == ':') && isHex(text[runStart]) && isHex(text[runStart+1]) && isHex(at(text, i+1)) {
				a.hex2 = append(a.hex2, int32(runStart))
			}
			runStart = -1
		}
		switch cls {
		case clsAt:
			a.ats = append(a.ats, int32(i))
		case clsColon:
			if isHex(prev) || prev == ':' || isHex(at(text, i+1)) || at(text, i+1) == ':' {
				a.colons = append(a.colons, int32(i))
			}
		case clsHigh:
			if c >= 0xC0 && !isAlnum(prev) && prev < 0x80 {
				a.caps = append(a.caps, int32(i))
			}
		}
		prev = c
	}
	if tokStart >= 0 && n-tokStart == 16 {
		a.tok16 = append(a.tok16, int32(tokStart))
	}
	if runStart >= 0 && n-runStart >= minEncodedLen {
		a.runs = append(a.runs, [2]int32{int32(runStart), int32(n)})
	}
}
