package pipeline

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// Carried requests: the pipeline decides, plans, reserves and makes the
// dispatch (the body redacted for the chosen tier) of a request whose
// bytes another data plane carries — Envoy, told by the ext_proc policy
// point of package envoy which cluster to send the dispatch's body to —
// and the answer comes back through the same delivery as Serve's
// (deliver, deliverStream) written into a buffer: placeholders restored,
// usage recorded before the answer is acknowledged, the outcome observed.

// Carried is one request carried by another data plane. Its methods are
// called from one goroutine, in the order the answer arrives: Started,
// Respond, then Whole or StartStream, Chunk… and EndStream; Close in any
// case.
type Carried struct {
	p      *Pipeline
	rq     *request
	o      outcome
	w      *carrierWriter
	cancel context.CancelFunc

	sent, answered, failed, closed bool
	feed                           *feed
	done                           chan struct{} // deliverStream returned
}

// Carry plans the decided request a for a data plane that sends the bytes
// itself, as Serve would with the single strategy (the data plane sends
// one request; its retries stay within the chosen target): the plan (the
// selection of Serve, with the X-Molly-* overrides of h), its worst case
// reserved on the ledger of the caller in ctx (identity.From), and the
// dispatch for the first candidate that egress.NewDispatch admits (a
// refused one counts as a failed attempt, as in a fallback). Errors are
// *openai.Error not yet written: 500 decision_mismatch when d was not made
// for a, 400 for a bad override header, 404 for a model no target serves,
// 429 from the ledger, 503 when no allowed target is left. The model
// listing is Models'.
func (p *Pipeline) Carry(ctx context.Context, a *classify.Annotation, d policies.Decided, h http.Header) (*Carried, error) {
	dec := d.Decision()
	if !d.Binds(a) || dec == nil || a.Endpoint() == openai.EndpointModels {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "decision_mismatch",
			Message: "The policy decision does not belong to this request."}
	}
	w := &carrierWriter{header: http.Header{}}
	w.Header().Set(HeaderDecisionID, dec.ID())
	ctx, cancel := context.WithCancel(ctx)
	rq := &request{w: w, r: &http.Request{Header: h}, ctx: ctx, a: a, d: d, dec: dec, id: identity.From(ctx), log: p.log(), begin: time.Now()}
	rq.outcome = newOutcome(a, dec, rq.id, rq.begin)
	fail := func(err error) (*Carried, error) {
		cancel()
		p.finish(rq, labelOf(err), statusOf(err, http.StatusOK))
		return nil, err
	}
	if err := p.plan(rq, h, route.Config{}); err != nil {
		return fail(err)
	}
	if err := p.reserve(rq); err != nil {
		return fail(err)
	}
	for _, c := range rq.plan.Candidates {
		disp, err := p.Egress.NewDispatch(d, a, c)
		if err != nil {
			rq.note(outcome{cand: c, kind: failRefused, failure: err.Error()})
			continue
		}
		disp = bounded(rq, disp) // as attempt does: the cap the reservation holds goes upstream
		w.Header().Set(HeaderPlan, string(rq.plan.Strategy))
		return &Carried{p: p, rq: rq, w: w, cancel: cancel,
			o: outcome{cand: c, disp: disp, start: time.Now(), meter: p.newMeter(rq, c, a.PromptTokens(), completionCap(rq, disp))}}, nil
	}
	rq.release()
	p.Metrics.Unrouted(a, "failed")
	return fail(noTarget("All allowed targets for model `"+a.Model()+"` failed", rq.plan.Excluded, rq.tried))
}

// Models answers the model listing decided by d (GET /v1/models and
// /v1/models/{model}) as Serve does, returning the JSON body. Errors are
// *openai.Error not yet written: 404 for an unknown model, 500 when d was
// not made for a.
func (p *Pipeline) Models(ctx context.Context, a *classify.Annotation, d policies.Decided) ([]byte, error) {
	dec := d.Decision()
	if !d.Binds(a) || dec == nil || a.Endpoint() != openai.EndpointModels {
		return nil, &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "decision_mismatch",
			Message: "The policy decision does not belong to this request."}
	}
	w := &carrierWriter{header: http.Header{}}
	rq := &request{w: w, ctx: ctx, a: a, d: d, dec: dec, id: identity.From(ctx), log: p.log(), begin: time.Now()}
	rq.outcome = newOutcome(a, dec, rq.id, rq.begin)
	err := p.models(rq)
	p.finish(rq, modelsLabel(err), statusOf(err, http.StatusOK))
	if err != nil {
		return nil, err
	}
	return w.take(), nil
}

// Dispatch is the request to send: its Body (redacted for the tier),
// Method, URL and Header.
func (c *Carried) Dispatch() *egress.Dispatch { return c.o.disp }

// Candidate is the chosen target and upstream model.
func (c *Carried) Candidate() route.Candidate { return c.o.cand }

