package route

import (
	"slices"

	"github.com/molly-gateway/molly/policies"
)

// policyTargets is input.targets converted once: one ast.Value per target,
// and the model names each engine target had when it was converted.
type policyTargets struct {
	list   []any
	models [][]string // per target; nil for targets that are not the engine's
}

// PolicyTargets is PolicyView with each target converted to an OPA value
// (policies.ValueOf) once per catalogue, so a decision converts no target:
// the list is built on first use and again only when the model names of a
// target served by the engine change (adapters loaded or removed). The
// list is shared: callers must not modify it. A target that cannot be
// converted stays a map, which Decide converts (and refuses) as before.
func (c *Catalogue) PolicyTargets() []any {
	cur := c.policy.Load()
	if cur != nil && c.sameEngineModels(cur) {
		return cur.list
	}
	next := &policyTargets{list: make([]any, len(c.targets)), models: make([][]string, len(c.targets))}
	for i, t := range c.targets {
		names := t.modelNames()
		view := t.policyViewOf(names)
		if t.engine != nil {
			next.models[i] = names
		}
		if v, err := policies.ValueOf(view); err == nil {
			next.list[i] = v
		} else {
			next.list[i] = view
		}
	}
	c.policy.Store(next)
	return next.list
}

// sameEngineModels reports whether every engine target still has the model
// names p was built with.
func (c *Catalogue) sameEngineModels(p *policyTargets) bool {
	for i, t := range c.targets {
		if t.engine != nil && !slices.Equal(p.models[i], t.modelNames()) {
			return false
		}
	}
	return true
}
