package capability

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The estimator reads a prompt once, as a stream of normalised bytes fed to
// one Aho-Corasick automaton that holds every phrase of every cue.
//
// The normalised stream is the prompt's tokens, each followed by one space,
// the whole preceded by one space:
//
//	"Hello, World!\nx=12.5"  →  " hello , world ! \n x = 0 . 0 \n "
//
//   - a word is a run of letters, digits and '_', lower-cased, accents
//     folded to ASCII (é→e, German ä ö ü ß → ae oe ue ss), a digit run
//     replaced by the single digit '0'; letters without an ASCII fold
//     (Cyrillic, Han, ...) become codeLetter, which no phrase contains;
//   - every other printable character is a token of its own (curly quotes
//     and dashes fold to ASCII, a few maths symbols keep a code of their
//     own, any other symbol is codeSymbol);
//   - a run of white space is one boundary, and a newline token '\n' when it
//     holds a line break; the end of the text is a newline token too.
//
// So a phrase " word word " matches whole words, a phrase without its
// trailing space matches a prefix, and counting spaces counts tokens.

// Codes of the normalised alphabet outside ASCII.
const (
	codeLetter byte = 0x80 // a letter with no ASCII fold
	codeSymbol byte = 0x81 // a symbol with no code of its own
	codeMath   byte = 0x82 // first code of mathSymbols
)

// mathSymbols keep a code of their own: codeMath+i for mathSymbols[i].
var mathSymbols = []rune{'×', '÷', '∫', '∑', '√', 'π', '≤', '≥', '≠', '∞', '€', '²'}

// Kinds of input characters.
const (
	kWord    = iota + 1 // letter or '_': written as is (one or two bytes)
	kDigit              // digit: '0' unless the token already ends in a digit
	kSpace              // white space without a line break
	kNewline            // line break
	kSymbol             // a token of its own
	kDrop               // format characters (zero-width joiners, soft hyphen, BOM): dropped
)

// asciiWord maps an ASCII byte that is a plain word byte to its lower case,
// and every other byte to 0.
var asciiWord [256]byte

// asciiKind is the kind of an ASCII byte (0 for bytes ≥ 0x80).
var asciiKind [256]uint8

// folded is the normalised form of a non-ASCII rune below foldLimit.
type folded struct {
	kind uint8
	n    uint8
	b    [2]byte
}

const foldLimit = 0x250 // Latin-1 Supplement, Latin Extended-A and -B

var foldTable [foldLimit]folded

func init() {
	for c := 0; c < 0x80; c++ {
		b := byte(c)
		switch {
		case b >= 'a' && b <= 'z' || b == '_':
			asciiKind[c], asciiWord[c] = kWord, b
		case b >= 'A' && b <= 'Z':
			asciiKind[c], asciiWord[c] = kWord, b+('a'-'A')
		case b >= '0' && b <= '9':
			asciiKind[c] = kDigit
		case b == '\n' || b == '\r' || b == '\v' || b == '\f':
			asciiKind[c] = kNewline
		case b <= ' ' || b == 0x7f:
			asciiKind[c] = kSpace
		default:
			asciiKind[c] = kSymbol
		}
	}
	for r := rune(0x80); r < foldLimit; r++ {
		foldTable[r] = foldSlow(r)
	}
}

// fold returns the normalised form of the non-ASCII rune r.
func fold(r rune) folded {
	if r < foldLimit {
		return foldTable[r]
	}
	return foldSlow(r)
}

