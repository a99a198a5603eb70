package policies

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// The decision log writes an input ast.Object as the JSON it stands for:
// checked against OPA's own conversion (ast.JSON) of the same value,
// through encoding/json, for nested objects, arrays of objects and arrays,
// sets, null, integers and fractions.
func TestAstObjectLogsTheJSONOfTheValue(t *testing.T) {
	v := ast.MustParseTerm(`{"a": [1, 2.5, "x", null, true, {"b": [[], [{"c": "d"}]]}], "s": {"only"}, "n": null, "o": {"p": {"q": -3}}}`).Value.(ast.Object)
	enc := zapcore.NewJSONEncoder(zapcore.EncoderConfig{})
	buf, err := enc.EncodeEntry(zapcore.Entry{}, []zap.Field{zap.Object("input", astObject{v})})
	if err != nil {
		t.Fatal(err)
	}
	var got struct{ Input any }
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%s: %v", buf.Bytes(), err)
	}
	oracle, err := ast.JSON(v)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(oracle)
	var want any
	_ = json.Unmarshal(b, &want)
	if !reflect.DeepEqual(got.Input, want) {
		t.Fatalf("logged %v, want %v", got.Input, want)
	}
}
