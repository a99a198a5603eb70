package policies

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
)

// DefaultMemoSize is how many route decisions a revision remembers.
const DefaultMemoSize = 4096

// memo remembers the route decisions of one revision by the parts of the
// input its policy can read, so a request like an earlier one is decided
// without evaluating the policy again. It is sound because a revision is
// immutable (modules and data compiled once) and its policy is a pure
// function of those parts:
//
//   - paths are the ground prefixes of every reference to input in the
//     query and the rules it can reach (input.request.endpoint gives
//     [request endpoint]; input[x], a bare input or a prefix that is not
//     a string gives the part of the path before it, down to the whole
//     input). Two inputs equal at every path cannot be told apart by the
//     policy: anything else it reads would be another reference.
//   - a revision that calls a builtin OPA marks non-deterministic
//     (time.now_ns, http.send, rand.intn, uuid.rfc4122, …) or an unknown
//     one gets no memo.
//
// Equal means identical JSON: numbers by their literal ("3" and "3.0"
// differ, as sprintf would print them), objects by members whatever their
// order (OPA iterates objects in key order). Only evaluations that
// returned a well-formed decision are remembered; errors, timeouts,
// cancellations and undefined results are evaluated again every time.
// When full, it forgets everything (size bounds memory; a revision's
// working set of distinct inputs is small: members × classes × findings).
type memo struct {
	paths  [][]*ast.Term // nil: the whole input; a memo with no paths keys nothing
	member []int         // by path: the input member its first segment names (memberRequest, …); -1: whole input or another name
	size   int

	// hot finds the entry of an input whose members the policy reads are
	// the very terms of an input seen before (callers share the terms of
	// what they convert once: targets, identities, subject members), in
	// a direct-mapped table read without a lock. Sound because a term
	// must not be mutated, so the same term is the same value at every
	// path below it. Not used when a path reads the whole input or a
	// member Decide does not build (hotOn is then false).
	reads [nMembers]bool
	hotOn bool
	seed  maphash.Seed
	hot   [hotSlots]atomic.Pointer[hotEntry]

	mu      sync.Mutex
	entries map[int][]*memoEntry // by key hash
	n       int
}

// hotSlots is the size of memo.hot: more than the distinct member terms
// a revision's traffic holds at once (classes × findings × members).
const hotSlots = 512

// hotEntry is the entry of the input whose read members are terms.
type hotEntry struct {
	terms [nMembers]*ast.Term
	entry *memoEntry
}

// memoEntry is one remembered evaluation.
type memoEntry struct {
	key      []ast.Value // the input's values at memo.paths; nil where absent
	value    any         // the rego result, for the decision log
	result   *logPlan    // value's log plan (nil: value is not an object)
	decision *Decision   // parsed, without id and revision
}

// newMemo analyses the compiled modules and the query; nil when the policy
// may not be memoised (or size < 0).
func newMemo(c *ast.Compiler, query string, size int) *memo {
	if size < 0 {
		return nil
	}
	if size == 0 {
		size = DefaultMemoSize
	}
	body, err := ast.ParseBody(query)
	if err != nil {
		return nil
	}
	paths, ok := inputPaths(append([]any{body}, reachable(c, body)...)...)
	if !ok {
		return nil
	}
	m := &memo{paths: paths, size: size, entries: map[int][]*memoEntry{}, seed: maphash.MakeSeed()}
	hot := true
	for _, p := range paths {
		i := -1
		if len(p) > 0 {
			if s, isStr := p[0].Value.(ast.String); isStr {
				i = slices.Index(memberNames[:], string(s))
			}
		}
		m.member = append(m.member, i)
		if i < 0 {
			hot = false
		} else {
			m.reads[i] = true
		}
	}
	m.hotOn = hot && len(paths) > 0
	return m
}