func foldSlow(r rune) folded {
	for i, m := range mathSymbols {
		if r == m {
			return folded{kind: kSymbol, n: 1, b: [2]byte{codeMath + byte(i)}}
		}
	}
	switch r {
	case 'ä', 'Ä', 'æ', 'Æ':
		return folded{kWord, 2, [2]byte{'a', 'e'}}
	case 'ö', 'Ö', 'œ', 'Œ':
		return folded{kWord, 2, [2]byte{'o', 'e'}}
	case 'ü', 'Ü':
		return folded{kWord, 2, [2]byte{'u', 'e'}}
	case 'ß', 'ẞ':
		return folded{kWord, 2, [2]byte{'s', 's'}}
	case 'ø', 'Ø':
		return folded{kWord, 1, [2]byte{'o'}}
	case 'ł', 'Ł':
		return folded{kWord, 1, [2]byte{'l'}}
	case 'đ', 'Đ':
		return folded{kWord, 1, [2]byte{'d'}}
	case '\u2018', '\u2019', '\u201a', '\u201b', '\u02bc', '\u2032': // curly apostrophes, prime
		return folded{kSymbol, 1, [2]byte{'\''}}
	case '\u201c', '\u201d', '\u201e', '\u201f', '«', '»', '\u2033':
		return folded{kSymbol, 1, [2]byte{'"'}}
	case '\u2010', '\u2011', '\u2012', '\u2013', '\u2014', '\u2015', '\u2212':
		return folded{kSymbol, 1, [2]byte{'-'}}
	case '\u2026':
		return folded{kSymbol, 1, [2]byte{'.'}}
	case '\u2028', '\u2029', '\u0085':
		return folded{kind: kNewline}
	}
	switch {
	case unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Mn, r):
		return folded{kind: kDrop}
	case unicode.IsSpace(r):
		return folded{kind: kSpace}
	case unicode.IsDigit(r):
		return folded{kind: kDigit}
	case unicode.IsLetter(r):
		// A Latin letter with diacritics folds to its base letter (NFD,
		// then the first rune if it is an ASCII letter).
		if d := norm.NFD.PropertiesString(string(r)).Decomposition(); len(d) > 0 {
			if b := d[0]; b < 0x80 && asciiWord[b] != 0 {
				return folded{kWord, 1, [2]byte{asciiWord[b]}}
			}
		}
		return folded{kWord, 1, [2]byte{codeLetter}}
	}
	return folded{kSymbol, 1, [2]byte{codeSymbol}}
}

// normaliser turns text into the normalised stream, one character at a
// time (char); automaton.scan and normalise share it.
type normaliser struct {
	flags     uint8 // fSpace, fNewline, fDigit
	questions int   // '?' seen
	lines     int   // line breaks seen
}

// Normaliser flags, all clear after a word byte.
const (
	fSpace   = 1 << iota // the last byte written is a boundary
	fNewline             // the last token written is a newline
	fDigit               // the last byte written is the '0' of a digit run
)

// newNormaliser returns a normaliser at the start of a stream, whose
// leading space the caller has written.
func newNormaliser() normaliser { return normaliser{flags: fSpace | fNewline} }

// char normalises the character at src[i] into out and returns the bytes
// written (0 to 3) and the bytes of src consumed.
func (z *normaliser) char(src string, i int, out *[3]byte) (n, size int) {
	c := src[i]
	if w := asciiWord[c]; w != 0 {
		out[0] = w
		z.flags = 0
		return 1, 1
	}
	f := folded{kind: asciiKind[c], n: 1, b: [2]byte{c}}
	size = 1
	if c >= utf8.RuneSelf {
		var r rune
		r, size = utf8.DecodeRuneInString(src[i:])
		if r == utf8.RuneError && size == 1 {
			f = folded{kSymbol, 1, [2]byte{codeSymbol}}
		} else {
			f = fold(r)
		}
	}
	switch f.kind {
	case kWord:
		out[0], out[1] = f.b[0], f.b[1]
		n = int(f.n)
		z.flags = 0
	case kDigit:
		if z.flags&fDigit == 0 {
			out[0] = '0'
			n = 1
			z.flags = fDigit
		}
	case kSpace:
		if z.flags&fSpace == 0 {
			out[0] = ' '
			n = 1
			z.flags = fSpace
		}
	case kNewline:
		if c == '\n' {
			z.lines++
		}
		if z.flags&fSpace == 0 {
			out[n] = ' '
			n++
		}
		if z.flags&fNewline == 0 {
			out[n], out[n+1] = '\n', ' '
			n += 2
		}
		z.flags = fSpace | fNewline
	case kSymbol:
		if c == '?' {
			z.questions++
		}
		if z.flags&fSpace == 0 {
			out[n] = ' '
			n++
		}
		out[n], out[n+1] = f.b[0], ' '
		n += 2
		z.flags = fSpace
	}
	return n, size
}

// end returns the end of the stream: a boundary and a newline token.
func (z *normaliser) end(out *[3]byte) int {
	n := 0
	if z.flags&fSpace == 0 {
		out[n] = ' '
		n++
	}
	if z.flags&fNewline == 0 {
		out[n], out[n+1] = '\n', ' '
		n += 2
	}
	z.flags = fSpace | fNewline
	return n
}

