package policies

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap/zapcore"
)

// Tiers is the ordered list of tier names a decision may allow: T0
// on-device, T1 LAN, T2 self-hosted remote, T3 external API.
var Tiers = []string{"T0", "T1", "T2", "T3"}

// Denial codes: the machine-readable cause of a denied decision
// (Decision.Code, ToolDecision.Code). Codes other than these come from the
// policy's own "code" member.
const (
	// CodePolicyDenied: the policy refused without a more specific code (no
	// tier left, no rule matched).
	CodePolicyDenied = "policy_denied"
	// CodeModelNotAllowed: the client model is outside the key's model scope.
	CodeModelNotAllowed = "model_not_allowed"
	// CodeToolNotAllowed: the request declares a function outside the key's
	// tool scope.
	CodeToolNotAllowed = "tool_not_allowed"
	// CodeToolResultTooSensitive: a tool round is more sensitive than the
	// decision it continues.
	CodeToolResultTooSensitive = "tool_result_too_sensitive"
	// CodePolicyTimeout: evaluation used more CPU time than Options.Timeout
	// (or ran past the wall-clock backstop). Fail closed.
	CodePolicyTimeout = "policy_timeout"
	// CodePolicyError: the policy could not be evaluated or its result broke
	// the contract (evaluation error, undefined or malformed result). Fail
	// closed; the details are in the server log only.
	CodePolicyError = "policy_error"
	// CodeClientClosed: the caller's context ended (the client went away, or
	// the caller's own deadline passed) before the decision was made. Not a
	// policy timeout: callers log and count it as client-closed (499).
	CodeClientClosed = "client_closed"
)

// Digest binds a decision to the content it judged: SHA-256 (FIPS 180-4)
// over a request body and its classification, computed by the classifier.
type Digest [32]byte

// Subject is what a route decision judges: the classification of one
// request body. It carries no request text.
type Subject interface {
	// Digest is SHA-256 over the body and its classification.
	Digest() Digest
	// PolicyInput returns the "request", "capability" and "sovereignty"
	// members of the input document (policies/README.md) as JSON-compatible
	// Go values (map[string]any, []any, []string, string, bool, numbers,
	// nil, or ast.Value).
	PolicyInput() map[string]any
}

// ValueSubject is an optional fast path of a Subject: PolicyValue returns an
// ast.Object holding the same members as PolicyInput, built once, which
// Decide then uses without converting anything. The object must not be
// mutated after it is returned.
type ValueSubject interface {
	Subject
	PolicyValue() ast.Value
}

// MemberSubject is an optional faster path of a ValueSubject: PolicyMembers
// returns PolicyValue's "request", "capability" and "sovereignty" members
// (nil where absent; all nil where PolicyValue is not an object), which
// Decide puts into the input without PolicyValue's own object. The terms
// must not be mutated.
type MemberSubject interface {
	ValueSubject
	PolicyMembers() (request, capability, sovereignty *ast.Term)
}

// Input is what a route decision is asked about.
type Input struct {
	// Subject supplies input.request, input.capability and
	// input.sovereignty. A nil Subject is denied (CodePolicyError).
	Subject Subject
	// Identity is input.identity (schema in policies/README.md); never a
	// key: a map[string]any, or that map converted once with ValueOf (an
	// ast.Value, as identity.Identity.PolicyValue keeps it). nil is {}.
	Identity any
	// Targets is input.targets: one object per catalogue target. Elements
	// may be ast.Value (converted once by the caller with ValueOf).
	Targets []any
	// Derived is input.derived for a request the gateway derives from an
	// earlier decision: {"kind": "tool_round" | "cascade_step" | "subtask" |
	// "follow_up", "parent": {"decision_id", "sensitivity", "findings"}};
	// nil for a client request.
	Derived map[string]any
}

// Decided is a decision bound to the Digest of the Subject it judged. Only
// (*Engine).Decide makes one; the zero value allows nothing.
type Decided struct {
	decision *Decision
	digest   Digest
}

// Digest is the digest of the Subject the decision judged.
func (d Decided) Digest() Digest { return d.digest }

// Binds reports whether the decision judged s: same digest, and a decision
// was made (a nil s binds nothing).
func (d Decided) Binds(s Subject) bool {
	return d.decision != nil && s != nil && s.Digest() == d.digest
}

// Decision returns the decision (nil for the zero Decided; a nil *Decision
// allows nothing and its accessors return zero values).
func (d Decided) Decision() *Decision { return d.decision }