// Plan is the request's plan (strategy single; candidates in order).
func (c *Carried) Plan() route.Plan { return c.rq.plan }

// Header is the response header Molly adds so far: X-Molly-Decision-Id
// and X-Molly-Strategy (Respond, Whole and StartStream return the rest).
func (c *Carried) Header() http.Header { return c.w.header.Clone() }

// Started records that the data plane has the request: latencies count
// from now, and a client that goes away from now on is billed the prompt
// estimate (the upstream may have the prompt).
func (c *Carried) Started() {
	c.sent = true
	c.o.start = time.Now()
}

// Respond takes the status of the upstream's answer (and its header) as
// the data plane received it, once its retries are over. A 429 or 5xx is
// a failed attempt, as in Serve: it is logged and counted, nothing is
// billed, and the returned *openai.Error (503 no_target_available naming
// the target) is what the client gets instead of the upstream's body.
func (c *Carried) Respond(status int, h http.Header) error {
	o := &c.o
	o.disp.ScrubHeader(h) // an upstream may echo its key (egress.Dispatch.Send)
	o.status, o.header, o.ttfb = status, h, time.Since(o.start)
	if status != http.StatusTooManyRequests && status < 500 {
		return nil
	}
	o.kind, o.failure = failServer, "HTTP "+strconv.Itoa(status)+" "+http.StatusText(status)
	if status == http.StatusTooManyRequests {
		o.kind = failRateLimited
	}
	c.failed = true
	c.rq.tried = append(c.rq.tried, failed{target: o.cand.Target.Name, err: o.failure, kind: o.kind})
	c.rq.track(o, false)
	c.rq.log.Warn("upstream failed", zap.String("target", o.cand.Target.Name), zap.String("decision_id", c.rq.dec.ID()),
		zap.String("failure", string(o.kind)), zap.String("error", o.failure), zap.Bool("carried", true))
	c.p.Metrics.Unrouted(c.rq.a, "failed")
	err := noTarget("All allowed targets for model `"+c.rq.a.Model()+"` failed", c.rq.plan.Excluded, c.rq.tried)
	c.rq.outcome.Label, c.rq.outcome.Status = "failed", err.Status
	return err
}

// Streaming reports whether the answer Respond took is a stream to relay
// with StartStream: a 2xx server-sent event stream to a streamed request
// (one to a request that asked for none is joined by Whole).
func (c *Carried) Streaming() bool {
	return c.o.status/100 == 2 && strings.HasPrefix(c.o.header.Get("Content-Type"), "text/event-stream") && c.o.disp.Stream()
}

// Whole delivers a whole (non-streamed) answer whose body the upstream
// sent, as Serve's deliver does: a 2xx answer's usage recorded first, its
// placeholders restored, Molly's headers set; it returns the header to
// set on the client's answer (Content-Length included) and the body.
func (c *Carried) Whole(body []byte) (http.Header, []byte) {
	o := &c.o
	body = o.disp.ScrubAnswer(body)
	if h, out, ok := c.wholeAsStream(body); ok {
		return h, out
	}
	if o.status/100 == 2 && !o.disp.Stream() && strings.HasPrefix(o.header.Get("Content-Type"), "text/event-stream") {
		// A stream to a request that asked for none: the answer it says
		// (as Serve's attempt joins it).
		if whole := relay.AnswerOfStream(c.rq.a.Endpoint(), body); whole != nil {
			body = whole
			o.header = o.header.Clone()
			o.header.Set("Content-Type", "application/json")
		}
	}
	o.body, o.total, o.doc = body, time.Since(o.start), openai.Doc{} // not read by wholeAnswer
	if o.status/100 == 2 && gjson.ValidBytes(body) {
		o.meter.Body(body)
		o.logprob, o.tokens = MeanLogprob(body)
	}
	c.answered = true
	c.p.deliver(c.rq, o, "")
	return c.w.header.Clone(), c.w.take()
}

// wholeAsStream delivers a whole 2xx answer to a streamed request as
// Serve does (notStreamed): the stream that says the same
// (relay.StreamOfAnswer), held and relayed by deliverStream; the header
// carries the stream's Content-Length. ok is false, nothing done, for a
// request that is not streamed or a body that is no whole answer (Whole
// then delivers it as it is).
func (c *Carried) wholeAsStream(body []byte) (http.Header, []byte, bool) {
	o := &c.o
	ep := c.rq.a.Endpoint()
	if o.status/100 != 2 || !o.disp.Stream() {
		return nil, nil, false
	}
	resp := &http.Response{StatusCode: o.status, Header: o.header.Clone()}
	if _, kind, _ := wholeAnswer(ep, resp, body); kind != failNone {
		return nil, nil, false
	}
	sse := relay.StreamOfAnswer(ep, validUTF8(body))
	if sse == nil {
		return nil, nil, false
	}
	resp.Header.Set("Content-Type", "text/event-stream")
	resp.Header.Del("Content-Length")
	resp.Body = io.NopCloser(bytes.NewReader(sse))
	o.header = resp.Header
	held := c.p.hold(c.rq, *o, resp, 0)
	if !held.ok() {
		return nil, nil, false
	}
	c.o = held
	c.answered = true
	_ = c.p.deliverStream(c.rq, &c.o, "")
	h, out := c.w.header.Clone(), c.w.take()
	h.Set("Content-Length", strconv.Itoa(len(out)))
	return h, out, true
}

