package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/specialise"
	"github.com/molly-gateway/molly/learning/traces"
	"github.com/molly-gateway/molly/registry/postgres"
	"github.com/molly-gateway/molly/router/route"
)

// provisionSpecialise starts trace capture and prepares the specialisation
// loop (learning/specialise) when the app has a specialise block: the
// loop trains adapters for the engine's base, so it needs the engine, and
// it moves the prior of the first engine target. Promoted versions of an
// earlier run are registered in the fresh engine (their aliases and pinned
// names), so a restart serves what was promoted.
func (a *App) provisionSpecialise(ctx caddy.Context) error {
	if a.Specialise == nil {
		return nil
	}
	if a.engine == nil {
		return errors.New("specialise: the loop trains adapters for the T0 engine's base; configure an engine")
	}
	cfg := *a.Specialise
	if cfg.Dir == "" {
		base := filepath.Join(caddy.AppDataDir(), "molly")
		if !postgres.IsDSN(a.registryPath) {
			base = filepath.Dir(a.registryPath)
		}
		cfg.Dir = filepath.Join(base, "specialise")
	}
	a.specDir = cfg.Dir
	target, seed := "", func(string, string) float64 { return 0.5 }
	for _, t := range a.Targets {
		if t.Kind == route.KindEngine {
			target, seed = t.Name, t.Seed
			break
		}
	}
	if target == "" {
		return errors.New("specialise: no target of kind engine: promotions would move no prior")
	}
	rec, err := traces.New(a.registry, traces.Options{RetentionDays: cfg.RetentionDays, Logger: a.logger.Named("traces")})
	if err != nil {
		return fmt.Errorf("specialise: traces: %w", err)
	}
	a.recorder = rec
	a.share = processShare()
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		for _, c := range traces.Collectors() {
			if err := reg.Register(c); err != nil {
				if _, ok := err.(prometheus.AlreadyRegisteredError); !ok {
					return fmt.Errorf("specialise: metrics: %w", err)
				}
			}
		}
	}
	var priors adapters.Priors
	if p := a.Priors(); p != nil {
		priors = p
	}
	a.loop, err = specialise.New(cfg, specialise.Deps{Registry: a.registry, BaseModel: a.EngineConfig.ModelPath,
		Engine: a.engine, Priors: priors, Target: target, Seed: seed, Recorder: rec, Logger: a.logger.Named("specialise"),
		OnCycle: a.afterCycle})
	if err != nil {
		return err
	}
	if err := a.loop.Store().Apply(context.Background(), a.engine); err != nil {
		a.logger.Warn("promoted adapter versions not served", zap.Error(err))
	}
	return nil
}

// Specialiser returns the specialisation loop, or nil without a
// specialise block.
func (a *App) Specialiser() *specialise.Loop { return a.loop }

// Traces returns the trace recorder, or nil without a specialise block.
func (a *App) Traces() *traces.Recorder { return a.recorder }

// processShare is the one per-tier share of the process (hourly buckets, a
// week), kept across config reloads as the metrics are.
var processShare = sync.OnceValue(func() *traces.Share { return traces.NewShare(time.Hour, 168) })
