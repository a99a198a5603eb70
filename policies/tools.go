package policies

import (
	"context"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"go.uber.org/zap"
)

// ToolDecision is the policy's verdict on one governed-tool call
// (tool_decision) or offer (tool_offer); the zero value denies.
type ToolDecision struct {
	// ID is the decision id (a UUID), in the decision log.
	ID string
	// Revision is the policy revision that decided.
	Revision string
	// Allow is true when the call may run (the tool may be offered).
	Allow bool
	// Code is "" when allowed, else CodePolicyDenied for a policy denial or
	// the fail-closed cause (CodePolicyError, CodePolicyTimeout,
	// CodeClientClosed).
	Code string
	// Reasons explain the verdict.
	Reasons []string
}

// DecideTool evaluates ToolQuery on input (tool, arguments' findings,
// identity, tier, amount; see policies/README.md) and logs the decision.
// Like Decide it never fails: an error, an undefined or malformed result or
// a timeout denies.
func (e *Engine) DecideTool(ctx context.Context, input map[string]any) ToolDecision {
	return e.decideTool(ctx, ToolQuery, "tool", func(r *revision) *rego.PreparedEvalQuery { return &r.tool }, input)
}

// DecideToolOffer evaluates ToolOfferQuery: may the governed tool
// input.tool {name, side_effect} be offered to a model on input.tier, for
// input.identity? Logged like every decision; anything but an allowing
// result does not offer the tool.
func (e *Engine) DecideToolOffer(ctx context.Context, input map[string]any) ToolDecision {
	return e.decideTool(ctx, ToolOfferQuery, "tool offer", func(r *revision) *rego.PreparedEvalQuery { return &r.offer }, input)
}

func (e *Engine) decideTool(ctx context.Context, query, what string, q func(*revision) *rego.PreparedEvalQuery, input map[string]any) ToolDecision {
	rev := e.rev.Load()
	d := ToolDecision{ID: newID(), Revision: rev.id}
	v, err := ValueOf(input)
	if err != nil {
		d.Code, d.Reasons = CodePolicyError, []string{what + " policy input is malformed"}
		e.logDecision(rulePath(query), d.ID, rev.id, astObject{ast.NewObject()}, result{}, nil, err.Error(), nil, zap.Bool("allow", false))
		return d
	}
	obj := v.(ast.Object)
	r := eval(ctx, q(rev), obj, e.opts.Timeout)
	var detail string
	switch r.outcome {
	case evalTimeout:
		d.Code, d.Reasons = CodePolicyTimeout, []string{fmt.Sprintf("%s policy evaluation used more than %s of CPU time", what, e.opts.Timeout)}
	case evalCanceled:
		d.Code, d.Reasons, detail = CodeClientClosed, []string{"the request ended before the " + what + " policy decided"}, r.err.Error()
	case evalError:
		d.Code, d.Reasons, detail = CodePolicyError, []string{what + " policy evaluation failed"}, r.err.Error()
	default:
		if !r.defined {
			d.Code, d.Reasons = CodePolicyError, []string{what + " policy decision is undefined"}
			break
		}
		allow, reasons, err := parseVerdict(r.value, "allow")
		if err != nil {
			d.Code, d.Reasons, detail = CodePolicyError, []string{what + " policy returned a malformed decision"}, err.Error()
			break
		}
		d.Allow, d.Reasons = allow, reasons
		if !allow {
			d.Code = CodePolicyDenied
		}
	}
	e.logDecision(rulePath(query), d.ID, rev.id, astObject{obj}, r, nil, detail, nil, zap.Bool("allow", d.Allow), zap.String("code", d.Code))
	return d
}

// parseVerdict reads {key: bool, "reasons": [strings]}.
func parseVerdict(v any, key string) (bool, []string, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return false, nil, fmt.Errorf("decision is %T, want an object", v)
	}
	b, ok := m[key].(bool)
	if !ok {
		return false, nil, fmt.Errorf("%q is %T, want a boolean", key, m[key])
	}
	reasons, err := stringList(m, "reasons")
	if err != nil {
		return false, nil, err
	}
	return b, reasons, nil
}

// EscalationDecision is escalation.rego's verdict on one cascade attempt;
// the zero value does not escalate.
type EscalationDecision struct {
	ID, Revision string
	// Escalate is true when the cascade should try its next candidate.
	Escalate bool
	Reasons  []string
}

// DecideEscalation evaluates EscalationQuery on input (the attempt, the
// threshold, the remaining candidates; see policies/README.md) and logs the
// decision. An undefined, malformed or failed evaluation (or a timeout)
// does not escalate, and the cascade returns the answer in hand: that is
// the safe side, since escalating only ever moves to another candidate
// inside the tiers the route decision already allowed, so not escalating
// never sends anything anywhere the policy did not allow; it only forgoes
// a possibly better answer.
func (e *Engine) DecideEscalation(ctx context.Context, input map[string]any) EscalationDecision {
	rev := e.rev.Load()
	d := EscalationDecision{ID: newID(), Revision: rev.id}
	path := rulePath(EscalationQuery)
	v, err := ValueOf(input)
	if err != nil {
		d.Reasons = []string{"escalation policy input is malformed; the answer in hand is returned"}
		e.logDecision(path, d.ID, rev.id, astObject{ast.NewObject()}, result{}, nil, err.Error(), nil, zap.Bool("escalate", false))
		return d
	}
	obj := v.(ast.Object)
	r := eval(ctx, &rev.escalate, obj, e.opts.Timeout)
	var detail string
	switch r.outcome {
	case evalTimeout:
		d.Reasons = []string{"escalation policy timed out; the answer in hand is returned"}
	case evalCanceled:
		d.Reasons, detail = []string{"the request ended before the escalation policy decided"}, r.err.Error()
	case evalError:
		d.Reasons, detail = []string{"escalation policy evaluation failed; the answer in hand is returned"}, r.err.Error()
	default:
		if !r.defined {
			d.Reasons = []string{"escalation policy decision is undefined; the answer in hand is returned"}
			break
		}
		esc, reasons, err := parseVerdict(r.value, "escalate")
		if err != nil {
			d.Reasons, detail = []string{"escalation policy returned a malformed decision; the answer in hand is returned"}, err.Error()
			break
		}
		d.Escalate, d.Reasons = esc, reasons
	}
	e.logDecision(path, d.ID, rev.id, astObject{obj}, r, nil, detail, nil, zap.Bool("escalate", d.Escalate))
	return d
}
