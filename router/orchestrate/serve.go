package orchestrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// run is one orchestrated request while it is served.
type run struct {
	o      *Orchestrator
	w      http.ResponseWriter
	ctx    context.Context
	a      *classify.Annotation
	dec    *policies.Decision
	parent pipeline.Parent
	rec    *Record
	log    *zap.Logger
	begin  time.Time
	msgs   []gjson.Result // the client's messages
	parts  Parts
	base   string // the default specialist model
	triage string

	plan *Plan
	byID map[string]*Subtask
	// plannerTier and plannerTarget are who planned: tool subtasks are
	// decided as if a model there had called them.
	plannerTier, plannerTarget string
	budget                     Cost
	// admitted is what was spent before admission (the controller's
	// calls, reserved on their own): refinement draws on the plan's
	// budget from there.
	admitted Cost
	prices   map[string][]*route.Target // client model → targets serving it

	mu      sync.Mutex // guards the fields below
	results map[string]*result
	spent   Cost
	stream  *sse // nil for a whole answer
	wrote   bool // a whole answer was written
}

// result is a subtask's latest output.
type result struct {
	ok       bool
	out      string // the (fused) output; for a tool, its result JSON
	finish   string
	err      string
	denied   bool
	disagree []string // the alternatives' answers when they disagree
}

// Serve answers a composite request: plan, admission, execution,
// fusion, check and refinement, then one chat completion (or stream).
// Errors are unwritten *openai.Error values (403 plan_denied, 429 from
// the reservation, 502 invalid_plan, 503 when every subtask failed);
// nil once a response was written or the client went away.
func (o *Orchestrator) Serve(w http.ResponseWriter, r *http.Request, a *classify.Annotation, d policies.Decided) error {
	dec := d.Decision()
	if !d.Binds(a) || dec == nil {
		return &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "decision_mismatch",
			Message: "The policy decision does not belong to this request."}
	}
	if _, aerr := route.ParseOverrides(r.Header); aerr != nil {
		return aerr
	}
	id := identity.From(r.Context())
	rn := &run{o: o, w: w, ctx: r.Context(), a: a, dec: dec, parent: pipeline.Parent{Annotation: a, Decided: d, Identity: id, Header: r.Header},
		begin: time.Now(), results: map[string]*result{}, msgs: gjson.Get(a.Body(), "messages").Array(), base: o.base}
	if a.Model() != ModelName {
		rn.base = a.Model()
	}
	rn.triage = "model " + ModelName
	switch {
	case strings.EqualFold(strings.TrimSpace(r.Header.Get(HeaderMode)), ModeOrchestrate):
		rn.triage = HeaderMode + ": " + ModeOrchestrate
	case a.Model() != ModelName:
		rn.triage = "composite: parts of several task categories or a governed tool"
	}
	rn.rec = &Record{ID: newID(), Created: rn.begin.UTC(), Member: id.Name(), DecisionID: dec.ID(), Model: a.Model(), Stream: a.Stream(),
		Triage: rn.triage, Status: StatusPlanning, Subtasks: []*SubtaskRecord{}}
	rn.log = o.log.With(zap.String("plan_id", rn.rec.ID), zap.String("decision_id", dec.ID()))
	o.store.add(rn.rec)
	w.Header().Set(HeaderPlanID, rn.rec.ID)
	w.Header().Set(pipeline.HeaderPlan, StrategyOrchestrate)
	err := rn.serve()
	rn.finish(err)
	if rn.ctx.Err() != nil {
		return nil // the client went away: nobody reads an error
	}
	if err != nil && rn.stream != nil {
		// The stream has started: the error goes inside it, as an error event.
		var ae *openai.Error
		if !errors.As(err, &ae) {
			ae = &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal error"}
		}
		rn.stream.event("error", ae.Body())
		return nil
	}
	return err
}

