package federation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"gonum.org/v1/gonum/mat"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
)

// Errors of submitting to an aggregator.
var (
	// ErrOtherBase: the delta was trained against another base.
	ErrOtherBase = errors.New("delta made for another base")
	// ErrReplay: the delta names a round that is closed (or a repeat from
	// the same peer in the open round).
	ErrReplay = errors.New("replayed delta")
	// ErrFutureRound: the delta names a round that has not opened.
	ErrFutureRound = errors.New("round not open")
	// ErrMismatch: the delta's matrices differ from the round's.
	ErrMismatch = errors.New("delta does not match the round's matrices")
	// ErrUnknownPeer: the sender is not a configured participant.
	ErrUnknownPeer = errors.New("unknown peer")
	// ErrWrongRound: the delta's header names another domain or round
	// than the path it was posted to.
	ErrWrongRound = errors.New("delta posted to another round")
	// ErrTooFew: the round closed with fewer reports than
	// MinParticipants.
	ErrTooFew = errors.New("round closed with too few participants")
)

// AggregatorConfig configures an Aggregator.
type AggregatorConfig struct {
	Base Base // the base every delta must be for
	// Peers are the participants' certificate names; a round closes early
	// once every one of them has reported.
	Peers []string
	// MinParticipants is the least reports a round aggregates (default 2).
	MinParticipants int
	// Deadline is how long a round stays open after its first report
	// (default 10 minutes); it then closes with the reports it has.
	Deadline time.Duration
	// Rank is the rank the average is re-factorised to (0: the largest
	// rank among the deltas).
	Rank int
	// MaxDeltaBytes bounds one encoded delta (default DefaultMaxDeltaBytes).
	MaxDeltaBytes int
	// Dir is where aggregate adapters are written:
	// <Dir>/<domain>-round-<N>.gguf.
	Dir    string
	Logger *zap.Logger
	// Evaluator and Probes, when both are set, score each aggregate on
	// the aggregator's own probes of its domain (Result.ProbeNLL).
	Evaluator *eval.Evaluator
	Probes    map[string][]lora.Example
	// Store, when set, receives each aggregate as a new version of its
	// domain (source "federated"; Result.Version). Promotion stays with
	// each participant's gate.
	Store *adapters.Store
}

// Aggregator runs FedAvg rounds, one open round per domain at a time.
// Safe for concurrent use.
type Aggregator struct {
	cfg    AggregatorConfig
	mu     sync.Mutex
	rounds map[string]*Round // the open (or last) round by domain
	closed map[string]map[uint64]*Round
	last   map[string]uint64 // the last closed round by domain, kept in <Dir>/rounds.json
	stop   bool
}

// roundsFile keeps the last closed round of each domain across restarts,
// so that a delta of a round closed before a restart is still a replay.
const roundsFile = "rounds.json"

// Round is one domain's round.
type Round struct {
	Domain   string
	ID       uint64
	Opened   time.Time // the first report (zero while none)
	Deadline time.Time
	reports  map[string]*Delta // by peer
	timer    *time.Timer
	done     chan struct{} // closed when the round closes
	Result   *Result       // set when closed
}

// Result is a closed round.
type Result struct {
	Domain       string   `json:"domain"`
	Round        uint64   `json:"round"`
	Participants []string `json:"participants"`
	Samples      int64    `json:"samples"`
	Rank         int      `json:"rank"`
	// EnergyKept is Σ of the kept singular values squared over Σ of all,
	// over every matrix: the share of the average the rank-r adapter
	// keeps (1: exact).
	EnergyKept float64 `json:"energy_kept"`
	Path       string  `json:"path,omitempty"` // the aggregate adapter GGUF
	// ProbeNLL is the aggregate's mean NLL per token on the aggregator's
	// own probes of the domain (0: none configured).
	ProbeNLL float64 `json:"probe_nll,omitempty"`
	// Version is the aggregate's version in the aggregator's store.
	Version  string    `json:"version,omitempty"`
	Error    string    `json:"error,omitempty"`
	ClosedAt time.Time `json:"closed_at"`
	err      error
}

// Err is the round's failure (nil: it aggregated).
func (r *Result) Err() error { return r.err }

