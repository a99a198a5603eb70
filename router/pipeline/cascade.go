package pipeline

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/route"
)

// HeaderCascade lists a cascade's attempts on its answer, in order, joined
// by " -> ": "<target>/<model> logprob=<mean><<threshold>" for an answer
// that was escalated, "<target>/<model> failed" for an upstream failure
// that fell back, and last the answer returned: "<target>/<model>
// logprob=<mean>", "logprob=none" when the backend gave no logprobs, or
// "HTTP <status>" for a non-2xx answer. Log-probabilities have 2 decimals.
// Example: "local/m logprob=-2.31<-1.50 -> lan/m logprob=-0.20".
const HeaderCascade = "X-Molly-Cascade"

// selfCheckQuestion is the follow-up a self-check asks.
const selfCheckQuestion = "On a scale from 0 to 10, how confident are you that your previous answer is correct and complete? Reply with the number only."

var selfCheckNumber = regexp.MustCompile(`\d+(\.\d+)?`)

// scored sends a request to c asking for logprobs (unless the client
// did), holding hold tokens of a stream; an upstream that answers 400 to
// the logprobs it was not asked for by the client is asked again without
// them (OpenAI's reasoning models refuse logprobs); the answer is then
// unscored. An answer without logprobs is scored by a self-check when
// configured.
func (p *Pipeline) scored(rq *request, c route.Candidate, hold int) outcome {
	disp, err := p.Egress.NewDispatch(rq.d, rq.a, c)
	if err != nil {
		return outcome{cand: c, kind: failRefused, failure: err.Error()}
	}
	ask := disp
	if !rq.a.Logprobs() && c.Target.Supports(route.CapLogprobs) { // a target without logprobs is not asked for them
		if ask, err = disp.WithParam("logprobs", true); err != nil {
			return outcome{cand: c, kind: failRefused, failure: "asking for logprobs: " + err.Error()}
		}
	}
	o := p.attempt(rq, c, ask, rq.a.PromptTokens(), hold)
	if o.ok() && o.status == http.StatusBadRequest && ask != disp {
		o = p.attempt(rq, c, disp, rq.a.PromptTokens(), hold)
	}
	cfg := p.Strategies.Cascade
	if o.ok() && o.status/100 == 2 && o.tokens == 0 && o.stream == nil && cfg != nil && cfg.SelfCheck {
		if score, ok := p.selfCheck(rq, o); ok {
			o.logprob, o.tokens, o.selfChecked = score, 1, true
		}
	}
	return o
}

// selfCheck asks o's target to rate its own answer (Cascade.SelfCheck) in
// a follow-up request — the client's conversation, the answer (placeholders
// restored), the question — classified and decided again like every derived
// request, and returns the score ln(c/10) and whether a number from 0 to 10
// came back. Its tokens are recorded.
func (p *Pipeline) selfCheck(rq *request, o outcome) (float64, bool) {
	answer := gjson.GetBytes(o.body, "choices.0.message.content")
	if answer.Type != gjson.String || answer.Str == "" {
		return 0, false
	}
	text := answer.Str
	if v := o.disp.Vault(); v != nil {
		text = v.Restore(text)
	}
	body := []byte(rq.a.Body())
	var err error
	for _, k := range []string{"logprobs", "top_logprobs", "tools", "tool_choice", "stream_options", "n", "max_tokens", "response_format"} {
		if body, err = sjson.DeleteBytes(body, k); err != nil {
			return 0, false
		}
	}
	body, _ = sjson.SetBytes(body, "stream", false)
	body, _ = sjson.SetBytes(body, "max_completion_tokens", route.SelfCheckTokens)
	body, _ = sjson.SetBytes(body, "messages.-1", map[string]any{"role": "assistant", "content": text})
	body, err = sjson.SetBytes(body, "messages.-1", map[string]any{"role": "user", "content": selfCheckQuestion})
	if err != nil {
		return 0, false
	}
	a, d, err := p.derive(rq.ctx, rq, "follow_up", body)
	if err != nil || !d.Decision().Allowed() {
		return 0, false
	}
	disp, err := p.Egress.NewDispatch(d, a, o.cand)
	if err != nil {
		return 0, false
	}
	resp, err := disp.Send(rq.ctx, rq.r.Header)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode/100 != 2 {
		return 0, false
	}
	p.newMeter(rq, o.cand, a.PromptTokens(), route.SelfCheckTokens).Body(out)
	m := selfCheckNumber.FindString(gjson.GetBytes(out, "choices.0.message.content").String())
	c, err := strconv.ParseFloat(m, 64)
	if err != nil || c < 0 || c > 10 {
		return 0, false
	}
	return math.Log(max(c, 0.01) / 10), true
}

// scoreName names what the score is, for the cascade header.
func (o *outcome) scoreName() string {
	switch {
	case o.selfChecked:
		return "selfcheck"
	case o.tokens == 0:
		return "none"
	}
	return "logprob"
}