// normalise returns the normalised stream of s, with its leading space and,
// when final, the end of the stream. For building phrases and for tests.
func normalise(s string, final bool) string {
	var b strings.Builder
	b.WriteByte(' ')
	z := newNormaliser()
	var out [3]byte
	for i := 0; i < len(s); {
		n, size := z.char(s, i, &out)
		b.Write(out[:n])
		i += size
	}
	if final {
		b.Write(out[:z.end(&out)])
	}
	return b.String()
}

// Kinds of automaton actions.
const (
	actCount = iota // count a match of the cue
	actMark         // remember where a first phrase of the pair ended
	actThen         // count the cue if the pair's first phrase ended in range
)

// action is what a phrase match does.
type action struct {
	kind   uint8
	cue    int32 // the cue counted (actCount, actThen)
	pair   int32 // the pair marked or tested (actMark, actThen)
	spaces int32 // spaces in the phrase: its token count plus 1 if it ends on a boundary
	trail  bool  // the phrase ends on a boundary (a whole word)
}

// pair is a compiled nearDef.
type pair struct {
	lo, hi int32 // tokens between the first phrase's end and the next one's start
	line   bool  // no newline token in between
}

// automaton is an Aho-Corasick automaton (Aho and Corasick, "Efficient
// string matching: an aid to bibliographic search", CACM 18(6), 1975)
// made a DFA: the goto function completed with the failure transitions,
// over byte classes (the bytes the phrases use, plus one class for all
// others). A transition costs one table load; a state's outputs include
// those of its failure chain.
type automaton struct {
	nc    uint32     // byte classes, a power of two (unused ones are never reached)
	shift uint32     // log2(nc)
	class [256]uint8 // byte → class
	// wordClass[c] is the class of the lower case of the ASCII word byte
	// c, 0 for any other byte (class 0 is never a word byte's: the
	// normalised stream always has a space class).
	wordClass [256]uint8
	// delta[s+c] for the premultiplied state s (state number × nc) is the
	// next premultiplied state, with outFlag set when it has outputs.
	delta []uint32
	first []int32 // first[n]..first[n+1]: the outputs of state number n in outs
	// single[n] is the cue of state n's one output when that is a count
	// (most matches: stop words, keywords), else -1.
	single []int32
	outs   []action // outputs, grouped by state
	pairs  []pair   // by action.pair
}

const outFlag = 1 << 31

// phraseSet collects phrases and their actions before building.
type phraseSet struct {
	index   map[string]int
	phrases []string
	actions [][]action
}

// add expands spec (see lexicon.go for the syntax) and gives every phrase
// the action a; spaces and trail are filled in per phrase.
func (p *phraseSet) add(spec string, a action) error {
	for _, alt := range strings.Split(spec, "|") {
		words, err := expand(alt)
		if err != nil {
			return fmt.Errorf("phrase %q: %w", alt, err)
		}
		for _, w := range words {
			// A trailing '*' after a word byte marks a prefix; any other
			// '*' is the character.
			prefix := len(w) > 1 && w[len(w)-1] == '*' && asciiWord[w[len(w)-2]] != 0
			if prefix {
				w = w[:len(w)-1]
			}
			n := normalise(w, false)
			if strings.TrimSpace(n) == "" {
				return fmt.Errorf("phrase %q: no token", alt)
			}
			if !prefix && n[len(n)-1] != ' ' {
				n += " "
			}
			a := a
			a.spaces = int32(strings.Count(n, " "))
			a.trail = n[len(n)-1] == ' '
			if p.index == nil {
				p.index = map[string]int{}
			}
			k, ok := p.index[n]
			if !ok {
				k = len(p.phrases)
				p.index[n] = k
				p.phrases = append(p.phrases, n)
				p.actions = append(p.actions, nil)
			}
			p.actions[k] = append(p.actions[k], a)
		}
	}
	return nil
}