// NewAggregator makes an aggregator. Errors: no base checksum, no
// folder.
func NewAggregator(cfg AggregatorConfig) (*Aggregator, error) {
	if cfg.Base.Checksum == "" {
		return nil, errors.New("federation aggregator: the base checksum is required")
	}
	if cfg.Dir == "" {
		return nil, errors.New("federation aggregator: dir is required")
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if cfg.MinParticipants <= 0 {
		cfg.MinParticipants = 2
	}
	if cfg.Deadline <= 0 {
		cfg.Deadline = 10 * time.Minute
	}
	if cfg.MaxDeltaBytes <= 0 {
		cfg.MaxDeltaBytes = DefaultMaxDeltaBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	a := &Aggregator{cfg: cfg, rounds: map[string]*Round{}, closed: map[string]map[uint64]*Round{}, last: map[string]uint64{}}
	if b, err := os.ReadFile(filepath.Join(cfg.Dir, roundsFile)); err == nil {
		if err := json.Unmarshal(b, &a.last); err != nil {
			return nil, fmt.Errorf("federation aggregator: %s: %w", filepath.Join(cfg.Dir, roundsFile), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return a, nil
}

// saveRounds writes a.last atomically. Called with mu held.
func (a *Aggregator) saveRounds() error {
	b, _ := json.Marshal(a.last)
	path := filepath.Join(a.cfg.Dir, roundsFile)
	if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// MaxDeltaBytes is the configured bound of one encoded delta.
func (a *Aggregator) MaxDeltaBytes() int { return a.cfg.MaxDeltaBytes }

// Peers are the allowed participants.
func (a *Aggregator) Peers() []string { return a.cfg.Peers }

// current returns domain's open round, opening round 1 (or the one after
// the last closed) when there is none. Called with mu held.
func (a *Aggregator) current(domain string) *Round {
	r := a.rounds[domain]
	if r == nil || r.Result != nil {
		id := a.last[domain] + 1
		if r != nil {
			id = max(id, r.ID+1)
		}
		r = &Round{Domain: domain, ID: id, reports: map[string]*Delta{}, done: make(chan struct{})}
		a.rounds[domain] = r
	}
	return r
}

// RoundState is a domain's current round as participants see it.
type RoundState struct {
	Domain   string    `json:"domain"`
	Round    uint64    `json:"round"`
	Reported int       `json:"reported"`
	Deadline time.Time `json:"deadline,omitzero"`
}

// Current is domain's open round.
func (a *Aggregator) Current(domain string) RoundState {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := a.current(domain)
	return RoundState{Domain: domain, Round: r.ID, Reported: len(r.reports), Deadline: r.Deadline}
}

// Submit decodes and checks one encoded delta from peer, posted for
// round of domain, and adds it to that domain's open round; the round
// closes at once when every peer has reported. Errors: ErrUnknownPeer,
// ErrWrongRound (the delta's header names another domain or round),
// ErrTooLarge, ErrMalformed,
// ErrOtherBase, ErrReplay (an old round or a repeat), ErrFutureRound,
// ErrMismatch. A refused delta is logged (peer, reason) and changes
// nothing.
func (a *Aggregator) Submit(peer, domain string, round uint64, b []byte) (RoundState, error) {
	st, err := a.submit(peer, domain, round, b)
	if err != nil {
		a.cfg.Logger.Warn("federation delta refused", zap.String("peer", peer), zap.Int("bytes", len(b)), zap.Error(err))
	}
	return st, err
}

func (a *Aggregator) submit(peer, domain string, round uint64, b []byte) (RoundState, error) {
	if !slices.Contains(a.cfg.Peers, peer) {
		return RoundState{}, fmt.Errorf("%w %q", ErrUnknownPeer, peer)
	}
	d, err := DecodeDelta(b, a.cfg.MaxDeltaBytes)
	if err != nil {
		return RoundState{}, err
	}
	if d.Domain != domain || d.Round != round {
		return RoundState{}, fmt.Errorf("%w: posted for round %d of %s, its header names round %d of %s",
			ErrWrongRound, round, domain, d.Round, d.Domain)
	}
	if d.Base != a.cfg.Base {
		return RoundState{}, fmt.Errorf("%w: trained against %s %.12s… %s, this federation's base is %s %.12s… %s",
			ErrOtherBase, d.Base.Arch, d.Base.Checksum, d.Base.Quant, a.cfg.Base.Arch, a.cfg.Base.Checksum, a.cfg.Base.Quant)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stop {
		return RoundState{}, errors.New("aggregator closed")
	}
	r := a.current(d.Domain)
	switch {
	case d.Round < r.ID:
		return RoundState{}, fmt.Errorf("%w: round %d of %s is closed; the open round is %d", ErrReplay, d.Round, d.Domain, r.ID)
	case d.Round > r.ID:
		return RoundState{}, fmt.Errorf("%w: round %d of %s; the open round is %d", ErrFutureRound, d.Round, d.Domain, r.ID)
	case r.reports[peer] != nil:
		return RoundState{}, fmt.Errorf("%w: %s already reported round %d of %s", ErrReplay, peer, r.ID, d.Domain)
	}
	for _, o := range r.reports {
		if !slices.Equal(o.Tensors, d.Tensors) {
			return RoundState{}, fmt.Errorf("%w: its tensors or shapes differ from the first report's", ErrMismatch)
		}
		break
	}
	r.reports[peer] = d
	if r.Opened.IsZero() {
		r.Opened = time.Now()
		r.Deadline = r.Opened.Add(a.cfg.Deadline)
		r.timer = time.AfterFunc(a.cfg.Deadline, func() { a.closeRound(r) })
	}
	st := RoundState{Domain: d.Domain, Round: r.ID, Reported: len(r.reports), Deadline: r.Deadline}
	if len(r.reports) == len(a.cfg.Peers) {
		r.timer.Stop()
		go a.closeRound(r)
	}
	return st, nil
}

// closeRound aggregates r (once).
func (a *Aggregator) closeRound(r *Round) {
	a.mu.Lock()
	if r.Result != nil {
		a.mu.Unlock()
		return
	}
	reports := make(map[string]*Delta, len(r.reports))
	for k, v := range r.reports {
		reports[k] = v
	}
	// Mark closed under the lock so no report joins while aggregating.
	r.Result = &Result{Domain: r.Domain, Round: r.ID}
	if a.closed[r.Domain] == nil {
		a.closed[r.Domain] = map[uint64]*Round{}
	}
	a.closed[r.Domain][r.ID] = r
	a.last[r.Domain] = max(a.last[r.Domain], r.ID)
	if err := a.saveRounds(); err != nil {
		a.cfg.Logger.Error("federation round counters not saved; a restart may reopen this round", zap.Error(err))
	}
	a.mu.Unlock()

	res := a.aggregate(r.Domain, r.ID, reports)
	a.mu.Lock()
	*r.Result = res
	a.mu.Unlock()
	close(r.done)
	if res.err != nil {
		a.cfg.Logger.Warn("federation round failed", zap.String("domain", r.Domain), zap.Uint64("round", r.ID), zap.Error(res.err))
	} else {
		a.cfg.Logger.Info("federation round aggregated", zap.String("domain", r.Domain), zap.Uint64("round", r.ID),
			zap.Strings("participants", res.Participants), zap.Int64("samples", res.Samples), zap.Float64("energy_kept", res.EnergyKept))
	}
}

func (a *Aggregator) aggregate(domain string, id uint64, reports map[string]*Delta) Result {
	res := Result{Domain: domain, Round: id, ClosedAt: time.Now()}
	for p := range reports {
		res.Participants = append(res.Participants, p)
	}
	slices.Sort(res.Participants)
	if len(reports) < a.cfg.MinParticipants {
		res.err = fmt.Errorf("%w: %d reported, %d needed", ErrTooFew, len(reports), a.cfg.MinParticipants)
		res.Error = res.err.Error()
		return res
	}
	ds := make([]*Delta, 0, len(reports))
	for _, p := range res.Participants {
		ds = append(ds, reports[p])
	}
	avg, samples := FedAvg(ds)
	rank := a.cfg.Rank
	if rank <= 0 {
		for _, d := range ds {
			rank = max(rank, d.Rank)
		}
	}
	ad, kept, err := Factorize(avg, rank)
	if err == nil {
		res.Path = filepath.Join(a.cfg.Dir, fmt.Sprintf("%s-round-%d.gguf", domain, id))
		err = ad.WriteGGUF(res.Path, &lora.Model{Arch: a.cfg.Base.Arch, Checksum: a.cfg.Base.Checksum}, fmt.Sprintf("%s-federated-%d", domain, id))
	}
	if err != nil {
		res.err = fmt.Errorf("aggregating round %d of %s: %w", id, domain, err)
		res.Error, res.Path = res.err.Error(), ""
		return res
	}
	res.Samples, res.Rank, res.EnergyKept = samples, ad.Rank, kept
	if probes := a.cfg.Probes[domain]; a.cfg.Evaluator != nil && len(probes) > 0 {
		s, err := a.cfg.Evaluator.NLL(res.Path, probes, false)
		if err != nil {
			a.cfg.Logger.Warn("federation aggregate not scored", zap.String("domain", domain), zap.Error(err))
		} else {
			res.ProbeNLL = s.NLL
		}
	}
	if a.cfg.Store != nil {
		v, err := a.cfg.Store.Add(context.Background(), domain, res.Path, "federated", "", nil)
		if err != nil {
			a.cfg.Logger.Warn("federation aggregate not published", zap.String("domain", domain), zap.Error(err))
		} else {
			res.Version = v.Version
		}
	}
	return res
}

// Result waits until round id of domain closes or stop is closed, and
// returns it; ok is false when stop came first or the round is unknown
// (later than the open one).
func (a *Aggregator) Result(domain string, id uint64, stop <-chan struct{}) (Result, bool) {
	a.mu.Lock()
	var r *Round
	if c := a.closed[domain][id]; c != nil {
		r = c
	} else if o := a.current(domain); o.ID == id {
		r = o
	}
	a.mu.Unlock()
	if r == nil {
		return Result{}, false
	}
	select {
	case <-r.done:
		return *r.Result, true
	case <-stop:
		return Result{}, false
	}
}

// Close stops the round timers; open rounds are abandoned.
func (a *Aggregator) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stop = true
	for _, r := range a.rounds {
		if r.timer != nil {
			r.timer.Stop()
		}
	}
}

// FedAvg is the sample-weighted mean of deltas with the same matrices:
// Σᵢ nᵢ·ΔWᵢ / Σᵢ nᵢ per matrix (McMahan et al. 2017, Algorithm 1's server
// update), accumulated in float64; it returns the mean (with the first
// delta's header, Samples the total) and the total sample count.
func FedAvg(ds []*Delta) (*Delta, int64) {
	var total int64
	for _, d := range ds {
		total += d.Samples
	}
	out := &Delta{Header: ds[0].Header}
	out.Samples = total
	acc := make([][]float64, len(ds[0].W))
	for t := range acc {
		acc[t] = make([]float64, len(ds[0].W[t]))
	}
	for _, d := range ds {
		w := float64(d.Samples) / float64(total)
		for t, m := range d.W {
			at := acc[t]
			for i, v := range m {
				at[i] += w * float64(v)
			}
		}
	}
	out.W = make([][]float32, len(acc))
	for t, at := range acc {
		out.W[t] = make([]float32, len(at))
		for i, v := range at {
			out.W[t][i] = float32(v)
		}
	}
	return out, total
}

// Factorize re-factorises every matrix of d to rank r by truncated SVD
// (gonum's mat.SVD, thin): ΔW ≈ U_r·Σ_r·V_rᵀ, B = U_r·Σ_r^½ and
// A = Σ_r^½·V_rᵀ, with alpha = r so that llama.cpp's scale alpha/r is 1.
// kept is the share of squared singular values kept over all matrices.
// Errors: a rank out of range, a tensor name that is not
// blk.N.<target>.weight, an SVD that does not converge.
func Factorize(d *Delta, r int) (*lora.Adapter, float64, error) {
	if r <= 0 {
		return nil, 0, fmt.Errorf("rank %d must be positive", r)
	}
	for _, t := range d.Tensors {
		r = min(r, t.Out, t.In)
	}
	a := &lora.Adapter{Rank: r, Alpha: float32(r)}
	var keptE, allE float64
	for ti, t := range d.Tensors {
		var l int
		var target string
		if _, err := fmt.Sscanf(t.Name, "blk.%d.%s", &l, &target); err != nil {
			return nil, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		target = target[:len(target)-len(".weight")]
		w := make([]float64, len(d.W[ti]))
		for i, v := range d.W[ti] {
			w[i] = float64(v)
		}
		var svd mat.SVD
		if !svd.Factorize(mat.NewDense(t.Out, t.In, w), mat.SVDThin) {
			return nil, 0, fmt.Errorf("tensor %s: SVD did not converge", t.Name)
		}
		s := svd.Values(nil)
		var u, v mat.Dense
		svd.UTo(&u)
		svd.VTo(&v)
		p := &lora.Pair{Name: t.Name, Layer: l, Target: target, In: t.In, Out: t.Out,
			A: make([]float32, r*t.In), B: make([]float32, t.Out*r)}
		for k, sv := range s {
			allE += sv * sv
			if k < r {
				keptE += sv * sv
			}
		}
		for k := range r {
			rs := math.Sqrt(s[k])
			for o := range t.Out {
				p.B[o*r+k] = float32(u.At(o, k) * rs)
			}
			for i := range t.In {
				p.A[k*t.In+i] = float32(v.At(i, k) * rs)
			}
		}
		a.Pairs = append(a.Pairs, p)
		if !slices.Contains(a.Targets, target) {
			a.Targets = append(a.Targets, target)
		}
	}
	kept := 1.0
	if allE > 0 {
		kept = keptE / allE
	}
	return a, kept, nil
}
