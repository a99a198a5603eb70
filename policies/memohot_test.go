package policies

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// sharedTerms converts route inputs as the pipeline passes them: subject
// members, identities and targets converted once, and a member equal to
// one converted before is that very term (classify's term caches,
// identity.PolicyValue, Catalogue.PolicyTargets), so memo.hot applies.
type sharedTerms struct {
	t     *testing.T
	terms map[string]*ast.Term
	vals  map[string]ast.Value
}

func (s *sharedTerms) term(x any) *ast.Term {
	b, _ := json.Marshal(x)
	if t, ok := s.terms[string(b)]; ok {
		return t
	}
	v, err := ValueOf(x)
	if err != nil {
		s.t.Fatal(err)
	}
	t := ast.NewTerm(v)
	s.terms[string(b)] = t
	return t
}

func (s *sharedTerms) value(x any) ast.Value {
	b, _ := json.Marshal(x)
	if v, ok := s.vals[string(b)]; ok {
		return v
	}
	v, err := ValueOf(x)
	if err != nil {
		s.t.Fatal(err)
	}
	s.vals[string(b)] = v
	return v
}

func (s *sharedTerms) input(in Input) Input {
	m := in.Subject.PolicyInput()
	v, err := ValueOf(m)
	if err != nil {
		s.t.Fatal(err)
	}
	ms := memberSubject{valueSubject: valueSubject{subject: newSubject(m), v: v},
		req: s.term(m["request"]), capability: ast.NewTerm(v.(ast.Object).Get(keyCapability).Value), sov: s.term(m["sovereignty"])}
	out := Input{Subject: ms, Identity: s.value(in.Identity), Derived: in.Derived}
	for _, tg := range in.Targets {
		out.Targets = append(out.Targets, s.value(tg))
	}
	return out
}

// Decisions found by the members' terms (memo.hot) are the ones the
// policy evaluates, over every kind of route input, with the memo large
// enough to hold them and with one that keeps forgetting them.
func TestDecisionsFoundByTheirTermsAreTheEvaluatedOnes(t *testing.T) {
	ctx := context.Background()
	fresh, err := New(ctx, Options{MemoSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	s := &sharedTerms{t: t, terms: map[string]*ast.Term{}, vals: map[string]ast.Value{}}
	var corpus []Input
	for _, in := range memoCorpus() {
		corpus = append(corpus, s.input(in))
	}
	for _, size := range []int{0, 3} {
		core, logs := observer.New(zap.InfoLevel)
		memo, err := New(ctx, Options{Logger: zap.New(core), MemoSize: size})
		if err != nil {
			t.Fatal(err)
		}
		if m := memo.rev.Load().memo; m == nil || !m.hotOn {
			t.Fatal("the default policy's memo should find decisions by their members' terms")
		}
		for round := range 3 {
			for i, in := range corpus {
				got, want := memo.Decide(ctx, in).Decision(), fresh.Decide(ctx, in).Decision()
				if !reflect.DeepEqual(decisionView(got), decisionView(want)) {
					t.Fatalf("size %d round %d input %d: memoised decision\n%v\nevaluated\n%v", size, round, i, decisionView(got), decisionView(want))
				}
			}
		}
		if hits := logs.FilterField(zap.Bool("memoized", true)).Len(); size == 0 && hits < 2*len(corpus) {
			t.Fatalf("%d memoised decisions over three rounds of %d inputs", hits, len(corpus))
		}
	}
}

// A policy that reads the capability keys its decisions by it: inputs
// sharing every other member's term are told apart by it.
func TestTermsTheMemoDoesNotCompareAreNotAssumedEqual(t *testing.T) {
	memo, fresh := memoEngines(t, `package molly.policy
import rego.v1
decision := {"allow": true, "tiers": ["T0"], "reasons": [sprintf("%v %v", [input.capability.task, input.sovereignty.sensitivity])]}
`)
	s := &sharedTerms{t: t, terms: map[string]*ast.Term{}, vals: map[string]ast.Value{}}
	var ins []Input
	for _, task := range []string{"chat", "code", "chat"} {
		m := members("public", map[string]any{})
		m["capability"].(map[string]any)["task"] = task
		ins = append(ins, s.input(Input{Subject: newSubject(m)}))
	}
	sameDecisions(t, memo, fresh, ins...)
	if got := memo.Decide(context.Background(), ins[1]).Decision().Reasons(); !reflect.DeepEqual(got, []string{"code public"}) {
		t.Fatalf("reasons %v, want [code public]", got)
	}
}

// The members of a route input are logged (and keyed) in the order an
// ast.Object holding them iterates.
func TestRouteMembersAreInTheObjectsOrder(t *testing.T) {
	obj := ast.NewObject()
	for _, k := range []*ast.Term{keyTargets, keyRequest, keyDerived, keyIdentity, keySovereignty, keyCapability} {
		obj.Insert(k, ast.NullTerm())
	}
	var got []string
	obj.Foreach(func(k, _ *ast.Term) { got = append(got, string(k.Value.(ast.String))) })
	if !reflect.DeepEqual(got, memberNames[:]) {
		t.Fatalf("ast.Object iterates %v, memberNames is %v", got, memberNames)
	}
}

// A decision found by its members' terms allocates the decision (with its
// input document) and its id, nothing else, when nothing is logged.
func TestARememberedDecisionAllocatesLittle(t *testing.T) {
	ctx := context.Background()
	e := defaultEngine(t)
	s := &sharedTerms{t: t, terms: map[string]*ast.Term{}, vals: map[string]ast.Value{}}
	m, id, targets := typical()
	in := s.input(Input{Subject: newSubject(m), Identity: id, Targets: targets})
	if !e.Decide(ctx, in).Decision().Allowed() {
		t.Fatal("denied")
	}
	if n := testing.AllocsPerRun(100, func() { e.Decide(ctx, in) }); n > 2 {
		t.Fatalf("%v allocations per remembered decision, want at most 2", n)
	}
}
