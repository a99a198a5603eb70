package policies

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logNumbers are number literals of every form the log writes: integers,
// negative, -0, integral fractions, fractions, exponents, beyond int64,
// beyond float64.
var logNumbers = []string{"0", "-0", "7", "-12", "3.0", "-3.000", "0.5", "4.25", "-0.125", "1e2", "1E-3", "2.5e+10",
	"-6.02e23", "0.1", "0.30000000000000004", "123456789012345678", "9223372036854775807", "-9223372036854775808",
	"9223372036854775808", "12345678901234567890123", "1.7976931348623157e308", "5e-324", "1e400", "-1e400"}

// logCorpus is objects of every JSON shape: numbers of every form, strings
// needing escapes, nested and empty arrays and objects, sets, null.
func logCorpus(t *testing.T) []ast.Object {
	t.Helper()
	var nums []string
	for i, n := range logNumbers {
		nums = append(nums, `"n`+string(rune('a'+i))+`": `+n)
	}
	srcs := []string{
		`{` + strings.Join(nums, ", ") + `}`,
		`{"a": [` + strings.Join(logNumbers, ", ") + `]}`,
		`{"q": "say \"hi\"\\n", "ctl": "\u0001\t\r\n", "u": "é ✓ \ud83d\ude00", "html": "<a href='x'>&</a>", "": "empty key", "k \"x\"": 1}`,
		`{"e": {}, "ea": [], "n": null, "t": true, "f": false, "deep": {"a": [[], [{}], [{"b": [1, {"c": [null, -0.5]}]}]]}}`,
		`{"s": {"only", 2, 1.5}, "o": {"p": {"q": -3}}, "mixed": [1, "x", null, true, {"k": []}, [[[]]]]}`,
		`{}`,
	}
	var out []ast.Object
	for _, s := range srcs {
		v, err := ast.ParseTerm(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		out = append(out, v.Value.(ast.Object))
	}
	return out
}

// encodeField is the JSON encoder's line for one field.
func encodeField(t *testing.T, f zap.Field) []byte {
	t.Helper()
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	buf, err := enc.EncodeEntry(zapcore.Entry{Message: "m"}, []zap.Field{f})
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(buf.Bytes())
}

// decodeJSON decodes b with encoding/json, numbers as float64.
func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return v
}

// A plan writes the bytes the ast walk (astObject, the encoding before
// plans) writes, and those bytes decode to the value OPA's own JSON
// conversion (ast.JSON, encoding/json) gives, for numbers JSON decoders
// can hold.
func TestLogPlansWriteWhatTheWalkWrites(t *testing.T) {
	for i, o := range logCorpus(t) {
		walked := encodeField(t, zap.Object("v", astObject{o}))
		planned := encodeField(t, zap.Object("v", astObjectPlan(o)))
		if !bytes.Equal(planned, walked) {
			t.Fatalf("object %d: plan wrote\n%s\nthe walk\n%s", i, planned, walked)
		}
		if i == 0 || i == 1 {
			continue // holds ±1e400, which float64 cannot hold
		}
		native, err := ast.JSON(o)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(native)
		got := decodeJSON(t, planned).(map[string]any)["v"]
		if w := decodeJSON(t, want); !reflect.DeepEqual(got, w) {
			t.Fatalf("object %d: logged %v, ast.JSON gives %v", i, got, w)
		}
	}
	// The number text, literal by literal, is what the walk writes and,
	// where a float64 holds it, the literal's value.
	for _, n := range logNumbers {
		o := ast.NewObject(ast.Item(ast.StringTerm("n"), ast.NumberTerm(json.Number(n))))
		walked := encodeField(t, zap.Object("v", astObject{o}))
		planned := encodeField(t, zap.Object("v", astObjectPlan(o)))
		if !bytes.Equal(planned, walked) {
			t.Fatalf("%s: plan wrote %s, the walk %s", n, planned, walked)
		}
		var lit float64
		if err := json.Unmarshal([]byte(n), &lit); err == nil {
			if got := decodeJSON(t, planned).(map[string]any)["v"].(map[string]any)["n"]; got != lit {
				t.Fatalf("%s logged as %v", n, got)
			}
		}
	}
}

