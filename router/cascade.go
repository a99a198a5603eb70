package router

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
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
// A streamed request is cascaded only with HoldTokens set: its first tokens
// are held back from the client and scored the same way.
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
	// HoldTokens, when above 0, cascades streamed chat requests too: each
	// attempt's stream is read, and nothing of it sent, until HoldTokens
	// tokens with logprobs (choices[].logprobs.content entries) arrived or
	// it ended; their mean log-probability decides as for a whole answer,
	// and a stream that is kept is relayed from its first event. 0: streams
	// are not cascaded. Holding delays the first token by HoldTokens tokens.
	HoldTokens int `json:"hold_tokens,omitempty"`
	// SelfCheck scores non-streamed chat answers that come without logprobs
	// by asking the same target, in the same conversation as it saw it
	// (redacted for its tier), how confident it is from 0 to 10 (the
	// self-evaluation of Kadavath et al. 2022, "Language Models (Mostly)
	// Know What They Know"). The answer c becomes the score ln(c/10), in the
	// same nats as Threshold: c=6 gives −0.51. Its tokens are recorded.
	SelfCheck bool `json:"self_check,omitempty"`
}

// selfCheckQuestion is the follow-up a self-check asks.
const selfCheckQuestion = "On a scale from 0 to 10, how confident are you that your previous answer is correct and complete? Reply with the number only."

// selfCheck asks o's target to rate its own answer (SelfCheck) and returns
// the score ln(c/10) and whether a number from 0 to 10 came back.
func (f *Forwarder) selfCheck(ctx context.Context, log *zap.Logger, a *Annotation, d *policies.Decision, o outcome) (float64, bool) {
	answer := gjson.GetBytes(o.body, "choices.0.message.content")
	if answer.Type != gjson.String || answer.Str == "" || o.disp == nil {
		return 0, false
	}
	// The answer goes back as the target wrote it (placeholders intact):
	// the follow-up carries nothing the target's tier has not seen.
	follow, err := o.disp.followUp(
		map[string]any{"role": "assistant", "content": answer.Str},
		map[string]any{"role": "user", "content": selfCheckQuestion})
	if err != nil {
		return 0, false
	}
	resp, err := follow.send(ctx)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode/100 != 2 {
		return 0, false
	}
	f.newUsageMeter(ctx, log, a, d.ID(), o.cand.Target).body(body)
	m := selfCheckNumber.FindString(gjson.GetBytes(body, "choices.0.message.content").String())
	c, err := strconv.ParseFloat(m, 64)
	if err != nil || c < 0 || c > 10 {
		return 0, false
	}
	return math.Log(max(c, 0.01) / 10), true
}

var selfCheckNumber = regexp.MustCompile(`\d+(\.\d+)?`)

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
	case c.HoldTokens < 0:
		return fmt.Errorf("cascade: hold_tokens %d must be 0 (streams are not cascaded) or more", c.HoldTokens)
	}
	return nil
}

func (c *Cascade) applies(a *Annotation, cands []Candidate) bool {
	return c != nil && a.Endpoint == EndpointChat && (!a.Stream || c.HoldTokens > 0) && len(cands) > 1
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
	stream  *heldStream   // a 2xx stream whose first tokens are held; body is nil
	// selfChecked: logprob is the self-check score ln(c/10), not logprobs.
	selfChecked bool
}

func (o outcome) label() string { return o.cand.Target.Name + "/" + o.cand.Model }

// scoreName names what the score is, for the cascade header.
func (o outcome) scoreName() string {
	if o.selfChecked {
		return "selfcheck"
	}
	return "logprob"
}

// try sends a request with logprobs to c and reads the whole answer, or
// holds the first tokens of a 2xx stream (hold); an upstream that answers
// 400 to it is asked again without logprobs (unless the client asked for
// them). A 2xx answer's usage is recorded at once: every attempt consumed
// tokens, returned to the client or not.
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
	if a.Stream && resp.StatusCode/100 == 2 && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		return f.hold(ctx, log, a, d, o, resp)
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
		m := f.newUsageMeter(ctx, log, a, d.ID(), c.Target)
		m.body(body)
		o.usage = m.final
		o.logprob, o.tokens = MeanLogprob(body)
		if o.tokens == 0 && f.Cascade != nil && f.Cascade.SelfCheck && a.Endpoint == EndpointChat {
			if score, ok := f.selfCheck(ctx, log, a, d, o); ok {
				o.logprob, o.tokens, o.selfChecked = score, 1, true
			}
		}
	}
	return o
}