// reachable returns the rules the query body may evaluate: those its data
// references select, and everything they depend on in the compiler's
// dependency graph (which holds dynamic references too), else branches
// included. Rules only other queries use (tool decisions, escalation) are
// left out, so what they read does not key route decisions.
func reachable(c *ast.Compiler, body ast.Body) []any {
	seen := map[*ast.Rule]bool{}
	var todo []*ast.Rule
	add := func(r *ast.Rule) {
		for ; r != nil; r = r.Else {
			if !seen[r] {
				seen[r] = true
				todo = append(todo, r)
			}
		}
	}
	ast.WalkRefs(body, func(r ast.Ref) bool {
		if r.HasPrefix(ast.DefaultRootRef) {
			for _, rule := range c.GetRulesDynamicWithOpts(r, ast.RulesOptions{IncludeHiddenModules: true}) {
				add(rule)
			}
		}
		return false
	})
	for len(todo) > 0 {
		r := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		for dep := range c.Graph.Dependencies(r) {
			if rule, isRule := dep.(*ast.Rule); isRule {
				add(rule)
			}
		}
	}
	out := make([]any, 0, len(seen))
	for r := range seen {
		out = append(out, r)
	}
	return out
}

// inputPaths collects the ground prefixes of the references to input in
// nodes, reduced to the shortest (a prefix covers its extensions); ok is
// false when a call is to a non-deterministic or unknown builtin.
func inputPaths(nodes ...any) (paths [][]*ast.Term, ok bool) {
	ok = true
	var found [][]*ast.Term
	whole := false
	var vis *ast.GenericVisitor
	vis = ast.NewGenericVisitor(func(x any) bool {
		switch x := x.(type) {
		case *ast.Head:
			// A rule's reference head (p.q[input.x] := …) is not walked by
			// the visitor; its terms may read input.
			for _, t := range x.Reference {
				vis.Walk(t)
			}
		case ast.Ref:
			start := 0
			if x.HasPrefix(ast.InputRootRef) {
				p := []*ast.Term{}
				for _, t := range x[1:] {
					if _, isStr := t.Value.(ast.String); !isStr {
						break
					}
					p = append(p, t)
				}
				found = append(found, p)
				start = 1
			} else if _, isVar := x[0].Value.(ast.Var); isVar {
				start = 1 // data, or a local variable
			}
			for _, t := range x[start:] {
				vis.Walk(t)
			}
			return true
		case ast.Var:
			if x.Equal(ast.InputRootDocument.Value) { // input itself, not as a reference's head
				whole = true
			}
		case ast.Call:
			if !deterministic(x[0]) {
				ok = false
			}
		case *ast.Expr:
			if x.IsCall() && !deterministic(x.Operator()) {
				ok = false
			}
		}
		return false
	})
	for _, n := range nodes {
		vis.Walk(n)
	}
	if whole {
		return [][]*ast.Term{nil}, ok
	}
	slices.SortFunc(found, func(a, b []*ast.Term) int { return len(a) - len(b) })
	for _, p := range found {
		covered := false
		for _, q := range paths {
			if len(q) <= len(p) && ast.Ref(q).Equal(ast.Ref(p[:len(q)])) {
				covered = true
				break
			}
		}
		if !covered {
			paths = append(paths, p)
		}
	}
	return paths, ok
}

// deterministic reports whether a call to op gives the same result for the
// same arguments: a Rego function (its body is analysed too) or a builtin
// OPA does not mark non-deterministic.
func deterministic(op any) bool {
	var ref ast.Ref
	switch op := op.(type) {
	case ast.Ref:
		ref = op
	case *ast.Term:
		r, isRef := op.Value.(ast.Ref)
		if !isRef {
			return false
		}
		ref = r
	default:
		return false
	}
	if ref.HasPrefix(ast.DefaultRootRef) {
		return true
	}
	b, known := ast.BuiltinMap[ref.String()]
	return known && !b.Nondeterministic
}

