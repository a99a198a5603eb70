package federation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/registry"
)

// ParticipantConfig configures a Participant.
type ParticipantConfig struct {
	// Aggregator is the aggregator's base URL, https://host:port.
	Aggregator string
	// Client reaches the aggregator (nil: one with ClientTLS(TLS) that
	// follows no redirect).
	Client *http.Client
	TLS    TLSFiles
	// DP turns on clipping and noise (nil: off).
	DP *DP
	// StatePath is the JSON file the privacy spending and round history
	// are kept in ("": kept in memory only).
	StatePath string
	// Rand is the noise source (nil: ChaCha8 seeded from crypto/rand).
	Rand *rand.Rand
}

// Participant exports deltas to an aggregator and pulls aggregates.
type Participant struct {
	cfg    ParticipantConfig
	client *http.Client
	mu     sync.Mutex
	state  State
}

// State is a participant's privacy spending and history, as `molly
// federation status` shows it.
type State struct {
	Accountant Accountant `json:"accountant"`
	// Delta is the δ of Epsilon; EpsilonBudget the configured budget (0:
	// none).
	Delta         float64      `json:"delta,omitempty"`
	Epsilon       float64      `json:"epsilon"`
	EpsilonBudget float64      `json:"epsilon_budget,omitempty"`
	Sent          []SentRecord `json:"sent"`
}

// SentRecord is one delta sent.
type SentRecord struct {
	Domain  string    `json:"domain"`
	Round   uint64    `json:"round"`
	Samples int64     `json:"samples"`
	Bytes   int       `json:"bytes"`
	Norm    float64   `json:"norm"`              // L2 norm of the update before clipping
	Epsilon float64   `json:"epsilon,omitempty"` // ε of this release alone at δ
	Total   float64   `json:"epsilon_total,omitempty"`
	At      time.Time `json:"at"`
}

// NewParticipant loads the state at cfg.StatePath (if any) and builds
// the client. Errors: bad DP settings, unreadable certificates or state,
// an aggregator URL that is not https.
func NewParticipant(cfg ParticipantConfig) (*Participant, error) {
	if u, err := url.Parse(cfg.Aggregator); err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("federation aggregator %q: want an https:// URL", cfg.Aggregator)
	}
	if cfg.DP != nil {
		if err := cfg.DP.Validate(); err != nil {
			return nil, err
		}
	}
	p := &Participant{cfg: cfg, client: cfg.Client}
	if p.client == nil {
		tc, err := ClientTLS(cfg.TLS)
		if err != nil {
			return nil, err
		}
		p.client = &http.Client{Transport: &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}, CheckRedirect: noRedirect}
	}
	if cfg.StatePath != "" {
		st, err := ReadState(cfg.StatePath)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		p.state = st
	}
	if cfg.DP != nil {
		p.state.Delta, p.state.EpsilonBudget = cfg.DP.delta(), cfg.DP.EpsilonBudget
	}
	return p, nil
}

// noRedirect keeps the participant's requests at the aggregator it was
// configured with: a 3xx answer is returned as it is (an *APIError with
// its status), never followed, so no delta goes to a host the answer
// names (a 307 or 308 would resend the body there).
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// ReadState reads a participant's state file.
func ReadState(path string) (State, error) {
	var st State
	b, err := os.ReadFile(path)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("federation state %s: %w", path, err)
	}
	return st, nil
}

// State is a copy of the participant's state.
func (p *Participant) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.state
	st.Sent = append([]SentRecord(nil), st.Sent...)
	return st
}

func (p *Participant) save() error {
	if p.cfg.StatePath == "" {
		return nil
	}
	b, _ := json.MarshalIndent(p.state, "", "  ")
	tmp := p.cfg.StatePath + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, p.cfg.StatePath)
}

// APIError is an error answer of the aggregator.
type APIError struct {
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("aggregator answered %d %s: %s", e.Status, e.Code, e.Message)
}

