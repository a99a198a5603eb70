// Package app is the Caddy app "molly": it holds the target catalogue and the
// policy engine that the molly_* HTTP handlers share.
package app

import (
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router"
	"github.com/molly-gateway/molly/serving"
)

// App is the molly app. JSON: {"apps": {"molly": {...}}}.
type App struct {
	// Targets are the backends requests may be routed to.
	Targets []*router.Target `json:"targets,omitempty"`
	// PolicyDir is a directory of .rego files used instead of the embedded
	// defaults; edits take effect on the next request.
	PolicyDir string `json:"policy_dir,omitempty"`
	// PolicyTimeout bounds one policy evaluation (default 250ms); past it the request is denied.
	PolicyTimeout caddy.Duration `json:"policy_timeout,omitempty"`
	// Weights of the selection objective; defaults router.DefaultWeights.
	Weights *router.Weights `json:"weights,omitempty"`
	// Engine configures the in-process T0 engine (llama.cpp, one base model,
	// many LoRA adapters) that targets of kind "engine" route to.
	EngineConfig *serving.Config `json:"engine,omitempty"`
	// PriorsDB is the SQLite file learned quality and latency priors are
	// kept in; default DefaultPriorsDB() (priors.go).
	PriorsDB string `json:"priors_db,omitempty"`
	// Cascade tries cheap candidates first and escalates on low confidence
	// (router.Cascade); nil: no cascades.
	Cascade *router.Cascade `json:"cascade,omitempty"`
	// Mixture asks several candidates when the task category is uncertain
	// and returns the best answer (router.Mixture); nil: no mixtures.
	Mixture *router.Mixture `json:"mixture,omitempty"`
	// Tools are the governed tool plugins offered to models (issue 6),
	// each pinned by its binary's SHA-256; ToolSteps bounds the rounds of
	// tool calls in one request (0: router.DefaultToolSteps).
	Tools     []plugins.Config `json:"tools,omitempty"`
	ToolSteps int              `json:"tool_steps,omitempty"`
	// UsageTool names a configured tool (the billing plugin) that gets
	// every usage record as a record_usage call, in the background
	// (usage.go); "": none.
	UsageTool string `json:"usage_tool,omitempty"`

	engine    *serving.Engine
	policy    *policies.Engine
	catalogue *router.Catalogue
	forwarder *router.Forwarder
	logger    *zap.Logger
	tools     *plugins.Manager
	usage     *usageSender // UsageTool's sender (usage.go)
	// toolClassifier classifies direct tool calls (admin.go): the default detectors.
	toolClassifier *router.Classifier

	priors     *priorsHandle // shared across reloads (priors.go)
	priorsPath string
}

func init() { caddy.RegisterModule(App{}) }

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "molly", New: func() caddy.Module { return new(App) }}
}

// Provision compiles the policy and builds the catalogue.
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	eng, err := policies.New(ctx, policies.Options{
		Dir:     a.PolicyDir,
		Timeout: time.Duration(a.PolicyTimeout),
		Logger:  a.logger.Named("decision"),
	})
	if err != nil {
		return fmt.Errorf("molly: policy: %w", err)
	}
	a.policy = eng
	var engine router.Engine
	if a.EngineConfig != nil {
		a.engine, err = serving.New(*a.EngineConfig)
		if err != nil {
			return fmt.Errorf("molly: engine: %w", err)
		}
		engine = a.engine
		a.logger.Info("T0 engine loaded", zap.String("model", a.engine.Name()), zap.Strings("models", a.engine.Models()))
	}
	cat, err := router.NewCatalogue(a.Targets, engine)
	if err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	a.catalogue = cat
	w := router.DefaultWeights
	if a.Weights != nil {
		w = *a.Weights
	}
	if err := a.provisionPriors(); err != nil {
		return fmt.Errorf("molly: priors: %w", err)
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := router.DefaultMetrics.Register(reg); err != nil {
			return fmt.Errorf("molly: metrics: %w", err)
		}
		if a.engine != nil {
			if err := reg.Register(a.engine.Collector()); err != nil {
				if _, ok := err.(prometheus.AlreadyRegisteredError); !ok {
					return fmt.Errorf("molly: engine metrics: %w", err)
				}
			}
		}
	}
	a.forwarder = &router.Forwarder{Catalogue: cat, Weights: w, Logger: a.logger.Named("route"),
		Priors: a.Priors(), Metrics: router.DefaultMetrics, Cascade: a.Cascade, Mixture: a.Mixture}
	if a.tools, err = a.provisionTools(); err != nil {
		return fmt.Errorf("molly: tools: %w", err)
	}
	if a.tools != nil {
		a.forwarder.Tools, a.forwarder.ToolPolicy, a.forwarder.ToolSteps = toolRunner{a.tools}, eng, a.ToolSteps
		scanner, err := redaction.NewScanner(redaction.Config{})
		if err != nil {
			return fmt.Errorf("molly: tools: classifier: %w", err)
		}
		a.toolClassifier = router.NewClassifier(scanner, nil)
	}
	if a.UsageTool != "" {
		a.usage = &usageSender{tool: a.UsageTool, runner: toolRunner{a.tools}, log: a.logger.Named("usage"), timeout: usageTimeout, stats: new(UsageStats)}
		a.forwarder.UsageSink = a.usage.send
		// The usage tool records spend for the gateway itself: models never see it.
		a.forwarder.ToolsHidden = []string{a.UsageTool}
	}
	return nil
}

