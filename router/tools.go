package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/policies"
)

// Governed tools (issue 6): tools the gateway itself offers to models and
// runs, under policy, on the caller's behalf. This package only sees them
// through ToolRunner; the Caddy app implements it with plugins.Manager.

// DefaultToolSteps is how many rounds of tool calls one request may make
// when Forwarder.ToolSteps is 0.
const DefaultToolSteps = 4

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

// ToolPolicy decides whether one tool call may run (policies.Engine).
type ToolPolicy interface {
	DecideTool(ctx context.Context, input map[string]any) policies.ToolDecision
}

// ToolError is a failed tool invocation as the model sees it.
type ToolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *ToolError) Error() string { return "tool error " + e.Code + ": " + e.Message }

// toolsApply: the request is a non-streamed chat request that declares no
// tools and carries no tool messages of its own, and governed tools in the
// caller's tool scope are configured.
func (f *Forwarder) toolsApply(a *Annotation, id *Identity) bool {
	return f.Tools != nil && f.ToolPolicy != nil && a.Endpoint == EndpointChat && !a.Stream && !a.Tools &&
		a.classifier != nil && !gjson.GetBytes(a.Body, "functions").Exists() && len(f.offered(id)) > 0
}

// offered returns the governed tools in the identity's tool scope, by name.
func (f *Forwarder) offered(id *Identity) map[string]ToolSpec {
	out := map[string]ToolSpec{}
	for _, s := range f.Tools.Tools() {
		if slices.Contains(f.ToolsHidden, s.Name) {
			continue
		}
		if id != nil && len(id.Tools) > 0 && !slices.ContainsFunc(id.Tools, func(p string) bool { return scopeMatch(p, s.Name) }) {
			continue
		}
		out[s.Name] = s
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

// toolLoop answers a chat request with the governed tools offered: each
// upstream answer whose tool calls all name governed tools has them run
// (policy first) and their results appended, and the same target is asked
// again, at most ToolSteps rounds. Every upstream request is a Dispatch made
// by NewDispatch under d from the conversation classified again, so the
// tier's redaction applies to tool results as to the client's text. Only
// the first round falls back to the next candidate: once a tool has run, the
// conversation stays with the model that asked for it.
func (f *Forwarder) toolLoop(w http.ResponseWriter, r *http.Request, a *Annotation, d *policies.Decision, cands []Candidate, excluded []Exclusion, log *zap.Logger) error {
	id := IdentityFrom(r.Context())
	specs := f.offered(id)
	first, err := withTools(a.Body, specs)
	if err != nil {
		return fmt.Errorf("offering tools: %w", err)
	}
	steps := f.ToolSteps
	if steps <= 0 {
		steps = DefaultToolSteps
	}
	var tried []attempt
	for _, c := range cands {
		body := first
		for round := 0; ; round++ {
			ann, err := a.classifier.Classify(EndpointChat, body, a.Declared.String(), a.Residency)
			if err != nil {
				return fmt.Errorf("classifying the tool conversation: %w", err)
			}
			if ann.Sensitivity > a.Sensitivity || (ann.ScanFailed && !a.ScanFailed) ||
				(len(d.Redact(c.Target.Tier)) > 0 && len(newTypes(a, ann)) > 0) {
				// The decision was made for less sensitive content: fail closed.
				log.Warn("tool results raised the sensitivity; stopping", zap.String("decision_id", d.ID()),
					zap.Stringer("decided", a.Sensitivity), zap.Stringer("now", ann.Sensitivity), zap.Strings("new_types", newTypes(a, ann)))
				return &api.Error{Status: http.StatusForbidden, Type: "invalid_request_error", Code: "tool_result_too_sensitive",
					Message: "A tool result is more sensitive than the request the policy decided on; the conversation was stopped."}
			}
			disp, err := NewDispatch(d, ann, c)
			if err != nil {
				if round > 0 {
					return noTarget("The tool conversation could not continue on `"+c.Target.Name+"`", nil, []attempt{{c.Target.Name, err.Error()}})
				}
				tried = append(tried, attempt{c.Target.Name, err.Error()})
				break
			}
			start := time.Now()
			resp, err := disp.send(r.Context())
			ttfb := time.Since(start)
			if err != nil {
				if r.Context().Err() != nil {
					f.newUsageMeter(r.Context(), log, ann, d.ID(), c.Target).abandoned() // the upstream got the prompt
					return nil
				}
				if round > 0 {
					return noTarget("The tool conversation could not continue on `"+c.Target.Name+"`", nil, []attempt{{c.Target.Name, upstreamErr(err)}})
				}
				tried = append(tried, attempt{c.Target.Name, upstreamErr(err)})
				break
			}
			out, rerr := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamBody+1))
			resp.Body.Close()
			if rerr == nil && len(out) > MaxUpstreamBody {
				rerr = fmt.Errorf("answer over %d bytes", MaxUpstreamBody)
			}
			failed := rerr != nil || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
			if failed {
				why := "HTTP " + resp.Status
				if rerr != nil {
					why = "reading answer: " + rerr.Error()
				}
				if round > 0 {
					return noTarget("The tool conversation could not continue on `"+c.Target.Name+"`", nil, []attempt{{c.Target.Name, why}})
				}
				tried = append(tried, attempt{c.Target.Name, why})
				break
			}
			if resp.StatusCode/100 == 2 {
				f.newUsageMeter(r.Context(), log, ann, d.ID(), c.Target).body(out)
			}
			if disp.vault != nil {
				out = restoreBody(disp.vault, out)
			}
			calls := gjson.GetBytes(out, "choices.0.message.tool_calls").Array()
			if resp.StatusCode/100 != 2 || len(calls) == 0 || !allGoverned(calls, specs) {
				f.setHeaders(w, resp, disp)
				f.explain(w, c, cands)
				w.Header().Set("Content-Length", fmt.Sprint(len(out)))
				w.WriteHeader(resp.StatusCode)
				_, _ = w.Write(out)
				log.Info("routed", zap.String("decision_id", d.ID()), zap.String("target", c.Target.Name), zap.String("tier", c.Target.Tier),
					zap.Int("status", resp.StatusCode), zap.Int("redacted", disp.Redacted()), zap.Int("tool_rounds", round), zap.Duration("duration", time.Since(start)))
				f.observe(a, d, answered{chosen: c, cands: cands, start: start, ttfb: ttfb, status: resp.StatusCode, body: out})
				return nil
			}
			if round >= steps {
				log.Warn("tool step limit reached", zap.String("decision_id", d.ID()), zap.String("target", c.Target.Name), zap.Int("tool_steps", steps))
				return &api.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "tool_steps_exceeded",
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
				result := f.runTool(r.Context(), log, d, c, id, specs[call.Get("function.name").Str], call, a.classifier)
				tm := map[string]any{"role": "tool", "tool_call_id": call.Get("id").Str, "content": string(result)}
				if body, err = sjson.SetBytes(body, "messages.-1", tm); err != nil {
					return fmt.Errorf("appending a tool result: %w", err)
				}
			}
		}
	}
	return f.failed(a, noTarget("All allowed targets for model `"+a.Model+"` failed", excluded, tried))
}

