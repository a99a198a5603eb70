package policies

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap/zapcore"
)

// ValueOf converts a JSON-compatible Go value to an OPA ast.Value without a
// JSON round trip or reflection. Accepted: nil, bool, string, json.Number,
// Go integers and finite floats, []any, []string, []map[string]any,
// map[string]any, map[string]string, map[string]int, map[string][]string,
// ast.Value and *ast.Term (used as they are). Anything else is an error, so
// a caller that passes a struct learns it at once instead of paying for a
// reflection path on every request.
func ValueOf(x any) (ast.Value, error) {
	switch x := x.(type) {
	case ast.Value:
		return x, nil
	case *ast.Term:
		return x.Value, nil
	case nil:
		return ast.NullValue, nil
	case bool:
		return ast.InternedValue(x), nil
	case string:
		return ast.InternedValue(x), nil
	case json.Number:
		return ast.InterfaceToValue(x) // checked parse, interned small ints
	case int:
		return ast.InternedValue(x), nil
	case int8:
		return ast.InternedValue(x), nil
	case int16:
		return ast.InternedValue(x), nil
	case int32:
		return ast.InternedValue(x), nil
	case int64:
		return ast.InternedValue(x), nil
	case uint:
		return ast.Number(strconv.FormatUint(uint64(x), 10)), nil
	case uint8:
		return ast.InternedValue(x), nil
	case uint16:
		return ast.InternedValue(x), nil
	case uint32:
		return ast.Number(strconv.FormatUint(uint64(x), 10)), nil
	case uint64:
		return ast.Number(strconv.FormatUint(x, 10)), nil
	case float32:
		return floatValue(float64(x))
	case float64:
		return floatValue(x)
	case []any:
		terms := make([]*ast.Term, len(x))
		for i, e := range x {
			v, err := ValueOf(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			terms[i] = ast.NewTerm(v)
		}
		return ast.NewArray(terms...), nil
	case []string:
		terms := make([]*ast.Term, len(x))
		for i, e := range x {
			terms[i] = ast.InternedTerm(e)
		}
		return ast.NewArray(terms...), nil
	case []map[string]any:
		terms := make([]*ast.Term, len(x))
		for i, e := range x {
			v, err := ValueOf(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			terms[i] = ast.NewTerm(v)
		}
		return ast.NewArray(terms...), nil
	case map[string]any:
		obj := ast.NewObjectWithCapacity(len(x))
		for k, e := range x {
			v, err := ValueOf(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			obj.Insert(ast.InternedTerm(k), ast.NewTerm(v))
		}
		return obj, nil
	case map[string]string:
		obj := ast.NewObjectWithCapacity(len(x))
		for k, e := range x {
			obj.Insert(ast.InternedTerm(k), ast.InternedTerm(e))
		}
		return obj, nil
	case map[string]int:
		obj := ast.NewObjectWithCapacity(len(x))
		for k, e := range x {
			obj.Insert(ast.InternedTerm(k), ast.InternedTerm(e))
		}
		return obj, nil
	case map[string][]string:
		obj := ast.NewObjectWithCapacity(len(x))
		for k, e := range x {
			v, _ := ValueOf(e)
			obj.Insert(ast.InternedTerm(k), ast.NewTerm(v))
		}
		return obj, nil
	}
	return nil, fmt.Errorf("policies: %T is not a JSON-compatible value", x)
}

func floatValue(f float64) (ast.Value, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("policies: %v is not a JSON number", f)
	}
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return ast.InternedValue(int64(f)), nil
	}
	return ast.Number(strconv.FormatFloat(f, 'g', -1, 64)), nil
}

// astObject writes an ast.Object to a zap encoder as the JSON object it
// stands for (sets as arrays), without reflection.
type astObject struct{ ast.Object }

func (o astObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	return marshalObject(enc, o.Object)
}

// termObject and termArray are astObject for a term holding an object, and
// the array writer: one pointer each, so that handing them to the encoder
// (an interface) does not allocate, nor does walking an array by index.
// A decision log line walks dozens of them.
type (
	termObject struct{ t *ast.Term }
	termArray  struct{ a *ast.Array }
)

func (o termObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	return marshalObject(enc, o.t.Value.(ast.Object))
}

func marshalObject(enc zapcore.ObjectEncoder, o ast.Object) error {
	var err error
	o.Foreach(func(k, v *ast.Term) {
		key, ok := k.Value.(ast.String)
		if !ok {
			key = ast.String(k.Value.String())
		}
		if e := addValue(enc, string(key), v); e != nil && err == nil {
			err = e
		}
	})
	return err
}

func addValue(enc zapcore.ObjectEncoder, key string, t *ast.Term) error {
	switch v := t.Value.(type) {
	case ast.String:
		enc.AddString(key, string(v))
	case ast.Boolean:
		enc.AddBool(key, bool(v))
	case ast.Number:
		if i, ok := v.Int64(); ok {
			enc.AddInt64(key, i)
		} else if f, ok := v.Float64(); ok {
			enc.AddFloat64(key, f)
		} else {
			enc.AddString(key, string(v))
		}
	case ast.Null:
		return enc.AddReflected(key, nil)
	case ast.Object:
		return enc.AddObject(key, termObject{t})
	case *ast.Array:
		return enc.AddArray(key, termArray{v})
	case ast.Set:
		return enc.AddArray(key, astArray{v.Iter})
	default:
		enc.AddString(key, v.String())
	}
	return nil
}

func (a termArray) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for i := range a.a.Len() {
		if err := appendValue(enc, a.a.Elem(i)); err != nil {
			return err
		}
	}
	return nil
}