// Validate rejects impossible settings.
func (a *App) Validate() error {
	if a.Weights != nil && (a.Weights.Cost < 0 || a.Weights.Latency < 0) {
		return fmt.Errorf("molly: weights cost_weight and latency_weight must not be negative")
	}
	if a.PolicyTimeout < 0 {
		return fmt.Errorf("molly: policy_timeout must not be negative")
	}
	if err := a.Cascade.Validate(); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	if err := a.Mixture.Validate(); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	if err := validateTools(a.Tools, a.ToolSteps); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	if a.UsageTool != "" && !slices.ContainsFunc(a.Tools, func(t plugins.Config) bool { return t.Name == a.UsageTool }) {
		return fmt.Errorf("molly: usage_tool %q is not a configured tool", a.UsageTool)
	}
	return nil
}

// Start makes this app the one the admin API talks to.
func (a *App) Start() error {
	current.Store(a)
	return a.startPriors()
}

// Stop detaches the admin API if it still points at this app (on a reload
// the new app has started before the old one stops).
func (a *App) Stop() error {
	current.CompareAndSwap(a, nil)
	return nil
}

// Cleanup stops the tool plugins, closes idle upstream connections and the engine.
func (a *App) Cleanup() error {
	a.usage.wait() // usage records in flight, each bounded by its timeout
	if a.tools != nil {
		_ = a.tools.Close()
	}
	if err := a.cleanupPriors(); err != nil {
		a.logger.Error("closing the priors", zap.Error(err))
	}
	if a.catalogue != nil {
		a.catalogue.Close()
	}
	if a.engine != nil {
		return a.engine.Close()
	}
	return nil
}

// current is the running app, for admin API routes (which Caddy provisions
// outside any app's context).
var current atomic.Pointer[App]

// Current returns the running molly app, or nil.
func Current() *App { return current.Load() }

// Engine returns the T0 engine, or nil when none is configured.
func (a *App) Engine() *serving.Engine { return a.engine }

// Policy returns the policy engine.
func (a *App) Policy() *policies.Engine { return a.policy }

// Catalogue returns the target catalogue.
func (a *App) Catalogue() *router.Catalogue { return a.catalogue }

// UsageStats returns the counts of usage records sent to UsageTool, or
// nil when none is configured.
func (a *App) UsageStats() *UsageStats {
	if a.usage == nil {
		return nil
	}
	return a.usage.stats
}

// Forwarder returns the router's forwarder.
func (a *App) Forwarder() *router.Forwarder { return a.forwarder }

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)

// Load returns the molly app for the handler named by directive, loading
// and provisioning it if needed (handlers call this from Provision).
func Load(ctx caddy.Context, directive string) (*App, error) {
	a, err := ctx.App("molly")
	if err != nil {
		return nil, fmt.Errorf("%s: loading the molly app: %w", directive, err)
	}
	return a.(*App), nil
}