// newTypes returns the entity types found in now but not in the request the
// decision was made on: the decision's redaction lists cannot cover them.
func newTypes(decided, now *Annotation) []string {
	var out []string
	for t := range now.Sovereignty.Findings {
		if decided.Sovereignty.Findings[t] == 0 {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out
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
func argFindings(cl *Classifier, text string) (map[string]any, string) {
	body, _ := json.Marshal(map[string]any{"model": "tool", "messages": []any{map[string]any{"role": "user", "content": text}}})
	ann, err := cl.Classify(EndpointChat, body, "", "")
	if err != nil || ann.ScanFailed {
		return map[string]any{}, Restricted.String()
	}
	out := make(map[string]any, len(ann.Findings))
	for t, n := range ann.Sovereignty.Findings {
		out[t] = n
	}
	return out, ann.Sensitivity.String()
}

// runTool decides and runs one tool call and returns the content of its
// tool message: the result, or {"error": {code, message}} for a policy
// denial or a failed invocation. It logs one audit line per call, without
// arguments or results.
func (f *Forwarder) runTool(ctx context.Context, log *zap.Logger, d *policies.Decision, c Candidate, id *Identity, spec ToolSpec, call gjson.Result, cl *Classifier) []byte {
	callID := call.Get("id").Str
	res, _, te := f.callTool(ctx, log, d.ID(), callID, c.Target.Name, c.Target.Tier, id, spec, call.Get("function.arguments").Str, d.ID()+":"+callID, cl)
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
func (f *Forwarder) CallTool(ctx context.Context, cl *Classifier, id *Identity, name string, args []byte, key string) ([]byte, []string, *ToolError) {
	if f.Tools == nil || f.ToolPolicy == nil {
		return nil, nil, &ToolError{Code: "not_found", Message: "no governed tools are configured"}
	}
	var spec ToolSpec
	for _, s := range f.Tools.Tools() {
		if s.Name == name {
			spec = s
		}
	}
	if spec.Name == "" {
		return nil, nil, &ToolError{Code: "not_found", Message: fmt.Sprintf("no tool %q is configured", name)}
	}
	log := f.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return f.callTool(ctx, log, "", key, DirectTarget, DirectTier, id, spec, string(args), key, cl)
}

// callTool is runTool and CallTool: policy, invocation, one audit line.
// reasons are the policy's when it denied.
func (f *Forwarder) callTool(ctx context.Context, log *zap.Logger, decisionID, callID, target, tier string, id *Identity, spec ToolSpec, args, key string, cl *Classifier) (res []byte, reasons []string, te *ToolError) {
	start := time.Now()
	member, scopes := "anonymous", []string{}
	if id != nil {
		member, scopes = id.Member, id.Scopes()
	}
	argTypes, argClass := argFindings(cl, args)
	input := map[string]any{
		"tool":      map[string]any{"name": spec.Name, "side_effect": spec.SideEffect},
		"arguments": map[string]any{"findings": argTypes, "sensitivity": argClass},
		"identity":  identityInput(id),
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
	td := f.ToolPolicy.DecideTool(ctx, input)
	if !td.Allow {
		log.Info("tool call", append(audit, zap.Bool("allow", false), zap.Strings("reasons", td.Reasons), zap.String("outcome", "denied"))...)
		return nil, td.Reasons, &ToolError{Code: "permission_denied", Message: "policy: " + strings.Join(td.Reasons, "; ")}
	}
	res, err := f.Tools.Invoke(ctx, spec.Name, []byte(args), member, scopes, key)
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
