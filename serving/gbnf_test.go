package serving

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/molly-gateway/molly/serving/gguf"
	"github.com/molly-gateway/molly/serving/llama"
)

// grammarChecker answers whether llama.cpp's grammar sampler lets a whole
// text through: the text fed byte by byte (the demo vocabulary has a
// token per byte), each token allowed by the mask before it is accepted,
// and the end-of-generation token allowed after the last one (the grammar
// is complete there).
type grammarChecker struct {
	m           *llama.Model
	logits, out []float32
}

func newGrammarChecker(t testing.TB) *grammarChecker {
	t.Helper()
	m, err := llama.LoadModel(demoDir + "/" + DemoModelFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return &grammarChecker{m: m, logits: make([]float32, m.NVocab()), out: make([]float32, m.NVocab())}
}

// grammar parses gbnf in llama.cpp; the test fails if it cannot.
func (gc *grammarChecker) grammar(t testing.TB, gbnf string) *llama.Grammar {
	t.Helper()
	g, err := llama.NewGrammar(gc.m, gbnf)
	if err != nil {
		t.Fatalf("llama.cpp refused the grammar\n%s", gbnf)
	}
	t.Cleanup(g.Close)
	return g
}

// accepts resets g and reports whether it takes text whole.
func (gc *grammarChecker) accepts(g *llama.Grammar, text string) bool {
	g.Reset()
	for i := 0; i < len(text); i++ {
		tok := int32(gguf.TokenByte0) + int32(text[i])
		g.Mask(gc.logits, gc.out)
		if math.IsInf(float64(gc.out[tok]), -1) {
			return false
		}
		g.Accept(tok)
	}
	g.Mask(gc.logits, gc.out)
	return !math.IsInf(float64(gc.out[gc.m.EOS()]), -1)
}

// valid is the independent validator's verdict on text.
func valid(t testing.TB, s *jsonschema.Schema, text string) bool {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return false
	}
	return s.Validate(v) == nil
}

// TestGrammarCheckerSeesTheGrammar: the checker itself accepts what a
// hand-written grammar allows and nothing else (a prefix, a longer text,
// another text).
func TestGrammarCheckerSeesTheGrammar(t *testing.T) {
	gc := newGrammarChecker(t)
	g := gc.grammar(t, `root ::= "ab" | "a\"" [0-9]`)
	for text, want := range map[string]bool{"ab": true, `a"5`: true, "a": false, "abc": false, "b": false, `a"`: false, "": false} {
		if got := gc.accepts(g, text); got != want {
			t.Errorf("%q: %v, want %v", text, got, want)
		}
	}
}