// expand expands brace alternatives: "a {b,c}d" → "a bd", "a cd"; a
// brace written \{ or \} is the character itself.
func expand(s string) ([]string, error) {
	open := unescaped(s, '{')
	if open < 0 {
		if unescaped(s, '}') >= 0 {
			return nil, fmt.Errorf("unbalanced brace")
		}
		return []string{unescape(s)}, nil
	}
	end := unescaped(s[open:], '}')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced brace")
	}
	end += open
	rest, err := expand(s[end+1:])
	if err != nil {
		return nil, err
	}
	var out []string
	for _, alt := range strings.Split(s[open+1:end], ",") {
		for _, r := range rest {
			out = append(out, unescape(s[:open])+unescape(alt)+r)
		}
	}
	return out, nil
}

var unescape = strings.NewReplacer(`\{`, "{", `\}`, "}").Replace

// unescaped is the index of the first c in s not preceded by '\', or -1.
func unescaped(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' {
			i++
		} else if s[i] == c {
			return i
		}
	}
	return -1
}

// build compiles the phrases: trie, failure links by breadth-first
// search, then the DFA table.
func (p *phraseSet) build() *automaton {
	a := &automaton{}
	used := [256]bool{}
	for _, ph := range p.phrases {
		for i := 0; i < len(ph); i++ {
			used[ph[i]] = true
		}
	}
	n := 1 // class 0: bytes no phrase uses
	for b := range 256 {
		if used[b] {
			a.class[b] = uint8(n)
			n++
		}
	}
	for a.nc = 1; a.nc < uint32(n); a.nc <<= 1 {
		a.shift++
	}
	// In wordClass, a word byte no phrase uses gets a spare class that
	// behaves as class 0 (no phrase has it), so that 0 keeps meaning
	// "not a word byte".
	spare := uint8(0)
	for c := range 256 {
		if w := asciiWord[c]; w != 0 {
			k := a.class[w]
			if k == 0 {
				if spare == 0 {
					if uint32(n) == a.nc {
						a.nc <<= 1
						a.shift++
					}
					spare = uint8(n)
					n++
				}
				k = spare
			}
			a.wordClass[c] = k
		}
	}
	nc := int(a.nc)
	// Trie: node numbers; child[n*nc+c] is 0 for none (node 0 is the root,
	// never a child).
	child := make([]int32, nc, nc*64)
	var ends [][]int // phrases ending at node n
	ends = append(ends, nil)
	for k, ph := range p.phrases {
		n := 0
		for i := 0; i < len(ph); i++ {
			c := int(a.class[ph[i]])
			next := int(child[n*nc+c])
			if next == 0 {
				next = len(ends)
				ends = append(ends, nil)
				child = append(child, make([]int32, nc)...)
				child[n*nc+c] = int32(next)
			}
			n = next
		}
		ends[n] = append(ends[n], k)
	}
	nodes := len(ends)
	fail := make([]int32, nodes)
	delta := make([]int32, nodes*nc) // node numbers, completed below
	order := make([]int32, 0, nodes) // breadth-first
	for c := 0; c < nc; c++ {
		if x := child[c]; x != 0 {
			delta[c] = x
			order = append(order, x) // fail[x] = 0
		}
	}
	for q := 0; q < len(order); q++ {
		n := int(order[q])
		for c := 0; c < nc; c++ {
			if x := child[n*nc+c]; x != 0 {
				fail[x] = delta[int(fail[n])*nc+c]
				delta[n*nc+c] = x
				order = append(order, x)
			} else {
				delta[n*nc+c] = delta[int(fail[n])*nc+c]
			}
		}
	}
	// Outputs: a node's own phrases, then its failure chain's (fail[n]
	// comes earlier in breadth-first order, so its list is complete).
	outsOf := make([][]action, nodes)
	for _, n := range order {
		var o []action
		for _, k := range ends[n] {
			o = append(o, p.actions[k]...)
		}
		o = append(o, outsOf[fail[n]]...)
		outsOf[n] = o
	}
	// Number the states breadth-first, root first: the shallow states,
	// where text spends most of its bytes, share the first rows of the
	// table and stay in the L1 cache.
	order = append([]int32{0}, order...)
	rank := make([]uint32, nodes)
	for r, n := range order {
		rank[n] = uint32(r)
	}
	a.first = make([]int32, nodes+1)
	a.single = make([]int32, nodes)
	a.delta = make([]uint32, nodes*nc)
	for r, n := range order {
		a.first[r] = int32(len(a.outs))
		a.outs = append(a.outs, outsOf[n]...)
		a.single[r] = -1
		if o := outsOf[n]; len(o) == 1 && o[0].kind == actCount {
			a.single[r] = o[0].cue
		}
		for c := 0; c < nc; c++ {
			x := delta[int(n)*nc+c]
			v := rank[x] << a.shift
			if len(outsOf[x]) > 0 {
				v |= outFlag
			}
			a.delta[r*nc+c] = v
		}
	}
	a.first[nodes] = int32(len(a.outs))
	return a
}

