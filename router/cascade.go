package router

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
)

// HeaderCascade lists a cascade's attempts on its answer, in order, joined
// by " -> ": "<target>/<model> logprob=<mean><<threshold>" for an answer
// that was escalated, "<target>/<model> failed" for an upstream failure
// that fell back, and last the answer returned: "<target>/<model>
// logprob=<mean>", "logprob=none" when the backend gave no logprobs, or
// "HTTP <status>" for a non-2xx answer. Log-probabilities have 2 decimals.
// Example: "local/m logprob=-2.31<-1.50 -> lan/m logprob=-0.20".
const HeaderCascade = "X-Molly-Cascade"

// Cascade orders (Cascade.Order).
const (
	// OrderCheap tries the cheapest expected cost first; equal costs keep
	// the selection's ranking (the best of the cheap ones first).
	OrderCheap = "cheap"
	// OrderScore tries candidates in the selection's ranking.
	OrderScore = "score"
)

// Cascade defaults.
const (
	// DefaultCascadeThreshold is the mean token log-probability (nats per
	// token) below which an answer is escalated when the config sets none:
	// a geometric-mean token probability under e^-1 ≈ 0.37.
	DefaultCascadeThreshold = -1.0
	// DefaultCascadeAttempts bounds the answers one request may obtain.
	DefaultCascadeAttempts = 2
)

// Cascade configures LLM cascades after FrugalGPT (Chen, Zaharia and Zou,
// "FrugalGPT: How to Use Large Language Models While Reducing Cost and
// Improving Performance", 2023, arXiv:2305.05176): a non-streamed chat
// request goes to the cheapest allowed candidate first, and its answer is
// returned when the scorer trusts it; otherwise the next candidate is
// asked. The scorer is the answer's mean token log-probability (Molly asks
// the upstream for "logprobs": true and removes them from the answer when
// the client did not ask). An answer whose backend gives no logprobs
// cannot be scored and is returned as it is. Candidates come only from the
// policy decision's ranking, so escalation never leaves the allowed tiers.
// Streams are not cascaded yet.
type Cascade struct {
	// Threshold is the mean token log-probability, in nats per token (≤ 0),
	// an answer needs to be returned; below it the request escalates.
	Threshold float64 `json:"threshold"`
	// MaxAttempts bounds the answers obtained, escalations included
	// (upstream failures that fall back do not count); 0 means
	// DefaultCascadeAttempts. The last answer is returned whatever its score.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// Order is OrderCheap (default, "") or OrderScore.
	Order string `json:"order,omitempty"`
}

// Validate checks the settings; errors name the field.
func (c *Cascade) Validate() error {
	switch {
	case c == nil:
		return nil
	case !(c.Threshold <= 0) || math.IsInf(c.Threshold, 0):
		return fmt.Errorf("cascade: threshold %v must be a mean log-probability ≤ 0, such as -1.5", c.Threshold)
	case c.MaxAttempts < 0:
		return fmt.Errorf("cascade: max_attempts %d must be at least 1", c.MaxAttempts)
	case c.Order != "" && c.Order != OrderCheap && c.Order != OrderScore:
		return fmt.Errorf("cascade: order %q must be cheap or score", c.Order)
	}
	return nil
}

func (c *Cascade) applies(a *Annotation, cands []Candidate) bool {
	return c != nil && a.Endpoint == EndpointChat && !a.Stream && len(cands) > 1
}

func (c *Cascade) maxAttempts() int {
	if c.MaxAttempts > 0 {
		return c.MaxAttempts
	}
	return DefaultCascadeAttempts
}

// order returns the candidates in the order the cascade tries them.
func (c *Cascade) order(cands []Candidate) []Candidate {
	out := slices.Clone(cands)
	if c.Order != OrderScore {
		slices.SortStableFunc(out, func(x, y Candidate) int {
			switch {
			case x.CostUSD < y.CostUSD:
				return -1
			case x.CostUSD > y.CostUSD:
				return 1
			}
			return 0
		})
	}
	return out
}

