package serving

import (
	"fmt"
	"regexp/syntax"
	"strings"
	"unicode"
	"unicode/utf8"
)

// A JSON Schema "pattern" (an ECMA-262 regular expression that a string
// must contain a match of) as the GBNF of the JSON string literals whose
// decoded text matches it. The role of llama.cpp's _visit_pattern
// (examples/json_schema_to_grammar.py), rewritten on Go's regexp/syntax
// parse tree rather than llama.cpp's hand scanner, because the grammar is
// over the JSON text and not the decoded string: each character the
// expression matches is written as JSON writes it (`"` as \", `\` as \\,
// control characters as \n, \t, … or \u00XX), which llama.cpp's version
// does not do (its `.` lets an unescaped `"` end the string). An
// expression not anchored with ^ (or $) may have any text before (or
// after) its match, as JSON Schema's search semantics say.
//
// Where ECMA-262 and RE2 (the parser's syntax, and the default engine of
// Go validators) differ, the grammar takes what both accept: `.` is any
// character but \n, \r, U+2028 and U+2029 (ECMA-262; RE2's excludes only
// \n); \S is ECMA-262's non-space (a subset of RE2's), \s RE2's space (a
// subset of ECMA-262's); a character class matches only characters of the
// Basic Multilingual Plane (ECMA-262 without the u flag matches UTF-16
// code units). Refused, as an *UnsupportedSchemaError naming "pattern":
// what RE2 cannot parse (lookarounds, backreferences, ECMA-only escapes
// such as \cX), word boundaries, ^ or $ anywhere but at the start or end
// of the expression (or of one of its top-level alternatives), \S inside
// a character class and \s inside a negated one, and a class or literal
// no JSON string character can match.

// ecmaNotSpace is ECMA-262's \S: every character but WhiteSpace and
// LineTerminator (ECMA-262 §22.2.2.9, CharacterClassEscape).
const ecmaNotSpace = `[^\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}]`

// ecmaPattern rewrites the ECMA-262 escapes whose RE2 meaning differs:
// \S outside a class becomes ecmaNotSpace, \uXXXX becomes \x{XXXX}; \S in
// a class and \s in a negated class are refused.
func ecmaPattern(p string) (string, error) {
	var b strings.Builder
	inClass, negated := false, false
	for i := 0; i < len(p); i++ {
		ch := p[i]
		switch {
		case ch == '\\' && i+1 < len(p):
			next := p[i+1]
			switch {
			case next == 'S' && inClass:
				return "", fmt.Errorf(`\S inside a character class`)
			case next == 's' && inClass && negated:
				return "", fmt.Errorf(`\s inside a negated character class`)
			case next == 'S':
				b.WriteString(ecmaNotSpace)
			case next == 'u' && i+5 < len(p) && isHex(p[i+2:i+6]):
				b.WriteString(`\x{` + p[i+2:i+6] + `}`)
				i += 4
			default:
				b.WriteByte(ch)
				b.WriteByte(next)
			}
			i++
			continue
		case ch == '[' && !inClass:
			inClass = true
			negated = i+1 < len(p) && p[i+1] == '^'
		case ch == ']' && inClass:
			inClass = false
		}
		b.WriteByte(ch)
	}
	return b.String(), nil
}

