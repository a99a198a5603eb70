package redaction

import (
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Placeholders have the shape "[TYPE_N]": an opening bracket, the entity
// type (upper-case ASCII letters, digits and '_', starting with a letter),
// '_', a decimal counter without leading zeros starting at 1, and a closing
// bracket, e.g. "[EMAIL_1]", "[CREDIT_CARD_12]".
//
// Why this shape:
//   - The closing bracket makes the set prefix-free: "[EMAIL_1]" is not a
//     prefix of "[EMAIL_10]", so restore never confuses them.
//   - Only ASCII letters, digits, '_', '[' and ']': nothing JSON escapes
//     (no '"', '\\' or control characters, and none of the '<', '>', '&'
//     that Go's encoding/json and others escape as \u003c…), so a
//     placeholder reads the same in raw JSON as in decoded text, and
//     nothing that Markdown renderers or tokenisers tend to rewrite.
//   - Bracketed upper-case tags are how redacted text looks in the wild
//     ("[NAME]", "[REDACTED]"), so models copy them verbatim rather than
//     "fixing" them; the type keeps the answer readable ("write to
//     [EMAIL_1]").
const maxPlaceholderLen = 48

// Vault pseudonymises the values of one request and restores them in its
// answer. The same (type, value) pair always gets the same placeholder in
// one Vault; different values get different placeholders. A Vault is
// independent of every other Vault (use one per request). Safe for
// concurrent use.
type Vault struct {
	mu       sync.RWMutex
	byValue  map[vaultKey]string // (type, value) -> placeholder
	byPH     map[string]string   // placeholder -> value
	next     map[string]int      // type -> last counter used
	reserved map[string]bool     // placeholder-shaped strings present in redacted input
	unknown  atomic.Int64
	modes    map[string]Mode   // per type; absent = ModePlaceholder
	hmacKey  []byte            // ModeHash key; nil = processKey
	masked   map[vaultKey]bool // values replaced by a mask or pseudonym
	literal  map[string]bool   // placeholders that stand for a JSON number or literal (RedactJSON)
}

type vaultKey struct{ typ, value string }

// NewVault returns an empty Vault. Without options every type is replaced
// by reversible placeholders (ModePlaceholder); WithMode and WithHMACKey
// choose masks or keyed pseudonyms per type.
func NewVault(opts ...VaultOption) *Vault {
	v := &Vault{
		byValue:  map[vaultKey]string{},
		byPH:     map[string]string{},
		next:     map[string]int{},
		reserved: map[string]bool{},
		modes:    map[string]Mode{},
	}
	for _, o := range opts {
		o(v)
	}
	return v
}

// Replaced returns the number of distinct (type, value) pairs Redact
// replaced, in any mode: placeholders issued plus values masked or
// pseudonymised.
func (v *Vault) Replaced() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.byPH) + len(v.masked)
}

// Len returns the number of distinct values held (placeholders issued).
func (v *Vault) Len() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.byPH)
}

// Unknown returns how many well-formed placeholders of a known type
// (built-in or issued by this Vault) Restore, RestoreJSON and stream
// restorers met that this Vault never issued and that were not in the
// redacted input either — invented or mangled by the model. They are left
// in the text as they are.
func (v *Vault) Unknown() int { return int(v.unknown.Load()) }

// placeholderType returns the type part of a placeholder-shaped
// string such as "[EMAIL_1]".
func placeholderType(ph string) string {
	k := strings.LastIndexByte(ph, '_')
	return ph[1:k]
}

// typeName turns an entity type into the placeholder's type part: upper
// case, characters other than [A-Z0-9_] replaced by '_', "REDACTED" if empty
// or not starting with a letter.
func typeName(t string) string {
	b := []byte(strings.ToUpper(t))
	for i, c := range b {
		if !isUpper(c) && !isDigit(c) && c != '_' {
			b[i] = '_'
		}
	}
	if len(b) == 0 || !isUpper(b[0]) || len(b) > maxPlaceholderLen-16 {
		return "REDACTED"
	}
	return string(b)
}

// Redact returns text with every finding whose Type is in types replaced by
// its placeholder (or mask or pseudonym, per the type's Mode); findings of
// other types are left as they are, so a nil or empty types redacts
// nothing. Findings are byte ranges into text as
// Scan returns them; ones out of range, empty, or overlapping an earlier
// one (by Start) are ignored. Placeholder-shaped strings already present in
// text are never issued, so a literal "[EMAIL_1]" typed by the user cannot
// be "restored" into someone's address.
func (v *Vault) Redact(text string, findings []Finding, types map[string]bool) string {
	fs := make([]Finding, 0, len(findings))
	for _, f := range findings {
		if types[f.Type] && f.Start >= 0 && f.End <= len(text) && f.Start < f.End {
			fs = append(fs, f)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	forEachPlaceholder(text, func(s, e int) {
		if _, ok := v.byPH[text[s:e]]; !ok {
			v.reserved[text[s:e]] = true
		}
	})
	if len(fs) == 0 {
		return text
	}
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].Start < fs[j].Start })
	var b strings.Builder
	b.Grow(len(text))
	last := 0
	for _, f := range fs {
		if f.Start < last {
			continue
		}
		b.WriteString(text[last:f.Start])
		b.WriteString(v.placeholderLocked(f.Type, text[f.Start:f.End]))
		last = f.End
	}
	b.WriteString(text[last:])
	return b.String()
}

