package classify

import (
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/molly-gateway/molly/policies"
)

// Member names of the policy input document (policies/README.md), made
// once and shared by every annotation's PolicyValue.
var (
	termRequest, termCapability, termSovereignty = ast.StringTerm("request"), ast.StringTerm("capability"), ast.StringTerm("sovereignty")

	termEndpoint, termModel, termStream, termTools, termChoices = ast.StringTerm("endpoint"), ast.StringTerm("model"),
		ast.StringTerm("stream"), ast.StringTerm("tools"), ast.StringTerm("choices")

	termTask, termDifficulty, termModalities, termPromptTokens, termMaxTokens = ast.StringTerm("task"), ast.StringTerm("difficulty"),
		ast.StringTerm("modalities"), ast.StringTerm("prompt_tokens"), ast.StringTerm("max_tokens")

	termSensitivity, termDetected, termDeclared, termFindings, termOpaque = ast.StringTerm("sensitivity"), ast.StringTerm("detected"),
		ast.StringTerm("declared"), ast.StringTerm("findings"), ast.StringTerm("opaque")

	termAPI, termStored = ast.StringTerm("api"), ast.StringTerm("stored_conversation")

	termUnscanned, termScanFailed, termResidency, termPath, termReason = ast.StringTerm("unscanned"), ast.StringTerm("scan_failed"),
		ast.StringTerm("residency"), ast.StringTerm("path"), ast.StringTerm("reason")
)

// closedTerms holds the terms of strings from closed sets (endpoints,
// tasks, modalities, classes, finding types): made once and shared by
// every PolicyValue, as OPA shares the terms it interns (ast.InternedTerm,
// which knows only a few common strings and makes a term per call for the
// others). Bounded: past maxClosedTerms strings, a term is made per use.
var closedTerms struct {
	mu sync.RWMutex
	m  map[string]*ast.Term
}

const maxClosedTerms = 1024

// closedTerm returns the shared term of s, a string from a closed set.
func closedTerm(s string) *ast.Term {
	closedTerms.mu.RLock()
	t, ok := closedTerms.m[s]
	closedTerms.mu.RUnlock()
	if ok {
		return t
	}
	t = ast.StringTerm(s)
	closedTerms.mu.Lock()
	if closedTerms.m == nil {
		closedTerms.m = map[string]*ast.Term{}
	}
	if prev, ok := closedTerms.m[s]; ok {
		t = prev
	} else if len(closedTerms.m) < maxClosedTerms {
		closedTerms.m[s] = t
	}
	closedTerms.mu.Unlock()
	return t
}

// PolicyValue is PolicyInput as an ast.Object (policies.ValueSubject):
// the same "request", "capability" and "sovereignty" members, built
// directly as OPA values once per annotation, so a decision converts
// nothing. The object must not be mutated. An annotation that JSON cannot
// hold (a NaN difficulty) gives null, which Decide refuses (fail closed),
// as it refuses PolicyInput's maps then.
func (a *Annotation) PolicyValue() ast.Value {
	a.policyOnce.Do(func() { a.policyValue = a.buildPolicyValue() })
	return a.policyValue
}

func (a *Annotation) buildPolicyValue() ast.Value {
	strs := func(ss []string, term func(string) *ast.Term) *ast.Term {
		terms := make([]*ast.Term, len(ss))
		for i, s := range ss {
			terms[i] = term(s)
		}
		return ast.ArrayTerm(terms...)
	}
	findings := ast.NewObjectWithCapacity(len(a.counts))
	for t, n := range a.counts {
		findings.Insert(closedTerm(t), ast.InternedTerm(n))
	}
	unscanned := make([]*ast.Term, len(a.unscanned))
	for i, u := range a.unscanned {
		unscanned[i] = ast.ObjectTerm(ast.Item(termPath, ast.StringTerm(u.Path)), ast.Item(termReason, ast.StringTerm(u.Reason)))
	}
	// A float as policies.ValueOf writes it (an integral one as an
	// integer), so both paths give the policy the same number.
	diff, err := policies.ValueOf(a.diff)
	if err != nil {
		return ast.Null{}
	}
	return ast.NewObject(
		ast.Item(termRequest, ast.ObjectTerm(
			ast.Item(termEndpoint, closedTerm(string(a.req.Endpoint))),
			ast.Item(termModel, ast.StringTerm(a.req.Model)),
			ast.Item(termStream, ast.InternedTerm(a.req.Stream)),
			ast.Item(termTools, strs(a.req.Tools, ast.InternedTerm[string])),
			ast.Item(termChoices, ast.InternedTerm(a.req.Choices())),
			ast.Item(termAPI, ast.StringTerm(a.api)),
			ast.Item(termStored, ast.InternedTerm(a.stored)),
		)),
		ast.Item(termCapability, ast.ObjectTerm(
			ast.Item(termTask, closedTerm(a.task)),
			ast.Item(termDifficulty, ast.NewTerm(diff)),
			ast.Item(termModalities, strs(a.modal, closedTerm)),
			ast.Item(termPromptTokens, ast.InternedTerm(a.tokens)),
			ast.Item(termMaxTokens, ast.InternedTerm(a.req.MaxTokens)),
			ast.Item(termTools, ast.InternedTerm(a.Tools())),
		)),
		ast.Item(termSovereignty, ast.ObjectTerm(
			ast.Item(termSensitivity, closedTerm(a.Sensitivity().String())),
			ast.Item(termDetected, closedTerm(a.detected.String())),
			ast.Item(termDeclared, closedTerm(a.declared.String())),
			ast.Item(termFindings, ast.NewTerm(findings)),
			ast.Item(termOpaque, ast.InternedTerm(a.Opaque())),
			ast.Item(termUnscanned, ast.ArrayTerm(unscanned...)),
			ast.Item(termScanFailed, ast.InternedTerm(a.failed)),
			ast.Item(termResidency, ast.InternedTerm(a.residency)),
		)),
	)
}

var _ policies.ValueSubject = (*Annotation)(nil)
