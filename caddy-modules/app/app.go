// Package app is the Caddy app "molly": it holds the target catalogue and the
// policy engine that the molly_* HTTP handlers share.
package app

import (
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/internal/asynclog"
	"github.com/molly-gateway/molly/learning/federation"
	"github.com/molly-gateway/molly/learning/specialise"
	"github.com/molly-gateway/molly/learning/traces"
	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/health"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/observe"
	"github.com/molly-gateway/molly/router/orchestrate"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

// App is the molly app. JSON: {"apps": {"molly": {...}}}.
type App struct {
	// Targets are the backends requests may be routed to.
	Targets []*route.Target `json:"targets,omitempty"`
	// PolicyDir is a directory of .rego files used instead of the embedded
	// defaults; edits take effect on the next request.
	PolicyDir string `json:"policy_dir,omitempty"`
	// PolicyTimeout bounds one policy evaluation (default 250ms); past it the request is denied.
	PolicyTimeout caddy.Duration `json:"policy_timeout,omitempty"`
	// Weights of the selection objective; defaults route.DefaultWeights.
	Weights *route.Weights `json:"weights,omitempty"`
	// Engine configures the in-process T0 engine (llama.cpp, one base model,
	// many LoRA adapters) that targets of kind "engine" route to.
	EngineConfig *serving.Config `json:"engine,omitempty"`
	// RegistryFile is the registry's SQLite file (members, keys, the usage
	// ledger, learned priors), shared with molly_auth; default
	// DefaultRegistry() (registry.go).
	RegistryFile string `json:"registry,omitempty"`
	// PriorsDB is deprecated: priors live in the registry. A priors file
	// of an older Molly named here (default DefaultLegacyPriors(), if it
	// exists) is imported into the registry once (priors.go).
	PriorsDB string `json:"priors_db,omitempty"`
	// Cascade tries cheap candidates first and escalates on low confidence
	// (route.Cascade); nil: no cascades.
	Cascade *route.Cascade `json:"cascade,omitempty"`
	// Mixture asks several candidates when the task category is uncertain
	// and returns the best answer (route.Mixture); nil: no mixtures.
	Mixture *route.Mixture `json:"mixture,omitempty"`
	// Tools are the governed tool plugins offered to models,
	// each pinned by its binary's SHA-256; ToolSteps bounds the rounds of
	// tool calls in one request (0: route.DefaultToolSteps).
	Tools     []plugins.Config `json:"tools,omitempty"`
	ToolSteps int              `json:"tool_steps,omitempty"`
	// UsageTool names a configured tool (the billing plugin) that gets
	// every usage record of the registry as a record_usage call, through
	// the registry's transactional outbox: retried until acknowledged,
	// across restarts, idempotent by record id (usage.go); "": none.
	UsageTool string `json:"usage_tool,omitempty"`
	// FirstEventTimeout bounds the wait for an upstream stream's first
	// content event after its headers; past it the attempt falls back
	// (default pipeline.DefaultFirstEventTimeout).
	FirstEventTimeout caddy.Duration `json:"first_event_timeout,omitempty"`
	// Orchestrator configures the orchestration of composite requests
	// (router/orchestrate; model molly-orchestrator, X-Molly-Mode:
	// orchestrate); nil: the defaults, the deterministic planner.
	// NoOrchestrator turns orchestration off.
	Orchestrator   *orchestrate.Config `json:"orchestrator,omitempty"`
	NoOrchestrator bool                `json:"no_orchestrator,omitempty"`
	// OutlierDetection is every target's circuit breaking (router/health),
	// where a target's own outlier_detection leaves a field unset; nil:
	// health's defaults. Health restarts from closed circuits on a reload.
	OutlierDetection *health.Config `json:"outlier_detection,omitempty"`
	// Specialise runs the specialisation loop (learning/specialise):
	// consented traces are captured, and cycles curate, train, evaluate and
	// promote LoRA adapters for the engine's base; nil: no capture, no loop.
	// Durations (every, budget) are in nanoseconds in JSON.
	Specialise *specialise.Config `json:"specialise,omitempty"`
	// Federation makes this Molly a participant and/or the aggregator of
	// federated adapter improvement (learning/federation; federation.go):
	// adapter deltas, never data, cross between named peers over mutual
	// TLS. nil: none. RoundDeadline is in nanoseconds in JSON.
	Federation *federation.Config `json:"federation,omitempty"`

	engine    *serving.Engine
	policy    *policies.Engine
	catalogue *route.Catalogue
	egress    *egress.Egress
	pipeline  *pipeline.Pipeline
	logger    *zap.Logger
	logq      *asynclog.Queue
	tools     *plugins.Manager
	usage     *registry.Deliverer // UsageTool's deliverer (usage.go)
	// toolClassifier classifies direct tool calls (admin.go): the default detectors.
	toolClassifier *classify.Classifier

	registry     *registry.Registry // shared with molly_auth and across reloads (registry.go)
	registryPath string
	anonymous    *identity.Identity // requests without molly_auth (registry.go)
	priors       *priorsHandle      // shared across reloads (priors.go)

	// orchestrator serves composite requests; nil when turned off.
	orchestrator *orchestrate.Orchestrator
	sampling     chan struct{} // stops the engine sampler (observe.go)
	inflight     *inflight     // requests the handlers are serving (drain.go)

	recorder *traces.Recorder // consented trace capture (specialise.go)
	loop     *specialise.Loop // the specialisation loop (specialise.go)
	share    *traces.Share    // requests per category and tier over time (specialise.go)
	specDir  string           // the loop's folder (specialise.go)
	fed      *fed             // the federation roles (federation.go)
}

func init() { caddy.RegisterModule(App{}) }

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "molly", New: func() caddy.Module { return new(App) }}
}