// scanState is the per-scan memory of the automaton's actions.
type scanState struct {
	counts []int32 // matches per cue
	marks  []int32 // per pair: end token of its first phrase's last match, 0 for none
	s      uint32  // premultiplied state
	tok    int32   // spaces seen: the index of the current token
	nl     int32   // index of the last newline token
}

// start resets st and feeds the stream's leading space.
func (a *automaton) start(st *scanState) {
	clear(st.counts)
	clear(st.marks)
	st.s, st.tok, st.nl = 0, 0, 0
	a.feed([]byte{' '}, st)
}

// scan normalises src with z and feeds it to the automaton: one pass, at
// most one table load per normalised byte (none for the rest of a word
// that no phrase continues). Runs of ASCII word bytes and single
// spaces, most of any prose, take the inlined fast paths; every other
// character goes through normaliser.char, so the stream is the one
// normalise writes.
func (a *automaton) scan(src string, z *normaliser, st *scanState) {
	s, tok, nl := st.s, st.tok, st.nl
	delta, wc := a.delta, &a.wordClass
	var out [3]byte
	for i := 0; i < len(src); {
		c := src[i]
		if k := wc[c]; k != 0 {
			z.flags = 0
			for {
				s = delta[s+uint32(k)]
				if s&outFlag != 0 {
					s &^= outFlag
					if cue := a.single[s>>a.shift]; cue >= 0 {
						st.counts[cue]++
					} else {
						a.fire(s, tok, nl, st)
					}
				}
				i++
				if s == 0 {
					// Every phrase starts with a space, so the root
					// stays the root for the rest of the word: skip it.
					for i < len(src) && wc[src[i]] != 0 {
						i++
					}
					break
				}
				if i == len(src) {
					break
				}
				if k = wc[src[i]]; k == 0 {
					break
				}
			}
			continue
		}
		if c == ' ' {
			i++
			if z.flags&fSpace != 0 {
				continue
			}
			z.flags = fSpace
			tok++
			s = delta[s+uint32(a.class[' '])]
			if s&outFlag != 0 {
				s &^= outFlag
				if cue := a.single[s>>a.shift]; cue >= 0 {
					st.counts[cue]++
				} else {
					a.fire(s, tok, nl, st)
				}
			}
			continue
		}
		n, size := z.char(src, i, &out)
		i += size
		for _, b := range out[:n] {
			s = delta[s+uint32(a.class[b])]
			if b == ' ' {
				tok++
			} else if b == '\n' {
				nl = tok
			}
			if s&outFlag != 0 {
				s &^= outFlag
				a.fire(s, tok, nl, st)
			}
		}
	}
	st.s, st.tok, st.nl = s, tok, nl
}

// feed feeds normalised bytes to the automaton.
func (a *automaton) feed(buf []byte, st *scanState) {
	for _, b := range buf {
		st.s = a.delta[st.s+uint32(a.class[b])]
		if b == ' ' {
			st.tok++
		} else if b == '\n' {
			st.nl = st.tok
		}
		if st.s&outFlag != 0 {
			st.s &^= outFlag
			a.fire(st.s, st.tok, st.nl, st)
		}
	}
}

// fire runs the outputs of the premultiplied state s; tok is the index of
// the current token and nl that of the last newline token.
func (a *automaton) fire(s uint32, tok, nl int32, st *scanState) {
	n := s >> a.shift
	for _, o := range a.outs[a.first[n]:a.first[n+1]] {
		switch o.kind {
		case actCount:
			st.counts[o.cue]++
		case actMark:
			end := tok
			if o.trail {
				end--
			}
			st.marks[o.pair] = end
		case actThen:
			m := st.marks[o.pair]
			if m == 0 {
				continue
			}
			gap := tok - o.spaces - m // tokens between: start − m − 1, start = tok − spaces + 1
			if pr := a.pairs[o.pair]; gap >= pr.lo && gap <= pr.hi && (!pr.line || nl < m) {
				st.counts[o.cue]++
			}
		}
	}
}
