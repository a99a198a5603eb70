package redaction

import (
	"encoding/json"
	"sort"
	"strings"
	"unicode/utf8"
)

// JSON-aware redaction, for texts that are JSON documents (tool-call
// arguments, structured prompts): placeholders never break the JSON they
// sit in. A finding inside a string literal (a value or a key) is replaced
// inside that literal, and the vault keeps the decoded value (RFC 8259 §7
// escapes undone), so that restoring into JSON re-escapes it exactly once.
// A finding that touches a number, true, false or null replaces the whole
// token by a quoted placeholder ("[CREDIT_CARD_1]", a JSON string), which
// RestoreJSON and JSON stream restorers turn back into the original token
// with its quotes dropped, so {"card": 4111111111111111} comes back
// byte for byte. A finding that runs over string edges is split into its
// parts inside each literal.

// jsonToken is a scalar token of a JSON text: [s, e) with, for strings,
// the quotes included.
type jsonToken struct {
	s, e   int
	str    bool
	escape bool // a string holding at least one escape
}

// jsonTokens lists the string and scalar tokens of raw, in order. It does
// not validate: bytes outside tokens are structure or white space. It
// returns false when raw ends inside a string.
func jsonTokens(raw string) ([]jsonToken, bool) {
	var out []jsonToken
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '"':
			t := jsonToken{s: i, str: true}
			j := i + 1
			for j < len(raw) && raw[j] != '"' {
				if raw[j] == '\\' {
					t.escape = true
					j++
				}
				j++
			}
			if j >= len(raw) {
				return out, false
			}
			t.e = j + 1
			out = append(out, t)
			i = j + 1
		case c == '-' || isDigit(c) || c == 't' || c == 'f' || c == 'n':
			j := i
			for j < len(raw) && (isAlnum(raw[j]) || raw[j] == '-' || raw[j] == '+' || raw[j] == '.') {
				j++
			}
			out = append(out, jsonToken{s: i, e: j})
			i = j
		default:
			i++
		}
	}
	return out, true
}

// unescapeJSON decodes the escapes of JSON string content s (RFC 8259 §7);
// an invalid escape is kept as it is.
func unescapeJSON(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		switch s[i+1] {
		case '"', '\\', '/':
			b.WriteByte(s[i+1])
			i++
		case 'b':
			b.WriteByte('\b')
			i++
		case 'f':
			b.WriteByte('\f')
			i++
		case 'n':
			b.WriteByte('\n')
			i++
		case 'r':
			b.WriteByte('\r')
			i++
		case 't':
			b.WriteByte('\t')
			i++
		case 'u':
			if r := jsonUnit(s[i:]); r >= 0 {
				// A surrogate pair.
				if r >= 0xD800 && r < 0xDC00 {
					if lo := jsonUnit(s[i+6:]); lo >= 0xDC00 && lo < 0xE000 {
						b.WriteRune((r-0xD800)<<10 | (lo - 0xDC00) + 0x10000)
						i += 11
						continue
					}
				}
				b.WriteRune(r)
				i += 5
				continue
			}
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// jsonUnit decodes "\uXXXX" at s[0], or returns -1.
func jsonUnit(s string) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, h := range []byte(s[2:6]) {
		v := hexVal(h)
		if v < 0 {
			return -1
		}
		r = r<<4 | rune(v)
	}
	return r
}

// RedactJSON is Redact for a JSON text raw (see the JSON-aware redaction
// notes above): findings are byte ranges into raw as Scan returns them
// for it; types selects which to replace, as for Redact. The result is
// valid JSON whenever raw is. When raw is not JSON (RFC 8259, checked
// with encoding/json) it falls back to Redact: findings in bare words
// outside any literal are replaced like in plain text. Restore values with RestoreJSON or a JSON stream restorer
// (they re-escape string values and unquote literal placeholders), or
// with Restore for plain text.
func (v *Vault) RedactJSON(raw string, findings []Finding, types map[string]bool) string {
	toks, ok := jsonTokens(raw)
	if !ok || !json.Valid([]byte(raw)) {
		return v.Redact(raw, findings, types)
	}
	type edit struct {
		s, e     int
		typ, val string
		literal  bool
	}
	var edits []edit
	for _, f := range findings {
		if !types[f.Type] || f.Start < 0 || f.End > len(raw) || f.Start >= f.End {
			continue
		}
		// The tokens the finding touches.
		k := sort.Search(len(toks), func(k int) bool { return toks[k].e > f.Start })
		for ; k < len(toks) && toks[k].s < f.End; k++ {
			t := toks[k]
			if !t.str {
				edits = append(edits, edit{t.s, t.e, f.Type, raw[t.s:t.e], true})
				continue
			}
			s, e := max(f.Start, t.s+1), min(f.End, t.e-1)
			if s >= e {
				continue
			}
			// Never cut an escape or a UTF-8 sequence in half.
			for s > t.s+1 && (isInEscape(raw, t.s+1, s) || !utf8.RuneStart(raw[s])) {
				s--
			}
			for e < t.e-1 && (isInEscape(raw, t.s+1, e) || !utf8.RuneStart(raw[e])) {
				e++
			}
			val := raw[s:e]
			if t.escape {
				val = unescapeJSON(val)
			}
			edits = append(edits, edit{s, e, f.Type, val, false})
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	forEachPlaceholder(raw, func(s, e int) {
		if _, ok := v.byPH[raw[s:e]]; !ok {
			v.reserved[raw[s:e]] = true
		}
	})
	if len(edits) == 0 {
		return raw
	}
	sort.SliceStable(edits, func(i, j int) bool { return edits[i].s < edits[j].s })
	var b strings.Builder
	b.Grow(len(raw) + 16*len(edits))
	last := 0
	for _, ed := range edits {
		if ed.s < last {
			continue
		}
		b.WriteString(raw[last:ed.s])
		ph := v.placeholderLocked(ed.typ, ed.val)
		if ed.literal {
			if v.modes[ed.typ] == ModePlaceholder {
				v.markLiteralLocked(ph)
			}
			b.WriteByte('"')
			b.WriteString(ph)
			b.WriteByte('"')
		} else {
			b.WriteString(ph)
		}
		last = ed.e
	}
	b.WriteString(raw[last:])
	return b.String()
}

// isInEscape reports whether offset i of a string's content starting at
// from falls inside a backslash escape (after its backslash).
func isInEscape(raw string, from, i int) bool {
	for k := from; k < i; k++ {
		if raw[k] != '\\' {
			continue
		}
		n := 2
		if k+1 < len(raw) && raw[k+1] == 'u' {
			n = 6
		}
		if i < k+n {
			return true
		}
		k += n - 1
	}
	return false
}

func (v *Vault) markLiteralLocked(ph string) {
	if v.literal == nil {
		v.literal = map[string]bool{}
	}
	v.literal[ph] = true
}