// spend accounts an answer that was obtained but not returned: its latency
// feeds the priors, its tokens and cost the metrics (its usage is already
// recorded).
func (f *Forwarder) spend(a *Annotation, o outcome) {
	if o.stream == nil { // a held stream was cut short: its total time says nothing
		f.Priors.ObserveLatency(o.cand.Target.Name, o.ttfb, o.total)
	}
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

// heldStream is a 2xx streamed answer whose first events a cascade has
// read and not yet sent: events are the raw SSE lines read, rest is the
// remainder of the upstream body.
type heldStream struct {
	events []byte
	rest   *bufio.Reader
	body   io.Closer
	meter  *usageMeter // sees the events only when relayed or abandoned
}

// hold reads the stream in resp until f.Cascade.HoldTokens tokens with
// logprobs arrived, the stream ended, or a chunk with text but no logprobs
// showed that the backend gives none; o gets their mean. A stream that
// breaks off first is a failure (nothing was sent, so the cascade falls
// back) whose usage is recorded.
func (f *Forwarder) hold(ctx context.Context, log *zap.Logger, a *Annotation, d *policies.Decision, o outcome, resp *http.Response) outcome {
	h := &heldStream{rest: bufio.NewReaderSize(resp.Body, 64<<10), body: resp.Body, meter: f.newUsageMeter(ctx, log, a, d.ID(), o.cand.Target)}
	o.stream, o.status, o.header = h, resp.StatusCode, resp.Header
	var sum float64
	var finished bool // a finish_reason came: an ending without [DONE] is whole, as in relaySSE
read:
	for o.tokens < f.Cascade.HoldTokens && len(h.events) < MaxUpstreamBody {
		line, err := h.rest.ReadBytes('\n')
		if err != nil {
			if finished {
				break
			}
			o.usage = h.abandon()
			o.failure = "stream broke off before " + fmt.Sprint(f.Cascade.HoldTokens) + " tokens: " + upstreamErr(err)
			return o
		}
		h.events = append(h.events, line...)
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		switch data = bytes.TrimSpace(data); {
		case ok && bytes.Equal(data, []byte("[DONE]")):
			break read
		case !ok || !gjson.ValidBytes(data):
			continue
		}
		chunk, n, text := gjson.ParseBytes(data), 0, strings.Builder{}
		chunk.Get("choices").ForEach(func(_, ch gjson.Result) bool {
			for _, v := range ch.Get("logprobs.content.#.logprob").Array() {
				sum += v.Float()
				n++
			}
			if ch.Get("finish_reason").Type == gjson.String {
				finished = true
			}
			return true
		})
		o.tokens += n
		if answerText(&text, chunk); n == 0 && text.Len() > 0 {
			break // text without logprobs: the backend gives none, waiting is pointless
		}
	}
	o.total = time.Since(o.start)
	if o.tokens > 0 {
		o.logprob = sum / float64(o.tokens)
	}
	return o
}

// abandon closes a held stream that is not relayed and records the usage
// of what it streamed (its usage chunk when it came, else the held text
// counted); it returns that usage. Calling it again, or after the stream
// was relayed, only returns the usage.
func (h *heldStream) abandon() *Usage {
	if h == nil {
		return nil
	}
	h.body.Close()
	if !h.meter.recorded {
		for line := range bytes.Lines(h.events) {
			if data, ok := bytes.CutPrefix(line, []byte("data:")); ok && !bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
				h.meter.event(bytes.TrimSpace(data))
			}
		}
		h.meter.streamEnd()
	}
	return h.meter.final
}

// deliverStream relays a held stream kept by the cascade: Molly's headers,
// then the held events and the rest as relaySSE relays any stream
// (placeholders restored, usage metered and recorded), logprobs removed
// from the chunks unless the client asked for them.
func (f *Forwarder) deliverStream(w http.ResponseWriter, a *Annotation, d *policies.Decision, o outcome, order []Candidate, decision string) error {
	h := o.stream
	defer h.body.Close()
	o.disp.dropLogprobs = !gjson.GetBytes(a.Body, "logprobs").Bool()
	f.setHeaders(w, &http.Response{Header: o.header}, o.disp)
	f.explain(w, o.cand, order)
	err := relaySSE(w, io.MultiReader(bytes.NewReader(h.events), h.rest), o.disp, h.meter)
	f.observe(a, d, answered{chosen: o.cand, cands: order, start: o.start, ttfb: o.ttfb, status: o.status, meter: h.meter, err: err, decision: decision})
	return err
}