// keywordCases are schemas with the keywords beyond llama.cpp's basic
// subset, and JSON texts: accept (the validator accepts them, and so
// must the grammar), reject (the validator rejects them, and so must the
// grammar), subset (the validator accepts them, the grammar leaves them
// out by design: an exponent on a bounded number, a shorter tuple). The
// validator's verdicts are checked first: it is the oracle.
var keywordCases = []struct {
	schema                 string
	accept, reject, subset []string
}{
	{`{"type":"integer","minimum":0,"maximum":100}`,
		[]string{"0", "7", "10", "99", "100"}, []string{"101", "-1", "1000", "100.5", `"5"`, "007"}, []string{"-0"}},
	{`{"type":"integer","exclusiveMinimum":-3,"exclusiveMaximum":12}`,
		[]string{"-2", "0", "11"}, []string{"-3", "12", "-4", "13"}, nil},
	{`{"type":"integer","minimum":100}`,
		[]string{"100", "101", "999", "1000", "9999999999999999"}, []string{"15", "99", "0", "-100"}, []string{"10000000000000000"}},
	{`{"type":"integer","maximum":-7}`,
		[]string{"-7", "-8", "-100", "-9999999999999999"}, []string{"-6", "0", "7", "-0"}, nil},
	{`{"type":"integer","minimum":2.5,"maximum":1e2}`,
		[]string{"3", "100"}, []string{"2", "101"}, nil},
	{`{"type":"integer","minimum":-9007199254740991,"maximum":9007199254740991}`,
		[]string{"-9007199254740991", "9007199254740991", "0", "123"}, []string{"9007199254740992", "-9007199254740992"}, nil},
	{`{"type":"number","minimum":0,"maximum":1}`,
		[]string{"0", "0.5", "1", "1.0", "1.000", "0.9999999999999999"}, []string{"1.0000001", "-0.5", "2", "-1"}, []string{"1e-3", "-0", "5E-1"}},
	{`{"type":"number","exclusiveMinimum":0}`,
		[]string{"0.001", "1", "12.5"}, []string{"0", "0.0", "-0.5", "-3"}, nil},
	{`{"type":"number","exclusiveMinimum":-2,"exclusiveMaximum":3}`,
		[]string{"-1.9", "-1", "0", "2.99", "-0.25"}, []string{"-2", "-2.0", "3", "3.0", "-2.5", "3.01"}, nil},
	{`{"type":"number","minimum":-2,"maximum":-1}`,
		[]string{"-2", "-1", "-1.5", "-2.0"}, []string{"-2.1", "-0.5", "0", "1"}, nil},
	{`{"type":"number","multipleOf":1,"minimum":1}`,
		[]string{"1", "5"}, []string{"0", "1.5"}, nil},
	{`{"type":"string","pattern":"^[a-c]{2,3}-\\d+$"}`,
		[]string{`"ab-1"`, `"cab-42"`}, []string{`"a-1"`, `"abcd-1"`, `"ab-"`, `"ab-x"`, `"xab-1"`}, nil},
	{`{"type":"string","pattern":"b.d"}`,
		[]string{`"bxd"`, `"abcde"`, `"b\"d"`, `"zzb\\dzz"`}, []string{`"bd"`, `"b\nd"`, `"bxe"`, `""`, `"b"d"`, `"b\d"`, "\"b\nd\""}, []string{`"\u0062xd"`}},
	{`{"type":"string","pattern":"^(?:\"|\\\\|x)+$"}`,
		[]string{`"\""`, `"\\"`, `"x\"\\x"`}, []string{`""`, `"y"`}, nil},
	{`{"type":"string","pattern":"^\\S+@\\S+\\.[a-z]{2,4}$"}`,
		[]string{`"a@b.io"`, `"x.y@z.com"`}, []string{`"a b@c.io"`, `"a@b"`, `"@b.io"`}, nil},
	{`{"type":"string","pattern":"^[^a-z]$"}`,
		[]string{`"A"`, `"\""`, `"\n"`, `"\\"`, `"é"`}, []string{`"a"`, `"AB"`, `"""`, `"\"`, "\"\t\""}, []string{`"😀"`}},
	// zod's uuid: an anchored group of alternatives.
	{`{"type":"string","format":"uuid","pattern":"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"}`,
		[]string{`"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"`, `"00000000-0000-0000-0000-000000000000"`},
		[]string{`"0190a1b2-c3d4-9e5f-8a9b-0c1d2e3f4a5b"`, `"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5"`, `"x0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"`}, nil},
	{`{"type":"string","pattern":"^(red|green)$|^x"}`,
		[]string{`"red"`, `"green"`, `"x"`, `"xyz"`}, []string{`"blue"`, `"redx"`, `"ax"`}, nil},
	{`{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":{"type":"string","maxLength":2}}`,
		[]string{`{"a":1}`, `{"a":1,"b":"x"}`, `{"a":1,"ab":"","b":"yy"}`, `{"a":1,"aa":"x"}`}, []string{`{"a":1,"b":3}`, `{"b":"x"}`, `{"a":1,"b":"xyz"}`},
		[]string{`{"b":"x","a":1}`}},
	{`{"type":"object","properties":{"ab":{"type":"null"},"abc":{"type":"null"}},"additionalProperties":{"type":"boolean"}}`,
		[]string{`{}`, `{"a":true}`, `{"abcd":false}`, `{"ab":null,"x":true}`}, []string{`{"ab":true}`, `{"abc":false}`, `{"a":null}`}, []string{`{"\u0061b":null}`}},
	{`{"type":"object","additionalProperties":{"type":"integer","minimum":1,"maximum":9},"maxProperties":2}`,
		[]string{`{}`, `{"x":1}`, `{"x":1,"y":9}`, `{"\u00e9":3}`}, []string{`{"x":0}`, `{"x":1,"y":2,"z":3}`, `{"x":"1"}`}, nil},
	{`{"type":"object","additionalProperties":{"type":"null"},"propertyNames":{"pattern":"^[a-z]{2}$"}}`,
		[]string{`{}`, `{"ab":null}`, `{"ab":null,"cd":null}`}, []string{`{"a":null}`, `{"abc":null}`, `{"AB":null}`, `{"ab":1}`}, nil},
	{`{"type":"object","propertyNames":{"enum":["x","y",3]}}`,
		[]string{`{}`, `{"x":1}`, `{"y":[],"x":"s"}`}, []string{`{"z":1}`, `{"3":1}`}, nil},
	{`{"additionalProperties":true,"minProperties":1}`,
		[]string{`{"x":[1]}`, `{"y":null,"z":{}}`}, []string{`{}`}, []string{`3`, `[]`}},
	{`{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":true}`,
		[]string{`{"a":1,"b":[true]}`, `{"c":{}}`}, []string{`{"a":"x"}`, `{"a":1,"a":"x"}`}, nil},
	{`{"allOf":[{"$ref":"#/$defs/Base"},{"type":"object","properties":{"b":{"type":"string","maxLength":3},"a":{"minimum":0}},"required":["b"]}],
	   "$defs":{"Base":{"type":"object","properties":{"a":{"type":"integer","maximum":5}},"required":["a"]}}}`,
		[]string{`{"a":0,"b":""}`, `{"a":5,"b":"xyz"}`}, []string{`{"a":6,"b":""}`, `{"a":-1,"b":""}`, `{"a":1}`, `{"b":"x"}`, `{"a":1,"b":"long"}`}, nil},
	{`{"allOf":[{"$ref":"#/$defs/Color"}],"description":"pydantic's $ref beside keywords","$defs":{"Color":{"enum":["red","green"]}}}`,
		[]string{`"red"`, `"green"`}, []string{`"blue"`, `1`}, nil},
	{`{"type":"object","properties":{"x":{"type":"boolean"}},"additionalProperties":false,"allOf":[{"properties":{"x":{"const":true},"y":{"type":"null"}}}]}`,
		[]string{`{}`, `{"x":true}`}, []string{`{"x":false}`, `{"y":null}`}, nil},
	{`{"type":"array","prefixItems":[{"type":"integer","minimum":0,"maximum":9},{"type":"string","pattern":"^[xy]$"}],"items":false}`,
		[]string{`[3,"x"]`, `[0,"y"]`}, []string{`[10,"x"]`, `[3,"z"]`, `[3,"x",1]`, `["x",3]`}, []string{`[3]`, `[]`}},
	{`{"type":"array","prefixItems":[{"type":"boolean"}],"items":{"type":"null"},"minItems":2,"maxItems":3}`,
		[]string{`[true,null]`, `[false,null,null]`}, []string{`[true]`, `[true,null,null,null]`, `[true,false]`, `[null,null]`}, nil},
	{`{"type":"array","items":{"type":"integer"},"uniqueItems":false,"maxItems":2}`,
		[]string{`[]`, `[1,1]`}, []string{`[1,2,3]`}, nil},
	{`{"type":"array","items":{"type":"integer"},"uniqueItems":true,"maxItems":1}`,
		[]string{`[]`, `[4]`}, []string{`[1,2]`}, nil},
	{`{"type":"string","enum":["ab","abcd",3,"é"],"maxLength":2}`,
		[]string{`"ab"`, `"é"`}, []string{`"abcd"`, `3`}, nil},
	{`{"anyOf":[{"type":"integer","minimum":10,"maximum":20},{"type":"null"}],"default":null,"title":"Optional[conint]"}`,
		[]string{`10`, `20`, `null`}, []string{`9`, `21`, `"x"`}, nil},
	// Keywords beside anyOf/oneOf: merged into each alternative.
	{`{"anyOf":[{"type":"integer"},{"type":"null"}],"minimum":3}`,
		[]string{`3`, `100`, `null`}, []string{`2`, `-3`, `"x"`, `3.5`}, nil},
	{`{"type":"integer","anyOf":[{"minimum":0,"maximum":9},{"minimum":100,"maximum":105}]}`,
		[]string{`0`, `9`, `100`, `105`}, []string{`10`, `99`, `106`, `-1`, `"5"`, `5.5`}, nil},
	{`{"type":["string","null"],"anyOf":[{"maxLength":2},{"type":"null"}]}`,
		[]string{`""`, `"ab"`, `null`}, []string{`"abc"`, `1`}, nil},
	{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":3}},"anyOf":[{"required":["a"]},{"required":["b"]}]}`,
		[]string{`{"a":1}`, `{"b":"x"}`, `{"a":1,"b":"x"}`, `{"b":"x","a":1}`}, []string{`{}`, `{"a":"x"}`, `{"b":"long!"}`, `{"a":1,"b":2}`, `[]`},
		[]string{`{"a":1,"c":1}`}},
	{`{"type":"object","required":["kind"],"additionalProperties":false,
	   "properties":{"kind":{"enum":["a","b"]},"n":{"type":"integer","minimum":0,"maximum":9}},
	   "oneOf":[{"properties":{"kind":{"const":"a"}},"required":["n"]},{"properties":{"kind":{"const":"b"},"n":false}}]}`,
		[]string{`{"kind":"a","n":3}`, `{"kind":"b"}`}, []string{`{"kind":"a"}`, `{"kind":"b","n":1}`, `{"kind":"c"}`, `{"n":1}`, `{"kind":"a","n":10}`, `{"kind":"a","n":1,"x":1}`}, nil},
	{`{"type":"string","anyOf":[{"minLength":2},{"pattern":"^x"}]}`,
		[]string{`"ab"`, `"x"`, `"xyz"`}, []string{`""`, `"a"`, `3`}, nil},
	{`{"type":"string","maxLength":4,"anyOf":[{"minLength":2},{"enum":["x","toolong",7]}]}`,
		[]string{`"ab"`, `"abcd"`, `"x"`}, []string{`""`, `"y"`, `"abcde"`, `"toolong"`, `7`}, nil},
	// The siblings leave no value in two alternatives (a minimum above
	// the maximum; types that do not meet): they are left out.
	{`{"type":"integer","minimum":5,"anyOf":[{"maximum":3},{"maximum":10},{"type":"string"}]}`,
		[]string{`5`, `10`}, []string{`3`, `4`, `11`, `"s"`}, nil},
	{`{"$defs":{"Small":{"type":"integer","maximum":9},"Name":{"type":"string","pattern":"^[a-z]+$"}},"minimum":0,
	   "anyOf":[{"$ref":"#/$defs/Small"},{"$ref":"#/$defs/Name"}]}`,
		[]string{`0`, `9`, `"abc"`}, []string{`-1`, `10`, `"ABC"`, `""`, `null`}, nil},
	// A recursive model behind a $ref in an alternative: its rule stays shared.
	{`{"$defs":{"L":{"type":"object","properties":{"v":{"type":"integer"},"next":{"$ref":"#/$defs/L"}}}},
	   "required":["v"],"anyOf":[{"$ref":"#/$defs/L"},{"type":"null"}]}`,
		[]string{`{"v":1}`, `{"v":1,"next":{}}`, `{"v":1,"next":{"v":2,"next":{}}}`, `null`}, []string{`{}`, `{"next":{"v":1}}`, `{"v":1,"next":{"v":"x"}}`, `3`}, nil},
	{`{"allOf":[{"$ref":"#/$defs/Base"},{"anyOf":[{"required":["a"]},{"required":["b"]}]}],
	   "$defs":{"Base":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"boolean"}}}}}`,
		[]string{`{"a":1}`, `{"b":true}`, `{"a":1,"b":false}`}, []string{`{}`, `{"a":true}`, `{"b":1}`}, nil},
	{`{"type":"integer","anyOf":[{"anyOf":[{"maximum":-5},{"minimum":5}]},{"const":0}]}`,
		[]string{`-5`, `5`, `0`, `-100`}, []string{`1`, `-4`, `4`, `"0"`}, nil},
	{`{"type":["integer","null"],"minimum":5,"maximum":4}`,
		[]string{`null`}, []string{`5`, `4`}, nil},
	{`{"anyOf":[{"type":"integer","minimum":5,"maximum":4},{"type":"null"},false]}`,
		[]string{`null`}, []string{`5`, `4`, `0`}, nil},
}

