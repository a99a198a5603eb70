package redaction

import (
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// startFilter is a necessary condition for a match of a rule to start at
// a position: one of its alternatives' literal prefix is there, followed by
// at least min bytes of the character class that comes next. It is read
// off the rule's syntax tree (regexp/syntax), so it never rejects a
// position where the rule could match.
type startFilter struct {
	alts []altStart
}

type altStart struct {
	lit  string // literal prefix (lower case when fold)
	fold bool
	cls  []rune // ranges of the class after the prefix (pairs); nil = no class check
	min  int
	// ascii is cls on ASCII bytes as a bitmap; high whether a byte of
	// 0x80 or more may be in it (a multi-byte rune of the class, or the
	// replacement character an invalid byte decodes to).
	ascii [2]uint64
	high  bool
	// pre is lit's first eight bytes (fewer when it is shorter) as le64
	// reads them, mask selecting them.
	pre, mask uint64
}

// newStartFilter analyses src and returns a filter when every match of src
// starts with a literal that begins with one of keywords (lower case), so
// that trying the rule anchored at the keyword hits finds every match.
func newStartFilter(src string, keywords []string) (*startFilter, bool) {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return nil, false
	}
	re = re.Simplify()
	var f startFilter
	for _, seq := range alternatives(re) {
		a, ok := altStartOf(seq)
		if !ok {
			return nil, false
		}
		low := strings.ToLower(a.lit)
		hit := false
		for _, k := range keywords {
			if strings.HasPrefix(low, k) {
				hit = true
			}
		}
		if !hit {
			return nil, false
		}
		for c := range rune(0x80) {
			if inRanges(c, a.cls) {
				a.ascii[c>>6] |= 1 << (c & 63)
			}
		}
		a.high = inRanges(unicode.ReplacementChar, a.cls) || len(a.cls) > 0 && a.cls[len(a.cls)-1] >= 0x80
		for i := 0; i < 8 && i < len(a.lit); i++ {
			a.pre |= uint64(a.lit[i]) << (8 * i)
			a.mask |= 0xFF << (8 * i)
		}
		f.alts = append(f.alts, a)
	}
	return &f, len(f.alts) > 0
}

// alternatives returns the node sequences a match can start with: the
// top-level alternation, through captures and the first element of a
// concatenation.
func alternatives(re *syntax.Regexp) [][]*syntax.Regexp {
	switch re.Op {
	case syntax.OpCapture:
		return alternatives(re.Sub[0])
	case syntax.OpAlternate:
		var out [][]*syntax.Regexp
		for _, s := range re.Sub {
			out = append(out, alternatives(s)...)
		}
		return out
	case syntax.OpConcat:
		if len(re.Sub) == 0 {
			return [][]*syntax.Regexp{nil}
		}
		var out [][]*syntax.Regexp
		for _, head := range alternatives(re.Sub[0]) {
			// A literal before an alternation is the prefix the parser
			// factored out of it ("AKIA|ASIA" is parsed as A(?:KIA|SIA)):
			// each branch is an alternative of its own, up to a few. So
			// are a small class ("xox[os]", "(?:sk|rk)_" parsed as
			// "[rs]k_": its bytes are alternatives of one byte each, see
			// classLiterals) and an optional part ("linked[_-]?in"),
			// also after further literals.
			if len(re.Sub) > 1 && allLiteral(head) && expandable(re.Sub[1]) {
				tails := alternatives(&syntax.Regexp{Op: syntax.OpConcat, Sub: re.Sub[1:]})
				if len(out)+len(tails) <= maxStartAlternatives {
					for _, tail := range tails {
						out = append(out, append(append([]*syntax.Regexp(nil), head...), tail...))
					}
					continue
				}
			}
			seq := append(append([]*syntax.Regexp(nil), head...), re.Sub[1:]...)
			out = append(out, seq)
		}
		return out
	case syntax.OpQuest:
		if smallPart(re.Sub[0]) {
			return append(alternatives(re.Sub[0]), nil)
		}
	case syntax.OpCharClass:
		if lits := classLiterals(re); lits != nil {
			var out [][]*syntax.Regexp
			for _, l := range lits {
				out = append(out, []*syntax.Regexp{l})
			}
			return out
		}
	}
	return [][]*syntax.Regexp{{re}}
}