// MeanLogprob returns the mean token log-probability (nats per token) of
// an OpenAI answer over all its choices — chat's
// choices[].logprobs.content[].logprob, completions'
// choices[].logprobs.token_logprobs[] — and the number of tokens behind
// it; n is 0 (and mean 0) when the answer carries none.
func MeanLogprob(body []byte) (mean float64, n int) {
	var sum float64
	gjson.GetBytes(body, "choices").ForEach(func(_, ch gjson.Result) bool {
		lp := ch.Get("logprobs")
		for _, v := range lp.Get("content.#.logprob").Array() {
			sum += v.Float()
			n++
		}
		for _, v := range lp.Get("token_logprobs").Array() {
			if v.Type == gjson.Number {
				sum += v.Float()
				n++
			}
		}
		return true
	})
	if n == 0 {
		return 0, 0
	}
	return sum / float64(n), n
}

// outcome is one upstream try of a cascade or a mixture.
type outcome struct {
	cand    Candidate
	disp    *Dispatch
	failure string // why the try failed (a fallback reason); "" when answered
	status  int
	header  http.Header
	body    []byte
	start   time.Time     // before the upstream call
	ttfb    time.Duration // until the answer's headers
	total   time.Duration // until the whole answer
	usage   *Usage        // as recorded, for a 2xx answer
	logprob float64       // MeanLogprob of a 2xx answer
	tokens  int           // tokens behind logprob; 0: none given
}

func (o outcome) label() string { return o.cand.Target.Name + "/" + o.cand.Model }

// try sends a request with logprobs to c and reads the whole answer; an
// upstream that answers 400 to it is asked again without logprobs (unless
// the client asked for them). A 2xx answer's usage is recorded at once:
// every attempt consumed tokens, returned to the client or not.
func (f *Forwarder) try(ctx context.Context, log *zap.Logger, a *Annotation, d *policies.Decision, c Candidate) outcome {
	o := outcome{cand: c}
	disp, err := NewDispatch(d, a, c)
	if err != nil {
		o.failure = err.Error()
		return o
	}
	// Only a request parameter is added; the body stays as NewDispatch
	// redacted it.
	plain, asked := disp.body, gjson.GetBytes(a.Body, "logprobs").Bool()
	if disp.body, err = sjson.SetBytes(disp.body, "logprobs", true); err != nil {
		o.failure = "asking for logprobs: " + err.Error()
		return o
	}
	o.disp, o.start = disp, time.Now()
	resp, err := disp.send(ctx)
	if err == nil && resp.StatusCode == http.StatusBadRequest && !asked {
		// Some models refuse logprobs (OpenAI's reasoning models do): ask
		// again without them; the answer is then unscored.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		disp.body = plain
		resp, err = disp.send(ctx)
	}
	o.ttfb = time.Since(o.start)
	if err != nil {
		o.failure = upstreamErr(err)
		return o
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		o.failure = "HTTP " + resp.Status
		return o
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamBody+1))
	if err == nil && len(body) > MaxUpstreamBody {
		err = fmt.Errorf("answer over %d bytes", MaxUpstreamBody)
	}
	if err != nil {
		o.failure = "reading answer: " + err.Error()
		return o
	}
	o.total = time.Since(o.start)
	o.status, o.header, o.body = resp.StatusCode, resp.Header, body
	if o.status/100 == 2 {
		m := newUsageMeter(ctx, log, a, d.ID(), c.Target)
		m.body(body)
		o.usage = m.final
		o.logprob, o.tokens = MeanLogprob(body)
	}
	return o
}

// spend accounts an answer that was obtained but not returned: its latency
// feeds the priors, its tokens and cost the metrics (its usage is already
// recorded).
func (f *Forwarder) spend(a *Annotation, o outcome) {
	f.Priors.ObserveLatency(o.cand.Target.Name, o.ttfb, o.total)
	if o.usage != nil {
		f.Metrics.spent(a, o.cand, o.usage.PromptTokens, o.usage.CompletionTokens)
	}
}

// deliver writes a whole answer obtained by try: logprobs removed unless
// the client asked for them, placeholders restored, Molly's headers set.
// order is the candidate list X-Molly-Route explains the choice against;
// decision labels the metrics ("escalated", "mixture").
func (f *Forwarder) deliver(w http.ResponseWriter, a *Annotation, d *policies.Decision, o outcome, order []Candidate, decision string) {
	body := o.body
	if !gjson.GetBytes(a.Body, "logprobs").Bool() {
		body = stripLogprobs(body)
	}
	if o.disp.vault != nil {
		body = restoreBody(o.disp.vault, body)
	}
	f.setHeaders(w, &http.Response{Header: o.header}, o.disp)
	f.explain(w, o.cand, order)
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(o.status)
	_, _ = w.Write(body)
	f.observe(a, d, answered{chosen: o.cand, cands: order, start: o.start, ttfb: o.ttfb, status: o.status, body: body, decision: decision})
}