// hotKey is doc's terms of the members the memo reads (nil for the
// others), and the slot of memo.hot it maps to; ok is false when hot is
// not used for doc.
func (m *memo) hotKey(doc *routeDoc) (k [nMembers]*ast.Term, slot *atomic.Pointer[hotEntry], ok bool) {
	if doc.whole || !m.hotOn {
		return k, nil, false
	}
	for i, t := range doc.terms {
		if m.reads[i] {
			k[i] = t
		}
	}
	return k, &m.hot[maphash.Comparable(m.seed, k)%hotSlots], true
}

// key returns doc's values at the memo's paths and their hash.
func (m *memo) key(doc *routeDoc) ([]ast.Value, int) {
	key := make([]ast.Value, len(m.paths))
	h := len(m.paths)
	for i, p := range m.paths {
		var v ast.Value
		if mi := m.member[i]; mi >= 0 && !doc.whole {
			if t := doc.terms[mi]; t != nil {
				v = valueAt(t.Value, p[1:])
			}
		} else {
			v = valueAt(doc.object(), p)
		}
		key[i] = v
		h *= 31
		if v != nil {
			h += v.Hash()
		}
	}
	return key, h
}

// valueAt is v's value at path; nil where absent.
func valueAt(v ast.Value, path []*ast.Term) ast.Value {
	for _, seg := range path {
		obj, isObj := v.(ast.Object)
		if !isObj {
			return nil
		}
		t := obj.Get(seg)
		if t == nil {
			return nil
		}
		v = t.Value
	}
	return v
}

// get returns the entry remembered for key, or nil.
func (m *memo) get(key []ast.Value, h int) *memoEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries[h] {
		if sameKey(e.key, key) {
			return e
		}
	}
	return nil
}

// put remembers an evaluation; it returns the entry remembered for key
// (an earlier one when another evaluation put it first).
func (m *memo) put(key []ast.Value, h int, value any, plan *logPlan, d *Decision) *memoEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range m.entries[h] {
		if sameKey(e.key, key) {
			return e
		}
	}
	if m.n >= m.size {
		clear(m.entries)
		m.n = 0
		for i := range m.hot {
			m.hot[i].Store(nil)
		}
	}
	e := &memoEntry{key: key, value: value, result: plan, decision: d}
	m.entries[h] = append(m.entries[h], e)
	m.n++
	return e
}

func sameKey(a, b []ast.Value) bool {
	for i := range a {
		if (a[i] == nil) != (b[i] == nil) || a[i] != nil && !identical(a[i], b[i]) {
			return false
		}
	}
	return true
}

// identical reports whether a and b are the same JSON value: same types,
// numbers with the same literal, objects with the same members (in any
// order), arrays and sets element by element.
func identical(a, b ast.Value) bool {
	switch a := a.(type) {
	case ast.String:
		bs, is := b.(ast.String)
		return is && a == bs
	case ast.Number:
		bn, is := b.(ast.Number)
		return is && a == bn
	case ast.Boolean:
		bb, is := b.(ast.Boolean)
		return is && a == bb
	case ast.Null:
		_, is := b.(ast.Null)
		return is
	case *ast.Array:
		ba, is := b.(*ast.Array)
		if !is || a.Len() != ba.Len() {
			return false
		}
		if a == ba { // the same value, e.g. targets converted once
			return true
		}
		for i := range a.Len() {
			if !identical(a.Elem(i).Value, ba.Elem(i).Value) {
				return false
			}
		}
		return true
	case ast.Object:
		bo, is := b.(ast.Object)
		if !is || a.Len() != bo.Len() {
			return false
		}
		if a == bo {
			return true
		}
		same := true
		a.Until(func(k, v *ast.Term) bool {
			// JSON member names are strings; any other key is not
			// compared (no hit, never a wrong one).
			_, isStr := k.Value.(ast.String)
			bv := bo.Get(k)
			same = isStr && bv != nil && identical(v.Value, bv.Value)
			return !same
		})
		return same
	case ast.Set:
		bs, is := b.(ast.Set)
		if !is || a.Len() != bs.Len() {
			return false
		}
		as, bl := a.Sorted(), bs.Sorted()
		return identical(as, bl)
	}
	return false // anything else (refs, vars, comprehensions) is not input
}
