package policies

import (
	"encoding/json"
	"fmt"
	"slices"

	"go.uber.org/zap/zapcore"
)

// Tiers is the ordered list of tier names a decision may allow: T0
// on-device, T1 LAN, T2 self-hosted remote, T3 external API.
var Tiers = []string{"T0", "T1", "T2", "T3"}

// Decision is the policy's verdict on one request. Only this package builds
// one (through Engine.Decide), so code holding a *Decision knows it came from
// the policy; the zero value allows nothing.
type Decision struct {
	id        string
	allow     bool
	tiers     []string
	redact    map[string][]string
	maxCost   float64 // USD; 0 means no limit from the policy
	regions   []string
	reasons   []string
	detail    string // why a fail-closed denial happened; logged, never sent to clients
	code      string
	models    []string // the models the caller may see (endpoint models); nil: not said
	hasModels bool
	class     string // the class the policy routed by (optional)
	revision  string
	output    map[string]OutputRule
}

// ID is the decision id (a UUID), also sent as X-Molly-Decision-Id.
func (d *Decision) ID() string { return d.id }

// Allowed reports whether the request may go anywhere.
func (d *Decision) Allowed() bool { return d != nil && d.allow && len(d.tiers) > 0 }

// Tiers returns the allowed tiers, in T0..T3 order.
func (d *Decision) Tiers() []string { return slices.Clone(d.tiers) }

// AllowsTier reports whether tier (e.g. "T2") may receive the request.
func (d *Decision) AllowsTier(tier string) bool {
	return d.Allowed() && slices.Contains(d.tiers, tier)
}

// Redact returns the entity types that must be replaced by placeholders
// before the request goes to tier.
func (d *Decision) Redact(tier string) []string { return slices.Clone(d.redact[tier]) }

// MaxCostUSD returns the policy's cost ceiling for the request in USD, if any.
func (d *Decision) MaxCostUSD() (float64, bool) { return d.maxCost, d.maxCost > 0 }

// Regions returns the residency regions targets must be in; empty means any.
func (d *Decision) Regions() []string { return slices.Clone(d.regions) }

// Reasons returns the policy's explanation, for denials and logs.
func (d *Decision) Reasons() []string { return slices.Clone(d.reasons) }

// MarshalLogObject writes the decision in the shape of the Rego result.
func (d *Decision) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddBool("allow", d.allow)
	_ = enc.AddReflected("tiers", d.tiers)
	_ = enc.AddReflected("redact", d.redact)
	if d.maxCost > 0 {
		enc.AddFloat64("max_cost_usd", d.maxCost)
	}
	if len(d.regions) > 0 {
		_ = enc.AddReflected("regions", d.regions)
	}
	if d.detail != "" {
		enc.AddString("error", d.detail)
	}
	return enc.AddReflected("reasons", d.reasons)
}

func deny(reason string) *Decision {
	return &Decision{reasons: []string{reason}}
}

// denyDetail denies with a reason fit for clients and a detail (compiler
// or evaluation errors, which quote policy source) for the log only.
func denyDetail(reason, detail string) *Decision {
	return &Decision{reasons: []string{reason}, detail: detail}
}

// parseDecision checks the Rego result against the contract; any deviation
// is an error (and so a denial).
func parseDecision(v any) (*Decision, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decision is %T, want an object", v)
	}
	d := &Decision{redact: map[string][]string{}}
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
		for tier := range rm {
			if !slices.Contains(Tiers, tier) {
				return nil, fmt.Errorf(`"redact" names unknown tier %q`, tier)
			}
			if d.redact[tier], err = stringList(rm, tier); err != nil {
				return nil, fmt.Errorf(`"redact": %w`, err)
			}
		}
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
	if v, ok := m["models"]; ok && v != nil {
		if d.models, err = stringList(m, "models"); err != nil {
			return nil, err
		}
		d.hasModels = true
	}
	if c, ok := m["class"]; ok && c != nil {
		if d.class, ok = c.(string); !ok {
			return nil, fmt.Errorf(`"class" is %T, want a string`, c)
		}
	}
	if c, ok := m["code"]; ok && c != nil {
		if d.code, ok = c.(string); !ok {
			return nil, fmt.Errorf(`"code" is %T, want a string`, c)
		}
	}
	if o, ok := m["output"]; ok && o != nil {
		om, ok := o.(map[string]any)
		if !ok {
			return nil, fmt.Errorf(`"output" is %T, want an object of tier to {mask, block}`, o)
		}
		d.output = map[string]OutputRule{}
		for tier, v := range om {
			rm, ok := v.(map[string]any)
			if !slices.Contains(Tiers, tier) || !ok {
				return nil, fmt.Errorf(`"output" names unknown tier %q or is not an object`, tier)
			}
			var r OutputRule
			if r.Mask, err = stringList(rm, "mask"); err != nil {
				return nil, fmt.Errorf(`"output": %w`, err)
			}
			if r.Block, err = stringList(rm, "block"); err != nil {
				return nil, fmt.Errorf(`"output": %w`, err)
			}
			d.output[tier] = r
		}
	}
	return d, nil
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

// Class is the sensitivity class the policy routed by (its "class"
// member: the detected and declared class raised for opaque content or a
// failed scan); "" when the policy does not say.
func (d *Decision) Class() string { return d.class }

// Models returns the model names the caller may see in a model listing
// (the decision's "models" member), and whether the policy said.
func (d *Decision) Models() ([]string, bool) { return slices.Clone(d.models), d.hasModels }
