package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/ollama/ollama/fs/ggml"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/curate"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/federation"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/learning/specialise"
	"github.com/molly-gateway/molly/registry"
)

// fed is the app's part in a federation (learning/federation): the
// aggregator's HTTPS server and the participant's client, its runs.
type fed struct {
	cfg  federation.Config
	base federation.Base // the engine's base: arch, checksum, weight type

	agg    *federation.Aggregator
	server *http.Server
	ln     net.Listener
	served chan struct{} // closed when Serve returned

	part *federation.Participant
	runs sync.Mutex // one federation run at a time
	mu   sync.Mutex
	last map[string]FederatedDomain // the last run of each domain

	ctx    context.Context // cancelled on Stop: ends background runs
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// FederatedDomain is one domain's part of a federation run of a
// participant: the local adapter version it contributed, the round, and
// what its gate decided about the aggregate.
type FederatedDomain struct {
	Domain string `json:"domain"`
	// Contributed is the local version (hash) whose delta was sent.
	Contributed string `json:"contributed,omitempty"`
	Round       uint64 `json:"round,omitempty"`
	Samples     int64  `json:"samples,omitempty"` // this participant's training pairs
	// Participants, TotalSamples, Rank and EnergyKept describe the
	// aggregate as the aggregator reported it.
	Participants int     `json:"participants,omitempty"`
	TotalSamples int64   `json:"total_samples,omitempty"`
	Rank         int     `json:"rank,omitempty"`
	EnergyKept   float64 `json:"energy_kept,omitempty"`
	// Version is the aggregate's version in this participant's store
	// (source "federated"); Promoted whether the gate promoted it, Reason
	// the gate's sentence.
	Version    string               `json:"version,omitempty"`
	Promoted   bool                 `json:"promoted"`
	Reason     string               `json:"reason,omitempty"`
	Evaluation *adapters.Evaluation `json:"evaluation,omitempty"`
	Skipped    string               `json:"skipped,omitempty"`
	Error      string               `json:"error,omitempty"`
	At         time.Time            `json:"at"`
}

// FederationStatus is GET /molly/federation/status: the role, the
// participant's privacy spending and history (federation.State) and the
// last run of each domain, or the aggregator's listener and peers.
type FederationStatus struct {
	Role   string            `json:"role"`
	Listen string            `json:"listen,omitempty"`
	Peers  []string          `json:"peers,omitempty"`
	State  *federation.State `json:"state,omitempty"`
	Runs   []FederatedDomain `json:"runs,omitempty"`
}

// ggufArch reads general.architecture of the GGUF at path.
func ggufArch(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return g.KV().Architecture(), nil
}

// provisionFederation checks the federation block against the rest of
// the app and prepares its roles: the aggregator's server (bound in
// Start) and the participant's client. Both need the engine: deltas are
// pinned to its base; a participant also needs the specialise block,
// whose adapters it contributes and whose gate judges aggregates.
func (a *App) provisionFederation() error {
	if a.Federation == nil {
		return nil
	}
	cfg := *a.Federation
	if err := cfg.Validate(); err != nil {
		return err
	}
	if a.EngineConfig == nil {
		return errors.New("federation: deltas are pinned to the T0 engine's base; configure an engine")
	}
	agg := cfg.Role == federation.RoleAggregator || cfg.Role == federation.RoleBoth
	part := cfg.Role == federation.RoleParticipant || cfg.Role == federation.RoleBoth
	if part && a.loop == nil {
		return errors.New("federation: a participant contributes the adapters of the specialisation loop; add a specialise block")
	}
	b, err := adapters.BaseOf(a.EngineConfig.ModelPath)
	if err != nil {
		return fmt.Errorf("federation: base model: %w", err)
	}
	arch, err := ggufArch(a.EngineConfig.ModelPath)
	if err != nil {
		return fmt.Errorf("federation: base model: %w", err)
	}
	f := &fed{cfg: cfg, base: federation.Base{Arch: arch, Checksum: b.Checksum, Quant: b.Quant}, last: map[string]FederatedDomain{}}
	log := a.logger.Named("federation")
	if agg {
		ac := cfg.AggregatorConfig(f.base)
		ac.Logger = log
		if a.loop != nil {
			ac.Store = a.loop.Store()
		}
		if f.agg, err = federation.NewAggregator(ac); err != nil {
			return fmt.Errorf("federation: %w", err)
		}
		if f.server, err = f.agg.Server(cfg.Listen, cfg.TLS); err != nil {
			return fmt.Errorf("federation: %w", err)
		}
		f.server.ErrorLog = zap.NewStdLog(log)
	}
	if part {
		pc := cfg.ParticipantConfig()
		if pc.StatePath == "" {
			pc.StatePath = filepath.Join(a.specialiseDir(), "federation-state.json")
		}
		if f.part, err = federation.NewParticipant(pc); err != nil {
			return fmt.Errorf("federation: %w", err)
		}
	}
	a.fed = f
	return nil
}

// startFederation binds the aggregator's listener through Caddy's
// listener pool (so a reload on the same address overlaps cleanly) and
// serves the federation API over mutual TLS.
func (a *App) startFederation() error {
	f := a.fed
	if f == nil {
		return nil
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	if f.server == nil {
		return nil
	}
	na, err := caddy.ParseNetworkAddress(f.cfg.Listen)
	if err != nil {
		return fmt.Errorf("federation: listen %q: %w", f.cfg.Listen, err)
	}
	l, err := na.Listen(f.ctx, 0, net.ListenConfig{})
	if err != nil {
		return fmt.Errorf("federation: listen %q: %w", f.cfg.Listen, err)
	}
	ln, ok := l.(net.Listener)
	if !ok {
		return fmt.Errorf("federation: listen %q is not a stream listener", f.cfg.Listen)
	}
	f.ln, f.served = ln, make(chan struct{})
	go func() {
		defer close(f.served)
		if err := f.server.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.logger.Named("federation").Error("federation server stopped", zap.Error(err))
		}
	}()
	a.logger.Named("federation").Info("federation aggregator serving", zap.String("listen", ln.Addr().String()),
		zap.Strings("peers", f.cfg.Peers), zap.Int("min_participants", f.cfg.MinParticipants))
	return nil
}

// stopFederation ends background runs and the aggregator's server.
func (a *App) stopFederation() {
	f := a.fed
	if f == nil || f.cancel == nil {
		return
	}
	f.cancel()
	if f.server != nil && f.served != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = f.server.Shutdown(ctx)
		cancel()
		<-f.served
	}
	f.wg.Wait()
}

