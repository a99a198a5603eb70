package policies

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/open-policy-agent/opa/v1/rego"
	"go.uber.org/zap"
)

// Digest binds a decision to the content it judged.
type Digest [32]byte

// Subject is what a route decision judges: the classification of one
// request body.
type Subject interface {
	// Digest is SHA-256 over the body and its classification.
	Digest() Digest
	// PolicyInput is the "request", "capability" and "sovereignty" members
	// of the input document (JSON-compatible values, no request text).
	PolicyInput() map[string]any
}

// Input is everything a route decision is made on.
type Input struct {
	Subject  Subject
	Identity map[string]any // input.identity
	Targets  []any          // input.targets
	// Derived, for a request Molly derives from a client's (a tool round, a
	// cascade step, a subtask), is input.derived: {"kind", "parent":
	// {"decision_id", "sensitivity", "findings"}}; nil otherwise.
	Derived map[string]any
}

// Decided is a decision bound to the Digest of the Subject it judged. Only
// Engine.Decide makes one; the zero value allows nothing.
type Decided struct {
	d      *Decision
	digest Digest
}

// Decide evaluates the route decision for in and binds it to in.Subject's
// digest. It never fails: whatever goes wrong becomes a denial.
func (e *Engine) Decide(ctx context.Context, in Input) Decided {
	input := in.Subject.PolicyInput()
	input["identity"] = in.Identity
	if in.Identity == nil {
		input["identity"] = map[string]any{"member": "anonymous", "scopes": []any{}, "models": []any{}, "tiers": []any{}, "tools": []any{}}
	}
	input["targets"] = in.Targets
	if in.Targets == nil {
		input["targets"] = []any{}
	}
	if in.Derived != nil {
		input["derived"] = in.Derived
	}
	return Decided{d: e.decideMap(ctx, input), digest: in.Subject.Digest()}
}

// Digest is the digest of the subject the decision judged.
func (d Decided) Digest() Digest { return d.digest }

// Binds reports whether the decision judged s (same digest) and exists.
func (d Decided) Binds(s Subject) bool { return d.d != nil && s != nil && s.Digest() == d.digest }

// Decision returns the decision (nil for the zero Decided).
func (d Decided) Decision() *Decision { return d.d }

// Code is the machine code of a denial ("policy_denied" unless the policy
// names one); "" when allowed.
func (d *Decision) Code() string {
	if d.Allowed() {
		return ""
	}
	if d.code != "" {
		return d.code
	}
	return "policy_denied"
}

// Revision is the policy revision that made the decision.
func (d *Decision) Revision() string { return d.revision }

// OutputRule is what to do with entity types a model wrote in an answer.
type OutputRule struct {
	Mask  []string // types replaced by a mask in the answer
	Block []string // types that make the answer refused
}

// Output returns the rule for answers from tier.
func (d *Decision) Output(tier string) OutputRule {
	r := d.output[tier]
	return OutputRule{Mask: slices.Clone(r.Mask), Block: slices.Clone(r.Block)}
}

// EscalationQuery is the cascade's escalation rule (escalation.rego).
const EscalationQuery = "data.molly.policy.escalate"

// EscalationDecision is the policy's verdict on one cascade step.
type EscalationDecision struct {
	ID, Revision string
	Escalate     bool
	Reasons      []string
}

// DecideEscalation evaluates EscalationQuery on input. An error or an
// undefined result does not escalate: the answer in hand is returned, and
// escalation only ever moves within the allowed set anyway.
func (e *Engine) DecideEscalation(ctx context.Context, input map[string]any) EscalationDecision {
	out := EscalationDecision{ID: newID()}
	q, err := e.prepared(ctx, EscalationQuery)
	if err != nil {
		out.Reasons = []string{"escalation policy unavailable"}
		return out
	}
	rs, err := q.Eval(ctx, rego.EvalInput(input))
	if err != nil || len(rs) == 0 || len(rs[0].Expressions) == 0 {
		out.Reasons = []string{"escalation policy undefined"}
		return out
	}
	m, _ := rs[0].Expressions[0].Value.(map[string]any)
	out.Escalate, _ = m["escalate"].(bool)
	if rl, ok := m["reasons"].([]any); ok {
		for _, r := range rl {
			if s, ok := r.(string); ok {
				out.Reasons = append(out.Reasons, s)
			}
		}
	}
	e.log.Info("policy decision", zap.String("decision_id", out.ID), zap.String("path", strings.ReplaceAll(strings.TrimPrefix(EscalationQuery, "data."), ".", "/")),
		zap.Any("input", input), zap.Bool("escalate", out.Escalate), zap.Strings("reasons", out.Reasons))
	return out
}

// ToolOfferQuery decides whether a governed tool may be offered to a
// model on a tier.
const ToolOfferQuery = "data.molly.policy.tool_offer"

// DecideToolOffer evaluates ToolOfferQuery; anything but an allow denies.
func (e *Engine) DecideToolOffer(ctx context.Context, input map[string]any) ToolDecision {
	q, err := e.prepared(ctx, ToolOfferQuery)
	if err != nil {
		return ToolDecision{Reasons: []string{"tool offer policy unavailable"}}
	}
	rs, err := q.Eval(ctx, rego.EvalInput(input))
	if err != nil || len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return ToolDecision{Reasons: []string{"tool offer policy undefined"}}
	}
	m, _ := rs[0].Expressions[0].Value.(map[string]any)
	allow, _ := m["allow"].(bool)
	var reasons []string
	if rl, ok := m["reasons"].([]any); ok {
		for _, r := range rl {
			if s, ok := r.(string); ok {
				reasons = append(reasons, s)
			}
		}
	}
	return ToolDecision{Allow: allow, Reasons: reasons}
}

// prepared returns the prepared query for one of the extra rules.
func (e *Engine) prepared(ctx context.Context, query string) (*rego.PreparedEvalQuery, error) {
	if _, _, err := e.queries(ctx); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.extra == nil {
		e.extra = map[string]*rego.PreparedEvalQuery{}
	}
	if q, ok := e.extra[query+"\x00"+e.print]; ok {
		return q, nil
	}
	var mods map[string]string
	var err error
	if e.opts.Dir == "" {
		mods, err = readModules(Default, ".")
	} else {
		mods, err = readModules(osDirFS(e.opts.Dir), ".")
	}
	if err != nil {
		return nil, err
	}
	q, err := prepare(ctx, query, mods)
	if err != nil {
		return nil, fmt.Errorf("preparing %s: %w", query, err)
	}
	e.extra[query+"\x00"+e.print] = q
	return q, nil
}