// splitAlternatives splits the expression p at its top-level |.
func splitAlternatives(p string) []string {
	var parts []string
	depth, start, inClass := 0, 0, false
	for i := 0; i < len(p); i++ {
		switch ch := p[i]; {
		case ch == '\\':
			i++
		case inClass:
			if ch == ']' {
				inClass = false
			}
		case ch == '[':
			inClass = true
			// A ] first in the class (after any ^) is a literal.
			if i+1 < len(p) && p[i+1] == '^' {
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				i++
			}
		case ch == '(':
			depth++
		case ch == ')':
			depth--
		case ch == '|' && depth == 0:
			parts = append(parts, p[start:i])
			start = i + 1
		}
	}
	return append(parts, p[start:])
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// patternRule returns the GBNF of the JSON strings whose text matches the
// JSON Schema pattern p (the comment at the top of gbnf_pattern.go).
func (c *schemaConverter) patternRule(p string) (string, error) {
	src, err := ecmaPattern(p)
	if err != nil {
		return "", err
	}
	// Each top-level alternative parsed alone: the parser would factor
	// a common ^ out of them, leaving a $ inside.
	var alts []string
	for _, part := range splitAlternatives(src) {
		br, err := syntax.Parse(part, syntax.Perl)
		if err != nil {
			return "", err
		}
		subs := []*syntax.Regexp{br}
		if br.Op == syntax.OpConcat {
			subs = br.Sub
		}
		start, end := false, false
		if len(subs) > 0 && subs[0].Op == syntax.OpBeginText {
			start, subs = true, subs[1:]
		}
		if len(subs) > 0 && subs[len(subs)-1].Op == syntax.OpEndText {
			end, subs = true, subs[:len(subs)-1]
		}
		var seq []string
		if !start {
			seq = append(seq, c.primitive("char")+"*")
		}
		for _, s := range subs {
			r, err := c.regexRule(s)
			if err != nil {
				return "", err
			}
			seq = append(seq, r)
		}
		if !end {
			seq = append(seq, c.primitive("char")+"*")
		}
		alts = append(alts, "("+strings.Join(seq, " ")+")")
	}
	return `"\"" (` + strings.Join(alts, " | ") + `) "\"" space`, nil
}

// regexRule is the GBNF of the JSON text of the strings re matches.
func (c *schemaConverter) regexRule(re *syntax.Regexp) (string, error) {
	switch re.Op {
	case syntax.OpEmptyMatch:
		return `""`, nil
	case syntax.OpLiteral:
		var parts []string
		for _, r := range re.Rune {
			if re.Flags&syntax.FoldCase != 0 {
				fold := []rune{r}
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					fold = append(fold, f)
				}
				if len(fold) > 1 {
					var ranges []rune
					for _, f := range fold {
						ranges = append(ranges, f, f)
					}
					cls, err := classRule(ranges)
					if err != nil {
						return "", err
					}
					parts = append(parts, cls)
					continue
				}
			}
			if r >= 0xD800 && r <= 0xDFFF || !utf8.ValidRune(r) {
				return "", fmt.Errorf("the literal U+%04X is not a character", r)
			}
			parts = append(parts, formatLiteral(jsonChar(r)))
		}
		return "(" + strings.Join(parts, " ") + ")", nil
	case syntax.OpCharClass:
		return classRule(re.Rune)
	case syntax.OpAnyCharNotNL:
		cls, err := classRule([]rune{0, '\n' - 1, '\n' + 1, '\r' - 1, '\r' + 1, 0x2027, 0x202A, unicode.MaxRune})
		if err != nil {
			return "", err
		}
		return c.addRule("dot", cls), nil
	case syntax.OpAnyChar:
		return c.primitive("char"), nil
	case syntax.OpCapture:
		return c.regexRule(re.Sub[0])
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		sub, err := c.regexRule(re.Sub[0])
		if err != nil {
			return "", err
		}
		return "(" + sub + ")" + map[syntax.Op]string{syntax.OpStar: "*", syntax.OpPlus: "+", syntax.OpQuest: "?"}[re.Op], nil
	case syntax.OpRepeat:
		sub, err := c.regexRule(re.Sub[0])
		if err != nil {
			return "", err
		}
		if re.Max < 0 {
			return fmt.Sprintf("(%s){%d,}", sub, re.Min), nil
		}
		return fmt.Sprintf("(%s){%d,%d}", sub, re.Min, re.Max), nil
	case syntax.OpConcat, syntax.OpAlternate:
		var parts []string
		for _, s := range re.Sub {
			r, err := c.regexRule(s)
			if err != nil {
				return "", err
			}
			parts = append(parts, r)
		}
		sep := " "
		if re.Op == syntax.OpAlternate {
			sep = " | "
		}
		return "(" + strings.Join(parts, sep) + ")", nil
	case syntax.OpBeginText, syntax.OpEndText:
		return "", fmt.Errorf("^ or $ inside the expression (only at its start or end)")
	case syntax.OpBeginLine, syntax.OpEndLine:
		return "", fmt.Errorf("multi-line ^ or $")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return "", fmt.Errorf(`a word boundary (\b, \B)`)
	case syntax.OpNoMatch:
		return "", fmt.Errorf("an expression that matches nothing")
	}
	return "", fmt.Errorf("the regular expression operator %v", re.Op)
}

// jsonChar is r as a JSON string literal writes it (without the quotes).
func jsonChar(r rune) string {
	switch r {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	}
	if r < 0x20 || r == 0x7f {
		return fmt.Sprintf(`\u%04x`, r)
	}
	return string(r)
}

// classRule is the GBNF of the JSON text of one character of the class
// ranges (pairs lo, hi, as regexp/syntax gives them), restricted to the
// Basic Multilingual Plane without surrogates: the characters JSON writes
// as themselves in one GBNF class, the others (", \, control characters,
// DEL) each as its escape.
func classRule(ranges []rune) (string, error) {
	var raw strings.Builder
	var escaped []string
	add := func(lo, hi rune) {
		if lo <= hi {
			raw.WriteString(classChar(lo))
			if hi > lo {
				raw.WriteString("-" + classChar(hi))
			}
		}
	}
	for i := 0; i+1 < len(ranges); i += 2 {
		lo, hi := ranges[i], min(ranges[i+1], 0xFFFF)
		for r := lo; r <= hi && r <= 0x7f; r++ {
			if r < 0x20 || r == '"' || r == '\\' || r == 0x7f {
				escaped = append(escaped, formatLiteral(jsonChar(r)))
			}
		}
		// The raw pieces: [lo, hi] without 0x00-0x1F, ", \, DEL and the
		// surrogates.
		for _, cut := range [][2]rune{{0x20, '"' - 1}, {'"' + 1, '\\' - 1}, {'\\' + 1, 0x7e}, {0x80, 0xD7FF}, {0xE000, 0xFFFF}} {
			add(max(lo, cut[0]), min(hi, cut[1]))
		}
	}
	var alts []string
	if raw.Len() > 0 {
		alts = append(alts, "["+raw.String()+"]")
	}
	alts = append(alts, escaped...)
	if len(alts) == 0 {
		return "", fmt.Errorf("a character class no JSON string character matches")
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

// classChar is r inside a GBNF character class: ASCII letters and digits
// as themselves, anything else as \uXXXX or \UXXXXXXXX.
func classChar(r rune) string {
	if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
		return string(r)
	}
	if r > 0xFFFF {
		return fmt.Sprintf(`\U%08X`, r)
	}
	return fmt.Sprintf(`\u%04X`, r)
}
