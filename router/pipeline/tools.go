package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// Governed tools: tools the gateway itself offers to models and runs, under
// policy, on the caller's behalf. This package only sees them through
// ToolRunner; the Caddy app implements it with plugins.Manager.

// ToolSpec describes one governed tool, as offered to a model.
type ToolSpec struct {
	Name        string
	Description string
	Parameters  json.RawMessage // JSON Schema of the arguments
	SideEffect  string          // "read", "write" or "money"
	Result      json.RawMessage // JSON Schema of the result (not offered to models)
}

// ToolRunner runs governed tools. Invoke returns the result JSON, or an
// error (a *ToolError is shown to the model with its code; any other error
// as "internal").
type ToolRunner interface {
	Tools() []ToolSpec
	Invoke(ctx context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error)
}

// ToolError is a failed tool invocation as the model sees it.
type ToolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *ToolError) Error() string { return "tool error " + e.Code + ": " + e.Message }

// offered returns the governed tools the policy lets the gateway offer to
// a model on tier for rq's caller (policies/tools.rego, tool_offer), by name.
func (p *Pipeline) offered(ctx context.Context, id *identity.Identity, tier string) map[string]ToolSpec {
	out := map[string]ToolSpec{}
	if p.Tools == nil {
		return out
	}
	for _, s := range p.Tools.Tools() {
		if slices.Contains(p.ToolsHidden, s.Name) {
			continue
		}
		d := p.Policy.DecideToolOffer(ctx, map[string]any{
			"tool":     map[string]any{"name": s.Name, "side_effect": s.SideEffect},
			"identity": id.PolicyInput(),
			"tier":     tier,
		})
		if d.Allow {
			out[s.Name] = s
		}
	}
	return out
}

// withTools adds the specs to body as OpenAI function tools, by name.
func withTools(body []byte, specs map[string]ToolSpec) ([]byte, error) {
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	sort.Strings(names)
	tools := make([]any, 0, len(names))
	for _, n := range names {
		s := specs[n]
		params := s.Parameters
		if len(params) == 0 || !json.Valid(params) {
			params = json.RawMessage(`{"type":"object"}`)
		}
		tools = append(tools, map[string]any{"type": "function",
			"function": map[string]any{"name": s.Name, "description": s.Description, "parameters": params}})
	}
	return sjson.SetBytes(body, "tools", tools)
}

// withoutTools removes the tools named in specs from body's tools, and
// tools and tool_choice themselves when none is left (OpenAI refuses a
// tool_choice without tools).
func withoutTools(body []byte, specs map[string]ToolSpec) ([]byte, error) {
	var keep []json.RawMessage
	gjson.GetBytes(body, "tools").ForEach(func(_, tl gjson.Result) bool {
		if _, governed := specs[tl.Get("function.name").Str]; !governed {
			keep = append(keep, json.RawMessage(tl.Raw))
		}
		return true
	})
	if len(keep) > 0 {
		return sjson.SetBytes(body, "tools", keep)
	}
	body, err := sjson.DeleteBytes(body, "tools")
	if err != nil {
		return nil, err
	}
	return sjson.DeleteBytes(body, "tool_choice")
}