// cleanupFederation stops the aggregator's round timers.
func (a *App) cleanupFederation() {
	if a.fed != nil && a.fed.agg != nil {
		a.fed.agg.Close()
	}
}

// specialiseDir is the specialisation loop's folder (provisionSpecialise).
func (a *App) specialiseDir() string { return a.specDir }

// afterCycle is the specialisation loop's OnCycle of a participant: the
// domains the cycle trained a version for are contributed in the
// background (FederationRun), so the cycle's caller is not held for the
// round.
func (a *App) afterCycle(rep specialise.Report) {
	f := a.fed
	if f == nil || f.part == nil || f.ctx == nil {
		return
	}
	var domains []string
	for _, d := range rep.Domains {
		if d.Version != "" && d.Error == "" {
			domains = append(domains, d.Domain)
		}
	}
	if len(domains) == 0 {
		return
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if _, err := a.FederationRun(f.ctx, domains); err != nil && !errors.Is(err, context.Canceled) {
			a.logger.Named("federation").Warn("federation run after the specialisation cycle failed", zap.Error(err))
		}
	}()
}

// ErrNoParticipant is returned by FederationRun when this Molly is not a
// participant.
var ErrNoParticipant = errors.New("this Molly is not a federation participant (federation { role participant ... })")

// FederationRun contributes, for each domain (nil: every domain with a
// locally made adapter version), the delta of the domain's latest local
// version (source trained, external or import: never a federated one),
// waits for its round to close, pulls the aggregate and adopts it through
// the specialisation gate on this participant's own held-out pairs
// (federation.Adopt): the aggregate becomes a version of source
// "federated", promoted or refused. A version already contributed is not
// sent again: its domain's earlier result is returned, unless that run
// failed (a round closed with too few reports, the aggregator
// unreachable), when it joins the open round again. One run at a time;
// a domain's failure is in its entry, not an error. Errors:
// ErrNoParticipant, the registry's.
func (a *App) FederationRun(ctx context.Context, domains []string) ([]FederatedDomain, error) {
	f := a.fed
	if f == nil || f.part == nil {
		return nil, ErrNoParticipant
	}
	f.runs.Lock()
	defer f.runs.Unlock()
	reg := a.registry
	all, err := reg.AdapterVersions(ctx, "")
	if err != nil {
		return nil, err
	}
	latest := map[string]registry.AdapterVersion{} // newest first in all
	for _, v := range all {
		if _, ok := latest[v.Name]; !ok && v.Source != "federated" {
			latest[v.Name] = v
		}
	}
	if domains == nil {
		for d := range latest {
			domains = append(domains, d)
		}
		slices.Sort(domains)
	}
	var out []FederatedDomain
	for _, d := range domains {
		v, ok := latest[d]
		if !ok {
			out = append(out, FederatedDomain{Domain: d, Skipped: "no locally trained adapter version", At: time.Now()})
			continue
		}
		f.mu.Lock()
		prev, seen := f.last[d]
		f.mu.Unlock()
		if seen && prev.Contributed == v.Version && prev.Error == "" {
			out = append(out, prev)
			continue
		}
		res := a.federateDomain(ctx, v)
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		f.mu.Lock()
		f.last[d] = res
		f.mu.Unlock()
		log := a.logger.Named("federation")
		switch {
		case res.Error != "":
			log.Warn("federation round failed for this participant", zap.String("domain", d), zap.String("error", res.Error))
		case res.Skipped != "":
			log.Info("federation skipped a domain", zap.String("domain", d), zap.String("reason", res.Skipped))
		default:
			log.Info("federated adapter adopted", zap.String("domain", d), zap.Uint64("round", res.Round),
				zap.Int("participants", res.Participants), zap.String("version", adapters.Short(res.Version)),
				zap.Bool("promoted", res.Promoted), zap.String("reason", res.Reason))
		}
		out = append(out, res)
	}
	return out, nil
}