// TestSchemaKeywordGrammarsAgreeWithTheValidator: for each keyword the
// converter now writes, llama.cpp's grammar sampler lets through the
// texts the independent validator accepts and refuses the ones it
// rejects (the subset texts aside, which it must refuse too).
func TestSchemaKeywordGrammarsAgreeWithTheValidator(t *testing.T) {
	gc := newGrammarChecker(t)
	for _, c := range keywordCases {
		oracle := compileSchema(t, c.schema)
		gbnf, err := SchemaToGBNF([]byte(c.schema))
		if err != nil {
			t.Fatalf("%s: %v", c.schema, err)
		}
		g := gc.grammar(t, gbnf)
		for _, l := range []struct {
			texts        []string
			valid, taken bool
		}{{c.accept, true, true}, {c.reject, false, false}, {c.subset, true, false}} {
			for _, text := range l.texts {
				if v := valid(t, oracle, text); v != l.valid {
					t.Errorf("%s: the validator says %v for %s; the case is wrong", c.schema, v, text)
				}
				if got := gc.accepts(g, text); got != l.taken {
					t.Errorf("%s: the grammar takes %s: %v, want %v\n%s", c.schema, text, got, l.taken, gbnf)
				}
			}
		}
	}
}

// TestIntegerAndNumberRangesAreExact: over every integer from -1200 to
// 1200 (and decimals around the bounds), the grammar of a bounded integer
// or number takes exactly what the validator accepts.
func TestIntegerAndNumberRangesAreExact(t *testing.T) {
	gc := newGrammarChecker(t)
	var ints, decimals []string
	for i := -1200; i <= 1200; i++ {
		ints = append(ints, fmt.Sprint(i))
	}
	for _, d := range []string{"0", "-0.5", "0.5", "-1.5", "1.5", "-3.25", "3.25", "-9.999", "9.999", "-10.0", "10.0", "-10.01", "10.01",
		"99.5", "100.0", "100.01", "-100.0", "-99.5", "-100.5", "0.0001", "-0.0001", "5.0", "-5.0", "4.9", "5.1", "-4.9", "-5.1"} {
		decimals = append(decimals, d)
	}
	schemas := []string{
		`{"type":"integer","minimum":0,"maximum":100}`, `{"type":"integer","minimum":-5,"maximum":5}`,
		`{"type":"integer","minimum":-1000,"maximum":-3}`, `{"type":"integer","minimum":7}`, `{"type":"integer","minimum":100}`,
		`{"type":"integer","minimum":105}`, `{"type":"integer","maximum":-12}`, `{"type":"integer","maximum":250}`,
		`{"type":"integer","exclusiveMinimum":-101,"exclusiveMaximum":1000}`, `{"type":"integer","minimum":1,"maximum":1}`,
		`{"type":"integer","minimum":19,"maximum":1001}`,
		`{"type":"number","minimum":-10,"maximum":10}`, `{"type":"number","exclusiveMinimum":-100,"maximum":5}`,
		`{"type":"number","minimum":5,"exclusiveMaximum":100}`, `{"type":"number","exclusiveMinimum":5}`, `{"type":"number","maximum":-5}`,
	}
	for _, s := range schemas {
		oracle := compileSchema(t, s)
		gbnf, err := SchemaToGBNF([]byte(s))
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		g := gc.grammar(t, gbnf)
		texts := ints
		if strings.Contains(s, "number") {
			texts = append(append([]string{}, ints...), decimals...)
		}
		wrong := 0
		for _, text := range texts {
			want := valid(t, oracle, text)
			if got := gc.accepts(g, text); got != want && wrong < 5 {
				wrong++
				t.Errorf("%s: the grammar takes %s: %v, the validator %v", s, text, got, want)
			}
		}
	}
}