// expandable reports whether alternatives may read more than one
// alternative, or a literal, off n.
func expandable(n *syntax.Regexp) bool {
	switch n.Op {
	case syntax.OpLiteral, syntax.OpAlternate:
		return true
	case syntax.OpQuest:
		return smallPart(n.Sub[0])
	case syntax.OpCapture, syntax.OpConcat:
		return len(n.Sub) > 0 && expandable(n.Sub[0])
	}
	return classLiterals(n) != nil
}

// smallPart reports whether n is a literal or a small class: an optional
// n is read as two alternatives ("linked[_-]?in"), not more (the nested
// options of "x{0,20}" would make thousands).
func smallPart(n *syntax.Regexp) bool {
	return n.Op == syntax.OpLiteral || classLiterals(n) != nil
}

// classLiterals returns a class of at most maxClassLiterals ASCII runes
// as literals of one rune, an ASCII letter in both cases as one
// case-folded literal (the form of "(?i)d" that altStartOf joins to the
// literals around it): the alternatives of one byte the class matches.
// It returns nil for any other node.
func classLiterals(n *syntax.Regexp) []*syntax.Regexp {
	if n.Op != syntax.OpCharClass {
		return nil
	}
	var rs []rune
	for k := 0; k+1 < len(n.Rune); k += 2 {
		if n.Rune[k+1] >= 0x80 || int(n.Rune[k+1]-n.Rune[k])+1+len(rs) > maxClassLiterals {
			return nil
		}
		for r := n.Rune[k]; r <= n.Rune[k+1]; r++ {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return nil
	}
	var out []*syntax.Regexp
	for _, r := range rs {
		lo, up := unicode.ToLower(r), unicode.ToUpper(r)
		switch {
		case lo != up && slices.Contains(rs, lo) && slices.Contains(rs, up):
			if r == lo {
				out = append(out, &syntax.Regexp{Op: syntax.OpLiteral, Rune: []rune{lo}, Flags: syntax.FoldCase})
			}
		default:
			out = append(out, &syntax.Regexp{Op: syntax.OpLiteral, Rune: []rune{r}})
		}
	}
	return out
}

// maxClassLiterals is the most runes of a class classLiterals expands.
const maxClassLiterals = 8

// maxStartAlternatives bounds the alternatives alternatives makes by
// distributing a factored prefix over its alternation.
const maxStartAlternatives = 64

// allLiteral reports whether seq is only literals (the empty sequence
// too).
func allLiteral(seq []*syntax.Regexp) bool {
	for _, n := range seq {
		if n.Op != syntax.OpLiteral {
			return false
		}
	}
	return true
}

// altStartOf reads the literal prefix of a node sequence and the class
// after it.
func altStartOf(seq []*syntax.Regexp) (altStart, bool) {
	var a altStart
	var lit []rune
	i := 0
	flat := flatten(seq)
	cut := false     // the literal goes on past a non-ASCII rune
	letters := false // lit has a letter (a.fold is its case)
	for ; i < len(flat) && !cut; i++ {
		n := flat[i]
		if n.Op != syntax.OpLiteral {
			break
		}
		// Folding changes only letters: a literal without letters
		// joins either kind.
		fold := n.Flags&syntax.FoldCase != 0
		if hasLetter(n.Rune) {
			if letters && fold != a.fold {
				break
			}
			a.fold, letters = fold, true
		}
		for _, r := range n.Rune {
			if r >= 0x80 {
				// The literal's ASCII prefix ("contrase" of
				// "contraseña"): a match starts with it, and no
				// class check follows.
				cut = true
				break
			}
			lit = append(lit, r)
		}
	}
	if len(lit) == 0 {
		return a, false
	}
	a.lit = string(lit)
	if a.fold {
		a.lit = strings.ToLower(a.lit)
	}
	if i < len(flat) && !cut {
		n := flat[i]
		switch n.Op {
		case syntax.OpCharClass:
			// Simplify writes x{n} as n copies of x, x{n,} as n-1 copies
			// and x+, x{n,m} as n copies and nested options: every
			// copy is one more byte of the class a match must hold.
			a.cls, a.min = n.Rune, 1
			for _, m := range flat[i+1:] {
				if m.Op == syntax.OpCharClass && slices.Equal(m.Rune, n.Rune) {
					a.min++
					continue
				}
				if (m.Op == syntax.OpPlus || m.Op == syntax.OpRepeat) && m.Sub[0].Op == syntax.OpCharClass && slices.Equal(m.Sub[0].Rune, n.Rune) {
					if m.Op == syntax.OpPlus {
						a.min++
					} else {
						a.min += m.Min
					}
				}
				break
			}
		case syntax.OpRepeat, syntax.OpPlus:
			if s := n.Sub[0]; s.Op == syntax.OpCharClass {
				a.cls = s.Rune
				a.min = max(n.Min, 1)
				if n.Op == syntax.OpRepeat {
					a.min = n.Min
				}
			}
		}
	}
	return a, true
}

// hasLetter reports whether rs holds a rune that case folding changes.
func hasLetter(rs []rune) bool {
	for _, r := range rs {
		if unicode.SimpleFold(r) != r {
			return true
		}
	}
	return false
}

// flatten expands nested concatenations and captures at the front.
func flatten(seq []*syntax.Regexp) []*syntax.Regexp {
	var out []*syntax.Regexp
	for k, n := range seq {
		switch n.Op {
		case syntax.OpConcat:
			out = append(out, flatten(n.Sub)...)
		case syntax.OpCapture:
			out = append(out, flatten(n.Sub)...)
		default:
			out = append(out, n)
		}
		if n.Op != syntax.OpLiteral && n.Op != syntax.OpConcat && n.Op != syntax.OpCapture {
			return append(out, seq[k+1:]...)
		}
	}
	return out
}

func inRanges(r rune, cls []rune) bool {
	for k := 0; k+1 < len(cls); k += 2 {
		if r >= cls[k] && r <= cls[k+1] {
			return true
		}
	}
	return false
}

// addThirds adds to t the bytes that can follow the two-byte keyword kw
// (lower case) at a position f admits: the byte after kw is then, by some
// alternative, its literal's third byte (in either case when it folds),
// or a byte of its class when the class starts there and must be read;
// or anything, or the end of the text, when the alternative reads no more.
func (f *startFilter) addThirds(kw string, t *thirdBytes) {
	for _, a := range f.alts {
		if len(a.lit) < 2 || lowerByte[a.lit[0]] != kw[0] || lowerByte[a.lit[1]] != kw[1] {
			if len(a.lit) < 2 {
				// Not one of the shapes below: anything may follow.
				t.end = true
				for c := range t.in {
					t.in[c] = true
				}
			}
			continue // the literal does not start with kw: it admits no hit of kw
		}
		switch k := 2 - len(a.lit); {
		case len(a.lit) >= 3:
			for c := range 256 {
				if byte(c) == a.lit[2] || a.fold && lowerByte[c] == a.lit[2] {
					t.in[c] = true
				}
			}
		case k < a.min:
			for c := range 256 {
				t.in[c] = t.in[c] || c >= 0x80 && a.high || c < 0x80 && a.ascii[c>>6]>>(c&63)&1 != 0
			}
		default:
			t.end = t.end || len(a.lit)+a.min <= 2
			for c := range t.in {
				t.in[c] = true
			}
		}
	}
}

// admits reports whether a match may start at text[p:]. Where eight
// bytes are left, the literals' first eight are compared in one load
// (lower8 for the ones that fold).
func (f *startFilter) admits(text string, p int) bool {
	var w, lw uint64
	long := len(text)-p >= 8
	if long {
		w = le64(text[p:])
		lw = lower8(w)
	}
	for i := range f.alts {
		a := &f.alts[i]
		if len(text)-p < len(a.lit)+a.min {
			continue
		}
		if long {
			x := w
			if a.fold {
				x = lw
			}
			if x&a.mask != a.pre {
				continue
			}
			if len(a.lit) > 8 {
				if a.fold && !hasPrefixFold(text, p+8, a.lit[8:]) || !a.fold && !strings.HasPrefix(text[p+8:], a.lit[8:]) {
					continue
				}
			}
		} else if a.fold {
			if !hasPrefixFold(text, p, a.lit) {
				continue
			}
		} else if !strings.HasPrefix(text[p:], a.lit) {
			continue
		}
		ok := true
		for k := 0; k < a.min && ok; k++ {
			c := text[p+len(a.lit)+k]
			if c >= 0x80 {
				ok = a.high
				continue
			}
			ok = a.ascii[c>>6]>>(c&63)&1 != 0
		}
		if ok {
			return true
		}
	}
	return false
}

// anchoredRe compiles src anchored at the start of its input.
func anchoredRe(src string) *regexp.Regexp { return regexp.MustCompile(`^(?:` + src + `)`) }

// minGroupWidth returns the least number of bytes capture group g of src
// can match (ASCII classes assumed: one byte per rune), or 1 when the
// group cannot be found.
func minGroupWidth(src string, g int) int {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return 1
	}
	var find func(n *syntax.Regexp) *syntax.Regexp
	find = func(n *syntax.Regexp) *syntax.Regexp {
		if n.Op == syntax.OpCapture && (n.Cap == g || g < 0) {
			return n
		}
		for _, s := range n.Sub {
			if c := find(s); c != nil {
				return c
			}
		}
		return nil
	}
	c := find(re)
	if c == nil {
		return 1
	}
	return max(1, minWidth(c))
}