// toolLoop answers a chat request with the governed tools the policy lets
// the gateway offer to each candidate's tier: each answer whose tool calls
// all name offered tools has them run (policy first) and their results
// appended, and the same target is asked again, at most Steps rounds. Every
// round is a request derived from the client's: classified and decided
// again (input.derived.kind "tool_round"), so the tier's redaction applies
// to tool results as to the client's text, and a result that raises the
// class stops the conversation (tool_result_too_sensitive). Only the first
// round falls back to the next candidate: once a tool has run, the
// conversation stays with the model that asked for it. A request bounding
// its built-in tool calls (openai.MaxToolCalls, the Responses API's
// max_tool_calls) has at most that many run: a call past it is answered
// {"error": {"code": "max_tool_calls", …}} without running, and once the
// bound is spent the next round offers no governed tool; a bound of 0
// offers none.
func (p *Pipeline) toolLoop(rq *request) error {
	steps := p.Strategies.Steps()
	limit, bounded := openai.MaxToolCalls(rq.ctx)
	for _, c := range rq.plan.Candidates {
		specs := p.offered(rq.ctx, rq.id, c.Target.Tier)
		if !c.Target.Supports(route.CapTools) || bounded && limit == 0 {
			specs = nil // a target without tools (or a request allowing no calls) is not offered any
		}
		if len(specs) == 0 { // nothing may be offered to this tier (or target): a plain attempt
			o := p.send(rq, c, 0)
			if o.kind == failClientGone {
				return p.clientGone(rq, &o)
			}
			if !o.ok() {
				rq.note(o)
				continue
			}
			return p.respond(rq, &o, "")
		}
		body, err := withTools([]byte(rq.a.Body()), specs)
		if err != nil {
			return fmt.Errorf("offering tools: %w", err)
		}
		var rounds spentWorst // the worst case of the rounds sent on c
		ran := 0              // governed calls run on c, for max_tool_calls
		for round := 0; ; round++ {
			a, d, err := p.derive(rq.ctx, rq, "tool_round", body)
			if err != nil {
				return fmt.Errorf("classifying the tool conversation: %w", err)
			}
			dec := d.Decision()
			if !dec.Allowed() {
				rq.log.Warn("the policy stopped the tool conversation", zap.String("decision_id", rq.dec.ID()), zap.String("round_decision_id", dec.ID()),
					zap.String("code", dec.Code()), zap.Strings("reasons", dec.Reasons()))
				return PolicyError(dec)
			}
			disp, err := p.Egress.NewDispatch(d, a, c)
			if err != nil {
				if round > 0 {
					return noTarget("The tool conversation could not continue on `"+c.Target.Name+"`", nil, []failed{{target: c.Target.Name, err: err.Error()}})
				}
				rq.note(outcome{cand: c, kind: failRefused, failure: err.Error()})
				break
			}
			if err := p.holdRound(rq, &rounds, a, c); err != nil {
				return err
			}
			o := p.attempt(rq, c, disp, a.PromptTokens(), 0)
			if o.kind == failClientGone {
				return p.clientGone(rq, &o)
			}
			if !o.ok() {
				if round > 0 {
					return noTarget("The tool conversation could not continue on `"+c.Target.Name+"`", nil, []failed{{target: c.Target.Name, err: o.failure}})
				}
				rq.note(o)
				break
			}
			out := o.body
			if v := disp.Vault(); v != nil {
				out = relay.RestoreBody(v, out)
			}
			calls := gjson.GetBytes(out, "choices.0.message.tool_calls").Array()
			if o.status/100 != 2 || len(calls) == 0 || !allGoverned(calls, specs) {
				return p.respond(rq, &o, "")
			}
			if round >= steps {
				rq.log.Warn("tool step limit reached", zap.String("decision_id", rq.dec.ID()), zap.String("target", c.Target.Name), zap.Int("tool_steps", steps))
				return &openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "tool_steps_exceeded",
					Message: fmt.Sprintf("The model kept calling tools after %d rounds; no answer was produced.", steps)}
			}
			msg := gjson.GetBytes(out, "choices.0.message")
			assistant := map[string]any{"role": "assistant", "content": nil, "tool_calls": json.RawMessage(msg.Get("tool_calls").Raw)}
			if s := msg.Get("content"); s.Type == gjson.String {
				assistant["content"] = s.Str
			}
			if body, err = sjson.SetBytes(body, "messages.-1", assistant); err != nil {
				return fmt.Errorf("appending the tool calls: %w", err)
			}
			for _, call := range calls {
				var result []byte
				if bounded && ran >= limit {
					// Past max_tool_calls: the call is ignored, and the model told so.
					result, _ = json.Marshal(map[string]any{"error": &ToolError{Code: "max_tool_calls",
						Message: fmt.Sprintf("not run: this response's max_tool_calls (%d) is spent", limit)}})
				} else {
					result = p.runTool(rq, c, specs[call.Get("function.name").Str], call, a.Classifier())
					ran++
				}
				tm := map[string]any{"role": "tool", "tool_call_id": call.Get("id").Str, "content": string(result)}
				if body, err = sjson.SetBytes(body, "messages.-1", tm); err != nil {
					return fmt.Errorf("appending a tool result: %w", err)
				}
			}
			if bounded && ran >= limit {
				// Spent: the next round offers the model no governed tool, so it answers.
				if body, err = withoutTools(body, specs); err != nil {
					return fmt.Errorf("withdrawing the tools: %w", err)
				}
			}
		}
	}
	return noTarget("All allowed targets for model `"+rq.a.Model()+"` failed", rq.plan.Excluded, rq.tried)
}

