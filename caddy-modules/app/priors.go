package app

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/route"
)

// PriorsFlushInterval is how often learned latencies are written to the
// registry; quality updates (feedback) are written before they are
// acknowledged.
const PriorsFlushInterval = 5 * time.Second

// DefaultLegacyPriors is where Molly kept priors before they joined the
// registry (priors_db's default): <Caddy's data directory>/molly/priors.db.
// If the file exists it is imported into the registry once.
func DefaultLegacyPriors() string { return filepath.Join(caddy.AppDataDir(), "molly", "priors.db") }

// priorsPool shares one route.Priors per registry file across config
// reloads (the new config provisions before the old one is cleaned up), so
// learned values in memory carry over.
var priorsPool = caddy.NewUsagePool()

// priorsHandle is the pooled value: the priors, attached to the registry
// they are kept in (the handle holds its own reference to the registry).
type priorsHandle struct {
	*route.Priors
	path string // the registry file
}

// Destruct flushes the priors, then gives back the registry (last user gone).
func (h *priorsHandle) Destruct() error {
	err := h.Priors.Close()
	if _, rerr := ReleaseRegistry(h.path); err == nil {
		err = rerr
	}
	return err
}

// provisionPriors takes the priors of the app's registry from the pool and,
// the first time, imports a legacy priors file (priors_db, or its default
// if present) and loads them, so the learned priors are in place before
// any request is routed.
func (a *App) provisionPriors() error {
	v, loaded, err := priorsPool.LoadOrNew(a.registryPath, func() (caddy.Destructor, error) {
		reg, err := AcquireRegistry(a.registryPath)
		if err != nil {
			return nil, err
		}
		legacy := a.PriorsDB
		if legacy == "" {
			legacy = DefaultLegacyPriors()
		}
		if n, err := reg.ImportPriors(context.Background(), legacy); err != nil {
			a.logger.Error("importing the legacy priors file failed; it is left as it is", zap.String("path", legacy), zap.Error(err))
		} else if n > 0 {
			a.logger.Info("legacy priors imported into the registry", zap.String("from", legacy), zap.String("registry", a.registry.Path()), zap.Int("priors", n))
		}
		h := &priorsHandle{Priors: route.NewPriors(), path: a.registryPath}
		if err := h.Attach(priorStore{reg}); err != nil {
			_, _ = ReleaseRegistry(a.registryPath)
			return nil, err
		}
		return h, nil
	})
	if err != nil {
		return fmt.Errorf("priors in %s: %w", a.registry.Path(), err)
	}
	a.priors = v.(*priorsHandle)
	if !loaded {
		a.logger.Info("priors loaded", zap.String("registry", a.registry.Path()))
	}
	return nil
}

// startPriors starts saving learned latencies periodically.
func (a *App) startPriors() error {
	if a.priors != nil {
		a.priors.StartFlushing(PriorsFlushInterval)
	}
	return nil
}

// cleanupPriors returns the priors to the pool.
func (a *App) cleanupPriors() error {
	if a.priors == nil {
		return nil
	}
	_, err := priorsPool.Delete(a.registryPath)
	a.priors = nil
	return err
}

// Priors returns the learned priors (for molly_feedback), or nil before Provision.
func (a *App) Priors() *route.Priors {
	if a.priors == nil {
		return nil
	}
	return a.priors.Priors
}

// priorStore adapts the registry's priors to route.PriorStore.
type priorStore struct{ reg *registry.Registry }

func (p priorStore) Load() ([]route.PriorRecord, error) {
	rows, err := p.reg.LoadPriors(context.Background())
	if err != nil {
		return nil, err
	}
	out := make([]route.PriorRecord, len(rows))
	for i, r := range rows {
		out[i] = route.PriorRecord{Kind: r.Kind, PriorKey: route.PriorKey{Target: r.Target, Model: r.Model, Category: r.Category},
			Value: r.Value, N: r.N, Updated: r.Updated}
	}
	return out, nil
}

func (p priorStore) Save(recs []route.PriorRecord) error {
	rows := make([]registry.Prior, len(recs))
	for i, r := range recs {
		rows[i] = registry.Prior{Kind: r.Kind, Target: r.Target, Model: r.Model, Category: r.Category, Value: r.Value, N: r.N, Updated: r.Updated}
	}
	return p.reg.SavePriors(context.Background(), rows)
}
