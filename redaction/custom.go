package redaction

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// maxCustomTypeLen bounds a user-defined type name so its placeholders stay
// within maxPlaceholderLen (see typeName).
const maxCustomTypeLen = maxPlaceholderLen - 16

// validCustomType reports whether name can be a user-defined entity type:
// upper-case ASCII letters, digits and '_', starting with a letter, at most
// 32 bytes, and not a built-in type.
func validCustomType(name string) error {
	if name == "" || len(name) > maxCustomTypeLen || !isUpper(name[0]) {
		return fmt.Errorf("redaction: custom type %q must start with an upper-case letter and be 1 to %d characters of A-Z, 0-9 and _", name, maxCustomTypeLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !isUpper(c) && !isDigit(c) && c != '_' {
			return fmt.Errorf("redaction: custom type %q must be upper-case: only A-Z, 0-9 and _", name)
		}
	}
	if slices.Contains(builtinTypes, name) {
		return fmt.Errorf("redaction: custom type %q is a built-in type; pick another name", name)
	}
	return nil
}

// patternDetector finds the matches of user-defined RE2 expressions. When an
// expression has a group named "value", only that group is the finding (so
// "badge\s*#(?P<value>\d{6})" redacts the number and keeps the word).
type patternDetector struct {
	typ string
	res []*regexp.Regexp
}

func (d *patternDetector) Type() string { return d.typ }

func (d *patternDetector) Detect(text string, dst []Finding) []Finding {
	for _, re := range d.res {
		g := re.SubexpIndex("value")
		for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
			s, e := m[0], m[1]
			if g > 0 {
				s, e = m[2*g], m[2*g+1]
			}
			if s >= 0 && s < e {
				dst = append(dst, Finding{Type: d.typ, Start: s, End: e})
			}
		}
	}
	return dst
}

// newPatternDetector compiles the expressions of one custom type. Errors
// name the type and the expression: one that does not compile (RE2 syntax,
// https://github.com/google/re2/wiki/Syntax) or that matches the empty
// string (it would find nothing useful and everything at once).
func newPatternDetector(typ string, exprs []string) (*patternDetector, error) {
	d := &patternDetector{typ: typ}
	for _, expr := range exprs {
		re, err := regexp.Compile(expr)
		if err != nil {
			return nil, fmt.Errorf("redaction: pattern for %s: %w", typ, err)
		}
		if re.MatchString("") {
			return nil, fmt.Errorf("redaction: pattern %q for %s matches the empty string", expr, typ)
		}
		d.res = append(d.res, re)
	}
	return d, nil
}

// wordClass is what continues a word for dictionary matching: letters,
// marks, digits and '_' in any script.
const wordClass = `\p{L}\p{M}\p{N}_`

// newDictionaryDetector builds a case-insensitive whole-word matcher for
// words (e.g. project code names). A word may hold spaces, which match any
// run of white space. Longer entries are tried first, so "Apollo 11" wins
// over "Apollo". Errors: an empty word.
func newDictionaryDetector(typ string, words []string) (*dictionaryDetector, error) {
	alts := make([]string, 0, len(words))
	for _, w := range words {
		f := strings.Fields(w)
		if len(f) == 0 {
			return nil, fmt.Errorf("redaction: dictionary for %s holds an empty word", typ)
		}
		for i := range f {
			f[i] = regexp.QuoteMeta(f[i])
		}
		alts = append(alts, strings.Join(f, `\s+`))
	}
	sort.SliceStable(alts, func(i, j int) bool { return len(alts[i]) > len(alts[j]) })
	re, err := regexp.Compile(`(?i)(?:^|[^` + wordClass + `])(` + strings.Join(alts, "|") + `)(?:[^` + wordClass + `]|$)`)
	if err != nil {
		return nil, fmt.Errorf("redaction: dictionary for %s: %w", typ, err)
	}
	return &dictionaryDetector{typ: typ, re: re, first: regexp.MustCompile(`[` + wordClass + `]$`)}, nil
}

// dictionaryDetector finds whole-word, case-insensitive occurrences of a
// user-defined word list.
type dictionaryDetector struct {
	typ   string
	re    *regexp.Regexp
	first *regexp.Regexp // does a prefix end in a word character?
}

func (d *dictionaryDetector) Type() string { return d.typ }

func (d *dictionaryDetector) Detect(text string, dst []Finding) []Finding {
	for pos := 0; pos < len(text); {
		m := d.re.FindStringSubmatchIndex(text[pos:])
		if m == nil {
			return dst
		}
		s, e := pos+m[2], pos+m[3]
		// "^" matched at pos, which is only a boundary if the text before
		// pos does not end in a word character.
		if m[2] == 0 && pos > 0 && d.first.MatchString(text[max(0, pos-4):pos]) {
			pos++
			for pos < len(text) && text[pos]&0xC0 == 0x80 {
				pos++
			}
			continue
		}
		dst = append(dst, Finding{Type: d.typ, Start: s, End: e})
		pos = e
	}
	return dst
}

// customDetectors builds the detectors of cfg.Patterns and
// cfg.Dictionaries, sorted by type name, and returns them with the sorted
// list of custom types.
func customDetectors(cfg Config) ([]Detector, []string, error) {
	var types []string
	for t := range cfg.Patterns {
		types = append(types, t)
	}
	for t := range cfg.Dictionaries {
		if _, dup := cfg.Patterns[t]; !dup {
			types = append(types, t)
		}
	}
	sort.Strings(types)
	var ds []Detector
	for _, t := range types {
		if err := validCustomType(t); err != nil {
			return nil, nil, err
		}
		if len(cfg.Patterns[t]) == 0 && len(cfg.Dictionaries[t]) == 0 {
			return nil, nil, fmt.Errorf("redaction: custom type %s has no pattern and no word", t)
		}
		if exprs := cfg.Patterns[t]; len(exprs) > 0 {
			d, err := newPatternDetector(t, exprs)
			if err != nil {
				return nil, nil, err
			}
			ds = append(ds, d)
		}
		if words := cfg.Dictionaries[t]; len(words) > 0 {
			d, err := newDictionaryDetector(t, words)
			if err != nil {
				return nil, nil, err
			}
			ds = append(ds, d)
		}
	}
	return ds, types, nil
}