// federateDomain is one domain of FederationRun.
func (a *App) federateDomain(ctx context.Context, v registry.AdapterVersion) FederatedDomain {
	f := a.fed
	res := FederatedDomain{Domain: v.Name, At: time.Now()}
	fail := func(err error) FederatedDomain {
		res.Error = err.Error()
		return res
	}
	if v.Set == "" {
		res.Skipped = "version " + adapters.Short(v.Version) + " names no curated set: its sample count and held-out pairs are unknown"
		return res
	}
	set, err := a.registry.CuratedSet(ctx, v.Set)
	if err != nil {
		return fail(fmt.Errorf("curated set %s: %w", v.Set, err))
	}
	for _, it := range set.Items {
		if it.Split == registry.SplitTrain {
			res.Samples++
		}
	}
	held, err := curate.Pairs(set, registry.SplitHeldOut)
	if err != nil {
		return fail(err)
	}
	if res.Samples == 0 || len(held) == 0 {
		res.Skipped = fmt.Sprintf("curated set %s has %d training and %d held-out pairs", v.Set, res.Samples, len(held))
		return res
	}
	model, err := lora.LoadModel(a.EngineConfig.ModelPath)
	if err != nil {
		return fail(err)
	}
	ad, err := lora.ReadAdapter(v.Path, model)
	if err != nil {
		return fail(err)
	}
	st, err := f.part.Contribute(ctx, federation.Contribution{Domain: v.Name, Adapter: ad, Samples: res.Samples, Base: f.base})
	res.Round = st.Round
	if err != nil {
		return fail(fmt.Errorf("contributing: %w", err))
	}
	res.Contributed = v.Version
	wait := f.cfg.RoundDeadline
	if wait <= 0 {
		wait = 10 * time.Minute
	}
	path := filepath.Join(a.specialiseDir(), "federated", fmt.Sprintf("%s-round-%d.gguf", v.Name, st.Round))
	agg, err := f.part.Pull(ctx, v.Name, st.Round, wait+time.Minute, path)
	if err != nil {
		return fail(fmt.Errorf("pulling round %d: %w", st.Round, err))
	}
	defer os.Remove(path) // the store keeps its own copy
	res.Participants, res.TotalSamples, res.Rank, res.EnergyKept = agg.Participants, agg.Samples, agg.Rank, agg.EnergyKept
	ev, err := eval.Open(a.EngineConfig.ModelPath)
	if err != nil {
		return fail(err)
	}
	defer ev.Close()
	heldEx, err := ev.EncodeAll(held)
	if err != nil {
		return fail(err)
	}
	var gate eval.Gate
	if a.Specialise != nil {
		gate = a.Specialise.Gate
	}
	ado, err := federation.Adopt(ctx, ev, a.loop.Store(), a.loop.Promotion(), gate, v.Name, path, heldEx)
	res.Version, res.Promoted = ado.Version.Version, ado.Promoted
	if ado.Version.Version != "" {
		e := ado.Evaluation
		res.Evaluation, res.Reason = &e, e.Verdict.Reason
	}
	if err != nil {
		return fail(fmt.Errorf("adopting the aggregate: %w", err))
	}
	return res
}

// FederationStatus is the federation's state now; ok is false without a
// federation block.
func (a *App) FederationStatus() (FederationStatus, bool) {
	f := a.fed
	if f == nil {
		return FederationStatus{}, false
	}
	s := FederationStatus{Role: f.cfg.Role}
	if f.agg != nil {
		s.Listen, s.Peers = f.cfg.Listen, f.agg.Peers()
		if f.ln != nil {
			s.Listen = f.ln.Addr().String()
		}
	}
	if f.part != nil {
		st := f.part.State()
		s.State = &st
		f.mu.Lock()
		for _, r := range f.last {
			s.Runs = append(s.Runs, r)
		}
		f.mu.Unlock()
		slices.SortFunc(s.Runs, func(x, y FederatedDomain) int {
			if x.Domain < y.Domain {
				return -1
			}
			if x.Domain > y.Domain {
				return 1
			}
			return 0
		})
	}
	return s, true
}
