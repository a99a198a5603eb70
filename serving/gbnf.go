package serving

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"

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
// additionalProperties false (the default, as in llama.cpp), items,
// minItems, maxItems, enum, const, anyOf, oneOf (treated as anyOf),
// minLength, maxLength, local $ref with $defs / definitions, and the
// annotations title, description, default, examples, $schema, $id,
// $comment, strict and format (JSON Schema 2020-12 treats format as an
// annotation unless a validator opts in to asserting it; the grammar does
// not constrain it). A $ref is a JSON pointer fragment ("#/$defs/Item",
// "#/definitions/Item", "#" or any other "#/…") into its schema resource:
// the document, or the nearest enclosing schema with an $id (how the
// engine embeds each tool's parameters in its tool-call schema). Each
// target becomes one rule, shared by all references to it, so recursive
// definitions (a pydantic model with a list of itself) give recursive
// rules, as llama.cpp's _resolve_ref does; only annotations may sit beside
// a $ref, other keywords there are refused, and a $ref to another document
// is an *UnsupportedSchemaError. Anything else is refused with
// an *UnsupportedSchemaError naming the keyword, since a grammar that
// ignored it would let through values the schema rejects. minLength,
// maxLength, minItems and maxItems above MaxSchemaRepetition are refused
// with a *SchemaLimitError: they become GBNF repetitions x{m,n}, and
// llama.cpp's grammar parser refuses any m or n above that bound.

// UnsupportedSchemaError names a JSON Schema keyword the converter cannot
// express as a grammar and where it was found (a JSON pointer).
type UnsupportedSchemaError struct {
	Keyword string
	Pointer string
}

func (e *UnsupportedSchemaError) Error() string {
	return fmt.Sprintf("JSON Schema keyword %q (at %q) is not supported by this engine's grammar sampler", e.Keyword, e.Pointer)
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
	// Definitions apply only where a $ref names them.
	"$defs": true, "definitions": true,
}

var gbnfKeywords = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "enum": true, "const": true,
	"anyOf": true, "oneOf": true, "minLength": true, "maxLength": true, "$ref": true,
}

var gbnfInvalidRuleChars = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

