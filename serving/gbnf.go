package serving

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// JSON Schema → GBNF, a Go port of the common subset of llama.cpp's
// json-schema-to-grammar (common/json-schema-to-grammar.cpp and
// examples/json_schema_to_grammar.py, MIT): the same primitive rules, the
// same object layout (required properties in declaration order, then the
// optional ones in order, each may be left out) and the same rule naming.
// The vendored C++ converter is not used because the module copy of
// llama.cpp lacks its nlohmann/json dependency (Go module zips drop vendor
// folders).
//
// Supported: type (one or a list), properties, required,
// additionalProperties (false, the default beside properties as in
// llama.cpp; true or a schema: other members, keys none of the
// properties'), propertyNames (on a map), minProperties/maxProperties
// where a grammar holds them (object), items, prefixItems, minItems,
// maxItems, uniqueItems (false; true for at most one item) (array),
// minLength, maxLength, pattern (string; gbnf_pattern.go), minimum,
// maximum, exclusiveMinimum, exclusiveMaximum (exact integer ranges;
// integer bounds on a number), multipleOf 1, enum, const, anyOf, oneOf
// (treated as anyOf: a value several alternatives take is let through),
// allOf (its members merged into one schema), keywords beside anyOf or
// oneOf (merged into each alternative, as allOf merges: JSON Schema's
// {A, anyOf [B, C]} is exactly anyOf [allOf [A, B], allOf [A, C]]; an
// alternative no value satisfies is left out, as is an optional property
// or a type of a type list no value satisfies), local $ref with $defs /
// definitions, and the annotations title,
// description, default, examples, $schema, $id, $comment, strict,
// deprecated, readOnly, writeOnly, discriminator and format (JSON Schema
// 2020-12 treats format as an annotation unless a validator opts in to
// asserting it; the grammar does not constrain it). A schema without
// type that has keywords of one type (minimum, pattern, items, …) is
// converted as that type. A $ref is a JSON pointer fragment
// ("#/$defs/Item", "#/definitions/Item", "#" or any other "#/…") into its
// schema resource: the document, or the nearest enclosing schema with an
// $id (how the engine embeds each tool's parameters in its tool-call
// schema). Each target becomes one rule, shared by all references to it,
// so recursive definitions (a pydantic model with a list of itself) give
// recursive rules, as llama.cpp's _resolve_ref does; only annotations may
// sit beside a $ref, other keywords there are refused, and a $ref to
// another document is an *UnsupportedSchemaError.
//
// The rule: a grammar never lets through a value the schema rejects. It
// may keep to a subset of the valid values, as llama.cpp does (no
// properties beside the declared ones unless additionalProperties says
// so, properties in declaration order, at most 16 integer digits, no
// exponent on a bounded number, a tuple written whole), but what it
// cannot express exactly is refused: any other keyword, and the cases
// each function's comment names (uniqueItems true, multipleOf other than
// 1, a bound with a fraction on a number, a pattern with lookarounds or
// backreferences, pattern beside minLength/maxLength, counts of distinct
// keys, an allOf whose members do not merge or an anyOf alternative that
// does not merge with the keywords beside it, constraints beside enum,
// more than maxDistributed alternatives from such merges), each as an
// *UnsupportedSchemaError naming the keyword and its JSON pointer; a
// schema no value satisfies (a minimum above its maximum, an anyOf none
// of whose alternatives is left) is an error too. minLength, maxLength,
// minItems, maxItems and a map's maxProperties above MaxSchemaRepetition
// are refused with a *SchemaLimitError: they become GBNF repetitions
// x{m,n}, and llama.cpp's grammar parser refuses any m or n above that
// bound.

// UnsupportedSchemaError names a JSON Schema keyword the converter cannot
// express as a grammar and where it was found (a JSON pointer).
type UnsupportedSchemaError struct {
	Keyword string
	Pointer string
	Reason  string // why, where the keyword is supported elsewhere; may be ""
}

func (e *UnsupportedSchemaError) Error() string {
	msg := fmt.Sprintf("JSON Schema keyword %q (at %q) is not supported by this engine's grammar sampler", e.Keyword, e.Pointer)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

// noValueError is a schema, or a part of one every value must satisfy,
// that no value satisfies (a minimum above its maximum, types that do
// not meet), or none the grammar writes (a required property outside
// properties, where the grammar writes only the declared ones): an
// anyOf/oneOf alternative that is one is left out of the rule.
type noValueError struct{ msg string }

func (e *noValueError) Error() string { return e.msg }

func noValue(format string, a ...any) error { return &noValueError{fmt.Sprintf(format, a...)} }

// tentatively runs f and, where it fails with a *noValueError, takes back
// the rules and $ref targets it added, so that a left-out alternative
// leaves no rule behind (a $ref target's pending rule among them).
func (c *schemaConverter) tentatively(f func() (string, error)) (string, error) {
	rules, refs := maps.Clone(c.rules), maps.Clone(c.refs)
	r, err := f()
	var nv *noValueError
	if errors.As(err, &nv) {
		c.rules, c.refs = rules, refs
	}
	return r, err
}

// alternatives converts n alternatives with each, every one tried
// tentatively (its rules rolled back when it fails): the rules of those that
// have a value, the first "no value satisfies" error among the others, and
// any other error, which stops it.
func (c *schemaConverter) alternatives(n int, each func(i int) (string, error)) (parts []string, first, err error) {
	for i := range n {
		r, err := c.tentatively(func() (string, error) { return each(i) })
		var nv *noValueError
		switch {
		case errors.As(err, &nv):
			if first == nil {
				first = err
			}
		case err != nil:
			return nil, nil, err
		default:
			parts = append(parts, r)
		}
	}
	return parts, first, nil
}

// MaxSchemaRepetition is the largest minLength, maxLength, minItems or
// maxItems SchemaToGBNF accepts: llama.cpp's grammar parser refuses a
// repetition x{m,n} with m or n above MAX_REPETITION_THRESHOLD (2000,
// src/llama-grammar.cpp of the pinned llama.cpp), and the converter writes
// these keywords as such repetitions (an array's items as
// item ("," item){m-1,n-1}).
const MaxSchemaRepetition = 2000

// SchemaLimitError names a JSON Schema keyword whose value is beyond what
// the grammar sampler can express, where it was found (a JSON pointer),
// the value (its JSON text) and the limit.
type SchemaLimitError struct {
	Keyword string
	Pointer string
	Value   string
	Limit   int
}

func (e *SchemaLimitError) Error() string {
	return fmt.Sprintf("JSON Schema keyword %q (at %q) is %s; this engine's grammar sampler (llama.cpp) allows at most %d", e.Keyword, e.Pointer, e.Value, e.Limit)
}

// gbnfSpace is the whitespace between tokens, bounded as llama.cpp's
// grammars/json.gbnf bounds it (ws ::= | " " | "\n" [ \t]{0,20}), so a model
// cannot spend its tokens on whitespace.
const gbnfSpace = `| " " | "\n" [ \t]{0,20}`

// gbnfPrimitives are llama.cpp's PRIMITIVE_RULES: rule and dependencies.
var gbnfPrimitives = map[string]struct {
	rule string
	deps []string
}{
	"boolean":       {`("true" | "false") space`, nil},
	"decimal-part":  {`[0-9]{1,16}`, nil},
	"integral-part": {`[0] | [1-9] [0-9]{0,15}`, nil},
	"number":        {`("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space`, []string{"integral-part", "decimal-part"}},
	"integer":       {`("-"? integral-part) space`, []string{"integral-part"}},
	"value":         {`object | array | string | number | boolean | null`, []string{"object", "array", "string", "number", "boolean", "null"}},
	"object":        {`"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space`, []string{"string", "value"}},
	"array":         {`"[" space ( value ("," space value)* )? "]" space`, []string{"value"}},
	"char":          {`[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})`, nil},
	"string":        {`"\"" char* "\"" space`, []string{"char"}},
	"null":          {`"null" space`, nil},
}

var gbnfAnnotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true,
	"$schema": true, "$id": true, "$comment": true, "strict": true, "format": true,
	"deprecated": true, "readOnly": true, "writeOnly": true,
	// OpenAPI's (pydantic writes it beside a tagged union's oneOf):
	// validators ignore it.
	"discriminator": true,
	// Definitions apply only where a $ref names them.
	"$defs": true, "definitions": true,
}