// serve is Serve's body; finish records how it ended.
func (rn *run) serve() error {
	rn.parts = SplitParts(rn.a.LastUserText(), rn.o.est)
	if err := rn.makePlan(); err != nil {
		return err
	}
	release, err := rn.admit()
	if err != nil {
		return err
	}
	defer release()
	rn.setStatus(StatusRunning)
	if rn.a.Stream() {
		s := startSSE(rn.w)
		rn.mu.Lock()
		rn.stream = s
		rn.mu.Unlock()
		rn.progress(fmt.Sprintf("molly plan %s: %d subtask(s), planner %s, budget %d tokens %.6f USD", rn.rec.ID, len(rn.plan.Subtasks),
			rn.plan.Planner, rn.budget.Tokens, rn.budget.CostUSD))
	}
	ids := make([]string, len(rn.plan.Subtasks))
	for i, s := range rn.plan.Subtasks {
		ids[i] = s.ID
	}
	rn.execute(ids, nil)
	if rn.ctx.Err() != nil {
		return rn.ctx.Err()
	}
	answer, unc := rn.refine()
	if rn.ctx.Err() != nil {
		return rn.ctx.Err()
	}
	if err := rn.conforms(); err != nil {
		return err
	}
	if strings.TrimSpace(answer) == "" {
		return rn.allFailed()
	}
	return rn.respond(answer, unc)
}

// finish records the end of the request and logs it.
func (rn *run) finish(err error) {
	rec := rn.rec
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var ae *openai.Error
	switch {
	case rn.ctx.Err() != nil:
		rec.Status = StatusClientClosed
	case errors.As(err, &ae) && ae.Code == policies.CodePlanDenied:
		rec.Status, rec.Error = StatusDenied, ae.Message
	case errors.As(err, &ae) && ae.Code == "invalid_plan":
		rec.Status, rec.Error = StatusInvalid, ae.Message
	case err != nil:
		rec.Status, rec.Error = StatusFailed, err.Error()
	case rec.Uncertainty != nil:
		rec.Status = StatusUncertain
	default:
		rec.Status = StatusAnswered
	}
	rec.LatencyMS = ms(time.Since(rn.begin))
	rec.CriticalPathMS = rn.criticalPath()
	rec.OverheadMS = max(rec.LatencyMS-rec.CriticalPathMS, 0)
	rec.CostUSD, rec.PromptTokens, rec.CompletionTokens = round6(rn.spent.CostUSD), rn.spentPrompt(), rn.spentCompletion()
	rn.log.Info("orchestration", zap.String("status", rec.Status), zap.String("planner", rec.Planner), zap.Int("subtasks", len(rec.Subtasks)),
		zap.Int("refinements", len(rec.Refinements)), zap.Float64("cost_usd", rec.CostUSD), zap.Float64("latency_ms", rec.LatencyMS),
		zap.Float64("critical_path_ms", rec.CriticalPathMS), zap.Float64("overhead_ms", rec.OverheadMS))
	if rn.ctx.Err() != nil {
		rn.o.p.Metrics.Unrouted(rn.a, "client_closed")
		if rn.stream == nil && !rn.wrote {
			rn.w.WriteHeader(499) // as the pipeline does: for the access log
		}
	}
}

func (rn *run) setStatus(s string) {
	rn.rec.mu.Lock()
	rn.rec.Status = s
	rn.rec.mu.Unlock()
}

// criticalPath is the subtasks' own latency along the slowest dependency
// chain, in ms (each subtask's recorded latency, refinements included).
func (rn *run) criticalPath() float64 {
	if rn.plan == nil {
		return 0
	}
	lat := map[string]float64{}
	for _, s := range rn.rec.Subtasks {
		lat[s.ID] = s.LatencyMS
	}
	memo := map[string]float64{}
	var at func(id string) float64
	at = func(id string) float64 {
		if v, ok := memo[id]; ok {
			return v
		}
		best := 0.0
		for _, d := range rn.byID[id].DependsOn {
			best = max(best, at(d))
		}
		memo[id] = best + lat[id]
		return memo[id]
	}
	total := 0.0
	for _, s := range rn.plan.Subtasks {
		total = max(total, at(s.ID))
	}
	return total
}