type schemaConverter struct {
	rules map[string]string
	// refs maps a $ref target (its resource's pointer, "#", the fragment)
	// to its rule; res is the schema resource $refs resolve in.
	refs map[string]string
	res  schemaResource
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
// *SchemaLimitError, or a schema that is not a JSON object/boolean.
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

// visit adds the rules of schema s under name and returns the rule to use.
func (c *schemaConverter) visit(s gjson.Result, name, ptr string) (string, error) {
	ruleName := name
	if ruleName == "" {
		ruleName = "root"
	}
	if s.Type == gjson.True || (s.IsObject() && len(s.Map()) == 0) {
		return c.addRule(ruleName, c.primitive("value")), nil
	}
	if !s.IsObject() {
		return "", fmt.Errorf("the schema at %q must be an object or true", ptr)
	}
	if id := s.Get("$id"); id.Type == gjson.String && ptr != c.res.ptr {
		outer := c.res
		c.res = schemaResource{root: s, ptr: ptr}
		defer func() { c.res = outer }()
	}
	var bad string
	s.ForEach(func(k, _ gjson.Result) bool {
		if !gbnfKeywords[k.Str] && !gbnfAnnotations[k.Str] {
			bad = k.Str
			return false
		}
		return true
	})
	if bad != "" {
		return "", &UnsupportedSchemaError{Keyword: bad, Pointer: ptr + "/" + escapePointer(bad)}
	}
	if ref := s.Get("$ref"); ref.Exists() {
		s.ForEach(func(k, _ gjson.Result) bool {
			if k.Str != "$ref" && !gbnfAnnotations[k.Str] {
				bad = k.Str
				return false
			}
			return true
		})
		if bad != "" {
			return "", fmt.Errorf("JSON Schema keyword %q at %q sits beside a $ref; only annotations may", bad, ptr+"/"+escapePointer(bad))
		}
		r, err := c.ref(ref, ptr+"/$ref")
		if err != nil {
			return "", err
		}
		return c.addRule(ruleName, r), nil
	}
	if alts := s.Get("anyOf"); alts.Exists() || s.Get("oneOf").Exists() {
		key := "anyOf"
		if !alts.Exists() {
			key, alts = "oneOf", s.Get("oneOf")
		}
		var parts []string
		for i, a := range alts.Array() {
			r, err := c.visit(a, fmt.Sprintf("%s%d", nameOr(name), i), fmt.Sprintf("%s/%s/%d", ptr, key, i))
			if err != nil {
				return "", err
			}
			parts = append(parts, r)
		}
		if len(parts) == 0 {
			return "", fmt.Errorf("%s at %q must not be empty", key, ptr)
		}
		return c.addRule(ruleName, strings.Join(parts, " | ")), nil
	}
	if v := s.Get("const"); v.Exists() {
		return c.addRule(ruleName, jsonLiteral(v)+" space"), nil
	}
	if v := s.Get("enum"); v.Exists() {
		var parts []string
		for _, x := range v.Array() {
			parts = append(parts, jsonLiteral(x))
		}
		if len(parts) == 0 {
			return "", fmt.Errorf("enum at %q must not be empty", ptr)
		}
		return c.addRule(ruleName, "("+strings.Join(parts, " | ")+") space"), nil
	}
	t := s.Get("type")
	if t.IsArray() {
		var parts []string
		for i, x := range t.Array() {
			one, err := withType(s.Raw, x.Str)
			if err != nil {
				return "", err
			}
			r, err := c.visit(gjson.Parse(one), fmt.Sprintf("%s-%d", ruleName, i), ptr)
			if err != nil {
				return "", err
			}
			parts = append(parts, r)
		}
		return c.addRule(ruleName, strings.Join(parts, " | ")), nil
	}
	typ := t.Str
	if typ == "" && (s.Get("properties").Exists() || s.Get("additionalProperties").Exists()) {
		typ = "object"
	}
	if typ == "" && s.Get("items").Exists() {
		typ = "array"
	}
	switch typ {
	case "object":
		return c.object(s, name, ruleName, ptr)
	case "array":
		item := c.primitive("value")
		if it := s.Get("items"); it.Exists() {
			var err error
			if item, err = c.visit(it, nameOr(name)+"-item", ptr+"/items"); err != nil {
				return "", err
			}
		}
		lo, err := intKeyword(s, "minItems", ptr)
		if err != nil {
			return "", err
		}
		hi, err := intKeyword(s, "maxItems", ptr)
		if err != nil {
			return "", err
		}
		return c.addRule(ruleName, `"[" space `+repetition(item, max(lo, 0), hi, `"," space`)+` "]" space`), nil
	case "string":
		lo, err := intKeyword(s, "minLength", ptr)
		if err != nil {
			return "", err
		}
		hi, err := intKeyword(s, "maxLength", ptr)
		if err != nil {
			return "", err
		}
		if lo <= 0 && hi < 0 {
			return c.addRule(ruleName, c.primitive("string")), nil
		}
		ch := c.primitive("char")
		return c.addRule(ruleName, `"\"" `+repetition(ch, max(lo, 0), hi, "")+` "\"" space`), nil
	case "number", "integer", "boolean", "null":
		return c.addRule(ruleName, c.primitive(typ)), nil
	case "":
		return c.addRule(ruleName, c.primitive("value")), nil
	}
	return "", &UnsupportedSchemaError{Keyword: "type", Pointer: ptr + "/type"}
}

// ref returns the rule of the $ref value ref (at ptr), converting its
// target the first time. Errors: a $ref that is not a string, a $ref to
// another document (*UnsupportedSchemaError), a fragment that is not a
// JSON pointer or names nothing in the resource.
func (c *schemaConverter) ref(ref gjson.Result, ptr string) (string, error) {
	if ref.Type != gjson.String {
		return "", fmt.Errorf("$ref at %q must be a string", ptr)
	}
	frag, local := strings.CutPrefix(ref.Str, "#")
	if !local {
		return "", &UnsupportedSchemaError{Keyword: "$ref", Pointer: ptr}
	}
	frag, err := url.PathUnescape(frag)
	if err != nil || (frag != "" && frag[0] != '/') {
		return "", fmt.Errorf("$ref %q at %q is not a JSON pointer fragment (\"#/$defs/Name\")", ref.Str, ptr)
	}
	key := c.res.ptr + "#" + frag
	if r, ok := c.refs[key]; ok {
		return r, nil
	}
	target, base := c.res.root, "ref"
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
				return "", fmt.Errorf("$ref %q at %q names nothing in its schema", ref.Str, ptr)
			}
			base = tok
		}
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
	r, err := c.visit(target, name, c.res.ptr+frag)
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

// object is llama.cpp's _build_object_rule without additional properties.
func (c *schemaConverter) object(s gjson.Result, name, ruleName, ptr string) (string, error) {
	if ap := s.Get("additionalProperties"); ap.Exists() && ap.Type != gjson.False {
		return "", &UnsupportedSchemaError{Keyword: "additionalProperties", Pointer: ptr + "/additionalProperties"}
	}
	props := s.Get("properties")
	if !props.Exists() && !s.Get("additionalProperties").Exists() {
		return c.addRule(ruleName, c.primitive("object")), nil
	}
	required := map[string]bool{}
	for _, r := range s.Get("required").Array() {
		required[r.Str] = true
	}
	var req, opt []string
	kv := map[string]string{}
	var err error
	props.ForEach(func(k, v gjson.Result) bool {
		var r string
		if r, err = c.visit(v, nameOr(name)+"-"+k.Str, ptr+"/properties/"+escapePointer(k.Str)); err != nil {
			return false
		}
		kv[k.Str] = c.addRule(nameOr(name)+"-"+k.Str+"-kv", formatLiteral(strconv.Quote(k.Str))+` space ":" space `+r)
		if required[k.Str] {
			req = append(req, k.Str)
		} else {
			opt = append(opt, k.Str)
		}
		return true
	})
	if err != nil {
		return "", err
	}
	for k := range required {
		if _, ok := kv[k]; !ok {
			return "", fmt.Errorf("required property %q at %q is not in properties", k, ptr)
		}
	}
	var recursive func(ks []string, firstOptional bool) string
	recursive = func(ks []string, firstOptional bool) string {
		k, rest := ks[0], ks[1:]
		var res string
		if firstOptional {
			res = `( "," space ` + kv[k] + ` )?`
		} else {
			res = kv[k]
		}
		if len(rest) > 0 {
			res += " " + c.addRule(nameOr(name)+"-"+k+"-rest", recursive(rest, true))
		}
		return res
	}
	var parts []string
	for _, k := range req {
		parts = append(parts, kv[k])
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
