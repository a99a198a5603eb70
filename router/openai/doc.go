package openai

import (
	"math"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// ValueKind is the type of a JSON value (RFC 8259 §3).
type ValueKind uint8

// The JSON value types.
const (
	KindNull ValueKind = iota + 1
	KindFalse
	KindTrue
	KindNumber
	KindString
	KindArray
	KindObject
)

// Doc is a request body read once by Parse: one node per JSON value, in
// document order, each holding where its text is in the body, its member
// name, its parent and where its subtree ends. Strings are not decoded
// until asked for (Str, Key), and a string without escapes is a slice of
// the body, so walking a Doc allocates nothing. Node 0 is the root. A Doc is
// immutable and safe for concurrent use.
type Doc struct {
	body  string
	nodes []node
}

// node is one JSON value of a Doc (32 bytes). Offsets are int32: Parse
// refuses bodies of 2 GiB or more.
type node struct {
	start, end       int32 // the value's JSON text: body[start:end]
	keyStart, keyEnd int32 // the member name's JSON text, quotes included; keyStart is -1 outside objects
	parent           int32 // the enclosing array or object; -1 for the root
	next             int32 // the index after this value's subtree: its next sibling, or past its parent's last member
	index            int32 // the position among the parent's elements or members
	kind             ValueKind
	esc, keyEsc      bool // the string value (or the member name) holds a backslash escape
}

// Len is the number of values in the document.
func (d *Doc) Len() int { return len(d.nodes) }

// Body is the text the document was parsed from.
func (d *Doc) Body() string { return d.body }

// Kind is the type of value i.
func (d *Doc) Kind(i int) ValueKind { return d.nodes[i].kind }

// Raw is value i's JSON text as it appears in the body (a string with its
// quotes and escapes, an object with its braces).
func (d *Doc) Raw(i int) string {
	n := &d.nodes[i]
	return d.body[n.start:n.end]
}

// Offset is where value i's JSON text starts in the body, in bytes.
func (d *Doc) Offset(i int) int { return int(d.nodes[i].start) }

// Str is the decoded text of string value i ("" for other kinds). A string
// without escapes is a slice of the body; one with escapes is decoded as
// gjson decodes it (an invalid surrogate becomes U+FFFD).
func (d *Doc) Str(i int) string {
	n := &d.nodes[i]
	if n.kind != KindString {
		return ""
	}
	return decode(d.body[n.start:n.end], n.esc)
}

// Key is the decoded member name of value i; ok is false when value i is
// an array element or the root.
func (d *Doc) Key(i int) (name string, ok bool) {
	n := &d.nodes[i]
	if n.keyStart < 0 {
		return "", false
	}
	return decode(d.body[n.keyStart:n.keyEnd], n.keyEsc), true
}

// Parent is the index of the array or object holding value i; -1 for the root.
func (d *Doc) Parent(i int) int { return int(d.nodes[i].parent) }

// Index is value i's position among its parent's elements or members, from 0.
func (d *Doc) Index(i int) int { return int(d.nodes[i].index) }

// Next is the index after value i's subtree: the children of an array or
// object i are i+1, Next(i+1), … while below Next(i).
func (d *Doc) Next(i int) int { return int(d.nodes[i].next) }

// Member is the index of object i's member named name, or -1 when i is not
// an object or has no such member (names compared decoded, as gjson does).
func (d *Doc) Member(i int, name string) int {
	if i < 0 || d.nodes[i].kind != KindObject {
		return -1
	}
	for c, end := i+1, int(d.nodes[i].next); c < end; c = int(d.nodes[c].next) {
		if d.keyIs(c, name) {
			return c
		}
	}
	return -1
}

// keyIs reports whether member c's decoded name is name, without
// allocating for names without escapes.
func (d *Doc) keyIs(c int, name string) bool {
	n := &d.nodes[c]
	if !n.keyEsc {
		return int(n.keyEnd-n.keyStart) == len(name)+2 && d.body[n.keyStart+1:n.keyEnd-1] == name
	}
	k, _ := d.Key(c)
	return k == name
}

// result is value i as a gjson.Result (parsed from its raw text alone), for
// error messages that print values the way the gjson-based checks did; a
// negative i is a value that does not exist.
func (d *Doc) result(i int) gjson.Result {
	if i < 0 {
		return gjson.Result{}
	}
	return gjson.Parse(d.Raw(i))
}

// decode returns the text of the JSON string raw (quotes included), which
// the parser has checked.
func decode(raw string, esc bool) string {
	if !esc {
		return raw[1 : len(raw)-1]
	}
	return unescape(raw[1 : len(raw)-1])
}

// unescape decodes the escapes of a checked JSON string's content (RFC 8259
// §7) as gjson does: a \u escape of a high surrogate followed by one of a
// low surrogate is one code point (UTF-16, RFC 2781 §2.2), any other
// surrogate becomes U+FFFD. Runs without escapes are copied whole.
func unescape(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for {
		i := strings.IndexByte(s, '\\')
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		c := s[i+1]
		switch c {
		case 'u':
			r, n := hex4(s[i+2:]), 6
			if r >= 0xD800 && r < 0xDC00 && len(s)-i >= 12 && s[i+6] == '\\' && s[i+7] == 'u' {
				if r2 := hex4(s[i+8:]); r2 >= 0xDC00 && r2 < 0xE000 {
					r, n = utf16.DecodeRune(r, r2), 12
				}
			}
			b.WriteRune(r) // a lone surrogate is written as U+FFFD
			s = s[i+n:]
			continue
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		} // '"', '\\' and '/' stand for themselves
		b.WriteByte(c)
		s = s[i+2:]
	}
}

// hex4 reads four hexadecimal digits (checked by the parser).
func hex4(s string) rune {
	var r rune
	for _, c := range []byte(s[:4]) {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// problem is what parse found wrong, in the order ParseRequest reports it.
type problem uint8

const (
	problemNone   problem = iota
	problemSyntax         // not JSON (RFC 8259)
	problemUTF8           // JSON, but a string is not valid UTF-8 (RFC 8259 §8.1)
	problemDeep           // nesting deeper than MaxJSONDepth
	problemDup            // a member name repeated in one object
)

// parser reads a body once: it checks the grammar (the same RFC 8259 as
// gjson.Valid), the UTF-8 of every string, the depth and member names
// repeated in one object, and records the nodes. It keeps no recursion, so
// deeply nested bodies cost no stack. After the first structural problem
// (depth, repeated name) it stops recording and only checks the grammar
// and the UTF-8, which are reported first.
type parser struct {
	s         string
	nodes     []node
	open      []int32 // the arrays and objects open, while recording
	counts    []int32 // members or elements seen so far in each open one
	sets      []map[string]struct{}
	kinds     bitstack // object (1) or array (0) at every open level
	recording bool
	badUTF8   bool
	problem   problem // the first structural problem (problemDeep, problemDup)
	dupKey    string
	// The member name read last, for the value that follows it.
	keyStart, keyEnd int32
	keyEsc           bool
}

// dupSetMin is the member count from which repeated names are found with a
// map rather than by comparing each name with the members before it.
const dupSetMin = 16

// parse reads s and returns its first problem in the order ParseRequest
// reports them (problemNone: the Doc holds every value), with the repeated
// name of problemDup.
func parse(s string) (*Doc, problem, string) {
	p, ok := parseAll(s)
	switch {
	case !ok:
		return nil, problemSyntax, ""
	case p.badUTF8:
		return nil, problemUTF8, ""
	case p.problem != problemNone:
		return nil, p.problem, p.dupKey
	}
	return &Doc{body: s, nodes: p.nodes}, problemNone, ""
}

// parseAll runs the parser over s; ok is false when s is not JSON (or is 2
// GiB or more).
func parseAll(s string) (p parser, ok bool) {
	if len(s) >= math.MaxInt32 {
		return p, false
	}
	p = parser{s: s, recording: true, keyStart: -1}
	// A chat body has a value per ~100 bytes of structure and long strings:
	// start small and let append grow it.
	p.nodes = make([]node, 0, min(len(s)/256+16, 4096))
	// The levels open at once, in one allocation for the first 8 (an
	// answer or a request nests 4 to 6 deep) instead of each slice
	// growing from nothing.
	levels := make([]int32, 0, 16)
	p.open, p.counts = levels[:0:8], levels[8:8:16]
	p.sets = make([]map[string]struct{}, 0, 8)
	return p, p.run()
}

// Parser states: a value is expected, a member name is, or a value ended.
const (
	stValue = iota
	stKey
	stAfter
)

// run reports whether s is one JSON value with optional white space around.
func (p *parser) run() bool {
	s := p.s
	i := skipSpace(s, 0)
	state := stValue
	for {
		switch state {
		case stValue:
			if i >= len(s) {
				return false
			}
			switch c := s[i]; c {
			case '{', '[':
				obj := c == '{'
				p.openValue(i, obj)
				i = skipSpace(s, i+1)
				if i >= len(s) {
					return false
				}
				switch {
				case obj && s[i] == '}', !obj && s[i] == ']':
					i++
					p.closeValue(i)
					state = stAfter
				case obj && s[i] != '"':
					return false
				case obj:
					state = stKey
				}
			case '"':
				j, esc, ok := p.str(i + 1)
				if !ok {
					return false
				}
				p.leaf(KindString, i, j, esc)
				i, state = j, stAfter
			case 't', 'f', 'n':
				lit, k := "null", KindNull
				switch c {
				case 't':
					lit, k = "true", KindTrue
				case 'f':
					lit, k = "false", KindFalse
				}
				if len(s)-i < len(lit) || s[i:i+len(lit)] != lit {
					return false
				}
				p.leaf(k, i, i+len(lit), false)
				i, state = i+len(lit), stAfter
			default:
				j, ok := number(s, i)
				if !ok {
					return false
				}
				p.leaf(KindNumber, i, j, false)
				i, state = j, stAfter
			}
		case stKey: // s[i] is the name's opening quote
			j, esc, ok := p.str(i + 1)
			if !ok {
				return false
			}
			p.keyStart, p.keyEnd, p.keyEsc = int32(i), int32(j), esc
			if p.recording {
				p.checkName()
			}
			i = skipSpace(s, j)
			if i >= len(s) || s[i] != ':' {
				return false
			}
			i, state = skipSpace(s, i+1), stValue
		case stAfter:
			if p.kinds.n == 0 {
				return skipSpace(s, i) == len(s)
			}
			i = skipSpace(s, i)
			if i >= len(s) {
				return false
			}
			obj := p.kinds.top()
			switch c := s[i]; {
			case c == ',':
				i = skipSpace(s, i+1)
				if !obj {
					state = stValue
					break
				}
				if i >= len(s) || s[i] != '"' {
					return false
				}
				state = stKey
			case obj && c == '}', !obj && c == ']':
				i++
				p.closeValue(i)
			default:
				return false
			}
		}
	}
}

// leaf records a string, number or literal at s[start:end].
func (p *parser) leaf(k ValueKind, start, end int, esc bool) {
	if !p.recording {
		return
	}
	p.add(node{start: int32(start), end: int32(end), kind: k, esc: esc})
}

// add appends n as the next value of the innermost open array or object,
// with the member name read last.
func (p *parser) add(n node) int32 {
	idx := int32(len(p.nodes))
	n.parent, n.next, n.keyStart, n.keyEnd, n.keyEsc = -1, idx+1, -1, -1, false
	if top := len(p.open) - 1; top >= 0 {
		n.parent, n.index = p.open[top], p.counts[top]
		p.counts[top]++
		if p.kinds.top() {
			n.keyStart, n.keyEnd, n.keyEsc = p.keyStart, p.keyEnd, p.keyEsc
		}
	}
	p.nodes = append(p.nodes, n)
	return idx
}

// openValue starts an array or object at s[start].
func (p *parser) openValue(start int, obj bool) {
	if p.recording {
		if p.kinds.n == MaxJSONDepth {
			p.stop(problemDeep, "")
		} else {
			k := KindArray
			if obj {
				k = KindObject
			}
			p.open = append(p.open, p.add(node{start: int32(start), kind: k}))
			p.counts = append(p.counts, 0)
			p.sets = append(p.sets, nil)
		}
	}
	p.kinds.push(obj)
}

// closeValue ends the innermost array or object just before s[end].
func (p *parser) closeValue(end int) {
	p.kinds.pop()
	if !p.recording {
		return
	}
	top := len(p.open) - 1
	n := &p.nodes[p.open[top]]
	n.end, n.next = int32(end), int32(len(p.nodes))
	p.open, p.counts, p.sets = p.open[:top], p.counts[:top], p.sets[:top]
}

// stop records the first structural problem and stops recording.
func (p *parser) stop(pr problem, key string) {
	p.problem, p.dupKey, p.recording = pr, key, false
}

// checkName looks for the member name just read among the names of the
// members before it in the same object.
func (p *parser) checkName() {
	top := len(p.open) - 1
	obj := p.open[top]
	count := p.counts[top]
	key := decode(p.s[p.keyStart:p.keyEnd], p.keyEsc)
	if count < dupSetMin {
		d := Doc{body: p.s, nodes: p.nodes}
		for c := int(obj) + 1; c < len(p.nodes); c = int(p.nodes[c].next) {
			if d.keyIs(c, key) {
				p.stop(problemDup, key)
				return
			}
		}
		return
	}
	set := p.sets[top]
	if set == nil {
		set = make(map[string]struct{}, 2*count)
		d := Doc{body: p.s, nodes: p.nodes}
		for c := int(obj) + 1; c < len(p.nodes); c = int(p.nodes[c].next) {
			k, _ := d.Key(c)
			set[k] = struct{}{}
		}
		p.sets[top] = set
	}
	if _, seen := set[key]; seen {
		p.stop(problemDup, key)
		return
	}
	set[key] = struct{}{}
}

// str reads a string's content from s[i] (just after the opening quote) and
// returns the index after the closing quote, whether it holds an escape,
// and false when the string is not valid JSON: a control character, a bad
// escape or no closing quote. A byte sequence that is not UTF-8 sets
// p.badUTF8 and the reading goes on.
func (p *parser) str(i int) (end int, esc, ok bool) {
	s := p.s
	for {
		// Eight bytes at a time while none is a quote, a backslash, a
		// control character or non-ASCII.
		for i+8 <= len(s) {
			_ = s[i+7]
			w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
				uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
			if special(w) {
				break
			}
			i += 8
		}
		if i >= len(s) {
			return i, esc, false
		}
		switch c := s[i]; {
		case c == '"':
			return i + 1, esc, true
		case c == '\\':
			esc = true
			if i+1 >= len(s) {
				return i, esc, false
			}
			switch s[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(s)-i < 6 || !isHex(s[i+2]) || !isHex(s[i+3]) || !isHex(s[i+4]) || !isHex(s[i+5]) {
					return i, esc, false
				}
				i += 6
			default:
				return i, esc, false
			}
		case c < 0x20:
			return i, esc, false
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				p.badUTF8 = true
			}
			i += size
		default:
			i++
		}
	}
}

// special reports whether one of the eight bytes of w is '"', '\\', below
// 0x20 or above 0x7f (the zero-byte test of Mycroft, as in Hacker's Delight
// §6-1 and Anderson's "Bit Twiddling Hacks": (x-0x01…)&^x&0x80… is non-zero
// iff some byte of x is zero; with 0x20… it finds bytes below 0x20).
func special(w uint64) bool {
	const ones, high = 0x0101010101010101, 0x8080808080808080
	q := w ^ (ones * '"')
	b := w ^ (ones * '\\')
	return ((q-ones)&^q|(b-ones)&^b|(w-ones*0x20)&^w|w)&high != 0
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number reads a JSON number at s[i] (RFC 8259 §6) and returns the index
// after it; what follows is the caller's to check.
func number(s string, i int) (int, bool) {
	if s[i] == '-' {
		i++
	}
	if i >= len(s) || !isDigit(s[i]) {
		return i, false
	}
	if s[i] == '0' {
		i++
	} else {
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i >= len(s) || !isDigit(s[i]) {
			return i, false
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i >= len(s) || !isDigit(s[i]) {
			return i, false
		}
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	return i, true
}

// skipSpace returns the index of the first byte from i that is not JSON
// white space (RFC 8259 §2: space, tab, line feed, carriage return).
func skipSpace(s string, i int) int {
	for i < len(s) {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// bitstack is a stack of booleans, one bit each: the kind (object or not)
// of every open level, however deep, in n/8 bytes.
type bitstack struct {
	w0   uint64 // the first 64 levels
	more []uint64
	n    int
}

func (b *bitstack) push(v bool) {
	w := b.word(b.n)
	if v {
		*w |= 1 << (b.n % 64)
	} else {
		*w &^= 1 << (b.n % 64)
	}
	b.n++
}

func (b *bitstack) pop() { b.n-- }

func (b *bitstack) top() bool { return *b.word(b.n - 1)>>((b.n-1)%64)&1 == 1 }

func (b *bitstack) word(level int) *uint64 {
	if level < 64 {
		return &b.w0
	}
	k := level/64 - 1
	for k >= len(b.more) {
		b.more = append(b.more, 0)
	}
	return &b.more[k]
}