func minWidth(n *syntax.Regexp) int {
	switch n.Op {
	case syntax.OpLiteral:
		return len(n.Rune)
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 1
	case syntax.OpCapture:
		return minWidth(n.Sub[0])
	case syntax.OpConcat:
		w := 0
		for _, s := range n.Sub {
			w += minWidth(s)
		}
		return w
	case syntax.OpAlternate:
		w := -1
		for _, s := range n.Sub {
			if m := minWidth(s); w < 0 || m < w {
				w = m
			}
		}
		return max(w, 0)
	case syntax.OpPlus:
		return minWidth(n.Sub[0])
	case syntax.OpRepeat:
		return n.Min * minWidth(n.Sub[0])
	}
	return 0
}

// maxWidth returns the most bytes n can match, or -1 when unbounded
// (ASCII assumed for classes; a non-ASCII class counts 4 bytes).
func maxWidth(n *syntax.Regexp) int {
	switch n.Op {
	case syntax.OpLiteral:
		w := 0
		for _, r := range n.Rune {
			rw := utf8.RuneLen(r)
			if n.Flags&syntax.FoldCase != 0 {
				// (?i)k also matches U+212A KELVIN SIGN, three bytes.
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					rw = max(rw, utf8.RuneLen(f))
				}
			}
			w += rw
		}
		return w
	case syntax.OpCharClass:
		// Its ranges are sorted (with case folding applied): the last
		// one's end is its widest rune.
		if len(n.Rune) == 0 {
			return 0
		}
		return utf8.RuneLen(n.Rune[len(n.Rune)-1])
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 4
	case syntax.OpCapture:
		return maxWidth(n.Sub[0])
	case syntax.OpConcat:
		w := 0
		for _, s := range n.Sub {
			m := maxWidth(s)
			if m < 0 {
				return -1
			}
			w += m
		}
		return w
	case syntax.OpAlternate:
		w := 0
		for _, s := range n.Sub {
			m := maxWidth(s)
			if m < 0 {
				return -1
			}
			w = max(w, m)
		}
		return w
	case syntax.OpStar, syntax.OpPlus:
		return -1
	case syntax.OpQuest:
		return maxWidth(n.Sub[0])
	case syntax.OpRepeat:
		if n.Max < 0 {
			return -1
		}
		m := maxWidth(n.Sub[0])
		if m < 0 {
			return -1
		}
		return n.Max * m
	}
	return 0
}