func (v *Vault) placeholderLocked(typ, value string) string {
	switch v.modes[typ] {
	case ModeMask:
		v.markLocked(typ, value)
		return "[" + typeName(typ) + "]"
	case ModeHash:
		v.markLocked(typ, value)
		return v.pseudonym(typ, value)
	}
	k := vaultKey{typ, value}
	if ph, ok := v.byValue[k]; ok {
		return ph
	}
	name := typeName(typ)
	for {
		v.next[name]++
		ph := "[" + name + "_" + strconv.Itoa(v.next[name]) + "]"
		if v.reserved[ph] {
			continue
		}
		if _, taken := v.byPH[ph]; taken {
			continue // two types that sanitise to the same name
		}
		v.byValue[k] = ph
		v.byPH[ph] = value
		return ph
	}
}

func (v *Vault) markLocked(typ, value string) {
	if v.masked == nil {
		v.masked = map[vaultKey]bool{}
	}
	v.masked[vaultKey{typ, value}] = true
}

// Placeholders returns a copy of the issued placeholders and their values,
// for tests and audits; never log it, it holds the sensitive values.
func (v *Vault) Placeholders() map[string]string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]string, len(v.byPH))
	for k, val := range v.byPH {
		out[k] = val
	}
	return out
}

// matchKind is what scanning at a '[' found.
type matchKind int

const (
	noMatch    matchKind = iota // not a placeholder
	incomplete                  // the text ends while it could still be one
	wellFormed                  // a complete "[TYPE_N]"
)

// scanPlaceholder examines s[i:], where s[i] == '['. For a well-formed
// placeholder it returns its end offset.
func scanPlaceholder(s string, i int) (int, matchKind) {
	j := i + 1
	if j >= len(s) {
		return 0, incomplete
	}
	if !isUpper(s[j]) {
		return 0, noMatch
	}
	for j++; j < len(s) && j-i < maxPlaceholderLen; j++ {
		c := s[j]
		if isUpper(c) || isDigit(c) || c == '_' {
			continue
		}
		if c != ']' {
			return 0, noMatch
		}
		// s[i+1:j] must end in "_N", N without a leading zero.
		k := strings.LastIndexByte(s[i+1:j], '_') + i + 1
		if k <= i+1 || k+1 >= j || s[k+1] == '0' || !allDigits(s[k+1:j]) {
			return 0, noMatch
		}
		return j + 1, wellFormed
	}
	if j >= len(s) && j-i < maxPlaceholderLen {
		return 0, incomplete
	}
	return 0, noMatch
}

// forEachPlaceholder calls fn for every well-formed placeholder in s.
func forEachPlaceholder(s string, fn func(start, end int)) {
	for i := 0; ; {
		k := strings.IndexByte(s[i:], '[')
		if k < 0 {
			return
		}
		p := i + k
		if e, kind := scanPlaceholder(s, p); kind == wellFormed {
			fn(p, e)
			i = e
		} else {
			i = p + 1
		}
	}
}

// restore rewrites s, replacing known placeholders by esc(value). When
// final is false it stops at a trailing '[' that could still grow into a
// placeholder, or at a trailing incomplete UTF-8 sequence, and returns that
// tail as rest. It counts unknown placeholders.
func (v *Vault) restore(s string, final bool, esc func(*strings.Builder, string), json bool) (out, rest string) {
	var b *strings.Builder
	last, i := 0, 0
	v.mu.RLock()
	defer v.mu.RUnlock()
	lit := json && len(v.literal) > 0
	for {
		k := strings.IndexByte(s[i:], '[')
		if k < 0 {
			break
		}
		p := i + k
		e, kind := scanPlaceholder(s, p)
		if kind == incomplete {
			if !final {
				if lit && p > last && s[p-1] == '"' {
					p-- // the quote may belong to a literal placeholder
				}
				return v.emit(b, s, last, p), s[p:]
			}
			break
		}
		if kind == noMatch {
			i = p + 1
			continue
		}
		ph := s[p:e]
		if val, ok := v.byPH[ph]; ok {
			if b == nil {
				b = &strings.Builder{}
				b.Grow(len(s) + len(val))
			}
			// A placeholder for a JSON number or literal, quoted as a
			// JSON string: the token comes back without the quotes.
			if lit && v.literal[ph] && p > last && s[p-1] == '"' {
				if e == len(s) && !final {
					return v.emit(b, s, last, p-1), s[p-1:] // the closing quote is still to come
				}
				if at(s, e) == '"' {
					b.WriteString(s[last : p-1])
					b.WriteString(val)
					last, i = e+1, e+1
					continue
				}
			}
			b.WriteString(s[last:p])
			esc(b, val)
			last = e
		} else if !v.reserved[ph] && v.knownType(placeholderType(ph)) {
			v.unknown.Add(1)
		}
		i = e
	}
	cut := len(s)
	if !final {
		cut = utf8Cut(s)
		// A trailing quote may open a quoted literal placeholder.
		if lit && cut > last && cut == len(s) && s[cut-1] == '"' {
			cut--
		}
	}
	return v.emit(b, s, last, cut), s[cut:]
}

