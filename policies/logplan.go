package policies

import (
	"encoding/json"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap/zapcore"
)

// A logPlan is a JSON value prepared once for the decision log: the
// members (or elements) of an object (array) in the order the log writes
// them, numbers already converted to what the encoder is handed. Writing a
// plan calls the encoder exactly as walking the value would (astObject,
// jsonObject), so the encoded line is the same, without walking the ast or
// parsing number literals again. Built for the parts of an input that
// callers convert once (targets, identities, shared subject members) and
// for the results the memo remembers. Immutable once built.
type logPlan struct {
	ops []logOp
}

type logKind uint8

const (
	opString logKind = iota
	opBool
	opInt
	opFloat
	opReflected // AddReflected(val): null, and Go values jsonObject hands to reflection
	opObject
	opArray
)

// logOp is one member (key set) or element (key unused) of a plan.
type logOp struct {
	kind logKind
	b    bool
	key  string
	s    string
	i    int64
	f    float64
	val  any
	sub  *logPlan // opObject, opArray
}

func (p *logPlan) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	for i := range p.ops {
		op := &p.ops[i]
		var err error
		switch op.kind {
		case opString:
			enc.AddString(op.key, op.s)
		case opBool:
			enc.AddBool(op.key, op.b)
		case opInt:
			enc.AddInt64(op.key, op.i)
		case opFloat:
			enc.AddFloat64(op.key, op.f)
		case opReflected:
			err = enc.AddReflected(op.key, op.val)
		case opObject:
			err = enc.AddObject(op.key, op.sub)
		case opArray:
			err = enc.AddArray(op.key, op.sub)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *logPlan) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for i := range p.ops {
		op := &p.ops[i]
		var err error
		switch op.kind {
		case opString:
			enc.AppendString(op.s)
		case opBool:
			enc.AppendBool(op.b)
		case opInt:
			enc.AppendInt64(op.i)
		case opFloat:
			enc.AppendFloat64(op.f)
		case opReflected:
			err = enc.AppendReflected(op.val)
		case opObject:
			err = enc.AppendObject(op.sub)
		case opArray:
			err = enc.AppendArray(op.sub)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// astPlanOp is the op addValue/appendValue would perform for v.
func astPlanOp(key string, v ast.Value) logOp {
	switch v := v.(type) {
	case ast.String:
		return logOp{kind: opString, key: key, s: string(v)}
	case ast.Boolean:
		return logOp{kind: opBool, key: key, b: bool(v)}
	case ast.Number:
		if i, ok := v.Int64(); ok {
			return logOp{kind: opInt, key: key, i: i}
		} else if f, ok := v.Float64(); ok {
			return logOp{kind: opFloat, key: key, f: f}
		}
		return logOp{kind: opString, key: key, s: string(v)}
	case ast.Null:
		return logOp{kind: opReflected, key: key}
	case ast.Object:
		return logOp{kind: opObject, key: key, sub: astObjectPlan(v)}
	case *ast.Array:
		p := &logPlan{ops: make([]logOp, 0, v.Len())}
		for i := range v.Len() {
			p.ops = append(p.ops, astPlanOp("", v.Elem(i).Value))
		}
		return logOp{kind: opArray, key: key, sub: p}
	case ast.Set:
		p := &logPlan{ops: make([]logOp, 0, v.Len())}
		_ = v.Iter(func(t *ast.Term) error {
			p.ops = append(p.ops, astPlanOp("", t.Value))
			return nil
		})
		return logOp{kind: opArray, key: key, sub: p}
	}
	return logOp{kind: opString, key: key, s: v.String()}
}

// astObjectPlan is the plan of o, members in the order marshalObject writes
// them.
func astObjectPlan(o ast.Object) *logPlan {
	p := &logPlan{ops: make([]logOp, 0, o.Len())}
	o.Foreach(func(k, v *ast.Term) {
		key, ok := k.Value.(ast.String)
		if !ok {
			key = ast.String(k.Value.String())
		}
		p.ops = append(p.ops, astPlanOp(string(key), v.Value))
	})
	return p
}

// astValuePlan is the plan of an object or array value: the object is
// written with AddObject, the array with AddArray.
func astValuePlan(v ast.Value) (logOp, bool) {
	switch v.(type) {
	case ast.Object, *ast.Array:
		return astPlanOp("", v), true
	}
	return logOp{}, false
}

// jsonPlanOp is the op jsonObject/jsonArray would perform for v.
func jsonPlanOp(key string, v any) logOp {
	switch v := v.(type) {
	case string:
		return logOp{kind: opString, key: key, s: v}
	case bool:
		return logOp{kind: opBool, key: key, b: v}
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return logOp{kind: opInt, key: key, i: i}
		} else if f, err := v.Float64(); err == nil {
			return logOp{kind: opFloat, key: key, f: f}
		}
		return logOp{kind: opString, key: key, s: string(v)}
	case map[string]any:
		return logOp{kind: opObject, key: key, sub: jsonObjectPlan(v)}
	case []any:
		p := &logPlan{ops: make([]logOp, 0, len(v))}
		for _, e := range v {
			p.ops = append(p.ops, jsonPlanOp("", e))
		}
		return logOp{kind: opArray, key: key, sub: p}
	}
	return logOp{kind: opReflected, key: key, val: v}
}

// jsonObjectPlan is the plan of a decoded JSON object (the rego result),
// members in the order of one iteration of the map, as jsonObject writes
// them.
func jsonObjectPlan(m map[string]any) *logPlan {
	p := &logPlan{ops: make([]logOp, 0, len(m))}
	for k, v := range m {
		p.ops = append(p.ops, jsonPlanOp(k, v))
	}
	return p
}

// planCache remembers the plans of values that callers convert once and
// keep (their identity is their content: they must not be mutated), with
// a term holding the value, shared by every input that holds it. Reads
// take no lock (sync.Map: its keys are written once and read by every
// request). Bounded: when full it starts over.
type planCache[K comparable] struct {
	m sync.Map // K → *cachedPlan
	n atomic.Int64
}

// cachedPlan is a value's term and plan (nil when the value is neither an
// object nor an array).
type cachedPlan struct {
	term *ast.Term
	op   *logOp
}

const maxCachedPlans = 1024

// get returns the term and plan of v under k, building them on a miss.
func (c *planCache[K]) get(k K, v ast.Value) *cachedPlan {
	if p, ok := c.m.Load(k); ok {
		return p.(*cachedPlan)
	}
	p := &cachedPlan{term: ast.NewTerm(v)}
	if o, ok := astValuePlan(v); ok {
		p.op = &o
	}
	if c.n.Add(1) > maxCachedPlans {
		c.m.Clear()
		c.n.Store(1)
	}
	if old, loaded := c.m.LoadOrStore(k, p); loaded {
		return old.(*cachedPlan)
	}
	return p
}