// cascade answers a chat request — non-streamed, or streamed with
// HoldTokens set — by trying order (allowed, in the cascade's order) until
// the escalation policy (policies/escalation.rego) keeps an answer, or the
// candidates run out. An escalated stream stays open until a later answer
// replaces it. An escalated answer scores 0 on its quality prior. Upstream
// failures fall back as in single; when every candidate after an escalated
// answer fails, that answer is returned.
func (p *Pipeline) cascade(rq *request, order []route.Candidate) error {
	cfg := p.Strategies.Cascade
	var steps []string
	var escalated []outcome
	answers, spentUSD := 0, 0.0
	defer func() { // streams never relayed: the client went away, or a later answer won
		for i := range escalated {
			escalated[i].abandon()
		}
	}()
	finish := func(o outcome, step string) error {
		for i := range escalated {
			if e := &escalated[i]; !e.cand.Same(o.cand) {
				e.abandon()
				p.spend(rq, e)
			}
		}
		steps = append(steps, step)
		rq.w.Header().Set(HeaderCascade, strings.Join(steps, " -> "))
		label := ""
		if len(escalated) > 0 {
			label = labelEscalated
		}
		err := p.respond(rq, &o, label)
		if u := o.usage(); u != nil {
			spentUSD += u.CostUSD
		}
		rq.log.Info("cascade", zap.String("decision_id", rq.dec.ID()), zap.Strings("attempts", steps), zap.Float64("threshold", cfg.Threshold),
			zap.String("answered", o.label()), zap.Float64("cost_usd", spentUSD), zap.Duration("duration", time.Since(rq.begin)))
		return err
	}
	for i, c := range order {
		o := p.scored(rq, c, cfg.HoldTokens)
		if o.kind == failClientGone || rq.ctx.Err() != nil {
			return p.clientGone(rq, &o)
		}
		if !o.ok() {
			rq.note(o)
			steps = append(steps, o.label()+" failed")
			if o.meter.Recorded() && i < len(order)-1 {
				// A held stream that failed after it was billed: the plan
				// holds max_attempts answers, so the next attempt needs a
				// reservation of its own (as in single); refused, the
				// answer in hand, if any, is returned.
				if err := p.reserveAgain(rq); err != nil {
					if n := len(escalated); n > 0 {
						last := escalated[n-1]
						escalated = escalated[:n-1]
						return finish(last, last.label()+" returned")
					}
					return err
				}
			}
			continue
		}
		if o.stream == nil {
			if u := o.usage(); u != nil {
				spentUSD += u.CostUSD
			}
		}
		if o.status/100 != 2 && len(escalated) > 0 {
			// A later candidate refusing the request (e.g. one that rejects
			// logprobs) does not throw away the answer in hand: go on, and
			// return the last escalated answer if nothing better comes.
			rq.tried = append(rq.tried, failed{target: c.Target.Name, err: fmt.Sprintf("HTTP %d", o.status)})
			steps = append(steps, fmt.Sprintf("%s HTTP %d", o.label(), o.status))
			continue
		}
		answers++
		if o.status/100 != 2 {
			return finish(o, fmt.Sprintf("%s HTTP %d", o.label(), o.status))
		}
		remaining := order[i+1:]
		esc := p.Policy.DecideEscalation(rq.ctx, p.escalationInput(rq, o, answers, remaining))
		if answers >= cfg.Attempts() {
			// The reservation holds max_attempts answers: the bound is
			// kept here, whatever an edited escalation policy says.
			esc.Escalate = false
		}
		if !esc.Escalate {
			step := fmt.Sprintf("%s %s=%.2f", o.label(), o.scoreName(), o.logprob)
			if o.tokens == 0 {
				step = o.label() + " logprob=none"
			}
			return finish(o, step)
		}
		steps = append(steps, fmt.Sprintf("%s %s=%.2f<%.2f", o.label(), o.scoreName(), o.logprob, cfg.Threshold))
		if _, err := p.Priors.ObserveQuality(c.Key, c.Quality, 0); err != nil {
			rq.log.Error("saving an escalation to the priors failed", zap.String("prior", c.Key.String()), zap.Error(err))
		}
		if n := len(escalated); n > 0 { // keep only the last escalated stream open, for when all later ones fail
			escalated[n-1].abandon()
			p.spend(rq, &escalated[n-1])
		}
		escalated = append(escalated, o)
	}
	if n := len(escalated); n > 0 { // everything after it failed: the last escalated answer beats none
		last := escalated[n-1]
		escalated = escalated[:n-1]
		return finish(last, last.label()+" returned")
	}
	return noTarget("All allowed targets for model `"+rq.a.Model()+"` failed", rq.plan.Excluded, rq.tried)
}

// escalationInput is the input of policies/escalation.rego for answer o.
func (p *Pipeline) escalationInput(rq *request, o outcome, answers int, remaining []route.Candidate) map[string]any {
	cfg := p.Strategies.Cascade
	rest := make([]any, len(remaining))
	for i, c := range remaining {
		rest[i] = map[string]any{"target": c.Target.Name, "tier": c.Target.Tier, "model": c.Model, "cost_usd": c.CostUSD, "quality": c.Quality}
	}
	in := rq.a.PolicyInput()
	return map[string]any{
		"attempt": map[string]any{"target": o.cand.Target.Name, "tier": o.cand.Target.Tier, "model": o.cand.Model,
			"score": o.logprob, "score_kind": o.scoreName(), "tokens": o.tokens, "status": o.status,
			"answers": answers, "max_attempts": cfg.Attempts(), "decision_id": rq.dec.ID()},
		"threshold":  cfg.Threshold,
		"remaining":  rest,
		"request":    in["request"],
		"capability": in["capability"],
	}
}
