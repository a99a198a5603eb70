package app

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/route"
)

// PriorsFlushInterval is how often learned latencies are written to the
// priors file; quality updates (feedback) are written before they are
// acknowledged.
const PriorsFlushInterval = 5 * time.Second

// DefaultPriorsDB is the priors file when priors_db is not set:
// <Caddy's data directory>/molly/priors.db.
func DefaultPriorsDB() string { return filepath.Join(caddy.AppDataDir(), "molly", "priors.db") }

// priorsPool shares one route.Priors per file across config reloads (the
// new config provisions before the old one is cleaned up), so learned
// values in memory and the open file carry over.
var priorsPool = caddy.NewUsagePool()

// priorsHandle is the pooled value: the priors and, once the app started,
// their SQLite store.
type priorsHandle struct {
	*route.Priors
	path  string
	store *registry.PriorStore
}

// Destruct flushes the priors and closes the file (last user gone).
func (h *priorsHandle) Destruct() error {
	err := h.Priors.Close()
	if h.store != nil {
		if cerr := h.store.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// provisionPriors takes the priors of the configured file from the pool
// and, the first time, opens the file and loads it, so the learned priors
// are in place before any request is routed.
func (a *App) provisionPriors() error {
	a.priorsPath = a.PriorsDB
	if a.priorsPath == "" {
		a.priorsPath = DefaultPriorsDB()
	}
	v, loaded, err := priorsPool.LoadOrNew(a.priorsPath, func() (caddy.Destructor, error) {
		s, err := registry.OpenPriorStore(a.priorsPath)
		if err != nil {
			return nil, err
		}
		h := &priorsHandle{Priors: route.NewPriors(), path: a.priorsPath, store: s}
		if err := h.Attach(priorStore{s}); err != nil {
			s.Close()
			return nil, err
		}
		return h, nil
	})
	if err != nil {
		return fmt.Errorf("priors_db %s: %w", a.priorsPath, err)
	}
	a.priors = v.(*priorsHandle)
	if !loaded {
		a.logger.Info("priors loaded", zap.String("path", a.priorsPath))
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
	_, err := priorsPool.Delete(a.priorsPath)
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

// priorStore adapts registry.PriorStore to route.PriorStore.
type priorStore struct{ s *registry.PriorStore }

func (p priorStore) Load() ([]route.PriorRecord, error) {
	rows, err := p.s.Load()
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
	return p.s.Save(rows)
}
