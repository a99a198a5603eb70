package pipeline

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// HeaderReasoning is the T0 engine's reasoning-switcher decision
// (serving.HeaderReasoning), appended to X-Molly-Route as
// "; reasoning <decision>".
const HeaderReasoning = "X-Molly-Reasoning"

// streamTruncated is the SSE event sent when an upstream stream ends before
// its terminal chunk or [DONE]: an explicit error, never a made-up ending.
// OpenAI clients surface a data object with an "error" key as a stream error.
const streamTruncated = `{"error":{"message":"The upstream stream ended before completion; the answer is incomplete.","type":"upstream_error","param":null,"code":"stream_truncated"}}`

// Decision labels of answers in the metrics besides routed and fallback.
const (
	labelEscalated = "escalated"
	labelMixture   = "mixture"
)

// setHeaders sets Molly's headers and the upstream's few worth passing on.
func (p *Pipeline) setHeaders(rq *request, o *outcome) {
	h := rq.w.Header()
	for _, k := range []string{"Content-Type", "Cache-Control", "Openai-Processing-Ms"} {
		if v := o.header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	if v := o.header.Get("X-Request-Id"); v != "" && h.Get("X-Request-Id") == "" {
		h.Set("X-Request-Id", v)
	}
	h.Set(HeaderTier, o.cand.Target.Tier)
	h.Set(HeaderTarget, o.cand.Target.Name)
	explained := route.RouteHeader(o.cand, rq.plan.Candidates, rq.plan.Excluded)
	if v := o.header.Get(HeaderReasoning); v != "" {
		// The T0 engine's reasoning switcher: its decision and score.
		explained += "; reasoning " + v
	}
	h.Set(HeaderRoute, explained)
}

// deliver writes a whole answer: logprobs the client did not ask for
// removed, placeholders restored, Molly's headers set; then observes it.
// label names the answer in the metrics ("" for routed/fallback).
func (p *Pipeline) deliver(rq *request, o *outcome, label string) {
	body := o.body
	if t := rq.captured(o); t != nil && o.status/100 == 2 {
		t.setAnswer(body)
	}
	if o.status/100 == 2 {
		ans := answerOf(rq)
		if u := o.usage(); u != nil {
			// What the ledger recorded replaces a usage it did not believe.
			ans.Usage = &relay.Counts{Prompt: u.PromptTokens, Completion: u.CompletionTokens}
		}
		body = relay.NormaliseRead(ans, &o.doc, body)
	} else if o.status >= 400 {
		body = relay.NormaliseError(o.status, body)
		o.header.Set("Content-Type", "application/json")
	}
	if o.disp.Added("logprobs") {
		body = relay.StripLogprobs(body)
	}
	if v := o.disp.Vault(); v != nil {
		body = relay.RestoreBody(v, body)
	}
	if g := p.outputGuard(rq, o); g != nil && o.status/100 == 2 {
		guarded, err := guardBody(g, body)
		if err != nil {
			rq.log.Warn("answer withheld by the output rule", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name), zap.Error(err))
			outputBlocked(rq, err).Write(rq.w)
			p.observe(rq, o, "output_blocked", nil, nil)
			return
		}
		body = guarded
	}
	p.setHeaders(rq, o)
	rq.w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	rq.w.WriteHeader(o.status)
	if o.status/100 == 2 {
		p.remember(rq, o)
	}
	_, _ = rq.w.Write(body)
	rq.log.Info("routed", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name), zap.String("tier", o.cand.Target.Tier),
		zap.Int("status", o.status), zap.Int("redacted", o.disp.Redacted()), zap.String("strategy", string(rq.plan.Strategy)),
		zap.Duration("duration", time.Since(o.start)))
	p.observe(rq, o, label, body, nil)
}

// answerOf is what normalising rq's answer needs.
func answerOf(rq *request) relay.Answer {
	ans := relay.Answer{Endpoint: rq.a.Endpoint(), Model: rq.a.Model(), IncludeUsage: rq.a.IncludeUsage(), Created: time.Now().Unix()}
	if ans.Endpoint == openai.EndpointEmbeddings {
		ans.EncodingFormat = gjson.Get(rq.a.Body(), "encoding_format").Str
	}
	return ans
}