// PolicyError is the 403 of a denying decision: its code, and its reasons
// in the message (OpenAI clients show the message).
func PolicyError(d *policies.Decision) *openai.Error {
	reasons := d.Reasons()
	msg := "The request was denied by policy"
	if len(reasons) > 0 {
		msg += ": " + strings.Join(reasons, "; ")
	}
	return &openai.Error{Status: http.StatusForbidden, Type: "policy_denied", Code: d.Code(), Message: msg + ".",
		Extra: map[string]any{"reasons": reasons, "decision_id": d.ID()}}
}

// allGoverned reports whether every call names a governed tool in specs.
func allGoverned(calls []gjson.Result, specs map[string]ToolSpec) bool {
	for _, c := range calls {
		if _, ok := specs[c.Get("function.name").Str]; !ok || c.Get("type").Str != "function" && c.Get("type").Exists() {
			return false
		}
	}
	return true
}

// argFindings classifies text (tool arguments or results) and returns the
// finding counts by type and the sensitivity: what policy and audit see,
// never the values.
func argFindings(cl *classify.Classifier, text string) (map[string]any, string) {
	body, _ := json.Marshal(map[string]any{"model": "tool", "messages": []any{map[string]any{"role": "user", "content": text}}})
	a, err := cl.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: body})
	if err != nil || a.ScanFailed() {
		return map[string]any{}, classify.Restricted.String()
	}
	out := map[string]any{}
	for t, n := range a.Findings() {
		out[t] = n
	}
	s := a.Sensitivity()
	if a.Opaque() {
		s = max(s, classify.Confidential)
	}
	return out, s.String()
}

// runTool decides and runs one tool call and returns the content of its
// tool message: the result, or {"error": {code, message}} for a policy
// denial, a failed invocation or a result over the size bound.
func (p *Pipeline) runTool(rq *request, c route.Candidate, spec ToolSpec, call gjson.Result, cl *classify.Classifier) []byte {
	callID := call.Get("id").Str
	res, _, te := p.callTool(rq.ctx, rq.log, rq.dec.ID(), callID, c.Target.Name, c.Target.Tier, rq.id, spec, call.Get("function.arguments").Str, rq.dec.ID()+":"+callID, cl)
	if te == nil && capability.BoundTokens(string(res)) > p.Strategies.ResultTokens() { // at its bound, as the plan reserved it
		te = &ToolError{Code: "result_too_large", Message: fmt.Sprintf("the tool result is over %d tokens", p.Strategies.ResultTokens())}
	}
	if te != nil {
		b, _ := json.Marshal(map[string]any{"error": te})
		return b
	}
	return res
}

// DirectTier is the tier the tool policy sees for a direct call (CallTool):
// no model asked for it, the client did, so it counts as the gateway's own
// tier.
const DirectTier = "T0"

// DirectTarget is the target named in the audit line of a direct call.
const DirectTarget = "direct"