// stripLogprobs sets every choice's logprobs to null.
func stripLogprobs(body []byte) []byte {
	n := int(gjson.GetBytes(body, "choices.#").Int())
	for i := range n {
		path := fmt.Sprintf("choices.%d.logprobs", i)
		if v := gjson.GetBytes(body, path); !v.Exists() || v.Type == gjson.Null {
			continue
		}
		if out, err := sjson.SetRawBytes(body, path, []byte("null")); err == nil {
			body = out
		}
	}
	return body
}

// cascade answers a non-streamed chat request by trying cands (allowed,
// ranked) in the configured order until an answer scores at least the
// threshold, MaxAttempts answers were obtained or the candidates run out.
// An escalated answer scores 0 on its quality prior (QualityObserver).
// Upstream failures fall back as in Serve; when every candidate after an
// escalated answer fails, that answer is returned. tried holds failures
// from before (a mixture that failed). The error is a 503 *api.Error when
// no candidate answered, or nil once a response has been written.
func (f *Forwarder) cascade(w http.ResponseWriter, r *http.Request, a *Annotation, d *policies.Decision, cands []Candidate, excluded []Exclusion, tried []attempt, log *zap.Logger) error {
	cfg, order := f.Cascade, f.Cascade.order(cands)
	var steps []string
	var escalated []outcome
	answers, spentUSD, begin := 0, 0.0, time.Now()
	finish := func(o outcome, step string) {
		for _, e := range escalated {
			if e.cand != o.cand {
				f.spend(a, e)
			}
		}
		steps = append(steps, step)
		w.Header().Set(HeaderCascade, strings.Join(steps, " -> "))
		decision := "" // routed, or fallback after upstream failures
		if len(escalated) > 0 {
			decision = "escalated"
		}
		log.Info("cascade", zap.String("decision_id", d.ID()), zap.Strings("attempts", steps), zap.Float64("threshold", cfg.Threshold),
			zap.String("answered", o.label()), zap.Float64("cost_usd", spentUSD), zap.Duration("duration", time.Since(begin)))
		f.deliver(w, a, d, o, order, decision)
	}
	for i, c := range order {
		o := f.try(r.Context(), log, a, d, c)
		if r.Context().Err() != nil {
			return nil // the client went away; nothing to answer
		}
		if o.failure != "" {
			tried = append(tried, attempt{c.Target.Name, o.failure})
			steps = append(steps, o.label()+" failed")
			log.Warn("upstream failed, falling back", zap.String("target", c.Target.Name), zap.String("decision_id", d.ID()), zap.String("error", o.failure))
			continue
		}
		answers++
		if o.usage != nil {
			spentUSD += o.usage.CostUSD
		}
		switch {
		case o.status/100 != 2:
			finish(o, fmt.Sprintf("%s HTTP %d", o.label(), o.status))
			return nil
		case o.tokens == 0:
			finish(o, o.label()+" logprob=none")
			return nil
		case o.logprob >= cfg.Threshold || answers >= cfg.maxAttempts() || i == len(order)-1:
			finish(o, fmt.Sprintf("%s logprob=%.2f", o.label(), o.logprob))
			return nil
		}
		steps = append(steps, fmt.Sprintf("%s logprob=%.2f<%.2f", o.label(), o.logprob, cfg.Threshold))
		if _, err := f.Priors.ObserveQuality(c.Key, c.Quality, 0); err != nil {
			log.Error("saving an escalation to the priors failed", zap.String("prior", c.Key.String()), zap.Error(err))
		}
		escalated = append(escalated, o)
	}
	if n := len(escalated); n > 0 { // everything after it failed: the last escalated answer beats none
		finish(escalated[n-1], escalated[n-1].label()+" returned")
		return nil
	}
	return f.failed(a, noTarget("All allowed targets for model `"+a.Model+"` failed", excluded, tried))
}
