package router

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/policies"
)

// rank reads the request's overrides, ranks the candidates with the
// learned priors and logs the decision: every candidate with its score
// terms and every excluded target with the constraint that removed it.
// The error is a 400 *api.Error for an invalid override header.
func (f *Forwarder) rank(r *http.Request, a *Annotation, d *policies.Decision, log *zap.Logger) ([]Candidate, []Exclusion, bool, error) {
	o, aerr := ParseOverrides(r.Header)
	if aerr != nil {
		f.Metrics.unrouted(a, "bad_request")
		return nil, nil, false, aerr
	}
	sel := Selection{Weights: f.Weights, Priors: f.Priors, Overrides: o}
	if id := IdentityFrom(r.Context()); id != nil && id.Budgeted {
		sel.Budgeted, sel.RemainingUSD = true, id.RemainingUSD
	}
	cands, excluded, known := f.Catalogue.RankWith(a, d, sel)
	cs := make([]string, len(cands))
	for i, c := range cands {
		cs[i] = describe(c)
	}
	xs := make([]string, len(excluded))
	for i, e := range excluded {
		xs[i] = e.String()
	}
	fields := []zap.Field{zap.String("decision_id", d.ID()), zap.String("model", a.Model), zap.String("task", a.Task),
		zap.Float64("difficulty", a.Difficulty), zap.Strings("candidates", cs), zap.Strings("excluded", xs)}
	if o.Prefer != PreferNone {
		fields = append(fields, zap.String("prefer", string(o.Prefer)))
	}
	if o.HasMaxCost {
		fields = append(fields, zap.Float64("max_cost_usd", o.MaxCostUSD))
	}
	log.Info("route decision", fields...)
	switch {
	case !known:
		f.Metrics.unrouted(a, "model_not_found")
	case len(cands) == 0:
		f.Metrics.unrouted(a, "no_target")
	}
	return cands, excluded, known, nil
}

// describe is one candidate in the decision log:
// "lan/m q=0.7000 (learned 3) cost=0.002000 lat=1.000 score=0.6300".
func describe(c Candidate) string {
	src := "config"
	if c.Learned > 0 {
		src = fmt.Sprintf("learned %d", c.Learned)
	}
	return fmt.Sprintf("%s/%s q=%.4f (%s) cost=%.6f lat=%.3f score=%.4f", c.Target.Name, c.Model, c.Quality, src, c.CostUSD, c.LatencyS, c.Score)
}

// RouteHeader is the X-Molly-Route value for chosen among cands (best
// first): "<target>/<model> score=<s>", then "; runner-up <target>/<model>
// score=<s>" for the best other candidate (or "; runner-up none"), then
// "; fallback" when chosen was not the first choice. Scores have 4 decimals.
func RouteHeader(chosen Candidate, cands []Candidate) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s/%s score=%.4f", chosen.Target.Name, chosen.Model, chosen.Score)
	runnerUp := false
	for _, c := range cands {
		if c.Target == chosen.Target && c.Model == chosen.Model {
			continue
		}
		fmt.Fprintf(&b, "; runner-up %s/%s score=%.4f", c.Target.Name, c.Model, c.Score)
		runnerUp = true
		break
	}
	if !runnerUp {
		b.WriteString("; runner-up none")
	}
	if len(cands) > 0 && (cands[0].Target != chosen.Target || cands[0].Model != chosen.Model) {
		b.WriteString("; fallback")
	}
	return b.String()
}

// explain sets X-Molly-Route; call before the status is written.
func (f *Forwarder) explain(w http.ResponseWriter, chosen Candidate, cands []Candidate) {
	w.Header().Set(HeaderRoute, RouteHeader(chosen, cands))
}

// answered is what Serve knows about an answer once it is written.
type answered struct {
	chosen Candidate
	cands  []Candidate
	start  time.Time     // before the upstream call
	ttfb   time.Duration // until the upstream's answer headers
	status int
	body   []byte      // a whole answer; nil for a stream
	meter  *usageMeter // a stream's meter (its usage chunk)
	err    error       // a stream that broke off
	// decision labels a 2xx answer in the metrics instead of routed or
	// fallback: "escalated" (a cascade), "mixture"; "" for neither.
	decision string
}

// observe feeds an answer to the priors (latency; the decision, for
// feedback) and the metrics.
func (f *Forwarder) observe(a *Annotation, d *policies.Decision, x answered) {
	total := time.Since(x.start)
	decision := "routed"
	if len(x.cands) > 0 && (x.cands[0].Target != x.chosen.Target || x.cands[0].Model != x.chosen.Model) {
		decision = "fallback"
	}
	if x.decision != "" {
		decision = x.decision
	}
	switch {
	case x.status/100 != 2:
		decision = "upstream_error"
	case x.err != nil:
		decision = "truncated"
	}
	if x.status/100 == 2 && x.err == nil {
		f.Priors.ObserveLatency(x.chosen.Target.Name, x.ttfb, total)
		f.Priors.Remember(d.ID(), x.chosen.Key, x.chosen.Quality)
	}
	prompt, completion := -1, -1
	switch {
	case x.body != nil:
		if p, c, ok := reportedUsage(gjson.GetBytes(x.body, "usage")); ok {
			prompt, completion = p, c
		} else if x.status/100 == 2 { // counted as the usage ledger does
			var b strings.Builder
			answerText(&b, gjson.ParseBytes(x.body))
			prompt, completion = a.PromptTokens, EstimateTokens(b.String())
		}
	case x.meter != nil && x.meter.reported != nil:
		prompt, completion = x.meter.reported.PromptTokens, x.meter.reported.CompletionTokens
	}
	if x.status/100 == 2 && x.err == nil {
		// Generation time: after the first byte for streams (tokens arrive
		// as made); the whole exchange otherwise.
		gen := total
		if x.meter != nil {
			gen = total - x.ttfb
		}
		f.Priors.ObserveThroughput(x.chosen.Target.Name, x.chosen.Model, completion, gen)
	}
	f.Metrics.served(a, x.chosen, decision, total.Seconds(), x.ttfb.Seconds(), prompt, completion)
}

// failed counts a request every candidate failed.
func (f *Forwarder) failed(a *Annotation, err *api.Error) *api.Error {
	f.Metrics.unrouted(a, "failed")
	return err
}
