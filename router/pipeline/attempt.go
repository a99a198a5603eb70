package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/router/tracing"
)

// failure classifies why an attempt did not answer.
type failure string

// Failure kinds. Every kind but failClientGone falls back to the next
// candidate while nothing has reached the client.
const (
	failNone         failure = ""
	failRefused      failure = "refused"       // no dispatch could be made (policy, redaction)
	failConnect      failure = "connect"       // the upstream could not be reached
	failTimeout      failure = "timeout"       // connect, headers or first event took too long
	failRateLimited  failure = "rate_limited"  // 429, or a rate-limit error inside a 200 stream
	failServer       failure = "server_error"  // 5xx, or an error object inside a 200 answer or stream
	failRead         failure = "read"          // the answer broke off while being read
	failTooLarge     failure = "too_large"     // the answer is over MaxUpstreamBody
	failBadAnswer    failure = "bad_answer"    // a 200 that is not JSON, or not SSE when streaming was asked
	failEmptyStream  failure = "empty_stream"  // a stream that ended before its first content event
	failClientGone   failure = "client_gone"   // the client went away: nothing to answer
	failContext      failure = "context"       // a 400 saying the prompt exceeds the target's context window (single falls back)
	failUpstreamAuth failure = "upstream_auth" // a 401: the target refused Molly's credentials for it, not the client's
)

// outcome is one attempt: an answer in hand (whole or a stream held before
// its first content event reached the client), or why there is none.
type outcome struct {
	cand    route.Candidate
	disp    *egress.Dispatch
	kind    failure
	failure string // what went wrong, for the log and the error message
	status  int
	header  http.Header
	body    []byte      // a whole answer (any status); nil for a stream
	stream  *heldStream // a 2xx stream, held
	start   time.Time   // before the upstream call
	ttfb    time.Duration
	total   time.Duration
	meter   *meter.Meter
	// logprob is the answer's score (mean token log-probability, or the
	// self-check's ln(c/10) when selfChecked); tokens the tokens behind it,
	// 0 when there is no score.
	logprob     float64
	tokens      int
	selfChecked bool
	// doc is body as wholeAnswer read it (openai.ReadJSON), for the
	// stages after it (usage, logprobs, normalising) to look at without
	// parsing it again; empty when body was not read so (a stream, a
	// non-2xx answer), and stale once body is replaced (they check).
	doc openai.Doc
}

func (o *outcome) ok() bool { return o.kind == failNone }

func (o *outcome) label() string { return o.cand.Label() }

// usage is the recorded usage of the answer, nil when none yet.
func (o *outcome) usage() *meter.Usage { return o.meter.Final() }

// newMeter is the usage meter of one answer from c to rq, whose
// completion was capped upstream at completionCap tokens, what rq's
// reservation holds for it (meter.Options.CompletionCap; 0: none).
func (p *Pipeline) newMeter(rq *request, c route.Candidate, prompt, completionCap int) *meter.Meter {
	o := meter.Options{Log: rq.log, Target: c.Target, PromptEstimate: prompt, CompletionCap: completionCap, Metrics: p.Metrics,
		StripUsage: rq.a.Stream() && !rq.a.IncludeUsage(),
		Base:       meter.Usage{Member: rq.id.Name(), DecisionID: rq.dec.ID(), Model: rq.a.Model(), Target: c.Target.Name, Tier: c.Target.Tier}}
	if rq.id != nil {
		o.Ledger = rq.id.Ledger
	}
	return meter.New(rq.ctx, o)
}

