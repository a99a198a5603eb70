// Package orchestrate serves composite chat requests by delegation: a
// controller model (or, without one, a deterministic planner over the
// capability estimate) emits a typed plan of subtasks (plan.schema.json);
// the whole plan is admitted by the policy (policies/orchestration.rego)
// and its worst case reserved; each subtask is a request derived from the
// client's, classified on the data it will see, decided by the policy and
// run through the pipeline's strategies and egress
// (pipeline.Pipeline.RunDerived) on the least-exposed tier its data
// allows; independent subtasks run in parallel, dependent ones in order;
// alternatives are fused, complementary outputs composed; a meta-cognition
// check may send subtasks back with a critique (bounded refinement) before
// the answer is returned, annotated when doubts remain.
package orchestrate

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// ModelName is the client model name that asks for orchestration.
const ModelName = "molly-orchestrator"

// HeaderMode steers triage: "orchestrate" asks for orchestration whatever
// the model, "single" never orchestrates (not even with auto triage).
const HeaderMode = "X-Molly-Mode"

// Modes of HeaderMode.
const (
	ModeOrchestrate = "orchestrate"
	ModeSingle      = "single"
)

// Response headers of an orchestrated answer.
const (
	// HeaderPlanID is the plan's id: GET /molly/plans/<id> on the admin API.
	HeaderPlanID = "X-Molly-Plan-Id"
	// HeaderOrchestration lists each subtask as "<id>=<tier>/<target>
	// <outcome>", joined by ", ".
	HeaderOrchestration = "X-Molly-Orchestration"
	// HeaderUncertainty is set when the meta-cognition check did not pass:
	// "stopped=<budget|max_refinements|not_refinable>; <kind> <subtask>:
	// <detail>; ..." (the body's molly.uncertainty has the same).
	HeaderUncertainty = "X-Molly-Uncertainty"
)

// StrategyOrchestrate is the X-Molly-Strategy of an orchestrated answer.
const StrategyOrchestrate = "orchestrate"

// Defaults of Config.
const (
	DefaultMaxParallel      = 4
	DefaultSubtaskTokens    = 512
	DefaultControllerTokens = 1024
	DefaultRefinements      = 1
	DefaultControllerTier   = "T0"
	DefaultCeiling          = "T3"
)

// Config is what the operator configured (the molly app's orchestrator).
type Config struct {
	// Controller is the client model name of the controller that plans
	// (a catalogue model); "": the deterministic planner.
	Controller string `json:"controller,omitempty"`
	// ControllerTier is the highest tier the controller may run on
	// (default DefaultControllerTier): it sees the whole conversation.
	ControllerTier string `json:"controller_tier,omitempty"`
	// ControllerTokens bounds the plan's length (default DefaultControllerTokens).
	ControllerTokens int `json:"controller_tokens,omitempty"`
	// Model is the specialist for subtasks of a request to ModelName when
	// no adapter fits its task; "": the first model of the most local
	// target.
	Model string `json:"model,omitempty"`
	// Auto orchestrates requests triage recognises as composite (parts of
	// different task categories, or naming a governed tool) without being
	// asked; off by default.
	Auto bool `json:"auto,omitempty"`
	// MaxParallel bounds the subtasks running at once (default DefaultMaxParallel).
	MaxParallel int `json:"max_parallel,omitempty"`
	// SubtaskTokens is a subtask's completion budget when the plan sets
	// none (default DefaultSubtaskTokens).
	SubtaskTokens int `json:"subtask_tokens,omitempty"`
	// TierCeiling is a subtask's ceiling when the plan sets none (default
	// DefaultCeiling: its own decision alone decides).
	TierCeiling string `json:"tier_ceiling,omitempty"`
	// MaxRefinements is the rounds of refinement when the plan sets none
	// (nil: DefaultRefinements).
	MaxRefinements *int `json:"max_refinements,omitempty"`
	// PlansKept bounds the plan records kept for the admin API (default DefaultPlansKept).
	PlansKept int `json:"plans_kept,omitempty"`
}

// Validate checks the settings; errors name the field.
func (c *Config) Validate() error {
	switch {
	case c.ControllerTier != "" && tierIndex(c.ControllerTier) < 0:
		return fmt.Errorf("orchestrator: controller_tier %q must be one of T0, T1, T2, T3", c.ControllerTier)
	case c.TierCeiling != "" && tierIndex(c.TierCeiling) < 0:
		return fmt.Errorf("orchestrator: tier_ceiling %q must be one of T0, T1, T2, T3", c.TierCeiling)
	case c.ControllerTokens < 0 || c.SubtaskTokens < 0 || c.MaxParallel < 0 || c.PlansKept < 0:
		return fmt.Errorf("orchestrator: controller_tokens, subtask_tokens, max_parallel and plans_kept must not be negative")
	case c.MaxRefinements != nil && *c.MaxRefinements < 0:
		return fmt.Errorf("orchestrator: max_refinements %d must not be negative", *c.MaxRefinements)
	}
	return nil
}

// Policy is the policy engine as the orchestrator uses it (*policies.Engine).
type Policy interface {
	DecideOrchestration(ctx context.Context, input map[string]any) policies.ToolDecision
}

// Orchestrator serves composite requests (pipeline.Orchestrator). Safe
// for concurrent use; its fields are set by New.
type Orchestrator struct {
	p      *pipeline.Pipeline
	policy Policy
	cfg    Config
	est    *capability.Estimator
	store  *Store
	log    *zap.Logger
	base   string // the default specialist model
}

