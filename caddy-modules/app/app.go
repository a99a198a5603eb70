// Package app is the Caddy app "molly": it holds the target catalogue and the
// policy engine that the molly_* HTTP handlers share.
package app

import (
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router"
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

	policy    *policies.Engine
	catalogue *router.Catalogue
	forwarder *router.Forwarder
	logger    *zap.Logger
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
	cat, err := router.NewCatalogue(a.Targets, nil)
	if err != nil {
		return fmt.Errorf("molly: %w", err)
	}
	a.catalogue = cat
	w := router.DefaultWeights
	if a.Weights != nil {
		w = *a.Weights
	}
	a.forwarder = &router.Forwarder{Catalogue: cat, Weights: w, Logger: a.logger.Named("route")}
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
	return nil
}

// Start is a no-op: the handlers use the app as requests come.
func (a *App) Start() error { return nil }

// Stop is a no-op; Cleanup releases resources.
func (a *App) Stop() error { return nil }

// Cleanup closes idle upstream connections.
func (a *App) Cleanup() error {
	if a.catalogue != nil {
		a.catalogue.Close()
	}
	return nil
}

// Policy returns the policy engine.
func (a *App) Policy() *policies.Engine { return a.policy }

// Catalogue returns the target catalogue.
func (a *App) Catalogue() *router.Catalogue { return a.catalogue }

// Forwarder returns the router's forwarder.
func (a *App) Forwarder() *router.Forwarder { return a.forwarder }

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