// upstream sends disp and reads its answer: a whole answer, or a 2xx stream
// held until its first content event (and, with hold > 0, until hold tokens
// with logprobs arrived, for a cascade). It classifies every failure,
// meters a 2xx answer's usage (before it is written: every answer consumed
// tokens, returned or not), reading a priced target's non-streamed answer
// to its end even when the client went away after it was sent, and bills
// the prompt
// estimate when a client went away after the upstream got the request and
// no usage came (never before: see egress.Dispatch.Delivery). attempt
// (health.go) wraps it with the target's circuit.
func (p *Pipeline) upstream(rq *request, c route.Candidate, disp *egress.Dispatch, prompt, hold int) (o outcome) {
	ctx, span := startAttempt(rq, c)
	defer func() { endAttempt(span, &o) }()
	o = outcome{cand: c, disp: disp, start: time.Now(), meter: p.newMeter(rq, c, prompt, completionCap(rq, disp))}
	if rq.ctx.Err() != nil {
		o.kind, o.failure, o.meter = failClientGone, "the client went away before the upstream call", nil
		return o // no upstream saw it: nothing to bill
	}
	ctx, reached := disp.Delivery(ctx)
	if !disp.Stream() && c.Target.Kind != route.KindEngine && (c.Target.PriceIn > 0 || c.Target.PriceOut > 0) {
		// A provider generates, and bills, a whole answer whether or not
		// the client still waits for it: once sent to a priced target, the
		// call is read to its end (within twice the target's timeout) so
		// that its reported usage is recorded, not a guess. An unpriced
		// one (a server of one's own, which stops work for a closed
		// connection), a stream and the T0 engine stop when the client
		// leaves, freeing their capacity.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*c.Target.Timeout())
		defer cancel()
	}
	resp, err := disp.Send(ctx, tracing.Header(ctx, rq.r.Header))
	o.ttfb = time.Since(o.start)
	if err != nil {
		switch {
		case rq.ctx.Err() != nil:
			o.kind, o.failure = failClientGone, "the client went away"
			if !reached() {
				o.meter = nil // the request never reached the upstream: nothing to bill
				break
			}
			o.meter.Abandoned() // the upstream has the prompt: bill its estimate
		case isTimeout(err):
			o.kind, o.failure = failTimeout, "timed out"
		default:
			o.kind, o.failure = failConnect, upstreamErr(err)
		}
		return o
	}
	o.status, o.header = resp.StatusCode, resp.Header
	if resp.StatusCode == http.StatusUnauthorized {
		// The upstream refused the target's API key: the gateway's
		// credentials, not the client's, so the client must not get a 401
		// (its SDK would report its own key as invalid). Another target
		// may serve; the body may echo the key: dropped. (A 403 is
		// relayed: a policy's or a region's refusal of the request.)
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		o.kind, o.failure = failUpstreamAuth, "HTTP "+resp.Status+" (the target refused its API key)"
		return o
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		o.kind, o.failure = failServer, "HTTP "+resp.Status
		if resp.StatusCode == http.StatusTooManyRequests {
			o.kind = failRateLimited
		}
		return o
	}
	if resp.StatusCode/100 == 3 {
		// egress follows no redirect: the decision allowed this target,
		// not the host its Location names. A redirect is no answer of the
		// API either; another target may serve.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		o.kind, o.failure = failServer, "HTTP "+resp.Status+" (a redirect, not followed: the request goes to its target only)"
		return o
	}
	isSSE := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	if resp.StatusCode/100 == 2 && disp.Stream() {
		if !isSSE {
			return p.notStreamed(rq, o, resp, hold)
		}
		return p.hold(rq, o, resp, hold)
	}
	body, ok := readAnswer(rq, &o, resp, resp.Body)
	if !ok {
		return o
	}
	if resp.StatusCode/100 == 2 {
		if isSSE {
			// A stream to a request that asked for none (a server that
			// always streams): the whole answer it says.
			whole := relay.AnswerOfStream(rq.a.Endpoint(), body)
			if whole == nil {
				o.kind, o.failure = failBadAnswer, "a 200 event stream without an answer to a request that asked for none"
				return o
			}
			body = whole
			o.header = o.header.Clone()
			o.header.Set("Content-Type", "application/json")
		}
		var kind failure
		var why string
		if o.doc, kind, why = wholeAnswer(rq.a.Endpoint(), resp, body); kind != failNone {
			o.kind, o.failure = kind, why
			return o
		}
	}
	o.body = validUTF8(body)
	if resp.StatusCode/100 == 2 {
		o.meter.BodyUsage(body, usageMember(&o.doc))
		o.logprob, o.tokens = meanLogprob(&o.doc, body)
	}
	if rq.ctx.Err() != nil {
		// The client left while the upstream answered: its usage is in
		// (above); nothing more is asked or written for it.
		o.kind, o.failure = failClientGone, "the client went away"
	}
	return o
}