// New returns the orchestrator of p (which it serves requests for: set
// p.Orchestrator to it), deciding plans with policy. Errors name the
// setting: a controller or specialist model no target serves.
func New(p *pipeline.Pipeline, policy Policy, cfg Config, log *zap.Logger) (*Orchestrator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ControllerTier == "" {
		cfg.ControllerTier = DefaultControllerTier
	}
	if cfg.TierCeiling == "" {
		cfg.TierCeiling = DefaultCeiling
	}
	if cfg.ControllerTokens == 0 {
		cfg.ControllerTokens = DefaultControllerTokens
	}
	if cfg.SubtaskTokens == 0 {
		cfg.SubtaskTokens = DefaultSubtaskTokens
	}
	if cfg.MaxParallel == 0 {
		cfg.MaxParallel = DefaultMaxParallel
	}
	if cfg.MaxRefinements == nil {
		n := DefaultRefinements
		cfg.MaxRefinements = &n
	}
	if log == nil {
		log = zap.NewNop()
	}
	o := &Orchestrator{p: p, policy: policy, cfg: cfg, est: capability.NewEstimator(p.Catalogue.Domains), store: NewStore(cfg.PlansKept), log: log}
	served := catalogueModels(p.Catalogue)
	if cfg.Controller != "" && !slices.Contains(served, cfg.Controller) {
		return nil, fmt.Errorf("orchestrator: controller %q is not a model any target serves", cfg.Controller)
	}
	o.base = cfg.Model
	if o.base == "" {
		o.base = defaultModel(p.Catalogue)
	} else if !slices.Contains(served, o.base) {
		return nil, fmt.Errorf("orchestrator: model %q is not a model any target serves", o.base)
	}
	return o, nil
}

// Store is where the orchestrator keeps its plan records.
func (o *Orchestrator) Store() *Store { return o.store }

// catalogueModels lists every client model name the catalogue's targets
// serve now, sorted.
func catalogueModels(c *route.Catalogue) []string {
	var out []string
	for _, t := range c.Targets() {
		for _, m := range t.PolicyView()["models"].([]any) {
			out = append(out, m.(string))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// defaultModel is the first declared model (without an adapter) of the
// most local target, "" for an empty catalogue.
func defaultModel(c *route.Catalogue) string {
	best, model := len(policies.Tiers), ""
	for _, t := range c.Targets() {
		if i := tierIndex(t.Tier); i < best {
			for _, m := range t.Models {
				name, _, _ := strings.Cut(m, "=")
				if !strings.Contains(name, ":") {
					best, model = i, name
					break
				}
			}
			if model == "" {
				for _, m := range t.PolicyView()["models"].([]any) {
					if !strings.Contains(m.(string), ":") {
						best, model = i, m.(string)
						break
					}
				}
			}
		}
	}
	return model
}

// Triage reports whether a chat request is composite: its model is
// ModelName or X-Molly-Mode is "orchestrate" (explicit), or, with Auto,
// its last user message splits into parts of two or more task categories
// or into several parts one of which names a governed tool. Explicit
// orchestration refuses (400) what it cannot serve: another endpoint,
// client-declared tools, n > 1. It reads only the annotation and headers
// unless Auto is set.
func (o *Orchestrator) Triage(r *http.Request, a *classify.Annotation) (bool, error) {
	mode := strings.ToLower(strings.TrimSpace(r.Header.Get(HeaderMode)))
	switch mode {
	case "", ModeOrchestrate, ModeSingle:
	default:
		return false, openai.InvalidRequest(HeaderMode, "Invalid %s header %q: expected orchestrate or single.", HeaderMode, r.Header.Get(HeaderMode))
	}
	explicit := mode == ModeOrchestrate || a.Model() == ModelName
	if mode == ModeSingle {
		if a.Model() == ModelName {
			return false, openai.InvalidRequest(HeaderMode, "The model %s always orchestrates; %s: single contradicts it.", ModelName, HeaderMode)
		}
		return false, nil
	}
	if explicit {
		switch {
		case a.Endpoint() != openai.EndpointChat:
			return false, openai.InvalidRequest("model", "Orchestration serves chat completions only.")
		case a.DeclaresTools():
			return false, openai.InvalidRequest("tools", "An orchestrated request may not declare tools of its own; the gateway's governed tools are used by the plan.")
		case a.Choices() > 1:
			return false, openai.InvalidRequest("n", "An orchestrated request produces one answer (n must be 1).")
		case o.base == "" && a.Model() == ModelName:
			return false, &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_target_available",
				Message: "No specialist model is configured for " + ModelName + "."}
		}
		return true, nil
	}
	if !o.cfg.Auto || a.Endpoint() != openai.EndpointChat || a.Tools() || a.Choices() > 1 {
		return false, nil
	}
	return o.composite(a.LastUserText()), nil
}

// composite is Auto's test: two task categories, or a governed tool named
// in one of several parts. A text without two sentence ends or list items
// is rejected before any estimate.
func (o *Orchestrator) composite(text string) bool {
	text = strings.TrimSpace(text)
	if strings.Count(text, "\n")+strings.Count(text, ". ")+strings.Count(text, "? ")+strings.Count(text, "; ") < 1 {
		return false
	}
	parts := SplitParts(text, o.est)
	if len(parts.Items) < 2 {
		return false
	}
	tasks := map[string]bool{}
	for _, t := range parts.Tasks {
		if t != capability.TaskChat {
			tasks[t] = true
		}
	}
	if len(tasks) >= 2 {
		return true
	}
	if o.p.Tools == nil {
		return false
	}
	for _, s := range o.p.Tools.Tools() {
		if !slices.Contains(o.p.ToolsHidden, s.Name) && mentions(text, s.Name) {
			return true
		}
	}
	return false
}

var _ pipeline.Orchestrator = (*Orchestrator)(nil)