// StartStream begins relaying a streamed answer through Serve's
// deliverStream and returns the header to set on the client's answer.
// Chunk then takes each piece of the upstream's body, cut anywhere, and
// returns the bytes for the client (events whole, placeholders restored,
// the usage chunk hidden when the client did not ask for it); EndStream
// takes the end of the body and returns the last bytes (a
// stream_truncated error event when the stream broke off). The usage is
// recorded before the [DONE] event is returned.
func (c *Carried) StartStream() http.Header {
	c.answered = true
	c.done = make(chan struct{})
	c.feed = &feed{in: make(chan []byte), idle: make(chan struct{}), ended: make(chan struct{}), done: c.done}
	c.o.stream = &heldStream{dec: relay.NewDecoder(c.o.disp.ScrubReader(c.feed)), body: c.feed}
	go func() {
		defer close(c.done)
		_ = c.p.deliverStream(c.rq, &c.o, "")
	}()
	c.feed.wait() // the headers are written and the relay asks for bytes
	return c.w.header.Clone()
}

// Chunk feeds one piece of a streamed answer (see StartStream).
func (c *Carried) Chunk(b []byte) []byte {
	c.feed.push(b)
	return c.w.take()
}

// EndStream ends a streamed answer (see StartStream).
func (c *Carried) EndStream() []byte {
	c.feed.end()
	<-c.done
	return c.w.take()
}

// Close ends the carried request, releases its reservation and records
// its Outcome for the pipeline's recorders. Before the answer was
// delivered, the client (or the data plane) went away:
// once the data plane had the request (Started) this is accounted as
// Serve accounts a client that went away — the prompt estimate billed,
// "client went away" logged, counted as client_closed — and a stream being
// relayed stops there with the usage of what it streamed. Idempotent.
func (c *Carried) Close() {
	if c.closed {
		return
	}
	c.closed = true
	switch {
	case c.done != nil:
		select {
		case <-c.done:
		default: // the stream is cut short: the relay sees the client gone
			c.cancel()
			c.feed.end()
			<-c.done
		}
	case c.answered || c.failed:
	case c.sent:
		c.cancel()
		_ = c.p.clientGone(c.rq, &c.o)
	default:
		c.p.Metrics.Unrouted(c.rq.a, "client_closed")
		c.rq.outcome.Label = "client_closed"
	}
	c.cancel()
	c.rq.release()
	c.p.finish(c.rq, "", 0)
}

// carrierWriter is the http.ResponseWriter the delivery writes a carried
// answer into: headers, status and body bytes, taken by the data plane.
type carrierWriter struct {
	mu     sync.Mutex
	header http.Header
	status int
	buf    bytes.Buffer
}

func (w *carrierWriter) Header() http.Header { return w.header }

func (w *carrierWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *carrierWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

// Flush is a no-op: the data plane takes what was written after each
// piece of the stream (take).
func (w *carrierWriter) Flush() {}

func (w *carrierWriter) take() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := bytes.Clone(w.buf.Bytes())
	w.buf.Reset()
	return out
}

// feed is the upstream body of a carried stream as deliverStream reads
// it: the pieces the data plane pushes. Read reports idle when it has
// handed out every byte pushed and needs more, so the pusher knows that
// every complete event of a piece has been relayed when push returns.
type feed struct {
	in    chan []byte
	idle  chan struct{}
	ended chan struct{} // closed by end: no more pieces
	done  chan struct{} // the relay returned
	cur   []byte
}

func (f *feed) Read(p []byte) (int, error) {
	for len(f.cur) == 0 {
		select {
		case f.idle <- struct{}{}:
		case <-f.ended:
		}
		b, ok := <-f.in
		if !ok {
			return 0, io.EOF
		}
		f.cur = b
	}
	n := copy(p, f.cur)
	f.cur = f.cur[n:]
	return n, nil
}

// Close is the relay's close of the upstream body; pieces stop with end.
func (f *feed) Close() error { return nil }

// wait returns once the relay asks for more bytes or has returned.
func (f *feed) wait() {
	select {
	case <-f.idle:
	case <-f.done:
	}
}

// push hands b to the relay and waits until it is consumed.
func (f *feed) push(b []byte) {
	if len(b) == 0 {
		return
	}
	select {
	case f.in <- b:
	case <-f.done:
		return
	}
	f.wait()
}

// end closes the body: the relay reads io.EOF.
func (f *feed) end() {
	select {
	case <-f.ended:
		return
	default:
	}
	close(f.ended)
	close(f.in)
}