var gbnfKeywords = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"minProperties": true, "maxProperties": true, "propertyNames": true,
	"items": true, "prefixItems": true, "minItems": true, "maxItems": true, "uniqueItems": true,
	"enum": true, "const": true, "anyOf": true, "oneOf": true, "allOf": true,
	"minLength": true, "maxLength": true, "pattern": true, "$ref": true,
	"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true, "multipleOf": true,
}

var gbnfInvalidRuleChars = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

type schemaConverter struct {
	rules map[string]string
	// refs maps a $ref target (its resource's pointer, "#", the fragment)
	// to its rule; res is the schema resource $refs resolve in.
	refs map[string]string
	res  schemaResource
	// distributed counts the alternatives conjunctions were distributed
	// into (maxDistributed).
	distributed int
}

// schemaResource is a schema document or an embedded schema with an $id:
// the root local $refs resolve against, and its JSON pointer from the
// converted schema's root.
type schemaResource struct {
	root gjson.Result
	ptr  string
}

// pendingRule holds a $ref target's rule name while its schema is
// converted (no GBNF rule is empty), so that references inside it, and
// rules named like it, see the name taken.
const pendingRule = ""

// SchemaToGBNF converts a JSON Schema (the subset above) to a GBNF grammar
// whose start rule is "root". Errors: *UnsupportedSchemaError,
// *SchemaLimitError, a schema that is not a JSON object/boolean, or one
// no value satisfies (a minimum above its maximum, say).
func SchemaToGBNF(schema []byte) (string, error) {
	if !gjson.ValidBytes(schema) {
		return "", fmt.Errorf("the schema is not valid JSON")
	}
	root := gjson.ParseBytes(schema)
	c := &schemaConverter{rules: map[string]string{"space": gbnfSpace}, refs: map[string]string{}, res: schemaResource{root: root}}
	if _, err := c.visit(root, "", ""); err != nil {
		return "", err
	}
	return c.format(), nil
}

// JSONObjectGBNF is the grammar of response_format json_object: any JSON
// object (llama.cpp's primitive "object" as the root).
func JSONObjectGBNF() string {
	c := &schemaConverter{rules: map[string]string{"space": gbnfSpace}}
	c.addRule("root", c.primitive("object"))
	return c.format()
}

func (c *schemaConverter) format() string {
	names := make([]string, 0, len(c.rules))
	for n := range c.rules {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "%s ::= %s\n", n, c.rules[n])
	}
	return b.String()
}

// addRule adds name ::= rule, renaming on a clash with a different rule
// (llama.cpp's _add_rule), and returns the name used.
func (c *schemaConverter) addRule(name, rule string) string {
	esc := gbnfInvalidRuleChars.ReplaceAllString(name, "-")
	key := esc
	if old, ok := c.rules[esc]; ok && old != rule {
		for i := 0; ; i++ {
			key = esc + strconv.Itoa(i)
			if old, ok := c.rules[key]; !ok || old == rule {
				break
			}
		}
	}
	c.rules[key] = rule
	return key
}

func (c *schemaConverter) primitive(name string) string {
	p := gbnfPrimitives[name]
	if _, ok := c.rules[name]; ok {
		return name
	}
	c.rules[name] = p.rule // before the dependencies: value and object recurse
	for _, d := range p.deps {
		c.primitive(d)
	}
	return name
}

// formatLiteral is a GBNF string literal matching s exactly.
func formatLiteral(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// jsonString is s as a JSON string literal.
func jsonString(s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(buf.String(), "\n")
}

// jsonLiteral is the GBNF literal of a JSON value in compact form.
func jsonLiteral(v gjson.Result) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(v.Raw)); err != nil {
		buf.Reset()
		buf.WriteString(v.Raw)
	}
	return formatLiteral(buf.String())
}

func repetition(item string, lo, hi int, sep string) string {
	if hi >= 0 && hi < lo {
		hi = lo
	}
	if lo == 0 && hi == 0 {
		return ""
	}
	if sep == "" {
		if hi < 0 {
			if lo == 0 {
				return item + "*"
			}
			return fmt.Sprintf("%s{%d,}", item, lo)
		}
		return fmt.Sprintf("%s{%d,%d}", item, lo, hi)
	}
	rest := "(" + sep + " " + item + ")"
	var r string
	switch {
	case hi < 0 && lo > 1:
		r = item + " " + fmt.Sprintf("%s{%d,}", rest, lo-1)
	case hi < 0:
		r = item + " " + rest + "*"
	default:
		r = item + " " + fmt.Sprintf("%s{%d,%d}", rest, max(lo-1, 0), hi-1)
	}
	if lo == 0 {
		return "(" + r + ")?"
	}
	return r
}

