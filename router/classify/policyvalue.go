package classify

import (
	"encoding/binary"
	"slices"
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
	a.valueOnce.Do(func() {
		a.policyOnce.Do(a.buildPolicyValue)
		if a.policyMembers[0] == nil {
			a.policyValue = ast.Null{}
			return
		}
		a.policyValue = ast.NewObject(
			ast.Item(termRequest, a.policyMembers[0]),
			ast.Item(termCapability, a.policyMembers[1]),
			ast.Item(termSovereignty, a.policyMembers[2]),
		)
	})
	return a.policyValue
}

// PolicyMembers returns PolicyValue's "request", "capability" and
// "sovereignty" members (policies.MemberSubject), so the route decision's
// input holds them without PolicyValue's own object; all three nil where
// PolicyValue is null. The terms must not be mutated: the request and
// sovereignty members are shared by annotations equal in them (see
// termCache).
func (a *Annotation) PolicyMembers() (request, capability, sovereignty *ast.Term) {
	a.policyOnce.Do(a.buildPolicyValue)
	return a.policyMembers[0], a.policyMembers[1], a.policyMembers[2]
}

func (a *Annotation) buildPolicyValue() {
	// A float as policies.ValueOf writes it (an integral one as an
	// integer), so both paths give the policy the same number.
	diff, err := policies.ValueOf(a.diff)
	if err != nil {
		return // no members: PolicyValue is null
	}
	capability := ast.ObjectTerm(
		ast.Item(termTask, closedTerm(a.task)),
		ast.Item(termDifficulty, ast.NewTerm(diff)),
		ast.Item(termModalities, strsTerm(a.modal, closedTerm)),
		ast.Item(termPromptTokens, ast.InternedTerm(a.tokens)),
		ast.Item(termMaxTokens, ast.InternedTerm(a.req.MaxTokens)),
		ast.Item(termTools, ast.InternedTerm(a.Tools())),
	)
	a.policyMembers = [3]*ast.Term{a.requestTerm(), capability, a.sovereigntyTerm()}
}

// strsTerm is the array of the terms of ss.
func strsTerm(ss []string, term func(string) *ast.Term) *ast.Term {
	terms := make([]*ast.Term, len(ss))
	for i, s := range ss {
		terms[i] = term(s)
	}
	return ast.ArrayTerm(terms...)
}

// requestTerm is the "request" member, shared by annotations equal in it.
func (a *Annotation) requestTerm() *ast.Term {
	var buf [256]byte
	k := appendKeyString(buf[:0], string(a.req.Endpoint))
	k = appendKeyString(k, a.req.Model)
	k = appendKeyString(k, a.api)
	k = appendKeyInt(k, a.req.Choices())
	k = appendKeyBool(k, a.req.Stream)
	k = appendKeyBool(k, a.stored)
	for _, t := range a.req.Tools {
		k = appendKeyString(k, t)
	}
	return requestTerms.get(k, func() *ast.Term {
		return ast.ObjectTerm(
			ast.Item(termEndpoint, closedTerm(string(a.req.Endpoint))),
			ast.Item(termModel, ast.StringTerm(a.req.Model)),
			ast.Item(termStream, ast.InternedTerm(a.req.Stream)),
			ast.Item(termTools, strsTerm(a.req.Tools, ast.InternedTerm[string])),
			ast.Item(termChoices, ast.InternedTerm(a.req.Choices())),
			ast.Item(termAPI, ast.StringTerm(a.api)),
			ast.Item(termStored, ast.InternedTerm(a.stored)),
		)
	})
}

// sovereigntyTerm is the "sovereignty" member, shared by annotations
// equal in it; one with unscanned parts (their paths vary) gets its own.
func (a *Annotation) sovereigntyTerm() *ast.Term {
	build := func() *ast.Term {
		findings := ast.NewObjectWithCapacity(len(a.counts))
		for t, n := range a.counts {
			findings.Insert(closedTerm(t), ast.InternedTerm(n))
		}
		unscanned := make([]*ast.Term, len(a.unscanned))
		for i, u := range a.unscanned {
			unscanned[i] = ast.ObjectTerm(ast.Item(termPath, ast.StringTerm(u.Path)), ast.Item(termReason, ast.StringTerm(u.Reason)))
		}
		return ast.ObjectTerm(
			ast.Item(termSensitivity, closedTerm(a.Sensitivity().String())),
			ast.Item(termDetected, closedTerm(a.detected.String())),
			ast.Item(termDeclared, closedTerm(a.declared.String())),
			ast.Item(termFindings, ast.NewTerm(findings)),
			ast.Item(termOpaque, ast.InternedTerm(a.Opaque())),
			ast.Item(termUnscanned, ast.ArrayTerm(unscanned...)),
			ast.Item(termScanFailed, ast.InternedTerm(a.failed)),
			ast.Item(termResidency, ast.InternedTerm(a.residency)),
		)
	}
	if len(a.unscanned) > 0 || len(a.counts) > 8 {
		return build()
	}
	var buf [256]byte
	k := appendKeyString(buf[:0], a.Sensitivity().String())
	k = appendKeyString(k, a.detected.String())
	k = appendKeyString(k, a.declared.String())
	k = appendKeyString(k, a.residency)
	k = appendKeyBool(k, a.Opaque())
	k = appendKeyBool(k, a.failed)
	// The findings in type order, so equal counts give one key.
	var types [8]string
	ts := types[:0]
	for t := range a.counts {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	for _, t := range ts {
		k = appendKeyString(k, t)
		k = appendKeyInt(k, a.counts[t])
	}
	return sovereigntyTerms.get(k, build)
}

// Keys of the member caches: each field length-prefixed, so no two
// different members share a key.
func appendKeyString(k []byte, s string) []byte {
	return append(binary.AppendUvarint(k, uint64(len(s))), s...)
}

func appendKeyInt(k []byte, n int) []byte { return binary.AppendVarint(k, int64(n)) }

func appendKeyBool(k []byte, b bool) []byte {
	if b {
		return append(k, 1)
	}
	return append(k, 0)
}

// termCache holds policy input members by key, so that requests alike
// share one immutable term instead of building a handful of OPA objects
// (a Go map each) per request. Bounded: when full it forgets everything
// (a gateway's working set is small: models × endpoints, classes ×
// finding counts).
type termCache struct {
	mu sync.RWMutex
	m  map[string]*ast.Term
}

const maxCachedMembers = 1024

var requestTerms, sovereigntyTerms termCache

// get returns the term of key k, built with build when absent.
func (c *termCache) get(k []byte, build func() *ast.Term) *ast.Term {
	c.mu.RLock()
	t, ok := c.m[string(k)]
	c.mu.RUnlock()
	if ok {
		return t
	}
	t = build()
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCachedMembers {
		c.m = make(map[string]*ast.Term)
	}
	if prev, ok := c.m[string(k)]; ok {
		t = prev
	} else {
		c.m[string(k)] = t
	}
	c.mu.Unlock()
	return t
}

var (
	_ policies.ValueSubject  = (*Annotation)(nil)
	_ policies.MemberSubject = (*Annotation)(nil)
)