// readAnswer reads a whole answer of at most MaxUpstreamBody bytes from r
// (resp's body, or a reader over it) and closes resp's body; when it
// cannot (the client left, a read error, an answer too large) it sets
// o's failure and reports false.
func readAnswer(rq *request, o *outcome, resp *http.Response, r io.Reader) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r, MaxUpstreamBody+1))
	resp.Body.Close()
	o.total = time.Since(o.start)
	switch {
	case err != nil && rq.ctx.Err() != nil:
		o.kind, o.failure = failClientGone, "the client went away"
		o.meter.Abandoned()
	case err != nil:
		o.kind, o.failure = failRead, "reading the answer: "+upstreamErr(err)
	case len(body) > MaxUpstreamBody:
		o.kind, o.failure = failTooLarge, fmt.Sprintf("answer over %d bytes", MaxUpstreamBody)
	default:
		return body, true
	}
	return nil, false
}

// wholeAnswer says why the 2xx whole answer body of resp to a request for
// ep is no answer (failNone when it is one): not JSON, ambiguous,
// misshapen, or an error object (as some routers send a provider's
// failure in a 200: a failed attempt, as inside a stream). It reads body
// once (openai.ReadJSON) and returns what it read, for the stages after
// it (the Doc is empty when body is not JSON or is ambiguous).
func wholeAnswer(ep openai.Endpoint, resp *http.Response, body []byte) (openai.Doc, failure, string) {
	d, valid, key, dup, deep := openai.ReadJSON(body)
	switch {
	case !valid:
		return d, failBadAnswer, "a 200 answer that is not JSON (" + contentType(resp) + ")"
	case dup || deep:
		return d, failBadAnswer, "a 200 answer " + ambiguity(key, dup)
	}
	if why := misshapen(ep, &d); why != "" {
		return d, failBadAnswer, "a 200 answer " + why
	}
	if i := d.Member(0, "error"); i >= 0 && d.Kind(i) != openai.KindNull {
		e := gjson.Parse(d.Raw(i))
		kind := failServer
		if strings.Contains(e.Get("code").String()+e.Get("type").String(), "rate_limit") || e.Get("code").Int() == 429 {
			kind = failRateLimited
		}
		return d, kind, "an error object in a 200 answer: " + truncate(e.Get("message").String(), 200)
	}
	return d, failNone, ""
}

// usageMember is the "usage" member of the answer d holds (it does not
// exist when the answer has none, or d is empty), as
// gjson.GetBytes(body, "usage") finds it.
func usageMember(d *openai.Doc) gjson.Result {
	if d.Len() == 0 {
		return gjson.Result{}
	}
	i := d.Member(0, "usage")
	if i < 0 {
		return gjson.Result{}
	}
	return gjson.Parse(d.Raw(i))
}