// Decision is the policy's verdict on one request. Only this package builds
// one, so code holding a *Decision knows it came from the policy; the zero
// value, and a nil *Decision, allow nothing.
type Decision struct {
	id          string
	revision    string
	allow       bool
	tiers       []string
	redact      map[string][]string
	output      map[string]OutputRule
	sensitivity string
	code        string
	models      []string // the model names a listing may show (endpoint models)
	hasModels   bool
	maxCost     float64 // USD; 0 means no limit from the policy
	regions     []string
	reasons     []string
	detail      string // why a fail-closed denial happened; logged, never sent to clients
}

// OutputRule says what the gateway does with entity types a model wrote in
// an answer from one tier (redaction.rego's output[tier]). "*" names every
// type; Block wins over Mask; a type in neither passes.
type OutputRule struct {
	Mask  []string
	Block []string
}

// Masks reports whether typ must be masked in the answer (and is not blocked).
func (o OutputRule) Masks(typ string) bool {
	return !o.Blocks(typ) && (slices.Contains(o.Mask, "*") || slices.Contains(o.Mask, typ))
}

// Blocks reports whether an answer holding typ must be refused.
func (o OutputRule) Blocks(typ string) bool {
	return slices.Contains(o.Block, "*") || slices.Contains(o.Block, typ)
}

// ID is the decision id (a UUID), also sent as X-Molly-Decision-Id.
func (d *Decision) ID() string {
	if d == nil {
		return ""
	}
	return d.id
}

// Revision is the policy revision (content hash, see Status) that made the
// decision; "" when no revision was loaded.
func (d *Decision) Revision() string {
	if d == nil {
		return ""
	}
	return d.revision
}

// Allowed reports whether the request may go anywhere.
func (d *Decision) Allowed() bool { return d != nil && d.allow && len(d.tiers) > 0 }

// Code is the machine-readable cause of a denial (the Code* constants, or
// the policy's own "code"); "" when the decision allows.
func (d *Decision) Code() string {
	switch {
	case d.Allowed():
		return ""
	case d == nil || d.code == "":
		return CodePolicyDenied
	}
	return d.code
}

// Tiers returns the tiers the policy listed, in T0..T3 order (check
// Allowed first: a denial may list tiers too).
func (d *Decision) Tiers() []string {
	if d == nil {
		return nil
	}
	return slices.Clone(d.tiers)
}

// AllowsTier reports whether tier (e.g. "T2") may receive the request.
func (d *Decision) AllowsTier(tier string) bool {
	return d.Allowed() && slices.Contains(d.tiers, tier)
}

// Redact returns the entity types that must be replaced by placeholders
// before the request goes to tier.
func (d *Decision) Redact(tier string) []string {
	if d == nil {
		return nil
	}
	return slices.Clone(d.redact[tier])
}

// Output returns what to do with entity types the model writes in answers
// from tier; the zero OutputRule passes them.
func (d *Decision) Output(tier string) OutputRule {
	if d == nil {
		return OutputRule{}
	}
	o := d.output[tier]
	return OutputRule{Mask: slices.Clone(o.Mask), Block: slices.Clone(o.Block)}
}

// Sensitivity is the class the policy treated the request as (the decision's
// "sensitivity" member: public, internal, confidential or restricted); ""
// when the policy gave none. Derived requests pass it back as
// derived.parent.sensitivity.
func (d *Decision) Sensitivity() string {
	if d == nil {
		return ""
	}
	return d.sensitivity
}

// MaxCostUSD returns the policy's cost ceiling for the request in USD, if any.
func (d *Decision) MaxCostUSD() (float64, bool) {
	if d == nil {
		return 0, false
	}
	return d.maxCost, d.maxCost > 0
}

// Regions returns the residency regions targets must be in; empty means any.
func (d *Decision) Regions() []string {
	if d == nil {
		return nil
	}
	return slices.Clone(d.regions)
}

// Reasons returns the policy's explanation, for denials and logs.
func (d *Decision) Reasons() []string {
	if d == nil {
		return nil
	}
	return slices.Clone(d.reasons)
}

// MarshalLogObject writes the decision as Molly read it: allow, code,
// tiers, reasons.
func (d *Decision) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddBool("allow", d.Allowed())
	if c := d.Code(); c != "" {
		enc.AddString("code", c)
	}
	_ = enc.AddArray("tiers", (*logTiers)(d))
	_ = enc.AddArray("reasons", (*logReasons)(d))
	return nil
}

// logTiers and logReasons write a decision's tiers and reasons; pointers,
// so that handing them to the encoder does not allocate.
type (
	logTiers   Decision
	logReasons Decision
)

func (d *logTiers) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	return stringArray(d.tiers).MarshalLogArray(enc)
}

func (d *logReasons) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	return stringArray(d.reasons).MarshalLogArray(enc)
}

type stringArray []string

func (s stringArray) MarshalLogArray(enc zapcore.ArrayEncoder) error {
	for _, v := range s {
		enc.AppendString(v)
	}
	return nil
}