// cascade answers a chat request — non-streamed, or streamed with
// HoldTokens set (its first tokens held and scored, see hold) — by trying
// cands (allowed, ranked) in the configured order until an answer scores at
// least the threshold, MaxAttempts answers were obtained or the candidates
// run out. An escalated stream stays open until a later answer replaces it.
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
	drop := func(e *outcome) { // an escalated stream that will not be relayed
		if e.stream != nil && e.usage == nil {
			if e.usage = e.stream.abandon(); e.usage != nil {
				spentUSD += e.usage.CostUSD
			}
		}
	}
	defer func() { // streams never relayed: the client went away, or a later answer won
		for i := range escalated {
			drop(&escalated[i])
		}
	}()
	finish := func(o outcome, step string) {
		for i := range escalated {
			if e := &escalated[i]; e.cand != o.cand {
				drop(e)
				f.spend(a, *e)
			}
		}
		steps = append(steps, step)
		w.Header().Set(HeaderCascade, strings.Join(steps, " -> "))
		decision := "" // routed, or fallback after upstream failures
		if len(escalated) > 0 {
			decision = "escalated"
		}
		var err error
		if o.stream != nil {
			err = f.deliverStream(w, a, d, o, order, decision)
			if u := o.stream.meter.final; u != nil {
				spentUSD += u.CostUSD
			}
		} else {
			f.deliver(w, a, d, o, order, decision)
		}
		log.Info("cascade", zap.String("decision_id", d.ID()), zap.Strings("attempts", steps), zap.Float64("threshold", cfg.Threshold),
			zap.String("answered", o.label()), zap.Float64("cost_usd", spentUSD), zap.Duration("duration", time.Since(begin)), zap.NamedError("stream_error", err))
	}
	for i, c := range order {
		o := f.try(r.Context(), log, a, d, c)
		if r.Context().Err() != nil {
			o.stream.abandon()
			return nil // the client went away; nothing to answer
		}
		if o.usage != nil {
			spentUSD += o.usage.CostUSD
		}
		if o.failure != "" {
			tried = append(tried, attempt{c.Target.Name, o.failure})
			steps = append(steps, o.label()+" failed")
			log.Warn("upstream failed, falling back", zap.String("target", c.Target.Name), zap.String("decision_id", d.ID()), zap.String("error", o.failure))
			continue
		}
		if o.status/100 != 2 && len(escalated) > 0 {
			// A later candidate refusing the request (e.g. one that rejects
			// logprobs) does not throw away the answer in hand: go on, and
			// return the last escalated answer if nothing better comes.
			tried = append(tried, attempt{c.Target.Name, fmt.Sprintf("HTTP %d", o.status)})
			steps = append(steps, fmt.Sprintf("%s HTTP %d", o.label(), o.status))
			continue
		}
		answers++
		switch {
		case o.status/100 != 2:
			finish(o, fmt.Sprintf("%s HTTP %d", o.label(), o.status))
			return nil
		case o.tokens == 0:
			finish(o, o.label()+" logprob=none")
			return nil
		case o.logprob >= cfg.Threshold || answers >= cfg.maxAttempts() || i == len(order)-1:
			finish(o, fmt.Sprintf("%s %s=%.2f", o.label(), o.scoreName(), o.logprob))
			return nil
		}
		steps = append(steps, fmt.Sprintf("%s %s=%.2f<%.2f", o.label(), o.scoreName(), o.logprob, cfg.Threshold))
		if _, err := f.Priors.ObserveQuality(c.Key, c.Quality, 0); err != nil {
			log.Error("saving an escalation to the priors failed", zap.String("prior", c.Key.String()), zap.Error(err))
		}
		if n := len(escalated); n > 0 { // keep only the last escalated stream open, for when all later ones fail
			drop(&escalated[n-1])
		}
		escalated = append(escalated, o)
	}
	if n := len(escalated); n > 0 { // everything after it failed: the last escalated answer beats none
		finish(escalated[n-1], escalated[n-1].label()+" returned")
		return nil
	}
	return f.failed(a, noTarget("All allowed targets for model `"+a.Model+"` failed", excluded, tried))
}