func apiError(resp *http.Response) error {
	var body struct {
		Error struct {
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	_ = json.Unmarshal(b, &body)
	return &APIError{Status: resp.StatusCode, Code: body.Error.Code, Message: body.Error.Message}
}

func (p *Participant) url(domain string, parts ...string) string {
	return strings.TrimSuffix(p.cfg.Aggregator, "/") + "/federation/v1/rounds/" + url.PathEscape(domain) + strings.Join(parts, "")
}

// Round asks the aggregator for domain's open round.
func (p *Participant) Round(ctx context.Context, domain string) (RoundState, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url(domain), nil)
	if err != nil {
		return RoundState{}, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return RoundState{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return RoundState{}, apiError(resp)
	}
	var st RoundState
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Send exports d: with DP on it first checks that this release keeps
// the total ε within the budget (ErrBudget otherwise, nothing sent),
// clips and noises d in place and records the spending (before the bytes
// leave, so a failed send still counts); then it encodes and POSTs d.
// Errors: ErrBudget, the encoding's, transport failures, *APIError.
func (p *Participant) Send(ctx context.Context, d *Delta) (RoundState, error) {
	rec := SentRecord{Domain: d.Domain, Round: d.Round, Samples: d.Samples, Norm: d.Norm(), At: time.Now()}
	if dp := p.cfg.DP; dp != nil {
		p.mu.Lock()
		next := p.state.Accountant.after(*dp)
		total, _ := next.Epsilon(dp.delta())
		if dp.EpsilonBudget > 0 && total > dp.EpsilonBudget {
			spent := p.state.Epsilon
			p.mu.Unlock()
			return RoundState{}, fmt.Errorf("%w: this round would take ε from %.3g to %.3g, the budget is %.3g (δ=%g)", ErrBudget, spent, total, dp.EpsilonBudget, dp.delta())
		}
		one, _ := (Accountant{}).after(*dp).Epsilon(dp.delta())
		p.state.Accountant, p.state.Epsilon = next, total
		rec.Epsilon, rec.Total = one, total
		dp.Privatize(d, p.cfg.Rand)
		p.mu.Unlock()
	}
	b, err := d.Encode()
	if err != nil {
		return RoundState{}, err
	}
	rec.Bytes = len(b)
	p.mu.Lock()
	p.state.Sent = append(p.state.Sent, rec)
	err = p.save()
	p.mu.Unlock()
	if err != nil {
		return RoundState{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url(d.Domain, "/", strconv.FormatUint(d.Round, 10), "/deltas"), bytes.NewReader(b))
	if err != nil {
		return RoundState{}, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := p.client.Do(req)
	if err != nil {
		return RoundState{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return RoundState{}, apiError(resp)
	}
	var st RoundState
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Contribution is what a participant puts into a round of a domain: its
// locally trained adapter and the examples it was trained on (count only).
type Contribution struct {
	Domain  string
	Adapter *lora.Adapter
	Samples int64
	Base    Base
}

// Contribute asks the aggregator for c.Domain's open round, makes the
// delta of c's adapter for it (FromAdapter) and sends it (Send). Errors:
// Round's, FromAdapter's, Send's.
func (p *Participant) Contribute(ctx context.Context, c Contribution) (RoundState, error) {
	st, err := p.Round(ctx, c.Domain)
	if err != nil {
		return RoundState{}, err
	}
	d, err := FromAdapter(c.Adapter, st.Round, c.Domain, c.Base, c.Samples)
	if err != nil {
		return RoundState{}, err
	}
	return p.Send(ctx, d)
}

// Aggregate is a pulled aggregate.
type Aggregate struct {
	Path         string  // the adapter GGUF written
	Samples      int64   // total samples behind it
	Participants int     // reports averaged
	Rank         int     // its rank
	EnergyKept   float64 // share of the average the rank-r factors keep
}

// Pull waits (up to wait) for round of domain to close and writes its
// aggregate adapter GGUF to path. Errors: *APIError (404 still open, 410
// closed without an aggregate), transport and file errors.
func (p *Participant) Pull(ctx context.Context, domain string, round uint64, wait time.Duration, path string) (Aggregate, error) {
	u := p.url(domain, "/", strconv.FormatUint(round, 10), "/aggregate?wait=", wait.String())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Aggregate{}, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return Aggregate{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Aggregate{}, apiError(resp)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, DefaultMaxDeltaBytes+1))
	if err != nil {
		return Aggregate{}, err
	}
	if len(data) > DefaultMaxDeltaBytes {
		return Aggregate{}, fmt.Errorf("%w: the aggregate is larger than %d bytes", ErrTooLarge, DefaultMaxDeltaBytes)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return Aggregate{}, err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return Aggregate{}, err
	}
	h := resp.Header
	a := Aggregate{Path: path}
	a.Samples, _ = strconv.ParseInt(h.Get("X-Molly-Federation-Samples"), 10, 64)
	a.Participants, _ = strconv.Atoi(h.Get("X-Molly-Federation-Participants"))
	a.Rank, _ = strconv.Atoi(h.Get("X-Molly-Federation-Rank"))
	a.EnergyKept, _ = strconv.ParseFloat(h.Get("X-Molly-Federation-Energy-Kept"), 64)
	return a, nil
}

// Adoption is what a participant decided about an aggregate.
type Adoption struct {
	Version    registry.AdapterVersion
	Evaluation adapters.Evaluation
	Promoted   bool
}

// Adopt adds the aggregate adapter at path to store as a version of
// domain (source "federated"), scores it with ev against the incumbent
// (the version domain's alias serves, else the base) on the
// participant's own held-out examples and against the base on the
// general probes, applies gate, records the verdict, and promotes the
// version through store.Promote only when the gate says so. Errors: the
// store's (ErrOtherBase for an aggregate of another base), evaluation
// failures.
func Adopt(ctx context.Context, ev *eval.Evaluator, store *adapters.Store, promo adapters.Promotion, gate eval.Gate, domain, path string, held []lora.Example) (Adoption, error) {
	v, err := store.Add(ctx, domain, path, "federated", "", nil)
	if err != nil {
		return Adoption{}, err
	}
	incumbent := ""
	aliases, err := store.Registry.Aliases(ctx)
	if err != nil {
		return Adoption{}, err
	}
	if cur, ok := aliases[domain]; ok {
		iv, err := store.Registry.AdapterVersion(ctx, cur)
		if err != nil {
			return Adoption{}, err
		}
		incumbent = iv.Path
	}
	gen, err := ev.EncodeAll(eval.GeneralProbes())
	if err != nil {
		return Adoption{}, err
	}
	var s eval.Scores
	if s.IncumbentDomain, err = ev.NLL(incumbent, held, false); err != nil {
		return Adoption{}, err
	}
	if s.CandidateDomain, err = ev.NLL(v.Path, held, false); err != nil {
		return Adoption{}, err
	}
	if s.BaseGeneral, err = ev.NLL("", gen, false); err != nil {
		return Adoption{}, err
	}
	if s.CandidateGen, err = ev.NLL(v.Path, gen, false); err != nil {
		return Adoption{}, err
	}
	e := adapters.Evaluation{Scores: s, Verdict: gate.Judge(s), Quality: s.CandidateDomain.Quality(), HeldOut: len(held), Category: domain}
	out := Adoption{Version: v, Evaluation: e}
	b, _ := json.Marshal(e)
	v.Scores, v.Verdict = string(b), "refused"
	if e.Verdict.Promote {
		v.Verdict = "promoted"
	}
	if err := store.Registry.PutAdapterVersion(ctx, v, nil); err != nil {
		return out, err
	}
	out.Version = v
	if !e.Verdict.Promote {
		return out, store.Registry.AddAdapterEvent(ctx, registry.AdapterEvent{Name: domain, Version: v.Version, Action: "refuse", Reason: "federated: " + e.Verdict.Reason})
	}
	if _, err := store.Promote(ctx, promo, domain, v.Version, "promote", "federated: "+e.Verdict.Reason); err != nil {
		return out, err
	}
	out.Promoted = true
	return out, nil
}