// requiredLiterals returns the literals of at least four bytes that every
// match of src contains after its start (the top-level concatenation's
// literal elements past the first), e.g. "-----END" of a PEM block, in
// lower case with a "\x00" prefix when the literal is case-insensitive: a
// rule cannot match at p when one of them does not occur after p. A
// case-insensitive literal with a k or an s is left out: (?i) also
// matches those with U+212A and U+017F, which an ASCII search misses.
func requiredLiterals(src string) []string {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return nil
	}
	re = re.Simplify()
	for re.Op == syntax.OpCapture {
		re = re.Sub[0]
	}
	if re.Op != syntax.OpConcat {
		return nil
	}
	var out []string
	for _, s := range re.Sub[1:] {
		if s.Op != syntax.OpLiteral || len(s.Rune) < 4 {
			continue
		}
		lit := string(s.Rune)
		if s.Flags&syntax.FoldCase != 0 {
			lit = strings.ToLower(lit)
			if strings.ContainsAny(lit, "ks") {
				continue
			}
			lit = "\x00" + lit
		}
		out = append(out, lit)
	}
	return out
}

// ruleWidth returns maxWidth of src, or -1.
func ruleWidth(src string) int {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return -1
	}
	return maxWidth(re.Simplify())
}

// keywordReach returns, when every match of src contains one of
// keywords (lower case) ASCII case-insensitively, the most bytes from a
// match's start to where the first of them in it starts. It reads the
// literal runs of the pattern's top-level sequence (literals, small
// classes, optional literals, alternations of literals; see
// literalStrings) and takes the first run each of whose spellings holds
// a keyword; the bytes before the run are bounded by maxWidth. An
// alternation at the top is read branch by branch. ok is false when no
// such run exists or the bytes before it are unbounded.
func keywordReach(src string, keywords []string) (reach int, ok bool) {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return 0, false
	}
	return seqReach(re.Simplify(), keywords)
}