// deliverStream relays a held stream: Molly's headers, then the held
// events and the rest, each chunk with its usage taken (merged, and sent
// in one last chunk only to a client that asked for it), normalised to the
// spec's chunk shape (relay.Stream), logprobs the client did not ask for
// set to null, placeholders restored; the usage is recorded before [DONE]
// is written, and a stream that ended cleanly without [DONE] gets one. A
// stream that breaks off ends with the stream_truncated error event;
// upstream event:, id: and retry: lines are not passed on, comments are;
// an event whose data is not JSON is dropped, logged and counted. It
// returns the relay's error, if any.
func (p *Pipeline) deliverStream(rq *request, o *outcome, label string) error {
	h := o.stream
	defer h.body.Close()
	p.setHeaders(rq, o)
	w := rq.w
	w.Header().Del("Content-Length")
	w.Header().Set("Content-Type", "text/event-stream")
	// As the engine's and the translated streams: no cache or proxy may
	// keep (or hold back) an event stream.
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	var restore *relay.StreamRestore
	if v, g := o.disp.Vault(), p.outputGuard(rq, o); v != nil || g != nil {
		restore = relay.NewStreamRestore(v, g)
	}
	norm := relay.NewStream(answerOf(rq))
	stripLP := o.disp.Added("logprobs")
	text := rq.captured(o)
	var buf []byte
	sawDone, sawFinish := false, h.ended
	upstreamErr := "" // the message of the upstream's error event, once one came
	// tail is what goes before [DONE]: the usage recorded, the text still
	// held back, the chunk finishing the choices left open (for a stream
	// cut at its cap with "length", else as relay.Stream.Close says), the
	// usage chunk.
	tail := func(cut bool) {
		sawDone = true
		if cut {
			o.meter.Cut()
		}
		o.meter.StreamEnd()
		if restore != nil {
			if extra := restore.Final(); extra != nil {
				buf = relay.AppendData(buf, extra)
			}
		}
		var fin []byte
		if cut {
			fin = norm.Cut()
		} else {
			fin = norm.Close() // choices the upstream never finished
		}
		if fin != nil {
			buf = relay.AppendData(buf, fin)
		}
		prompt, completion := 0, 0
		if u := o.usage(); u != nil {
			// What the ledger recorded is what the usage chunk says.
			prompt, completion = u.PromptTokens, u.CompletionTokens
			norm.Settle(prompt, completion)
		}
		if fin := norm.Final(prompt, completion); fin != nil {
			buf = relay.AppendData(buf, fin)
		}
		buf = relay.AppendData(buf, []byte("[DONE]"))
		p.remember(rq, o)
	}
	emit := func(ev relay.Event, counted bool) error {
		buf = buf[:0]
		for _, c := range ev.Comments {
			buf = relay.AppendComment(buf, c)
		}
		var valid bool
		var why string
		if len(ev.Data) > 0 {
			valid, why = checkJSON(ev.Data)
		}
		switch {
		case ev.IsDone():
			tail(false)
		case valid && why != "":
			p.Metrics.Malformed(o.cand.Target.Name, "ambiguous")
			rq.log.Warn("dropping a malformed stream event", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name),
				zap.String("reason", "an event "+why), zap.Int("bytes", len(ev.Data)))
		case valid:
			data := validUTF8(ev.Data)
			if text != nil {
				text.appendChunk(data)
			}
			var drop bool
			if counted {
				data, drop = o.meter.Strip(data)
			} else {
				data, drop = o.meter.Event(data)
				if o.meter.Over() {
					return errOverCap // this event is not relayed
				}
			}
			if drop {
				break
			}
			if data = norm.Chunk(data); data == nil {
				break
			}
			if fr := gjson.GetBytes(data, "choices.#.finish_reason"); strings.Contains(fr.Raw, `"`) {
				sawFinish = true
			}
			if stripLP {
				data = relay.StripLogprobs(data)
			}
			if restore != nil {
				data = restore.Event(data)
				if err := restore.Err(); err != nil {
					return errOutputBlocked{err}
				}
			}
			if e := gjson.GetBytes(data, "error"); e.IsObject() {
				// The upstream's error event ends the answer: it is relayed
				// (OpenAI's error object, as OpenAI sends one inside a
				// stream) and nothing is read or added after it.
				upstreamErr = e.Get("message").String()
				if upstreamErr == "" {
					upstreamErr = "an error event"
				}
			}
			buf = relay.AppendData(buf, data)
		case len(ev.Data) > 0:
			p.Metrics.Malformed(o.cand.Target.Name, "not_json")
			rq.log.Warn("dropping a malformed stream event", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name),
				zap.String("reason", "not_json"), zap.Int("bytes", len(ev.Data)))
		}
		if len(buf) == 0 {
			return nil
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
		return rc.Flush()
	}
	var err error
	for _, ev := range h.events {
		if err = emit(ev, true); err != nil || upstreamErr != "" {
			break
		}
	}
	for err == nil && !sawDone && !h.done && upstreamErr == "" {
		var ev relay.Event
		ev, err = h.dec.Next()
		if err != nil {
			break
		}
		err = emit(ev, false)
	}
	if err == nil && h.over && !sawDone {
		err = errOverCap
	}
	if errors.Is(err, errOverCap) {
		// The upstream ran past the max_tokens it was sent (and the
		// reservation): the stream ends here as one that reached its
		// max_tokens, and the upstream is closed (deferred above).
		buf = buf[:0]
		tail(true)
		if _, werr := w.Write(buf); werr == nil {
			_ = rc.Flush()
		}
		err = nil
	}
	// A stream whose [DONE] was written was delivered, whatever the
	// client did next: openai-go, for one, closes the connection as soon
	// as it reads [DONE], which can cancel the request's context before
	// this line runs.
	if rq.ctx.Err() != nil && (!sawDone || err != nil) {
		o.meter.StreamEnd()
		rq.log.Info("client went away", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name),
			zap.Bool("stream", true), zap.Duration("after", time.Since(rq.begin)))
		p.observe(rq, o, "client_closed", nil, err)
		return err
	}
	var blocked errOutputBlocked
	if errors.As(err, &blocked) {
		// The answer holds a value the output rule blocks: end the stream
		// with an error event naming the type, never the value.
		rq.log.Warn("answer withheld by the output rule", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name), zap.Error(blocked.err))
		buf = relay.AppendEvent(buf[:0], relay.Event{Type: "error", Data: outputBlocked(rq, blocked.err).Body()}, false)
		_, _ = w.Write(buf)
		_ = rc.Flush()
		o.meter.StreamEnd()
		p.observe(rq, o, "output_blocked", nil, nil)
		return blocked
	}
	if errors.Is(err, relay.ErrLineTooLong) {
		p.Metrics.Malformed(o.cand.Target.Name, "line_too_long")
		rq.log.Warn("dropping a malformed stream event", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name),
			zap.String("reason", "line_too_long"))
	}
	switch {
	case sawDone:
		err = nil
	case upstreamErr != "" && err == nil:
		// Relayed as it came: the client saw the cause.
		err = fmt.Errorf("the upstream sent an error event: %s", upstreamErr)
	case sawFinish || h.done:
		// Ended after its last choice finished, without [DONE]: end it as OpenAI does.
		buf = buf[:0]
		tail(false)
		if _, werr := w.Write(buf); werr == nil {
			_ = rc.Flush()
		}
		err = nil
	default:
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		buf = relay.AppendEvent(buf[:0], relay.Event{Type: "error", Data: []byte(streamTruncated)}, false)
		_, _ = w.Write(buf)
		_ = rc.Flush()
		err = fmt.Errorf("upstream stream ended early: %w", err)
	}
	o.meter.StreamEnd()
	rq.log.Info("routed", zap.String("decision_id", rq.dec.ID()), zap.String("target", o.cand.Target.Name), zap.String("tier", o.cand.Target.Tier),
		zap.Bool("stream", true), zap.Int("redacted", o.disp.Redacted()), zap.String("strategy", string(rq.plan.Strategy)),
		zap.Duration("duration", time.Since(o.start)), zap.NamedError("stream_error", err))
	p.observe(rq, o, label, nil, err)
	return err
}