// TestStillUnsupportedKeywordsAreRefused: what a grammar cannot express
// exactly stays an *UnsupportedSchemaError naming the keyword and its
// place, and a 400 naming it from the engine.
func TestStillUnsupportedKeywordsAreRefused(t *testing.T) {
	e := newEngine(t, nil)
	for _, c := range []struct{ schema, keyword, pointer string }{
		{`{"type":"array","items":{"type":"integer"},"uniqueItems":true}`, "uniqueItems", "/uniqueItems"},
		{`{"type":"integer","multipleOf":3}`, "multipleOf", "/multipleOf"},
		{`{"type":"number","minimum":0.5}`, "minimum", "/minimum"},
		{`{"type":"object","properties":{"a":{"type":"string","pattern":"^(?=a)"}}}`, "pattern", "/properties/a/pattern"},
		{`{"type":"string","pattern":"^(a)\\1$"}`, "pattern", "/pattern"},
		{`{"type":"string","pattern":"\\bword"}`, "pattern", "/pattern"},
		{`{"type":"string","pattern":"a^b"}`, "pattern", "/pattern"},
		{`{"type":"string","pattern":"^[\\S]$"}`, "pattern", "/pattern"},
		{`{"type":"string","pattern":"^[a-z]+$","maxLength":8}`, "maxLength", "/maxLength"},
		{`{"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"}},"minProperties":1}`, "minProperties", "/minProperties"},
		{`{"type":"object","properties":{"a":{"type":"null"}},"additionalProperties":true,"maxProperties":3}`, "maxProperties", "/maxProperties"},
		{`{"type":"object","additionalProperties":{"type":"null"},"minProperties":2}`, "minProperties", "/minProperties"},
		{`{"allOf":[{"type":"string","pattern":"^a"},{"pattern":"b$"}]}`, "allOf", "/allOf"},
		{`{"allOf":[{"type":"string","pattern":"^a"},{"anyOf":[{"pattern":"b$"},{"const":"a"}]}]}`, "allOf", "/allOf"},
		{`{"type":"string","pattern":"^a","anyOf":[{"pattern":"b$"},{"const":"a"}]}`, "anyOf", "/anyOf/0"},
		{`{"anyOf":[{"enum":[1,5,200]},{"type":"null"}],"maximum":100}`, "maximum", "/anyOf/0/maximum"},
		{`{"type":"string","maxLength":3,"oneOf":[{"pattern":"^a"},{"const":"b"}]}`, "maxLength", "/oneOf/0/maxLength"},
		// $refs inlined into an alternative without end.
		{`{"$defs":{"A":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/A"}]}},"minLength":1,"allOf":[{"$ref":"#/$defs/A"}]}`, "allOf", "/allOf"},
		{`{"enum":[1,5,200],"maximum":100}`, "maximum", "/maximum"},
		{`{"type":"object","patternProperties":{"^x":{}}}`, "patternProperties", "/patternProperties"},
		{`{"type":"object","properties":{"a":{}},"additionalProperties":true,"propertyNames":{"maxLength":3}}`, "propertyNames", "/propertyNames"},
	} {
		_, err := SchemaToGBNF([]byte(c.schema))
		var ue *UnsupportedSchemaError
		if !errors.As(err, &ue) || ue.Keyword != c.keyword || ue.Pointer != c.pointer {
			t.Errorf("%s: %v, want an UnsupportedSchemaError for %s at %s", c.schema, err, c.keyword, c.pointer)
			continue
		}
		body := map[string]any{"model": "molly-demo", "messages": []map[string]any{{"role": "user", "content": "hi"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": json.RawMessage(c.schema)}}}
		code, r := chat(t, e, body)
		if code != http.StatusBadRequest || r.Error == nil || !strings.Contains(r.Error.Message, fmt.Sprintf("%q", c.keyword)) ||
			!strings.Contains(r.Error.Message, fmt.Sprintf("%q", c.pointer)) {
			t.Errorf("%s: status %d, error %+v; want 400 naming %s at %s", c.schema, code, r.Error, c.keyword, c.pointer)
		}
	}
	// Schemas no value satisfies are refused too, as plain errors (the
	// kind an anyOf alternative is left out for).
	for _, s := range []string{`{"type":"integer","minimum":5,"maximum":4}`, `{"type":"string","minLength":3,"maxLength":2}`,
		`{"type":"number","exclusiveMinimum":1,"exclusiveMaximum":1}`, `{"type":"array","prefixItems":[{}],"items":false,"minItems":2}`,
		`{"type":"string","anyOf":[{"type":"integer"},{"minLength":3,"maxLength":2}]}`,
		`{"type":"object","properties":{"a":{}},"additionalProperties":false,"oneOf":[{"properties":{"b":{}},"required":["b"]}]}`,
		`{"allOf":[{"type":"integer"},{"anyOf":[{"type":"string"},{"enum":["x",true]}]}]}`} {
		var nv *noValueError
		if _, err := SchemaToGBNF([]byte(s)); !errors.As(err, &nv) {
			t.Errorf("%s: %v, want an error that no value satisfies it", s, err)
		}
	}
}

// keywordSchema is shaped as pydantic, zod and OpenAI structured outputs
// write constrained models: an allOf with a $ref to a base model beside
// the model's own properties, integer and number bounds (inclusive and
// exclusive), patterns, a tuple (prefixItems, items false), a map
// (additionalProperties with propertyNames and maxProperties, as zod
// writes a record), uniqueItems false and an Optional of a bounded
// integer. Strings and keys are bounded so a random model ends (the
// demo model rarely closes an unbounded string: additional properties
// beside properties, whose keys are any other string, are checked by
// TestSchemaKeywordGrammarsAgreeWithTheValidator instead).
const keywordSchema = `{
  "$defs": {
    "Base": {"title": "Base", "type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}}, "required": ["id"]},
    "Level": {"type": "integer", "minimum": -3, "exclusiveMaximum": 4}
  },
  "allOf": [{"$ref": "#/$defs/Base"}],
  "title": "Reading", "type": "object",
  "properties": {
    "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    "email": {"type": "string", "pattern": "^[a-z]{1,5}@[a-z]{1,5}\\.(com|org)$"},
    "ratio": {"type": "number", "minimum": 0, "maximum": 1},
    "temp": {"type": "number", "exclusiveMinimum": -40, "exclusiveMaximum": 60},
    "level": {"$ref": "#/$defs/Level"},
    "point": {"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "pattern": "^[xy]$"}], "items": false},
    "labels": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 5}, "propertyNames": {"pattern": "^[a-z]{1,3}$"}, "maxProperties": 2},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}, "uniqueItems": false, "maxItems": 3},
    "limit": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0, "maximum": 50}, {"type": "null"}], "default": null}
  },
  "required": ["code", "ratio", "level", "point", "labels"]
}`

// TestKeywordSchemaOutputsValidateFor20Seeds: the real engine's
// response_format json_schema output under keywordSchema validates
// against it (the independent validator is the oracle) for 20 seeds, and
// so do a forced tool's arguments with it as the parameters for 6; an
// output cut by max_tokens is still the start of an object.
func TestKeywordSchemaOutputsValidateFor20Seeds(t *testing.T) {
	// The tool's schema is in its prompt twice, a byte-level token each.
	e := newEngine(t, func(c *Config) { c.NSeqMax = 2; c.NCtx = 2 * 4096 })
	oracle := compileSchema(t, keywordSchema)
	ended := 0
	for seed := range 20 {
		code, body := chatRaw(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 1500,
			"messages":        []map[string]any{{"role": "user", "content": "a reading"}},
			"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "reading", "strict": true, "schema": json.RawMessage(keywordSchema)}},
		})
		if code != http.StatusOK {
			t.Fatalf("seed %d: %d %s", seed, code, body)
		}
		var r chatResponse
		_ = json.Unmarshal(body, &r)
		text := r.Choices[0].Message.Content
		if r.Choices[0].FinishReason != "stop" {
			if first, ok := jsonPrefix(text); !ok || first != json.Delim('{') {
				t.Errorf("seed %d: finish %q and %q is not the start of an object", seed, r.Choices[0].FinishReason, text)
			}
			continue
		}
		ended++
		validateJSON(t, oracle, text)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(keywordSchema)); err != nil {
		t.Fatal(err)
	}
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "save_reading", "parameters": json.RawMessage(compact.Bytes())}}}
	for seed := range 6 {
		code, body := chatRaw(t, e, map[string]any{
			"model": "molly-demo", "seed": seed, "max_tokens": 1500, "tools": tools, "parallel_tool_calls": false,
			"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "save_reading"}},
			"messages":    []map[string]any{{"role": "user", "content": "save a reading"}},
		})
		if code != http.StatusOK {
			t.Fatalf("tool seed %d: %d %s", seed, code, body)
		}
		var r toolResponse
		_ = json.Unmarshal(body, &r)
		ch := r.Choices[0]
		if len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Name != "save_reading" {
			t.Fatalf("tool seed %d: %s", seed, body)
		}
		args := ch.Message.ToolCalls[0].Function.Arguments
		if ch.FinishReason != "tool_calls" {
			if first, ok := jsonPrefix(args); !ok || first != json.Delim('{') {
				t.Errorf("tool seed %d: finish %q and %q is not the start of an object", seed, ch.FinishReason, args)
			}
			continue
		}
		ended++
		validateJSON(t, oracle, args)
	}
	t.Logf("%d of 26 ended", ended)
	if ended < 20 {
		t.Fatalf("only %d of 26 outputs ended before max_tokens: too few checked against the schema", ended)
	}
}