// astArray writes a set (through its Iter) to a zap encoder.
type astArray struct {
	iter func(func(*ast.Term) error) error
}

func (a astArray) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	return a.iter(func(t *ast.Term) error { return appendValue(enc, t) })
}

func appendValue(enc zapcore.ArrayEncoder, t *ast.Term) error {
	switch v := t.Value.(type) {
	case ast.String:
		enc.AppendString(string(v))
	case ast.Boolean:
		enc.AppendBool(bool(v))
	case ast.Number:
		if i, ok := v.Int64(); ok {
			enc.AppendInt64(i)
		} else if f, ok := v.Float64(); ok {
			enc.AppendFloat64(f)
		} else {
			enc.AppendString(string(v))
		}
	case ast.Null:
		return enc.AppendReflected(nil)
	case ast.Object:
		return enc.AppendObject(termObject{t})
	case *ast.Array:
		return enc.AppendArray(termArray{v})
	case ast.Set:
		return enc.AppendArray(astArray{v.Iter})
	default:
		enc.AppendString(v.String())
	}
	return nil
}

// jsonObject writes a decoded JSON object (the rego result: map[string]any,
// []any, string, bool, json.Number, nil) to a zap encoder without reflection.
type jsonObject map[string]any

func (o jsonObject) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for k, v := range o {
		switch v := v.(type) {
		case string:
			enc.AddString(k, v)
		case bool:
			enc.AddBool(k, v)
		case json.Number:
			if i, err := v.Int64(); err == nil {
				enc.AddInt64(k, i)
			} else if f, err := v.Float64(); err == nil {
				enc.AddFloat64(k, f)
			} else {
				enc.AddString(k, string(v))
			}
		case map[string]any:
			if err := enc.AddObject(k, jsonObject(v)); err != nil {
				return err
			}
		case []any:
			if err := enc.AddArray(k, jsonArray(v)); err != nil {
				return err
			}
		default:
			if err := enc.AddReflected(k, v); err != nil {
				return err
			}
		}
	}
	return nil
}

type jsonArray []any

func (a jsonArray) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, v := range a {
		switch v := v.(type) {
		case string:
			enc.AppendString(v)
		case bool:
			enc.AppendBool(v)
		case json.Number:
			if i, err := v.Int64(); err == nil {
				enc.AppendInt64(i)
			} else if f, err := v.Float64(); err == nil {
				enc.AppendFloat64(f)
			} else {
				enc.AppendString(string(v))
			}
		case map[string]any:
			if err := enc.AppendObject(jsonObject(v)); err != nil {
				return err
			}
		case []any:
			if err := enc.AppendArray(jsonArray(v)); err != nil {
				return err
			}
		default:
			if err := enc.AppendReflected(v); err != nil {
				return err
			}
		}
	}
	return nil
}