func deny(code, reason string) *Decision {
	return &Decision{code: code, reasons: []string{reason}}
}

// denyDetail denies with a reason fit for clients and a detail (compiler
// or evaluation errors, which quote policy source) for the log only.
func denyDetail(code, reason, detail string) *Decision {
	return &Decision{code: code, reasons: []string{reason}, detail: detail}
}

// parseDecision checks the Rego result against the contract
// (policies/README.md); any deviation is an error (and so a denial).
func parseDecision(v any) (*Decision, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decision is %T, want an object", v)
	}
	d := &Decision{}
	allow, ok := m["allow"].(bool)
	if !ok {
		return nil, fmt.Errorf(`"allow" is %T, want a boolean`, m["allow"])
	}
	d.allow = allow
	var err error
	if d.tiers, err = stringList(m, "tiers"); err != nil {
		return nil, err
	}
	for _, t := range d.tiers {
		if !slices.Contains(Tiers, t) {
			return nil, fmt.Errorf(`"tiers" holds unknown tier %q (want T0..T3)`, t)
		}
	}
	slices.Sort(d.tiers)
	d.tiers = slices.Compact(d.tiers)
	if r, ok := m["redact"]; ok && r != nil {
		rm, ok := r.(map[string]any)
		if !ok {
			return nil, fmt.Errorf(`"redact" is %T, want an object of tier to types`, r)
		}
		d.redact = make(map[string][]string, len(rm))
		for tier := range rm {
			if !slices.Contains(Tiers, tier) {
				return nil, fmt.Errorf(`"redact" names unknown tier %q`, tier)
			}
			if d.redact[tier], err = stringList(rm, tier); err != nil {
				return nil, fmt.Errorf(`"redact": %w`, err)
			}
		}
	}
	if o, ok := m["output"]; ok && o != nil {
		om, ok := o.(map[string]any)
		if !ok {
			return nil, fmt.Errorf(`"output" is %T, want an object of tier to {"mask", "block"}`, o)
		}
		d.output = make(map[string]OutputRule, len(om))
		for tier, r := range om {
			if !slices.Contains(Tiers, tier) {
				return nil, fmt.Errorf(`"output" names unknown tier %q`, tier)
			}
			rm, ok := r.(map[string]any)
			if !ok {
				return nil, fmt.Errorf(`"output"[%q] is %T, want {"mask": [...], "block": [...]}`, tier, r)
			}
			var rule OutputRule
			if rule.Mask, err = stringList(rm, "mask"); err != nil {
				return nil, fmt.Errorf(`"output"[%q]: %w`, tier, err)
			}
			if rule.Block, err = stringList(rm, "block"); err != nil {
				return nil, fmt.Errorf(`"output"[%q]: %w`, tier, err)
			}
			d.output[tier] = rule
		}
	}
	if d.sensitivity, err = optString(m, "sensitivity"); err != nil {
		return nil, err
	}
	if d.code, err = optString(m, "code"); err != nil {
		return nil, err
	}
	if v, ok := m["models"]; ok && v != nil {
		if d.models, err = stringList(m, "models"); err != nil {
			return nil, err
		}
		d.hasModels = true
	}
	if c, ok := m["max_cost_usd"]; ok && c != nil {
		n, ok := c.(json.Number)
		if !ok {
			return nil, fmt.Errorf(`"max_cost_usd" is %T, want a number`, c)
		}
		if d.maxCost, err = n.Float64(); err != nil || d.maxCost < 0 {
			return nil, fmt.Errorf(`"max_cost_usd" must be a non-negative number, got %s`, n)
		}
	}
	if d.regions, err = stringList(m, "regions"); err != nil {
		return nil, err
	}
	if d.reasons, err = stringList(m, "reasons"); err != nil {
		return nil, err
	}
	return d, nil
}

// optString reads m[key] as a string; absent or null is "".
func optString(m map[string]any, key string) (string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%q is %T, want a string", key, v)
	}
	return s, nil
}

// stringList reads m[key] as an array of strings; absent is nil.
func stringList(m map[string]any, key string) ([]string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return nil, nil
	}
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%q is %T, want an array of strings", key, v)
	}
	out := make([]string, 0, len(arr))
	for _, e := range arr {
		s, ok := e.(string)
		if !ok {
			return nil, fmt.Errorf("%q holds %T, want strings", key, e)
		}
		out = append(out, s)
	}
	return out, nil
}

// Models returns the model names a model listing may show to the caller
// (the decision's optional "models" member: the catalogue's models in the
// caller's model scope), and whether the policy said.
func (d *Decision) Models() ([]string, bool) {
	if d == nil {
		return nil, false
	}
	return slices.Clone(d.models), d.hasModels
}