func seqReach(re *syntax.Regexp, keywords []string) (int, bool) {
	for re.Op == syntax.OpCapture {
		re = re.Sub[0]
	}
	if re.Op == syntax.OpAlternate {
		most := 0
		for _, s := range re.Sub {
			r, ok := seqReach(s, keywords)
			if !ok {
				return 0, false
			}
			most = max(most, r)
		}
		return most, true
	}
	seq := flattenAll(re, nil)
	off := 0
	for i := range seq {
		strs := []string{""}
		for j := i; j < len(seq); j++ {
			next := literalStrings(seq[j])
			if next == nil || len(strs)*len(next) > maxStartAlternatives {
				break
			}
			var grown []string
			for _, s := range strs {
				for _, t := range next {
					grown = append(grown, s+t)
				}
			}
			strs = grown
			if most, all := firstKeywordAt(strs, keywords); all {
				return off + most, true
			}
		}
		if seq[i].Op == syntax.OpAlternate {
			// An alternation whose every branch holds a keyword.
			if r, ok := seqReach(seq[i], keywords); ok {
				return off + r, true
			}
		}
		w := maxWidth(seq[i])
		if w < 0 {
			return 0, false
		}
		off += w
	}
	return 0, false
}

// firstKeywordAt reports whether every string of strs holds a keyword
// and the largest offset of the first one in them.
func firstKeywordAt(strs, keywords []string) (int, bool) {
	most := 0
	for _, s := range strs {
		first := -1
		for _, k := range keywords {
			if i := strings.Index(s, k); i >= 0 && (first < 0 || i < first) {
				first = i
			}
		}
		if first < 0 {
			return 0, false
		}
		most = max(most, first)
	}
	return most, true
}