func intKeyword(s gjson.Result, key, ptr string) (int, error) {
	v := s.Get(key)
	if !v.Exists() {
		return -1, nil
	}
	if v.Type != gjson.Number || v.Num < 0 || v.Num != math.Trunc(v.Num) {
		return 0, fmt.Errorf("JSON Schema keyword %q at %q must be a non-negative integer", key, ptr)
	}
	if v.Num > MaxSchemaRepetition {
		return 0, &SchemaLimitError{Keyword: key, Pointer: ptr + "/" + key, Value: v.Raw, Limit: MaxSchemaRepetition}
	}
	return int(v.Num), nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// ofType reports whether the JSON value v is of the type keyword t (a
// name or a list of names; absent: any).
func ofType(v, t gjson.Result) bool {
	if !t.Exists() {
		return true
	}
	names := []gjson.Result{t}
	if t.IsArray() {
		names = t.Array()
	}
	for _, n := range names {
		switch n.Str {
		case "string":
			if v.Type == gjson.String {
				return true
			}
		case "number":
			if v.Type == gjson.Number {
				return true
			}
		case "integer":
			if r, ok := new(big.Rat).SetString(v.Raw); v.Type == gjson.Number && ok && r.IsInt() {
				return true
			}
		case "boolean":
			if v.IsBool() {
				return true
			}
		case "null":
			if v.Type == gjson.Null {
				return true
			}
		case "object":
			if v.IsObject() {
				return true
			}
		case "array":
			if v.IsArray() {
				return true
			}
		}
	}
	return false
}

// withinLengths reports whether the JSON value v keeps the bounds of s
// that apply to it: minLength/maxLength (characters) on a string,
// minItems/maxItems on an array.
func withinLengths(v, s gjson.Result) bool {
	n, lo, hi := 0, s.Get("minLength"), s.Get("maxLength")
	switch {
	case v.Type == gjson.String:
		n = utf8.RuneCountInString(v.Str)
	case v.IsArray():
		n, lo, hi = len(v.Array()), s.Get("minItems"), s.Get("maxItems")
	default:
		return true
	}
	return (!lo.Exists() || float64(n) >= lo.Num) && (!hi.Exists() || float64(n) <= hi.Num)
}

// schemaTypeKeywords are the keywords that constrain values of one JSON
// type only: a schema without "type" that has them is converted as that
// type (the values of other types it also allows are left out, a subset).
var schemaTypeKeywords = []struct {
	typ      string
	keywords []string
}{
	{"object", []string{"properties", "additionalProperties", "required", "minProperties", "maxProperties", "propertyNames"}},
	{"array", []string{"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}},
	{"string", []string{"minLength", "maxLength", "pattern"}},
	{"number", []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}},
}

// beside returns the first keyword of s, other than the annotations and
// the keywords in ok, or "".
func beside(s gjson.Result, ok ...string) string {
	var bad string
	s.ForEach(func(k, _ gjson.Result) bool {
		if !gbnfAnnotations[k.Str] && !slices.Contains(ok, k.Str) {
			bad = k.Str
			return false
		}
		return true
	})
	return bad
}

// unknownKeyword returns the first keyword of s that is neither an
// annotation nor in gbnfKeywords, or "".
func unknownKeyword(s gjson.Result) string {
	var bad string
	s.ForEach(func(k, _ gjson.Result) bool {
		if !gbnfKeywords[k.Str] && !gbnfAnnotations[k.Str] {
			bad = k.Str
			return false
		}
		return true
	})
	return bad
}

// visit adds the rules of schema s under name and returns the rule to use.
func (c *schemaConverter) visit(s gjson.Result, name, ptr string) (string, error) {
	ruleName := name
	if ruleName == "" {
		ruleName = "root"
	}
	if s.Type == gjson.True || (s.IsObject() && len(s.Map()) == 0) {
		return c.addRule(ruleName, c.primitive("value")), nil
	}
	if s.Type == gjson.False {
		return "", noValue("the schema at %q is false: no value satisfies it", ptr)
	}
	if !s.IsObject() {
		return "", fmt.Errorf("the schema at %q must be an object or true", ptr)
	}
	if id := s.Get("$id"); id.Type == gjson.String && ptr != c.res.ptr {
		outer := c.res
		c.res = schemaResource{root: s, ptr: ptr}
		defer func() { c.res = outer }()
	}
	if bad := unknownKeyword(s); bad != "" {
		return "", &UnsupportedSchemaError{Keyword: bad, Pointer: ptr + "/" + escapePointer(bad)}
	}
	if ref := s.Get("$ref"); ref.Exists() {
		if bad := beside(s, "$ref"); bad != "" {
			return "", fmt.Errorf("JSON Schema keyword %q at %q sits beside a $ref; only annotations may", bad, ptr+"/"+escapePointer(bad))
		}
		r, err := c.ref(ref, ptr+"/$ref")
		if err != nil {
			return "", err
		}
		return c.addRule(ruleName, r), nil
	}
	if s.Get("allOf").Exists() {
		return c.allOf(s, name, ptr)
	}
	if alts := s.Get("anyOf"); alts.Exists() || s.Get("oneOf").Exists() {
		key := "anyOf"
		if !alts.Exists() {
			key, alts = "oneOf", s.Get("oneOf")
		}
		// Keywords beside the alternatives constrain each: they are
		// merged into each one (conjunction).
		if beside(s, key) != "" {
			return c.conjunction([]allOfMember{{orig: s, res: s, ptr: ptr, origPtr: ptr}}, name, ptr, mergeSite{})
		}
		if !alts.IsArray() || len(alts.Array()) == 0 {
			return "", fmt.Errorf("%s at %q must be a non-empty array", key, ptr)
		}
		as := alts.Array()
		parts, first, err := c.alternatives(len(as), func(i int) (string, error) {
			return c.visit(as[i], fmt.Sprintf("%s%d", nameOr(name), i), fmt.Sprintf("%s/%s/%d", ptr, key, i))
		})
		if err != nil {
			return "", err
		}
		if len(parts) == 0 {
			return "", noValue("no value satisfies any alternative of %s at %q (the first: %v)", key, ptr, first)
		}
		return c.addRule(ruleName, strings.Join(parts, " | ")), nil
	}
	if v, key := s.Get("const"), "const"; v.Exists() || s.Get("enum").Exists() {
		if !v.Exists() {
			v, key = s.Get("enum"), "enum"
		}
		// The values are written as they are: a constraint beside them
		// that some value might break is refused.
		if bad := beside(s, key, "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength", "maxLength"); bad != "" {
			return "", &UnsupportedSchemaError{Keyword: bad, Pointer: ptr + "/" + escapePointer(bad), Reason: "beside " + key + " (list only the values that satisfy it)"}
		}
		vals := []gjson.Result{v}
		if key == "enum" {
			vals = v.Array()
			if len(vals) == 0 {
				return "", fmt.Errorf("enum at %q must not be empty", ptr)
			}
		}
		// Only the values of the schema's type and within its lengths.
		var parts []string
		for _, x := range vals {
			if ofType(x, s.Get("type")) && withinLengths(x, s) {
				parts = append(parts, jsonLiteral(x))
			}
		}
		if len(parts) == 0 {
			return "", noValue("%s at %q: no value is of the schema's type and lengths", key, ptr)
		}
		if key == "const" {
			return c.addRule(ruleName, parts[0]+" space"), nil
		}
		return c.addRule(ruleName, "("+strings.Join(parts, " | ")+") space"), nil
	}
	t := s.Get("type")
	if t.IsArray() {
		// One alternative per type; one no value satisfies is left out.
		ts := t.Array()
		parts, first, err := c.alternatives(len(ts), func(i int) (string, error) {
			one, err := withType(s.Raw, ts[i].Str)
			if err != nil {
				return "", err
			}
			return c.visit(gjson.Parse(one), fmt.Sprintf("%s-%d", ruleName, i), ptr)
		})
		if err != nil {
			return "", err
		}
		if len(parts) == 0 {
			if first == nil {
				return "", noValue("type at %q is an empty list: no value satisfies it", ptr)
			}
			return "", first
		}
		return c.addRule(ruleName, strings.Join(parts, " | ")), nil
	}
	typ := t.Str
	for _, tk := range schemaTypeKeywords {
		for _, k := range tk.keywords {
			if typ == "" && s.Get(k).Exists() {
				typ = tk.typ
			}
		}
	}
	switch typ {
	case "object":
		return c.object(s, name, ruleName, ptr)
	case "array":
		return c.array(s, name, ruleName, ptr)
	case "string":
		return c.str(s, ruleName, ptr)
	case "number", "integer":
		return c.numeric(s, typ, ruleName, ptr)
	case "boolean", "null":
		return c.addRule(ruleName, c.primitive(typ)), nil
	case "":
		return c.addRule(ruleName, c.primitive("value")), nil
	}
	return "", &UnsupportedSchemaError{Keyword: "type", Pointer: ptr + "/type"}
}

// bounds returns the minLength/maxLength (or minItems/maxItems) pair of s,
// -1 where absent. Errors: a bad value, one over MaxSchemaRepetition
// (*SchemaLimitError), a minimum above the maximum (no value satisfies).
func bounds(s gjson.Result, minKey, maxKey, ptr string) (lo, hi int, err error) {
	if lo, err = intKeyword(s, minKey, ptr); err != nil {
		return 0, 0, err
	}
	if hi, err = intKeyword(s, maxKey, ptr); err != nil {
		return 0, 0, err
	}
	if hi >= 0 && lo > hi {
		return 0, 0, noValue("%s %d above %s %d at %q: no value satisfies the schema", minKey, lo, maxKey, hi, ptr)
	}
	return max(lo, 0), hi, nil
}

// str is a string schema: minLength/maxLength as a repetition of char,
// or pattern (patternRule), not both.
func (c *schemaConverter) str(s gjson.Result, ruleName, ptr string) (string, error) {
	lo, hi, err := bounds(s, "minLength", "maxLength", ptr)
	if err != nil {
		return "", err
	}
	if p := s.Get("pattern"); p.Exists() {
		if p.Type != gjson.String {
			return "", fmt.Errorf("pattern at %q must be a string", ptr)
		}
		for _, k := range []string{"minLength", "maxLength"} {
			if s.Get(k).Exists() && (k == "maxLength" || lo > 0) {
				return "", &UnsupportedSchemaError{Keyword: k, Pointer: ptr + "/" + k, Reason: "beside pattern (a grammar cannot intersect the two; bound the pattern's own repetitions instead)"}
			}
		}
		r, err := c.patternRule(p.Str)
		if err != nil {
			return "", &UnsupportedSchemaError{Keyword: "pattern", Pointer: ptr + "/pattern", Reason: err.Error()}
		}
		return c.addRule(ruleName, r), nil
	}
	if lo == 0 && hi < 0 {
		return c.addRule(ruleName, c.primitive("string")), nil
	}
	ch := c.primitive("char")
	return c.addRule(ruleName, `"\"" `+repetition(ch, lo, hi, "")+` "\"" space`), nil
}

// array is an array schema: prefixItems (a tuple) then items, within
// minItems/maxItems, as llama.cpp's tuple and item rules. A tuple's items
// are all written, and items after them only where "items" is a schema
// (JSON Schema allows a shorter tuple, and, without "items", any items
// after it: a subset, as llama.cpp). uniqueItems true is refused unless
// the array holds at most one item: a grammar cannot compare items.
func (c *schemaConverter) array(s gjson.Result, name, ruleName, ptr string) (string, error) {
	lo, hi, err := bounds(s, "minItems", "maxItems", ptr)
	if err != nil {
		return "", err
	}
	var prefix []string
	pi := s.Get("prefixItems")
	if pi.Exists() && !pi.IsArray() {
		return "", fmt.Errorf("prefixItems at %q must be an array", ptr)
	}
	for i, it := range pi.Array() {
		r, err := c.visit(it, fmt.Sprintf("%s-tuple-%d", nameOr(name), i), fmt.Sprintf("%s/prefixItems/%d", ptr, i))
		if err != nil {
			return "", err
		}
		prefix = append(prefix, r)
	}
	tail := ""
	switch it := s.Get("items"); {
	case it.Type == gjson.False:
	case it.Exists():
		if tail, err = c.visit(it, nameOr(name)+"-item", ptr+"/items"); err != nil {
			return "", err
		}
	case len(prefix) == 0:
		tail = c.primitive("value")
	}
	if hi >= 0 && hi < len(prefix) {
		prefix = prefix[:hi]
	}
	n := len(prefix)
	tlo, thi := max(lo-n, 0), -1
	if hi >= 0 {
		thi = hi - n
	}
	if tail == "" {
		thi = 0
	}
	if tlo > 0 && thi == 0 {
		return "", noValue("minItems %d at %q: the tuple holds %d items and none may follow", lo, ptr, n)
	}
	if u := s.Get("uniqueItems"); u.Exists() {
		if !u.IsBool() {
			return "", fmt.Errorf("uniqueItems at %q must be a boolean", ptr)
		}
		if u.Type == gjson.True && (thi < 0 || n+thi > 1) {
			return "", &UnsupportedSchemaError{Keyword: "uniqueItems", Pointer: ptr + "/uniqueItems", Reason: "a grammar cannot keep items distinct; only an array of at most one item (maxItems 1) takes uniqueItems true"}
		}
	}
	rule := `"[" space `
	if n > 0 {
		rule += strings.Join(prefix, ` "," space `)
		if thi != 0 {
			rule += " " + repetition(`( "," space `+tail+` )`, tlo, thi, "")
		}
	} else {
		rule += repetition(tail, tlo, thi, `"," space`)
	}
	return c.addRule(ruleName, rule+` "]" space`), nil
}

// resolve finds the target of the $ref value ref (at ptr) in the current
// schema resource: the target, its JSON pointer from the converted
// schema's root, and the last token of the fragment ("ref" for "#").
// Errors: a $ref that is not a string, a $ref to another document
// (*UnsupportedSchemaError), a fragment that is not a JSON pointer or
// names nothing in the resource.
func (c *schemaConverter) resolve(ref gjson.Result, ptr string) (target gjson.Result, tptr, base string, err error) {
	if ref.Type != gjson.String {
		return target, "", "", fmt.Errorf("$ref at %q must be a string", ptr)
	}
	frag, local := strings.CutPrefix(ref.Str, "#")
	if !local {
		return target, "", "", &UnsupportedSchemaError{Keyword: "$ref", Pointer: ptr}
	}
	frag, err = url.PathUnescape(frag)
	if err != nil || (frag != "" && frag[0] != '/') {
		return target, "", "", fmt.Errorf("$ref %q at %q is not a JSON pointer fragment (\"#/$defs/Name\")", ref.Str, ptr)
	}
	target, base = c.res.root, "ref"
	if frag != "" {
		for _, tok := range strings.Split(frag[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch {
			case target.IsObject():
				target = target.Map()[tok]
			case target.IsArray():
				i, err := strconv.Atoi(tok)
				if a := target.Array(); err == nil && i >= 0 && i < len(a) {
					target = a[i]
				} else {
					target = gjson.Result{}
				}
			default:
				target = gjson.Result{}
			}
			if !target.Exists() {
				return target, "", "", fmt.Errorf("$ref %q at %q names nothing in its schema", ref.Str, ptr)
			}
			base = tok
		}
	}
	return target, c.res.ptr + frag, base, nil
}

// ref returns the rule of the $ref value ref (at ptr), converting its
// target the first time. Errors: those of resolve.
func (c *schemaConverter) ref(ref gjson.Result, ptr string) (string, error) {
	target, tptr, base, err := c.resolve(ref, ptr)
	if err != nil {
		return "", err
	}
	key := c.res.ptr + "#" + strings.TrimPrefix(tptr, c.res.ptr)
	if r, ok := c.refs[key]; ok {
		return r, nil
	}
	// A fresh name, never the start rule's or a primitive's (primitives
	// are added when first used, under their own names).
	base = gbnfInvalidRuleChars.ReplaceAllString(base, "-")
	name := base
	for i := 0; ; i++ {
		_, taken := c.rules[name]
		_, primitive := gbnfPrimitives[name]
		if !taken && !primitive && name != "root" {
			break
		}
		name = base + strconv.Itoa(i)
	}
	c.rules[name], c.refs[key] = pendingRule, name
	r, err := c.visit(target, name, tptr)
	if err != nil {
		return "", err
	}
	// The target's own rule was renamed around the pending one: name is
	// its alias.
	c.rules[name] = r
	return name, nil
}

func nameOr(n string) string {
	if n == "" {
		return "root"
	}
	return n
}

func withType(raw, typ string) (string, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return "", err
	}
	m["type"], _ = json.Marshal(typ)
	b, err := json.Marshal(m)
	return string(b), err
}

// nonNegInt is the value of the count keyword key of s, -1 where absent.
func nonNegInt(s gjson.Result, key, ptr string) (int, error) {
	v := s.Get(key)
	if !v.Exists() {
		return -1, nil
	}
	if v.Type != gjson.Number || v.Num < 0 || v.Num != math.Trunc(v.Num) {
		return 0, fmt.Errorf("JSON Schema keyword %q at %q must be a non-negative integer", key, ptr)
	}
	return int(min(v.Num, math.MaxInt32)), nil
}

// objectKV is one member of an object rule: a property's key-value rule,
// or (star) the additional properties'.
type objectKV struct {
	key, rule string
	star      bool
}

// object is llama.cpp's _build_object_rule: the required properties in
// order, then the optional ones, each may be left out, then, where
// additionalProperties is true or a schema, any number of other members
// (their keys none of the properties', written without escapes so that
// an escaped key cannot spell a property's name). A map (additional
// properties, no properties) takes propertyNames as its keys' string
// schema; beside properties it is refused. Without additional
// properties, minProperties up to the number of required properties and
// maxProperties from the number of properties hold anyway; a map (no
// properties, additional ones) takes maxProperties as the bound of its
// members and minProperties 0 or 1; any other count is refused, since a
// grammar cannot keep keys distinct. An optional property no value
// satisfies (false, say) is left out; a required one makes the object a
// *noValueError.
func (c *schemaConverter) object(s gjson.Result, name, ruleName, ptr string) (string, error) {
	ap := s.Get("additionalProperties")
	if ap.Exists() && !ap.IsBool() && !ap.IsObject() {
		return "", fmt.Errorf("additionalProperties at %q must be a boolean or a schema", ptr)
	}
	minP, err := nonNegInt(s, "minProperties", ptr)
	if err != nil {
		return "", err
	}
	maxP, err := nonNegInt(s, "maxProperties", ptr)
	if err != nil {
		return "", err
	}
	props := s.Get("properties")
	required := map[string]bool{}
	for _, r := range s.Get("required").Array() {
		required[r.Str] = true
	}
	if !props.Exists() && len(required) == 0 && (!ap.Exists() || ap.Type == gjson.True) && minP <= 0 && maxP < 0 && !s.Get("propertyNames").Exists() {
		return c.addRule(ruleName, c.primitive("object")), nil
	}
	var req, opt []objectKV
	var names []string
	props.ForEach(func(k, v gjson.Result) bool {
		var r string
		r, err = c.tentatively(func() (string, error) {
			return c.visit(v, nameOr(name)+"-"+k.Str, ptr+"/properties/"+escapePointer(k.Str))
		})
		// A property no value satisfies cannot be present: an optional
		// one is left out (its key stays a property's, not an
		// additional one's).
		if nv := (*noValueError)(nil); errors.As(err, &nv) && !required[k.Str] {
			err = nil
			names = append(names, k.Str)
			return true
		}
		if err != nil {
			return false
		}
		kv := objectKV{key: k.Str, rule: c.addRule(nameOr(name)+"-"+k.Str+"-kv", formatLiteral(jsonString(k.Str))+` space ":" space `+r)}
		if required[k.Str] {
			req = append(req, kv)
		} else {
			opt = append(opt, kv)
		}
		names = append(names, k.Str)
		return true
	})
	if err != nil {
		return "", err
	}
	for k := range required {
		if !slices.Contains(names, k) {
			return "", noValue("required property %q at %q is not in properties (the grammar writes only the declared ones)", k, ptr)
		}
	}
	// Without properties, a missing additionalProperties allows any (JSON
	// Schema's default); beside properties none (llama.cpp's, a subset).
	additional := ap.Type == gjson.True || ap.IsObject() || !ap.Exists() && !props.Exists()
	if pn := s.Get("propertyNames"); pn.Exists() && !additional && pn.Type != gjson.True && !(pn.IsObject() && len(pn.Map()) == 0) {
		return "", &UnsupportedSchemaError{Keyword: "propertyNames", Pointer: ptr + "/propertyNames", Reason: "only on a map (additionalProperties without properties)"}
	}
	if !additional && maxP >= 0 && maxP < len(req) || minP > len(names) && !additional {
		return "", noValue("minProperties/maxProperties at %q: no object of the properties satisfies them", ptr)
	}
	countErr := func(k string) error {
		return &UnsupportedSchemaError{Keyword: k, Pointer: ptr + "/" + k, Reason: "a grammar cannot count distinct keys; it holds only up to the required properties (minProperties), from all properties without additional ones (maxProperties), or as the bounds of a map's members (maxProperties, minProperties up to 1)"}
	}
	var addKV string
	if additional {
		sub := nameOr(name) + "-additional"
		value := c.primitive("value")
		if ap.IsObject() {
			if value, err = c.visit(ap, sub+"-value", ptr+"/additionalProperties"); err != nil {
				return "", err
			}
		}
		key := c.primitive("string")
		if len(names) > 0 {
			key = c.addRule(sub+"-k", notStrings(names))
		}
		if pn := s.Get("propertyNames"); pn.Exists() && pn.Type != gjson.True && !(pn.IsObject() && len(pn.Map()) == 0) {
			if len(names) > 0 {
				return "", &UnsupportedSchemaError{Keyword: "propertyNames", Pointer: ptr + "/propertyNames", Reason: "only on a map (additionalProperties without properties)"}
			}
			if !pn.IsObject() {
				return "", fmt.Errorf("propertyNames at %q must be a schema", ptr)
			}
			one, err := withType(pn.Raw, "string")
			if err != nil {
				return "", err
			}
			if key, err = c.visit(gjson.Parse(one), sub+"-k", ptr+"/propertyNames"); err != nil {
				return "", err
			}
		}
		addKV = c.addRule(sub+"-kv", key+` ":" space `+value)
		if len(names) == 0 {
			if minP > 1 {
				return "", countErr("minProperties")
			}
			if maxP > MaxSchemaRepetition {
				return "", &SchemaLimitError{Keyword: "maxProperties", Pointer: ptr + "/maxProperties", Value: s.Get("maxProperties").Raw, Limit: MaxSchemaRepetition}
			}
			return c.addRule(ruleName, `"{" space `+repetition(addKV, max(minP, 0), maxP, `"," space`)+` "}" space`), nil
		}
		opt = append(opt, objectKV{key: "*", rule: addKV, star: true})
	}
	if minP > len(req) {
		return "", countErr("minProperties")
	}
	if maxP >= 0 && (additional || maxP < len(names)) {
		return "", countErr("maxProperties")
	}
	var recursive func(ks []objectKV, firstOptional bool) string
	recursive = func(ks []objectKV, firstOptional bool) string {
		k, rest := ks[0], ks[1:]
		comma := `( "," space ` + k.rule + ` )`
		var res string
		switch {
		case firstOptional && k.star:
			res = comma + "*"
		case firstOptional:
			res = comma + "?"
		case k.star:
			res = k.rule + " " + comma + "*"
		default:
			res = k.rule
		}
		if len(rest) > 0 {
			res += " " + c.addRule(nameOr(name)+"-"+k.key+"-rest", recursive(rest, true))
		}
		return res
	}
	var parts []string
	for _, k := range req {
		parts = append(parts, k.rule)
	}
	rule := `"{" space ` + strings.Join(parts, ` "," space `)
	if len(opt) > 0 {
		rule += " ("
		if len(req) > 0 {
			rule += ` "," space ( `
		}
		var alts []string
		for i := range opt {
			alts = append(alts, recursive(opt[i:], false))
		}
		rule += strings.Join(alts, " | ")
		if len(req) > 0 {
			rule += " )"
		}
		rule += " )?"
	}
	rule += ` "}" space`
	return c.addRule(ruleName, rule), nil
}

// gbnfKeyChar is a character of an additional property's key: any JSON
// string character but an escape, so the key's text is its value.
const gbnfKeyChar = `[^"\\\x7F\x00-\x1F]`

// notStrings is the GBNF of the JSON strings without escapes that are none
// of names: llama.cpp's _not_strings (a trie of the names), over
// characters rather than bytes, and exact where a name is a prefix of
// another or a prefix of a name is not one (llama.cpp leaves out the
// latter: "a" where only "ab" is a name).
func notStrings(names []string) string {
	type node struct {
		kids map[rune]*node
		end  bool
	}
	root := &node{kids: map[rune]*node{}}
	for _, n := range names {
		at := root
		for _, r := range n {
			k, ok := at.kids[r]
			if !ok {
				k = &node{kids: map[rune]*node{}}
				at.kids[r] = k
			}
			at = k
		}
		at.end = true
	}
	var visit func(n *node) string
	visit = func(n *node) string {
		keys := slices.Sorted(maps.Keys(n.kids))
		var alts []string
		rejects := ""
		for _, r := range keys {
			k := n.kids[r]
			rejects += classChar(r)
			alt := "[" + classChar(r) + "]"
			switch {
			case len(k.kids) > 0:
				alt += " (" + visit(k) + ")"
				if !k.end {
					alt += "?"
				}
			default:
				alt += " " + gbnfKeyChar + "+"
			}
			alts = append(alts, alt)
		}
		alts = append(alts, `[^"\\\x7F\x00-\x1F`+rejects+"] "+gbnfKeyChar+"*")
		return strings.Join(alts, " | ")
	}
	q := ""
	if !root.end {
		q = "?"
	}
	return `"\"" ( ` + visit(root) + ` )` + q + ` "\"" space`
}

// allOfMember is one conjunct of an allOf: res, the schema with its
// $refs followed, at ptr; orig, the schema as written (a $ref), at origPtr.
type allOfMember struct {
	orig, res    gjson.Result
	ptr, origPtr string
}

// mergeSite names, in mergeAllOf's errors, the conjunction merged: an
// allOf (keyword "allOf" at its pointer), or an anyOf/oneOf alternative
// with the keywords beside it (keyword "anyOf" at the alternative's
// pointer); what is its name in a sentence, parts its members'.
type mergeSite struct {
	keyword, pointer, what, parts string
}

// maxDistributed bounds the alternatives a schema's conjunctions are
// distributed into, all together (each copies the keywords beside its
// anyOf, so nested distributions multiply; a $ref inlined into its own
// alternative would recurse without end): beyond it the schema is an
// *UnsupportedSchemaError.
const maxDistributed = 1024

// conjuncts appends to ms the conjuncts of the schema x at xptr (orig as
// written, at origPtr): $refs followed and nested allOfs flattened, less
// the ones every value satisfies. Errors: an unknown keyword
// (*UnsupportedSchemaError), a keyword beside a $ref, those of resolve,
// false (*noValueError), a chain of over 64 $refs and allOfs.
func (c *schemaConverter) conjuncts(ms []allOfMember, x, orig gjson.Result, xptr, origPtr string, depth int) ([]allOfMember, error) {
	if depth > 64 {
		return nil, fmt.Errorf("allOf at %q nests or refers too deep", xptr)
	}
	if x.Type == gjson.True || x.IsObject() && beside(x) == "" {
		return ms, nil
	}
	if x.Type == gjson.False {
		return nil, noValue("the schema at %q is false: no value satisfies it", xptr)
	}
	if !x.IsObject() {
		return nil, fmt.Errorf("the allOf member at %q must be an object or true", xptr)
	}
	if bad := unknownKeyword(x); bad != "" {
		return nil, &UnsupportedSchemaError{Keyword: bad, Pointer: xptr + "/" + escapePointer(bad)}
	}
	if ref := x.Get("$ref"); ref.Exists() {
		if bad := beside(x, "$ref"); bad != "" {
			return nil, fmt.Errorf("JSON Schema keyword %q at %q sits beside a $ref; only annotations may", bad, xptr+"/"+escapePointer(bad))
		}
		target, tptr, _, err := c.resolve(ref, xptr+"/$ref")
		if err != nil {
			return nil, err
		}
		return c.conjuncts(ms, target, orig, tptr, origPtr, depth+1)
	}
	all := x.Get("allOf")
	if !all.Exists() {
		return append(ms, allOfMember{orig: orig, res: x, ptr: xptr, origPtr: origPtr}), nil
	}
	if !all.IsArray() || len(all.Array()) == 0 {
		return nil, fmt.Errorf("allOf at %q must be a non-empty array", xptr)
	}
	rest, err := withoutKey(x.Raw, "allOf")
	if err != nil {
		return nil, err
	}
	if ms, err = c.conjuncts(ms, rest, rest, xptr, xptr, depth+1); err != nil {
		return nil, err
	}
	for i, m := range all.Array() {
		mptr := fmt.Sprintf("%s/allOf/%d", xptr, i)
		if ms, err = c.conjuncts(ms, m, m, mptr, mptr, depth+1); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

// allOf is a schema with allOf: its conjuncts (conjuncts: its members and
// its own keywords beside allOf) converted as one schema (conjunction).
func (c *schemaConverter) allOf(s gjson.Result, name, ptr string) (string, error) {
	ms, err := c.conjuncts(nil, s, s, ptr, ptr, 0)
	if err != nil {
		return "", err
	}
	site := mergeSite{keyword: "allOf", pointer: ptr + "/allOf", what: fmt.Sprintf("the allOf at %q", ptr), parts: "its members"}
	return c.conjunction(ms, name, ptr, site)
}

// conjunction adds the rules of the schema of the values that satisfy
// every member of ms, under name, and returns the rule to use. No member
// left: any value; one: converted as it is. A member with anyOf or oneOf
// (treated as anyOf) beside other members or keywords is distributed, as
// JSON Schema's semantics have it exactly: allOf [A, {B, anyOf [C1, C2]}]
// is anyOf [allOf [A, B, C1], allOf [A, B, C2]], each alternative's
// conjunction converted in turn (its $refs followed), one alternative of
// the rule each; an alternative no value satisfies (*noValueError, the
// keywords beside it excluding it, say) is left out, and with none left
// the conjunction is a *noValueError. Without anyOf, several members are
// merged keyword by keyword into one schema (mergeAllOf), as llama.cpp
// merges the properties of allOf's members, but exactly (each keyword is
// a conjunct): the types intersected (integer within number), of each
// bound the tightest (minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, minLength, maxLength, minItems, maxItems,
// minProperties, maxProperties), uniqueItems if any, const and enum
// intersected, items as the allOf of the members' items; for objects
// every property of any member with the allOf of its schemas and of the
// additionalProperties schemas of members without it (one a member's
// additionalProperties false forbids is left out), the required
// properties of all, and other properties only as every member allows
// them. pattern, multipleOf and prefixItems that differ between members
// are an *UnsupportedSchemaError naming site's keyword and pointer (the
// allOf, or the anyOf alternative whose merge it is; site zero: the
// distribution starts at an anyOf with keywords beside it, and each
// alternative names itself). Errors inside the merged schema point at
// ptr: the allOf's schema, or the alternative. More than maxDistributed
// alternatives distributed into in one schema are refused.
func (c *schemaConverter) conjunction(ms []allOfMember, name, ptr string, site mergeSite) (string, error) {
	for j, m := range ms {
		key := "anyOf"
		alts := m.res.Get(key)
		if !alts.Exists() {
			key, alts = "oneOf", m.res.Get("oneOf")
		}
		if !alts.Exists() || len(ms) == 1 && beside(m.res, key) == "" {
			continue
		}
		if !alts.IsArray() || len(alts.Array()) == 0 {
			return "", fmt.Errorf("%s at %q must be a non-empty array", key, m.ptr)
		}
		rest, err := withoutKey(m.res.Raw, key)
		if err != nil {
			return "", err
		}
		head := slices.Clone(ms[:j])
		if beside(rest) != "" {
			head = append(head, allOfMember{orig: rest, res: rest, ptr: m.ptr, origPtr: m.ptr})
		}
		tail := ms[j+1:]
		as := alts.Array()
		parts, first, err := c.alternatives(len(as), func(i int) (string, error) {
			a := as[i]
			aptr := fmt.Sprintf("%s/%s/%d", m.ptr, key, i)
			if c.distributed++; c.distributed > maxDistributed {
				kw, p := site.keyword, site.pointer
				if kw == "" {
					kw, p = key, m.ptr+"/"+key
				}
				return "", &UnsupportedSchemaError{Keyword: kw, Pointer: p, Reason: fmt.Sprintf("distributed over anyOf/oneOf alternatives the schema gives more than %d alternatives", maxDistributed)}
			}
			s := site
			if s.keyword == "" {
				s = mergeSite{keyword: key, pointer: aptr, what: fmt.Sprintf("the %s alternative at %q (with the keywords beside %s)", key, aptr, key), parts: "it and the keywords beside " + key}
			}
			ams, err := c.conjuncts(slices.Clone(head), a, a, aptr, aptr, 0)
			if err != nil {
				return "", err
			}
			return c.conjunction(append(ams, tail...), fmt.Sprintf("%s%d", nameOr(name), i), aptr, s)
		})
		if err != nil {
			return "", err
		}
		if len(parts) == 0 {
			return "", noValue("no value satisfies any alternative of %s at %q together with the schemas beside it (the first: %v)", key, m.ptr, first)
		}
		return c.addRule(nameOr(name), strings.Join(parts, " | ")), nil
	}
	switch len(ms) {
	case 0:
		return c.visit(gjson.Parse(`true`), name, ptr)
	case 1:
		return c.visit(ms[0].orig, name, ms[0].origPtr)
	}
	merged, err := mergeAllOf(ms, site)
	if err != nil {
		return "", err
	}
	return c.visit(gjson.Parse(merged), name, ptr)
}

// mergeKeep says, for each keyword mergeAllOf combines as a bound, which
// value of several it keeps: +1 the largest, -1 the smallest.
var mergeKeep = map[string]int{
	"minimum": 1, "exclusiveMinimum": 1, "minLength": 1, "minItems": 1, "minProperties": 1,
	"maximum": -1, "exclusiveMaximum": -1, "maxLength": -1, "maxItems": -1, "maxProperties": -1,
}

// mergeAllOf is the schema (JSON text) of the values that satisfy every
// member of members (conjunction's doc comment), none with anyOf or
// oneOf; site names the conjunction in errors. Errors: members no value
// satisfies together (*noValueError), keywords it cannot merge
// (*UnsupportedSchemaError naming site's keyword and pointer).
func mergeAllOf(members []allOfMember, site mergeSite) (string, error) {
	out := map[string]string{}
	refuse := func(m string, k string) error {
		return &UnsupportedSchemaError{Keyword: site.keyword, Pointer: site.pointer, Reason: fmt.Sprintf("%s cannot be merged into one schema: %q at %q", site.parts, k, m)}
	}
	var types []string
	typed := false
	var values []string // const and enum, intersected
	valued := false
	var items []string
	var order []string
	schemas := map[string][]string{}
	required := map[string]bool{}
	var aps []string // additionalProperties schemas
	forbidExtra := false
	for _, m := range members {
		var err error
		m.res.ForEach(func(k, v gjson.Result) bool {
			switch key := k.Str; {
			case gbnfAnnotations[key]:
			case key == "type":
				var ts []string
				if v.IsArray() {
					for _, t := range v.Array() {
						ts = append(ts, t.Str)
					}
				} else {
					ts = []string{v.Str}
				}
				if !typed {
					types, typed = ts, true
					break
				}
				var both []string
				for _, t := range types {
					switch {
					case slices.Contains(ts, t):
						both = append(both, t)
					case t == "integer" && slices.Contains(ts, "number"), t == "number" && slices.Contains(ts, "integer"):
						both = append(both, "integer")
					}
				}
				types = both
			case mergeKeep[key] != 0:
				r, ok := new(big.Rat).SetString(v.Raw)
				if v.Type != gjson.Number || !ok {
					err = fmt.Errorf("JSON Schema keyword %q at %q must be a number", key, m.ptr)
					return false
				}
				if old, ok := out[key]; ok {
					o, _ := new(big.Rat).SetString(old)
					if r.Cmp(o)*mergeKeep[key] <= 0 {
						break
					}
				}
				out[key] = v.Raw
			case key == "uniqueItems":
				if old := out[key]; old != "true" {
					out[key] = v.Raw
				}
			case key == "const" || key == "enum":
				vs := []string{v.Raw}
				if key == "enum" {
					vs = nil
					for _, x := range v.Array() {
						vs = append(vs, x.Raw)
					}
				}
				vs = compactAll(vs)
				if !valued {
					values, valued = vs, true
					break
				}
				values = slices.DeleteFunc(values, func(x string) bool { return !slices.Contains(vs, x) })
			case key == "items":
				items = appendSchema(items, v.Raw)
			case key == "pattern" || key == "multipleOf" || key == "prefixItems":
				if old, ok := out[key]; ok && compactAll([]string{old})[0] != compactAll([]string{v.Raw})[0] {
					err = refuse(m.ptr, key)
					return false
				}
				out[key] = v.Raw
			case key == "properties":
				v.ForEach(func(pk, pv gjson.Result) bool {
					if _, ok := schemas[pk.Str]; !ok {
						order = append(order, pk.Str)
					}
					schemas[pk.Str] = appendSchema(schemas[pk.Str], pv.Raw)
					return true
				})
			case key == "required":
				for _, r := range v.Array() {
					required[r.Str] = true
				}
			case key == "additionalProperties":
				switch {
				case v.Type == gjson.False:
					forbidExtra = true
				case v.IsObject():
					aps = appendSchema(aps, v.Raw)
				}
			default:
				err = refuse(m.ptr, key)
				return false
			}
			return true
		})
		if err != nil {
			return "", err
		}
	}
	if typed && len(types) == 0 || valued && len(values) == 0 {
		return "", noValue("%s: no value satisfies all its members (their types or values do not meet)", site.what)
	}
	// Object keywords constrain objects only: where the types leave out
	// objects, they are no conjunct.
	objects := !typed || slices.Contains(types, "object")
	// A property a member lacks is one of its additional properties.
	dropped := map[string]bool{}
	for _, m := range members {
		ap := m.res.Get("additionalProperties")
		props := m.res.Get("properties").Map()
		for _, k := range order {
			if _, ok := props[k]; ok {
				continue
			}
			switch {
			case ap.Type == gjson.False:
				dropped[k] = true
			case ap.IsObject():
				schemas[k] = appendSchema(schemas[k], ap.Raw)
			}
		}
	}
	oneOrAll := func(list []string) string {
		if len(list) == 1 {
			return list[0]
		}
		return `{"allOf":[` + strings.Join(list, ",") + `]}`
	}
	if typed {
		tj, _ := json.Marshal(types)
		out["type"] = string(tj)
	}
	if valued {
		out["enum"] = "[" + strings.Join(values, ",") + "]"
	}
	if len(items) > 0 {
		out["items"] = oneOrAll(items)
	}
	if len(order) > 0 {
		var b strings.Builder
		b.WriteString("{")
		for _, k := range order {
			if dropped[k] {
				if required[k] && objects {
					return "", noValue("%s requires %q, which a member's additionalProperties false forbids: no value satisfies it", site.what, k)
				}
				continue
			}
			if b.Len() > 1 {
				b.WriteString(",")
			}
			b.WriteString(jsonString(k) + ":" + oneOrAll(schemas[k]))
		}
		out["properties"] = b.String() + "}"
	}
	if len(required) > 0 {
		var rs []string
		for _, k := range slices.Sorted(maps.Keys(required)) {
			if !slices.Contains(order, k) && objects {
				return "", noValue("required property %q of %s is in no member's properties (the grammar writes only the declared ones)", k, site.what)
			}
			rs = append(rs, jsonString(k))
		}
		out["required"] = "[" + strings.Join(rs, ",") + "]"
	}
	switch {
	case forbidExtra:
		out["additionalProperties"] = "false"
	case len(aps) > 0:
		out["additionalProperties"] = oneOrAll(aps)
	}
	var b strings.Builder
	b.WriteString("{")
	for _, k := range slices.Sorted(maps.Keys(out)) {
		if b.Len() > 1 {
			b.WriteString(",")
		}
		b.WriteString(jsonString(k) + ":" + out[k])
	}
	return b.String() + "}", nil
}

// compactAll is each JSON text of list in compact form.
func compactAll(list []string) []string {
	res := make([]string, len(list))
	for i, raw := range list {
		var buf bytes.Buffer
		if err := json.Compact(&buf, []byte(raw)); err != nil {
			res[i] = raw
		} else {
			res[i] = buf.String()
		}
	}
	return res
}

// appendSchema adds the schema raw to list unless an equal one (as
// compact JSON) is there.
func appendSchema(list []string, raw string) []string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(raw)); err == nil {
		raw = buf.String()
	}
	if slices.Contains(list, raw) {
		return list
	}
	return append(list, raw)
}

// withoutKey is the JSON object raw without its member key.
func withoutKey(raw, key string) (gjson.Result, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return gjson.Result{}, err
	}
	delete(m, key)
	b, err := json.Marshal(m)
	return gjson.ParseBytes(b), err
}