// TestDistributionOverAnyOfIsBounded: keywords beside anyOf are copied
// into each alternative, so nested ones multiply: a schema whose
// conjunctions are distributed into at most maxDistributed alternatives
// converts (and its grammar agrees with the validator), one level more
// is an *UnsupportedSchemaError naming anyOf, not an exponential
// conversion.
func TestDistributionOverAnyOfIsBounded(t *testing.T) {
	nested := func(levels int) string {
		s := `{"type":"null"}`
		for range levels {
			s = `{"type":"object","properties":{"p":` + s + `},"anyOf":[{"required":["p"]},{"maxProperties":1}]}`
		}
		return s
	}
	// Level k is converted once per alternative of the levels above it:
	// 2 + 4 + … + 2^levels alternatives in all.
	if n := 1<<10 - 2; n > maxDistributed || 2*n+2 <= maxDistributed {
		t.Fatalf("the levels below assume %d alternatives fit and %d do not", n, 2*n+2)
	}
	gc := newGrammarChecker(t)
	s := nested(9)
	gbnf, err := SchemaToGBNF([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	g, oracle := gc.grammar(t, gbnf), compileSchema(t, s)
	deep := strings.Repeat(`{"p":`, 9) + "null" + strings.Repeat("}", 9)
	for text, want := range map[string]bool{deep: true, `{}`: true, `{"p":{"p":{}}}`: true,
		strings.Replace(deep, "null", "1", 1): false, `{"p":{"p":{"p":2}}}`: false, `{"p":1}`: false, `[]`: false} {
		if v := valid(t, oracle, text); v != want {
			t.Errorf("the validator says %v for %s; the case is wrong", v, text)
		}
		if got := gc.accepts(g, text); got != want {
			t.Errorf("the grammar takes %s: %v, want %v", text, got, want)
		}
	}
	_, err = SchemaToGBNF([]byte(nested(10)))
	var ue *UnsupportedSchemaError
	if !errors.As(err, &ue) || ue.Keyword != "anyOf" || !strings.HasSuffix(ue.Pointer, "/anyOf") {
		t.Errorf("10 levels: %v, want an UnsupportedSchemaError naming an anyOf", err)
	}
}