// literalStrings returns the lower-case strings an ASCII node matches
// (a literal, a small class, an optional one of those, an alternation
// of literal sequences), or nil.
func literalStrings(n *syntax.Regexp) []string {
	switch n.Op {
	case syntax.OpLiteral:
		for _, r := range n.Rune {
			if r >= 0x80 {
				return nil
			}
		}
		return []string{strings.ToLower(string(n.Rune))}
	case syntax.OpCharClass:
		var out []string
		for _, l := range classLiterals(n) {
			out = append(out, strings.ToLower(string(l.Rune)))
		}
		return out
	case syntax.OpQuest:
		if smallPart(n.Sub[0]) {
			return append(literalStrings(n.Sub[0]), "")
		}
	case syntax.OpCapture:
		return literalStrings(n.Sub[0])
	case syntax.OpConcat:
		out := []string{""}
		for _, s := range n.Sub {
			next := literalStrings(s)
			if next == nil || len(out)*len(next) > maxStartAlternatives {
				return nil
			}
			var grown []string
			for _, a := range out {
				for _, b := range next {
					grown = append(grown, a+b)
				}
			}
			out = grown
		}
		return out
	case syntax.OpAlternate:
		var out []string
		for _, s := range n.Sub {
			next := literalStrings(s)
			if next == nil || len(out)+len(next) > maxStartAlternatives {
				return nil
			}
			out = append(out, next...)
		}
		return out
	}
	return nil
}

// leftContext reports whether a match of src can meet, before its first
// byte, an assertion that reads the byte before it (\b, \B, (?m)^):
// such a rule cannot be run on a window that starts inside the text. A
// ^ there (the start of the text) is not one: see withoutBeginText.
func leftContext(src string) bool {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return true
	}
	ctx, _ := startAssertions(re.Simplify())
	return ctx
}

// withoutBeginText returns src with every ^ (the start of the text) made
// a class that matches nothing, or "" when src has none: the rule as it
// reads a window that starts inside the text, where no ^ can hold.
func withoutBeginText(src string) string {
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return ""
	}
	found := false
	var walk func(n *syntax.Regexp)
	walk = func(n *syntax.Regexp) {
		for k, s := range n.Sub {
			if s.Op == syntax.OpBeginText {
				n.Sub[k] = &syntax.Regexp{Op: syntax.OpNoMatch}
				found = true
				continue
			}
			walk(s)
		}
	}
	walk(re)
	if !found || re.Op == syntax.OpBeginText {
		return ""
	}
	return re.String()
}

// startAssertions returns whether n can meet a left-context assertion
// before it consumes a byte, and whether it can match the empty string.
func startAssertions(n *syntax.Regexp) (ctx, nullable bool) {
	switch n.Op {
	case syntax.OpBeginLine, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return true, true
	case syntax.OpBeginText:
		return false, true
	case syntax.OpEmptyMatch, syntax.OpEndText, syntax.OpEndLine:
		return false, true
	case syntax.OpCapture, syntax.OpPlus:
		return startAssertions(n.Sub[0])
	case syntax.OpQuest, syntax.OpStar:
		c, _ := startAssertions(n.Sub[0])
		return c, true
	case syntax.OpRepeat:
		c, nul := startAssertions(n.Sub[0])
		return c, nul || n.Min == 0
	case syntax.OpConcat:
		for _, s := range n.Sub {
			c, nul := startAssertions(s)
			if c {
				return true, false
			}
			if !nul {
				return false, false
			}
		}
		return false, true
	case syntax.OpAlternate:
		for _, s := range n.Sub {
			c, nul := startAssertions(s)
			ctx, nullable = ctx || c, nullable || nul
		}
		return ctx, nullable
	}
	return false, false
}

// flattenAll appends to dst the elements of n's sequence, through every
// concatenation and capture.
func flattenAll(n *syntax.Regexp, dst []*syntax.Regexp) []*syntax.Regexp {
	switch n.Op {
	case syntax.OpConcat:
		for _, s := range n.Sub {
			dst = flattenAll(s, dst)
		}
		return dst
	case syntax.OpCapture:
		return flattenAll(n.Sub[0], dst)
	}
	return append(dst, n)
}
