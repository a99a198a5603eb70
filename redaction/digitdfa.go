package redaction

import (
	"regexp/syntax"
	"slices"
)

// digitDFA is a deterministic automaton over the ten ASCII digits that
// accepts exactly the digit strings a regular expression matches in full.
// It is built by the subset construction (M. O. Rabin, D. Scott, "Finite
// automata and their decision problems", 1959) over the program that
// regexp/syntax compiles the expression to, the same program the regexp
// package runs, so a match costs one table look-up per digit. Whether a
// string matches does not depend on which of several paths matches it,
// so the automaton agrees with the regexp's MatchString.
type digitDFA struct {
	next   [][10]int16 // state -> digit -> state; -1: no match can follow
	accept []bool      // states after which the string may end
}

// maxDFAStates bounds the automaton; an expression that needs more keeps
// its regexp.
const maxDFAStates = 4096

// newDigitDFA returns the automaton of the full matches of pattern (Perl
// syntax, as regexp.Compile reads it), or nil when pattern has an
// empty-width assertion (^, $, \b, ...), does not parse or needs more than
// maxDFAStates states.
func newDigitDFA(pattern string) *digitDFA {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil
	}
	// closure returns the sorted consuming instructions (and InstMatch)
	// reachable from pcs without reading input, or ok=false on an
	// instruction the automaton does not model.
	seen := make([]bool, len(prog.Inst))
	closure := func(pcs []uint32) (out []uint32, ok bool) {
		clear(seen)
		stack := slices.Clone(pcs)
		for len(stack) > 0 {
			pc := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if seen[pc] {
				continue
			}
			seen[pc] = true
			switch in := &prog.Inst[pc]; in.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				stack = append(stack, in.Out, in.Arg)
			case syntax.InstCapture, syntax.InstNop:
				stack = append(stack, in.Out)
			case syntax.InstMatch, syntax.InstRune, syntax.InstRune1, syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
				out = append(out, pc)
			case syntax.InstFail:
			default: // InstEmptyWidth
				return nil, false
			}
		}
		slices.Sort(out)
		return out, true
	}
	key := func(pcs []uint32) string {
		b := make([]byte, 0, 4*len(pcs))
		for _, pc := range pcs {
			b = append(b, byte(pc), byte(pc>>8), byte(pc>>16), byte(pc>>24))
		}
		return string(b)
	}
	start, ok := closure([]uint32{uint32(prog.Start)})
	if !ok {
		return nil
	}
	d := &digitDFA{}
	ids := map[string]int16{}
	var sets [][]uint32
	add := func(set []uint32) (int16, bool) {
		k := key(set)
		if id, ok := ids[k]; ok {
			return id, true
		}
		if len(sets) == maxDFAStates {
			return 0, false
		}
		id := int16(len(sets))
		ids[k] = id
		sets = append(sets, set)
		d.next = append(d.next, [10]int16{})
		d.accept = append(d.accept, slices.ContainsFunc(set, func(pc uint32) bool { return prog.Inst[pc].Op == syntax.InstMatch }))
		return id, true
	}
	add(start)
	for s := 0; s < len(sets); s++ {
		for digit := range 10 {
			var step []uint32
			for _, pc := range sets[s] {
				if in := &prog.Inst[pc]; consumes(in, rune('0'+digit)) {
					step = append(step, in.Out)
				}
			}
			if len(step) == 0 {
				d.next[s][digit] = -1
				continue
			}
			set, ok := closure(step)
			if !ok {
				return nil
			}
			if len(set) == 0 {
				d.next[s][digit] = -1
				continue
			}
			id, ok := add(set)
			if !ok {
				return nil
			}
			d.next[s][digit] = id
		}
	}
	return d
}

// consumes reports whether the instruction in reads the rune r.
func consumes(in *syntax.Inst, r rune) bool {
	switch in.Op {
	case syntax.InstRune, syntax.InstRune1:
		return in.MatchRune(r)
	case syntax.InstRuneAny:
		return true
	case syntax.InstRuneAnyNotNL:
		return r != '\n'
	}
	return false
}

// match reports whether d accepts s, and ok=false when s holds a byte
// that is not an ASCII digit (d says nothing about it).
func (d *digitDFA) match(s string) (matched, ok bool) {
	st := int16(0)
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return false, false
		}
		if st = d.next[st][c]; st < 0 {
			// No match, but the rest must still be digits for the
			// answer to be the automaton's.
			for ; i < len(s); i++ {
				if s[i]-'0' > 9 {
					return false, false
				}
			}
			return false, true
		}
	}
	return d.accept[st], true
}