// CallTool decides and runs a call a client makes directly (the admin
// API), outside any conversation: the policy sees tier DirectTier, the
// idempotency key is the client's, and the audit line is the tool loop's
// (decision_id empty, tool_call_id the key, target DirectTarget). It
// returns the result, or a *ToolError: "not_found" for a tool that is not
// configured, "permission_denied" with the policy's reasons, the tool's own
// code otherwise.
func (p *Pipeline) CallTool(ctx context.Context, cl *classify.Classifier, id *identity.Identity, name string, args []byte, key string) ([]byte, []string, *ToolError) {
	if p.Tools == nil {
		return nil, nil, &ToolError{Code: "not_found", Message: "no governed tools are configured"}
	}
	var spec ToolSpec
	for _, s := range p.Tools.Tools() {
		if s.Name == name {
			spec = s
		}
	}
	if spec.Name == "" {
		return nil, nil, &ToolError{Code: "not_found", Message: fmt.Sprintf("no tool %q is configured", name)}
	}
	return p.callTool(ctx, p.log(), "", key, DirectTarget, DirectTier, id, spec, string(args), key, cl)
}

// callTool is runTool and CallTool: policy, invocation, one audit line.
// reasons are the policy's when it denied.
func (p *Pipeline) callTool(ctx context.Context, log *zap.Logger, decisionID, callID, target, tier string, id *identity.Identity, spec ToolSpec, args, key string, cl *classify.Classifier) (res []byte, reasons []string, te *ToolError) {
	ctx, span := startTool(ctx, spec.Name, callID, target, tier)
	defer func() { endTool(span, te) }()
	start := time.Now()
	member, scopes := id.Name(), id.Scopes()
	argTypes, argClass := argFindings(cl, args)
	input := map[string]any{
		"tool":      map[string]any{"name": spec.Name, "side_effect": spec.SideEffect},
		"arguments": map[string]any{"findings": argTypes, "sensitivity": argClass},
		"identity":  id.PolicyInput(),
		"tier":      tier,
	}
	if spec.SideEffect == "money" && gjson.Valid(args) {
		if v := gjson.Get(args, "amount"); v.Exists() {
			input["amount_minor"] = v.Value()
		}
		if v := gjson.Get(args, "currency"); v.Exists() {
			input["currency"] = v.Value()
		}
	}
	audit := []zap.Field{zap.String("decision_id", decisionID), zap.String("tool", spec.Name), zap.String("tool_call_id", callID),
		zap.String("member", member), zap.String("target", target), zap.String("tier", tier), zap.Any("argument_findings", argTypes)}
	if !gjson.Valid(args) || !gjson.Parse(args).IsObject() {
		log.Info("tool call", append(audit, zap.Bool("allow", false), zap.String("outcome", "invalid_arguments"))...)
		return nil, nil, &ToolError{Code: "invalid_argument", Message: "the arguments are not a JSON object"}
	}
	td := p.Policy.DecideTool(ctx, input)
	if !td.Allow {
		log.Info("tool call", append(audit, zap.Bool("allow", false), zap.Strings("reasons", td.Reasons), zap.String("outcome", "denied"))...)
		return nil, td.Reasons, &ToolError{Code: "permission_denied", Message: "policy: " + strings.Join(td.Reasons, "; ")}
	}
	res, err := p.Tools.Invoke(ctx, spec.Name, []byte(args), member, scopes, key)
	if err != nil {
		te := &ToolError{Code: "internal", Message: err.Error()}
		errors.As(err, &te)
		log.Info("tool call", append(audit, zap.Bool("allow", true), zap.String("outcome", "error:"+te.Code), zap.Duration("duration", time.Since(start)))...)
		return nil, nil, te
	}
	if !json.Valid(res) {
		log.Info("tool call", append(audit, zap.Bool("allow", true), zap.String("outcome", "error:internal"), zap.Duration("duration", time.Since(start)))...)
		return nil, nil, &ToolError{Code: "internal", Message: "the tool returned invalid JSON"}
	}
	resTypes, resClass := argFindings(cl, string(res))
	log.Info("tool call", append(audit, zap.Bool("allow", true), zap.String("outcome", "ok"), zap.Any("result_findings", resTypes),
		zap.String("result_sensitivity", resClass), zap.Duration("duration", time.Since(start)))...)
	return res, nil, nil
}