// allFailed is the error when no subtask produced an answer.
func (rn *run) allFailed() error {
	var parts []string
	rn.rec.mu.Lock()
	for _, s := range rn.rec.Subtasks {
		if s.Error != "" {
			parts = append(parts, s.ID+": "+s.Error)
		}
	}
	rn.rec.mu.Unlock()
	msg := "Every subtask of plan " + rn.rec.ID + " failed"
	if len(parts) > 0 {
		msg += " (" + strings.Join(parts, "; ") + ")"
	}
	return &openai.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_target_available",
		Message: msg + ".", RetryAfter: 1, Extra: map[string]any{"plan_id": rn.rec.ID}}
}

// conforms re-checks the residency invariant on every subtask that
// answered: its tier is one its own decision allowed and under its
// ceiling. RunDerived guarantees it; a violation withholds the answer.
func (rn *run) conforms() error {
	rn.rec.mu.Lock()
	defer rn.rec.mu.Unlock()
	for _, s := range rn.rec.Subtasks {
		if s.Outcome != OutcomeOK || s.Kind != "model" {
			continue
		}
		allowed := false
		for _, t := range s.Tiers {
			allowed = allowed || t == s.Tier
		}
		if !allowed || tierIndex(s.Tier) > tierIndex(s.TierCeiling) {
			rn.log.Error("a subtask answered from a tier it was not allowed", zap.String("subtask", s.ID), zap.String("tier", s.Tier),
				zap.Strings("tiers", s.Tiers), zap.String("ceiling", s.TierCeiling))
			return &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "residency_violation",
				Message: "An orchestration subtask was answered from a tier its decision did not allow; the answer is withheld."}
		}
	}
	return nil
}

// reserve holds tokens and usd on the caller's ledger when it is a
// meter.Reserver (nothing otherwise) and returns the release.
func (rn *run) reserve(c Cost) (func(), error) {
	id := rn.parent.Identity
	if id == nil {
		return func() {}, nil
	}
	rv, ok := id.Ledger.(meter.Reserver)
	if !ok {
		return func() {}, nil
	}
	return rv.Reserve(rn.ctx, c.Tokens, c.CostUSD)
}

// spend adds what an answer cost to the plan's spend.
func (rn *run) spend(prompt, completion int, usd float64) {
	rn.mu.Lock()
	rn.spent.Tokens += prompt + completion
	rn.spent.CostUSD += usd
	rn.mu.Unlock()
	rn.rec.mu.Lock()
	rn.rec.PromptTokens += prompt
	rn.rec.CompletionTokens += completion
	rn.rec.mu.Unlock()
}

func (rn *run) spentNow() Cost {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.spent
}

// spentCompletionNow is the completion tokens spent so far.
func (rn *run) spentCompletionNow() int {
	rn.rec.mu.Lock()
	defer rn.rec.mu.Unlock()
	return rn.rec.CompletionTokens
}

func (rn *run) spentPrompt() int     { return rn.rec.PromptTokens }
func (rn *run) spentCompletion() int { return rn.rec.CompletionTokens }

// subtaskRecord returns the record of subtask id (made on first use).
func (rn *run) subtaskRecord(s *Subtask) *SubtaskRecord {
	rn.rec.mu.Lock()
	defer rn.rec.mu.Unlock()
	for _, r := range rn.rec.Subtasks {
		if r.ID == s.ID {
			return r
		}
	}
	r := &SubtaskRecord{ID: s.ID, Kind: s.Specialist.Kind(), Specialist: s.Specialist.Name(), TierCeiling: s.TierCeiling, Outcome: OutcomePending}
	rn.rec.Subtasks = append(rn.rec.Subtasks, r)
	sort.SliceStable(rn.rec.Subtasks, func(i, j int) bool { return rn.index(rn.rec.Subtasks[i].ID) < rn.index(rn.rec.Subtasks[j].ID) })
	return r
}

func (rn *run) index(id string) int {
	for i, s := range rn.plan.Subtasks {
		if s.ID == id {
			return i
		}
	}
	return len(rn.plan.Subtasks)
}

func (rn *run) result(id string) *result {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.results[id]
}

func (rn *run) setResult(id string, r *result) {
	rn.mu.Lock()
	rn.results[id] = r
	rn.mu.Unlock()
}

// newID returns a random RFC 4122 version 4 UUID.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func round6(x float64) float64 { return float64(int64(x*1e6+0.5)) / 1e6 }