// Provision checks the admin endpoint, compiles the policy and builds the catalogue.
func (a *App) Provision(ctx caddy.Context) error {
	// Log lines are encoded and written off the request path
	// (internal/asynclog); release writes what is left.
	a.logq = asynclog.New(4096)
	a.logger = a.logq.Wrap(ctx.Logger())
	a.inflight = new(inflight)
	// `molly validate` binds no admin listener (where admin.Check refuses
	// a plaintext one), so the app checks the admin block too.
	if err := admin.CheckContext(ctx); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	eng, err := policies.New(ctx, policies.Options{
		Dir:      a.PolicyDir,
		Timeout:  time.Duration(a.PolicyTimeout),
		Logger:   a.logger.Named("decision"),
		OnReload: a.onPolicyReload,
	})
	if err != nil {
		return fmt.Errorf("molly: policy: %w", err)
	}
	a.policy = eng
	a.policyLoaded()
	var engine route.Engine
	var handler http.Handler
	if a.EngineConfig != nil {
		a.engine, err = serving.New(*a.EngineConfig)
		if err != nil {
			return fmt.Errorf("molly: engine: %w", err)
		}
		engine, handler = a.engine, a.engine
		a.logger.Info("T0 engine loaded", zap.String("model", a.engine.Name()), zap.Strings("models", a.engine.Models()))
	}
	cat, err := route.NewCatalogue(a.Targets, engine)
	if err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	a.catalogue = cat
	for _, t := range cat.MissingKeys() {
		// The variable's name only, never a value: requests skip the target.
		a.logger.Warn("target excluded from routing: its API key is not set", zap.String("target", t.Name),
			zap.String("api_key_env", t.APIKeyEnv), zap.String("reason", t.MissingKey()))
	}
	if a.egress, err = egress.New(cat, handler); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	a.egress.SetLogger(a.logger.Named("draft"))
	w := route.DefaultWeights
	if a.Weights != nil {
		w = *a.Weights
	}
	if err := a.provisionRegistry(); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	a.anonymous = &identity.Identity{Member: AnonymousMember, Ledger: anonymousLedger{a.registry}}
	if err := a.provisionPriors(); err != nil {
		return fmt.Errorf("molly: priors: %w", err)
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := meter.DefaultMetrics.Register(reg); err != nil {
			return fmt.Errorf("molly: metrics: %w", err)
		}
		if err := observe.DefaultMetrics.Register(reg); err != nil {
			return fmt.Errorf("molly: metrics: %w", err)
		}
		if err := registerUsageMetrics(reg); err != nil {
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
	if err := a.provisionSpecialise(ctx); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	if err := a.provisionFederation(); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	a.pipeline = &pipeline.Pipeline{Catalogue: cat, Egress: a.egress, Policy: eng, Weights: w, Logger: a.logger.Named("route"),
		Priors: a.Priors(), Metrics: meter.DefaultMetrics,
		Strategies:        route.Config{Cascade: a.Cascade, Mixture: a.Mixture, ToolSteps: a.ToolSteps},
		FirstEventTimeout: time.Duration(a.FirstEventTimeout), Recorders: a.recorders()}
	if a.recorder != nil {
		a.pipeline.Capture = a.recorder
		a.pipeline.Recorders = append(a.pipeline.Recorders, a.recorder, a.share)
	}
	if a.pipeline.Health, err = a.provisionHealth(ctx); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	if a.tools, err = a.provisionTools(); err != nil {
		return fmt.Errorf("molly: tools: %w", err)
	}
	if a.tools != nil {
		a.pipeline.Tools, a.pipeline.Strategies.Tools = toolRunner{a.tools}, true
		scanner, err := redaction.NewScanner(redaction.Config{})
		if err != nil {
			return fmt.Errorf("molly: tools: classifier: %w", err)
		}
		a.toolClassifier = classify.New(scanner, nil)
	}
	if a.UsageTool != "" {
		if err := a.provisionUsage(ctx); err != nil {
			return fmt.Errorf("molly: usage_tool: %w", err)
		}
		// The usage tool records spend for the gateway itself: models never see it.
		a.pipeline.ToolsHidden = []string{a.UsageTool}
	}
	if !a.NoOrchestrator {
		cfg := orchestrate.Config{}
		if a.Orchestrator != nil {
			cfg = *a.Orchestrator
		}
		if a.orchestrator, err = orchestrate.New(a.pipeline, eng, cfg, a.logger.Named("orchestrate")); err != nil {
			return fmt.Errorf("molly: %w", err)
		}
		a.pipeline.Orchestrator = a.orchestrator
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
	if a.Orchestrator != nil {
		if err := a.Orchestrator.Validate(); err != nil {
			return fmt.Errorf("molly: %w", err)
		}
	}
	if a.OutlierDetection != nil {
		if err := a.OutlierDetection.Validate(); err != nil {
			return fmt.Errorf("molly: %w", err)
		}
	}
	if a.Specialise != nil {
		if err := a.Specialise.Validate(); err != nil {
			return fmt.Errorf("molly: %w", err)
		}
	}
	if a.Federation != nil {
		if err := a.Federation.Validate(); err != nil {
			return fmt.Errorf("molly: %w", err)
		}
	}
	if a.UsageTool != "" && !slices.ContainsFunc(a.Tools, func(t plugins.Config) bool { return t.Name == a.UsageTool }) {
		return fmt.Errorf("molly: usage_tool %q is not a configured tool", a.UsageTool)
	}
	return nil
}

// Start makes this app the one the admin API talks to and starts the
// priors' flushing and the usage tool's delivery.
func (a *App) Start() error {
	current.Store(a)
	a.startObserve()
	if err := a.startUsage(); err != nil {
		return fmt.Errorf("molly: usage_tool: %w", err)
	}
	if err := a.startFederation(); err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	if a.loop != nil {
		a.loop.Start()
	}
	return a.startPriors()
}

// Stop detaches the admin API if it still points at this app (on a reload
// the new app has started before the old one stops) and stops delivering
// usage (what is pending stays in the registry's outbox).
func (a *App) Stop() error {
	current.CompareAndSwap(a, nil)
	a.stopObserve()
	a.stopUsage()
	if a.loop != nil {
		a.loop.Stop() // a running cycle is interrupted; its training checkpointed
	}
	a.stopFederation() // background runs end; the aggregator's open rounds are abandoned
	return nil
}

// Cleanup stops the usage delivery and federation, then stops the tool
// plugins, closes upstream connections, the trace recorder, the registry
// and the engine: at once, or, when a reload replaced this app while its
// handlers still serve requests, once those have ended (drain.go).
func (a *App) Cleanup() error {
	a.stopUsage() // sends in flight, each bounded by its timeout (Stop did it unless Start never ran)
	a.stopFederation()
	a.cleanupFederation()
	if err := a.cleanupPriors(); err != nil {
		a.logger.Error("closing the priors", zap.Error(err))
	}
	a.afterDrain(a.release)
	return nil
}

// release closes what the requests of this app use.
func (a *App) release() {
	if a.tools != nil {
		_ = a.tools.Close()
	}
	if a.recorder != nil {
		_ = a.recorder.Close() // stores what is queued
	}
	if err := a.cleanupRegistry(); err != nil {
		a.logger.Error("closing the registry", zap.Error(err))
	}
	if a.egress != nil {
		a.egress.Close()
	}
	if a.engine != nil {
		if err := a.engine.Close(); err != nil {
			a.logger.Error("closing the engine", zap.Error(err))
		}
	}
	if a.logq != nil {
		a.logq.Close() // writes what is queued; later lines are written by their callers
	}
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
func (a *App) Catalogue() *route.Catalogue { return a.catalogue }

// Egress returns the upstream clients (for health probes).
func (a *App) Egress() *egress.Egress { return a.egress }

// Pipeline returns the request pipeline.
func (a *App) Pipeline() *pipeline.Pipeline { return a.pipeline }

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