// errOverCap ends a relayed stream whose answer ran past its completion
// cap (meter.Meter.Over).
var errOverCap = errors.New("the answer ran past its completion cap")

// errOutputBlocked ends a relayed stream the output rule refused.
type errOutputBlocked struct{ err error }

func (e errOutputBlocked) Error() string { return "output blocked: " + e.err.Error() }

// respond delivers o, whole or streamed.
func (p *Pipeline) respond(rq *request, o *outcome, label string) error {
	defer startDeliver(rq, o)()
	if o.stream != nil {
		_ = p.deliverStream(rq, o, label)
		return nil
	}
	p.deliver(rq, o, label)
	return nil
}

// remember keeps rq's decision for feedback on o's answer. It runs before
// the answer's last bytes are written (the whole body, a stream's [DONE]):
// a client may post its feedback the moment it has read them, before
// observe runs.
func (p *Pipeline) remember(rq *request, o *outcome) {
	p.Priors.Remember(rq.dec.ID(), o.cand.Key, o.cand.Quality)
}

// observe feeds a delivered answer to the priors (latency, throughput; the
// decision, for feedback) and the metrics.
func (p *Pipeline) observe(rq *request, o *outcome, label string, body []byte, streamErr error) {
	if rq.answered != nil {
		rq.answered(o)
	}
	total := time.Since(o.start)
	decision := "routed"
	if len(rq.plan.Candidates) > 0 && !rq.plan.Candidates[0].Same(o.cand) {
		decision = "fallback"
	}
	if label != "" {
		decision = label
	}
	switch {
	case decision == "client_closed":
	case o.status/100 != 2:
		decision = "upstream_error"
	case streamErr != nil:
		decision = "truncated"
	}
	good := o.status/100 == 2 && streamErr == nil && decision != "client_closed" && decision != "output_blocked"
	if good {
		p.Priors.ObserveLatency(o.cand.Target.Name, o.ttfb, total)
		p.remember(rq, o)
	}
	prompt, completion := -1, -1
	if u := o.usage(); u != nil {
		prompt, completion = u.PromptTokens, u.CompletionTokens
	} else if body != nil {
		if pt, ct, ok := meter.ReportedUsage(gjson.GetBytes(body, "usage")); ok {
			prompt, completion = pt, ct
		}
	}
	if good {
		// Generation time: after the first byte for streams (tokens arrive
		// as made); the whole exchange otherwise.
		gen := total
		if o.stream != nil {
			gen = total - o.ttfb
		}
		p.Priors.ObserveThroughput(o.cand.Target.Name, o.cand.Model, completion, gen)
	}
	p.Metrics.Served(rq.a, o.cand, decision, total.Seconds(), o.ttfb.Seconds(), prompt, completion)
	rq.track(o, decision != "client_closed" && decision != "output_blocked")
	rq.outcome.Label = decision
	if rq.outcome.Status == 0 {
		rq.outcome.Status = o.status
		if decision == "output_blocked" && o.stream == nil {
			rq.outcome.Status = http.StatusForbidden
		}
	}
}

// spend accounts an answer that was obtained but not returned: its latency
// feeds the priors, its tokens and cost the metrics (its usage is already
// recorded).
func (p *Pipeline) spend(rq *request, o *outcome) {
	rq.track(o, false)
	if o.stream == nil { // a held stream was cut short: its total time says nothing
		p.Priors.ObserveLatency(o.cand.Target.Name, o.ttfb, o.total)
	}
	if u := o.usage(); u != nil {
		p.Metrics.Spent(rq.a, o.cand, u.PromptTokens, u.CompletionTokens)
	}
}