// A result plan writes a rego result as jsonObject does: the same bytes
// for a result with one member per level (map order is Go's), the same
// value otherwise.
func TestResultPlansWriteWhatJsonObjectWrites(t *testing.T) {
	results := []string{
		`{"allow": true}`, `{"n": 1.5}`, `{"n": -0}`, `{"n": 1e400}`, `{"n": 123456789012345678901}`, `{"a": [1, -2.5e-3, "x\"\n", null, [], {}]}`,
		`{"allow": true, "tiers": ["T0", "T3"], "reasons": ["q \"x\""], "max_cost_usd": 0.25, "redact": {"T3": ["EMAIL"]}, "n": null, "o": {"e": {}}}`,
	}
	for _, s := range results {
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			t.Fatal(err)
		}
		walked := encodeField(t, zap.Object("r", jsonObject(m)))
		planned := encodeField(t, zap.Object("r", jsonObjectPlan(m)))
		if len(m) == 1 && !bytes.Equal(planned, walked) {
			t.Fatalf("%s: plan wrote %s, jsonObject %s", s, planned, walked)
		}
		if strings.Contains(s, "e400") {
			continue
		}
		if g, w := decodeJSON(t, planned), decodeJSON(t, walked); !reflect.DeepEqual(g, w) {
			t.Fatalf("%s: plan wrote %v, jsonObject %v", s, g, w)
		}
	}
}

// memberSubject offers PolicyMembers, as classify's annotations do, with
// members converted once.
type memberSubject struct {
	valueSubject
	req, capability, sov *ast.Term
}

func (m memberSubject) PolicyMembers() (request, capability, sovereignty *ast.Term) {
	return m.req, m.capability, m.sov
}

func newMemberSubject(t *testing.T, members map[string]any) memberSubject {
	t.Helper()
	v, err := ValueOf(members)
	if err != nil {
		t.Fatal(err)
	}
	o := v.(ast.Object)
	return memberSubject{valueSubject: valueSubject{subject: newSubject(members), v: v},
		req: o.Get(keyRequest), capability: o.Get(keyCapability), sov: o.Get(keySovereignty)}
}

// The decision log's input, written from the Engine's cached targets and
// plans, is byte for byte what the walk of the input (built without
// caches) writes, for route inputs of every kind and for odd numbers and
// strings in the identity, targets and subject; the whole line decodes to
// the input's ast.JSON and, on a memo hit, to the result the evaluation
// logged.
func TestTheDecisionLogIsWhatTheWalkWrites(t *testing.T) {
	ctx := context.Background()
	var logs logBuffer
	e, err := New(ctx, Options{Logger: jsonLogger(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	odd := func(in Input) Input {
		m := members("public", map[string]any{"EMAIL": 1})
		m["capability"].(map[string]any)["difficulty"] = json.Number("1e-7")
		m["request"].(map[string]any)["model"] = "ch\"at\n\u00e9"
		in.Subject = newMemberSubject(t, m)
		id, _ := ValueOf(map[string]any{"member": "a\\b", "remaining_usd": json.Number("-0"), "scopes": []any{}, "big": json.Number("1e400"), "n": json.Number("12345678901234567890")})
		in.Identity = id
		return in
	}
	corpus := append(memoCorpus(), odd(Input{}))
	for i := range corpus {
		// Half of them as the pipeline passes them: members, identity and
		// targets converted once.
		if i%2 == 0 {
			in := &corpus[i]
			in.Subject = newMemberSubject(t, in.Subject.PolicyInput())
			if m, ok := in.Identity.(map[string]any); ok {
				in.Identity, _ = ValueOf(m)
			}
			conv := make([]any, len(in.Targets))
			for j, tg := range in.Targets {
				conv[j], _ = ValueOf(tg)
			}
			in.Targets = conv
		}
	}
	for round := range 3 {
		for i, in := range corpus {
			plain, err := routeInput(in)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := e.routeDoc(in)
			if err != nil {
				t.Fatal(err)
			}
			walked := encodeField(t, zap.Object("input", astObject{plain}))
			planned := encodeField(t, zap.Object("input", doc))
			if !bytes.Equal(planned, walked) {
				t.Fatalf("round %d input %d: logged\n%s\nthe walk writes\n%s", round, i, planned, walked)
			}
			if i < len(corpus)-1 { // the last holds 1e400
				logs.buf.Reset()
				e.Decide(ctx, in)
				lines := logs.decisions(t)
				if len(lines) != 1 {
					t.Fatalf("%d lines", len(lines))
				}
				native, _ := ast.JSON(plain)
				want, _ := json.Marshal(native)
				if w := decodeJSON(t, want); !reflect.DeepEqual(lines[0]["input"], w) {
					t.Fatalf("round %d input %d: logged input %v, ast.JSON %v", round, i, lines[0]["input"], w)
				}
			}
		}
	}
	// A memo hit logs the result the evaluation logged.
	fresh, err := New(ctx, Options{Logger: jsonLogger(&logs), MemoSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i, in := range corpus[:len(corpus)-1] {
		logs.buf.Reset()
		e.Decide(ctx, in)
		fresh.Decide(ctx, in)
		lines := logs.decisions(t)
		if lines[0]["memoized"] != true || !reflect.DeepEqual(lines[0]["result"], lines[1]["result"]) || lines[0]["result"] == nil {
			t.Fatalf("input %d: memoised line result %v, evaluated %v", i, lines[0]["result"], lines[1]["result"])
		}
	}
}