// notStreamed handles a 2xx answer to a streamed request that is not
// labelled text/event-stream. An event stream under another content type
// (text/plain, application/json: its first line is an SSE field or
// comment) is held as one. A whole JSON answer (an upstream that does not
// stream, or not this request) becomes the stream that says the same
// (relay.StreamOfAnswer: its choices in one chunk, its usage in a last
// one), checked first as any whole answer is (wholeAnswer), then held as
// a stream; anything else is a bad answer.
func (p *Pipeline) notStreamed(rq *request, o outcome, resp *http.Response, hold int) outcome {
	br := bufio.NewReader(resp.Body)
	if looksLikeSSE(br) {
		resp.Body = readCloser{br, resp.Body}
		return p.hold(rq, o, resp, hold)
	}
	body, ok := readAnswer(rq, &o, resp, br)
	if !ok {
		return o
	}
	if _, kind, why := wholeAnswer(rq.a.Endpoint(), resp, body); kind != failNone {
		o.kind, o.failure = kind, "a stream was asked for: "+why
		return o
	}
	sse := relay.StreamOfAnswer(rq.a.Endpoint(), validUTF8(body))
	if sse == nil {
		o.kind, o.failure = failBadAnswer, "a stream was asked for, the answer is "+contentType(resp)+" without choices"
		return o
	}
	o.header = o.header.Clone()
	o.header.Set("Content-Type", "text/event-stream")
	o.header.Del("Content-Length")
	resp.Body = io.NopCloser(bytes.NewReader(sse))
	return p.hold(rq, o, resp, hold)
}

// looksLikeSSE reports whether the answer read by br begins (after
// blanks) with an event-stream field name and a colon, or a comment.
func looksLikeSSE(br *bufio.Reader) bool {
	head, _ := br.Peek(64)
	head = bytes.TrimLeft(head, " \t\r\n\ufeff")
	if len(head) > 0 && head[0] == ':' {
		return true
	}
	for _, f := range []string{"data:", "event:", "id:", "retry:"} {
		if bytes.HasPrefix(head, []byte(f)) {
			return true
		}
	}
	return false
}

// readCloser reads through a buffered reader and closes the body under it.
type readCloser struct {
	io.Reader
	io.Closer
}

// checkJSON reads b once (openai.CheckJSON): valid reports whether it is
// JSON, and ambiguous says why a valid b is still no answer to relay, ""
// when it is one: a member name repeated in one object (Molly's guard and
// restorer read one value, the client's parser may keep the other: Go's
// and JavaScript's keep the last), or nesting deeper than
// openai.MaxJSONDepth (deeper than any answer of the API, and than some
// clients' parsers recurse).
func checkJSON(b []byte) (valid bool, ambiguous string) {
	valid, key, dup, deep := openai.CheckJSON(b)
	if dup || deep {
		return valid, ambiguity(key, dup)
	}
	return valid, ""
}

// ambiguity says why JSON text with a repeated member name key (dup) or
// nesting deeper than openai.MaxJSONDepth (otherwise) is no answer.
func ambiguity(key string, dup bool) string {
	if dup {
		return fmt.Sprintf("with the key %q twice in one object", key)
	}
	return fmt.Sprintf("nested deeper than %d levels", openai.MaxJSONDepth)
}

// misshapen says why the JSON text d holds (openai.ReadJSON, not empty)
// is no answer of endpoint ep, "" when it may be one: a chat or
// completions answer is an object whose "choices" (when present) is an
// array of objects (the normaliser would otherwise make an answer up
// around a string or a number).
func misshapen(ep openai.Endpoint, d *openai.Doc) string {
	if ep != openai.EndpointChat && ep != openai.EndpointCompletions {
		return ""
	}
	if d.Kind(0) != openai.KindObject {
		return "that is not a JSON object"
	}
	ch := d.Member(0, "choices")
	if ch < 0 || d.Kind(ch) == openai.KindNull {
		return ""
	}
	if d.Kind(ch) != openai.KindArray {
		return `whose "choices" is not an array`
	}
	for c, end := ch+1, d.Next(ch); c < end; c = d.Next(c) {
		if d.Kind(c) != openai.KindObject {
			return `with a choice that is not an object`
		}
	}
	return ""
}

// validUTF8 is b with each invalid UTF-8 sequence replaced by U+FFFD (JSON
// text is UTF-8, RFC 8259 §8.1); b itself when it is valid.
func validUTF8(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return bytes.ToValidUTF8(b, []byte("\uFFFD"))
}