func (v *Vault) emit(b *strings.Builder, s string, last, cut int) string {
	if b == nil {
		return s[:cut]
	}
	b.WriteString(s[last:cut])
	return b.String()
}

// knownType reports whether t is a built-in type or one this Vault issued
// placeholders for. Caller holds v.mu.
func (v *Vault) knownType(t string) bool {
	if slices.Contains(builtinTypes, t) {
		return true
	}
	_, ok := v.next[t]
	return ok
}

// utf8Cut returns the length of the longest prefix of s that does not end
// inside a UTF-8 sequence that the next bytes could complete.
func utf8Cut(s string) int {
	for k := 1; k <= utf8.UTFMax-1 && k <= len(s); k++ {
		c := s[len(s)-k]
		if c < 0x80 {
			return len(s)
		}
		if c >= 0xC0 { // a leading byte: is its sequence complete?
			if utf8.FullRuneInString(s[len(s)-k:]) {
				return len(s)
			}
			return len(s) - k
		}
	}
	return len(s)
}

func writeRaw(b *strings.Builder, val string) { b.WriteString(val) }

// Restore returns text with every placeholder this Vault issued replaced by
// its original value. Unknown, invented or mangled placeholders stay as
// they are; well-formed ones of a known type are counted in Unknown.
func (v *Vault) Restore(text string) string {
	out, _ := v.restore(text, true, writeRaw, false)
	return out
}

// RestoreJSON does what Restore does on raw JSON bytes: it inserts each
// value escaped as the contents of a JSON string (RFC 8259 §7: '"', '\\'
// and control characters escaped, U+2028/U+2029 too for JavaScript
// consumers, invalid UTF-8 replaced by U+FFFD), without quotes, because
// placeholders sit inside JSON strings. A placeholder inside a JSON string
// that itself holds encoded JSON (tool-call "arguments") needs one more
// level of escaping: restore the decoded arguments with RestoreJSON and
// re-encode them instead. raw is not modified; the result may share it.
func (v *Vault) RestoreJSON(raw []byte) []byte {
	out, _ := v.restore(string(raw), true, writeJSONString, true)
	return []byte(out)
}

const hexDigits = "0123456789abcdef"

func writeJSONString(b *strings.Builder, s string) {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c == '\n':
				b.WriteString(`\n`)
			case c == '\r':
				b.WriteString(`\r`)
			case c == '\t':
				b.WriteString(`\t`)
			case c < 0x20 || c == 0x7f:
				b.WriteString(`\u00`)
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&0xF])
			default:
				b.WriteByte(c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\ufffd`)
		case r == '\u2028':
			b.WriteString(`\u2028`)
		case r == '\u2029':
			b.WriteString(`\u2029`)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
}

// StreamRestorer restores placeholders in a text stream delivered in
// arbitrary chunks (e.g. the delta.content of SSE chunks). It holds back
// only a tail that could still be the start of a placeholder (at most
// maxPlaceholderLen bytes) and never emits half a UTF-8 character, so the
// concatenation of everything Write and Flush return equals Restore of the
// concatenated input. One StreamRestorer serves one stream and is not safe
// for concurrent use; its Vault is.
type StreamRestorer struct {
	v       *Vault
	pending string
	esc     func(*strings.Builder, string)
	json    bool
}

// NewStreamRestorer returns a restorer for one text stream.
func (v *Vault) NewStreamRestorer() *StreamRestorer {
	return &StreamRestorer{v: v, esc: writeRaw}
}

// NewJSONStreamRestorer returns a restorer for a stream of JSON text, such
// as the "arguments" of a streamed tool call (JSON delivered as string
// fragments): it inserts values JSON-string-escaped, as RestoreJSON does,
// because there the placeholders sit inside JSON strings.
func (v *Vault) NewJSONStreamRestorer() *StreamRestorer {
	return &StreamRestorer{v: v, esc: writeJSONString, json: true}
}

// Write consumes the next chunk and returns the text that is safe to emit
// now (possibly empty).
func (r *StreamRestorer) Write(chunk string) string {
	s := chunk
	if r.pending != "" {
		s = r.pending + chunk
	}
	out, rest := r.v.restore(s, false, r.esc, r.json)
	r.pending = rest
	return out
}

// Flush returns the held-back tail at the end of the stream, restored if
// it completes a placeholder and as it is otherwise.
func (r *StreamRestorer) Flush() string {
	if r.pending == "" {
		return ""
	}
	out, _ := r.v.restore(r.pending, true, r.esc, r.json)
	r.pending = ""
	return out
}

// Pending returns the number of bytes held back.
func (r *StreamRestorer) Pending() int { return len(r.pending) }