func contentType(resp *http.Response) string {
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		return ct
	}
	return "no content type"
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

func upstreamErr(err error) string {
	if isTimeout(err) {
		return "timed out"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:] // drop the URL, keep the cause ("connection refused")
	}
	return s
}

// heldStream is a 2xx streamed answer whose first events were read and not
// yet sent to the client.
type heldStream struct {
	dec    *relay.Decoder
	events []relay.Event
	body   io.Closer
	done   bool // [DONE] or the end of the stream was read while holding
	ended  bool // a finish_reason was seen
	// over: the answer ran past its completion cap while held
	// (meter.Meter.Over); the event that crossed it is not in events, and
	// the relay ends the stream after them (deliverStream).
	over bool
}

// hold reads the stream in resp until its first content event (a chunk
// with text, a tool call, a refusal or a finish_reason) and, for hold > 0,
// until hold tokens with logprobs arrived (o gets their mean), the stream
// ended, or a chunk with text but no logprobs showed the backend gives
// none. Nothing is sent. An error object inside the stream, a stream that
// ends or breaks before its first content event, or one whose first event
// takes longer than the first-event timeout, is a failed attempt: the
// client has seen nothing, so the strategy falls back.
func (p *Pipeline) hold(rq *request, o outcome, resp *http.Response, hold int) outcome {
	h := &heldStream{dec: relay.NewDecoder(resp.Body), body: resp.Body}
	timeout := p.FirstEventTimeout
	if timeout <= 0 {
		timeout = DefaultFirstEventTimeout
	}
	var timedOut atomic.Bool
	timer := time.AfterFunc(timeout, func() { timedOut.Store(true); resp.Body.Close() })
	defer timer.Stop()
	var sum float64
	content := false
	fail := func(kind failure, why string) outcome {
		resp.Body.Close()
		o.kind, o.failure = kind, why
		if content || o.meter.Reported() != nil {
			o.meter.StreamEnd() // what it streamed was consumed: billed
		}
		return o
	}
	size := 0
read:
	for !content || (hold > 0 && o.tokens < hold) {
		ev, err := h.dec.Next()
		if err != nil {
			switch {
			case rq.ctx.Err() != nil:
				o.kind, o.failure = failClientGone, "the client went away"
				resp.Body.Close()
				o.meter.Abandoned() // the upstream had the prompt: its estimate, or what it reported
				return o
			case timedOut.Load():
				return fail(failTimeout, fmt.Sprintf("no content event within %s", timeout))
			case content && (h.ended || err == io.EOF):
				h.done = true // a short whole answer: deliver what was held
			case !content:
				return fail(failEmptyStream, "the stream ended before its first token: "+upstreamErr(err))
			default:
				return fail(failRead, "the stream broke off while held: "+upstreamErr(err))
			}
			break read
		}
		size += len(ev.Data)
		if size > MaxUpstreamBody {
			return fail(failTooLarge, "held stream over the size limit")
		}
		h.events = append(h.events, ev)
		if ev.IsDone() {
			if !content {
				return fail(failEmptyStream, "the stream ended before its first token")
			}
			h.done = true
			break read
		}
		if !gjson.ValidBytes(ev.Data) {
			continue
		}
		chunk := gjson.ParseBytes(ev.Data)
		o.meter.Event(ev.Data) // counted now; the relay does not count held events again
		if o.meter.Over() {
			// Past the cap: this event is not relayed, and the rest is
			// not read (deliverStream ends the stream with "length").
			h.events = h.events[:len(h.events)-1]
			h.over, h.done = true, true
			break read
		}
		if e := chunk.Get("error"); e.Exists() {
			kind := failServer
			if strings.Contains(e.Get("code").String()+e.Get("type").String(), "rate_limit") || e.Get("code").Int() == 429 {
				kind = failRateLimited
			}
			return fail(kind, "an error event inside the stream: "+truncate(e.Get("message").String(), 200))
		}
		n, text := 0, false
		chunk.Get("choices").ForEach(func(_, ch gjson.Result) bool {
			for _, v := range ch.Get("logprobs.content.#.logprob").Array() {
				sum += v.Float()
				n++
			}
			if fr := ch.Get("finish_reason"); fr.Type == gjson.String && fr.Str != "" {
				h.ended, content = true, true
			}
			d := ch.Get("delta")
			// "tool_calls": null and "function_call": null (LiteLLM's proxy
			// writes them on every delta) are no content.
			if d.Get("content").String() != "" || d.Get("refusal").String() != "" || d.Get("tool_calls").IsArray() ||
				ch.Get("text").String() != "" || d.Get("function_call").IsObject() {
				text, content = true, true
			}
			return true
		})
		o.tokens += n
		if hold > 0 && n == 0 && text {
			break read // text without logprobs: the backend gives none, waiting is pointless
		}
	}
	o.total = time.Since(o.start)
	if o.tokens > 0 {
		o.logprob = sum / float64(o.tokens)
	}
	o.stream = h
	return o
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// abandon closes a held stream that will not be relayed and records the
// usage of what it streamed (its usage chunk when it came, else the held
// text counted).
func (o *outcome) abandon() {
	if o.stream != nil {
		o.stream.body.Close()
	}
	o.meter.StreamEnd()
}

// clientGone handles a client that went away: the attempt's usage is
// billed as the README says (the prompt estimate once an upstream had the
// request), the log says so, and the request counts as client_closed
// (499), never as an upstream failure.
func (p *Pipeline) clientGone(rq *request, o *outcome) error {
	if o != nil {
		o.abandon()
	}
	target := ""
	if o != nil {
		target = o.cand.Target.Name
	}
	rq.log.Info("client went away", zap.String("decision_id", rq.dec.ID()), zap.String("target", target),
		zap.Duration("after", time.Since(rq.begin)))
	p.Metrics.Unrouted(rq.a, "client_closed")
	if o != nil && o.cand.Target != nil {
		rq.track(o, false)
	}
	rq.outcome.Label, rq.outcome.Status = "client_closed", 499
	rq.w.WriteHeader(499) // nginx's "client closed request", for the access log; nobody reads it
	return nil
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

// meanLogprob is MeanLogprob(body) for the answer body that d holds
// (openai.ReadJSON; empty: not read so), without reading body again when
// no member named "logprobs" in it is other than null: then it carries
// no log-probabilities (0, 0).
func meanLogprob(d *openai.Doc, body []byte) (mean float64, n int) {
	if d.Len() == 0 {
		return MeanLogprob(body)
	}
	for i := 1; i < d.Len(); i++ {
		if d.Kind(i) != openai.KindNull {
			if k, _ := d.Key(i); k == "logprobs" {
				return MeanLogprob(body)
			}
		}
	}
	return 0, 0
}

// send is the common case of an attempt: a dispatch for c under rq's
// decision, then the attempt; a dispatch that cannot be made is a refused
// attempt.
func (p *Pipeline) send(rq *request, c route.Candidate, hold int) outcome {
	disp, err := p.Egress.NewDispatch(rq.d, rq.a, c)
	if err != nil {
		return outcome{cand: c, kind: failRefused, failure: err.Error()}
	}
	return p.attempt(rq, c, disp, rq.a.PromptTokens(), hold)
}

// note records a failed attempt and logs the fallback.
func (rq *request) note(o outcome) {
	f := failed{target: o.cand.Target.Name, err: o.failure, kind: o.kind}
	if o.header != nil {
		f.retryAfter = retryAfter(o.header.Get("Retry-After"))
	}
	rq.tried = append(rq.tried, f)
	rq.track(&o, false)
	rq.log.Warn("upstream failed, falling back", zap.String("target", o.cand.Target.Name), zap.String("decision_id", rq.dec.ID()),
		zap.String("failure", string(o.kind)), zap.String("error", o.failure))
}
