package router

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/policies"
)

// Response headers Molly adds to every routed answer.
const (
	HeaderTier       = "X-Molly-Tier"
	HeaderTarget     = "X-Molly-Target"
	HeaderDecisionID = "X-Molly-Decision-Id"
)

// MaxUpstreamBody bounds a non-streaming upstream answer (64 MiB).
const MaxUpstreamBody = 64 << 20

// Forwarder routes annotated, decided requests to targets.
type Forwarder struct {
	Catalogue *Catalogue
	Weights   Weights
	Logger    *zap.Logger
	// Priors learns quality (feedback, outcomes) and latency, and remembers
	// decisions for feedback; nil: the configured priors only (priors.go).
	Priors *Priors
	// Metrics records requests, tokens, cost and latency; nil: none (metrics.go).
	Metrics *Metrics
	// Cascade, when set, tries cheap candidates first and escalates on low
	// confidence (cascade.go); Mixture, when set, answers requests of
	// uncertain category with the fused best of several (mixture.go).
	// Both apply to non-streamed chat requests; a cascade with HoldTokens
	// to streamed ones too.
	Cascade *Cascade
	Mixture *Mixture
	// Tools, when set with ToolPolicy, are governed tools offered to the
	// model on non-streamed chat requests that declare none (tools.go), at
	// most ToolSteps rounds (0: DefaultToolSteps). Such requests are
	// answered by the tool loop, without cascade or mixture.
	Tools      ToolRunner
	ToolPolicy ToolPolicy
	ToolSteps  int
	// ToolsHidden names governed tools never offered to models (and so
	// never run by the tool loop), e.g. the billing tool usage is sent to.
	ToolsHidden []string
	// UsageSink, when set, gets every usage record the forwarder makes
	// (the values written to the identity's Ledger, streams included;
	// member "anonymous" without an identity), synchronously on the
	// request's path: it must not block (the app hands it to billing in
	// the background).
	UsageSink func(Usage)
}

// attempt records one failed try, for the 503 message and the log.
type attempt struct {
	target string
	err    string
}

// Serve answers the request: the model list, or the best allowed target's
// answer with fallback to the next candidates on connect errors, timeouts,
// 429 and 5xx for as long as nothing has been written to the client.
// The returned error is an *api.Error not yet written, or nil once a
// response has been written.
func (f *Forwarder) Serve(w http.ResponseWriter, r *http.Request, a *Annotation, d *policies.Decision) error {
	log := f.Logger
	if log == nil {
		log = zap.NewNop()
	}
	w.Header().Set(HeaderDecisionID, d.ID())
	if a.Endpoint == EndpointModels {
		return f.models(w, d, IdentityFrom(r.Context()), a.Model)
	}
	cands, excluded, known, err := f.rank(r, a, d, log) // explain.go: overrides, learned priors, decision log
	if err != nil {
		return err
	}
	if !known {
		return &api.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", a.Model)}
	}
	if len(cands) == 0 {
		return noTarget("No allowed target is available for model `"+a.Model+"`", excluded, nil)
	}
	release, err := reserve(r.Context(), a, cands) // budget and TPM held while the request runs
	if err != nil {
		return err
	}
	defer release()
	if f.toolsApply(a, IdentityFrom(r.Context())) {
		return f.toolLoop(w, r, a, d, cands, excluded, log)
	}
	var tried []attempt
	if members, rest := f.mixtureMembers(r, a, d, cands); len(members) > 1 {
		var done bool
		if tried, done = f.mixture(w, r, a, d, members, log); done {
			return nil
		}
		cands = rest // every member failed: the others, one by one
	}
	if f.Cascade.applies(a, cands) {
		return f.cascade(w, r, a, d, cands, excluded, tried, log)
	}
	for _, c := range cands {
		disp, err := NewDispatch(d, a, c)
		if err != nil {
			tried = append(tried, attempt{c.Target.Name, err.Error()})
			continue
		}
		start := time.Now()
		resp, err := disp.send(r.Context())
		ttfb := time.Since(start)
		if err != nil {
			if r.Context().Err() != nil {
				log.Info("client went away", zap.String("decision_id", d.ID()), zap.String("target", c.Target.Name), zap.String("tier", c.Target.Tier))
				// The upstream got the prompt: bill its estimate.
				f.newUsageMeter(r.Context(), log, a, d.ID(), c.Target).abandoned()
				return nil // nothing to answer
			}
			tried = append(tried, attempt{c.Target.Name, upstreamErr(err)})
			log.Warn("upstream failed, falling back", zap.String("target", c.Target.Name), zap.String("decision_id", d.ID()), zap.Error(err))
			continue
		}
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500 {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			tried = append(tried, attempt{c.Target.Name, "HTTP " + resp.Status})
			log.Warn("upstream refused, falling back", zap.String("target", c.Target.Name), zap.Int("status", resp.StatusCode), zap.String("decision_id", d.ID()))
			continue
		}
		isSSE := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
		meter := f.newUsageMeter(r.Context(), log, a, d.ID(), c.Target)
		if resp.StatusCode/100 == 2 && isSSE {
			f.setHeaders(w, resp, disp)
			f.explain(w, c, cands)
			err := relaySSE(w, resp.Body, disp, meter)
			resp.Body.Close()
			log.Info("routed", zap.String("decision_id", d.ID()), zap.String("target", c.Target.Name), zap.String("tier", c.Target.Tier),
				zap.Bool("stream", true), zap.Int("redacted", disp.Redacted()), zap.Duration("duration", time.Since(start)), zap.NamedError("stream_error", err))
			f.observe(a, d, answered{chosen: c, cands: cands, start: start, ttfb: ttfb, status: resp.StatusCode, meter: meter, err: err})
			return nil
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, MaxUpstreamBody+1))
		resp.Body.Close()
		if err != nil || len(body) > MaxUpstreamBody {
			if r.Context().Err() != nil {
				log.Info("client went away", zap.String("decision_id", d.ID()), zap.String("target", c.Target.Name), zap.String("tier", c.Target.Tier))
				// The upstream got the prompt: bill its estimate.
				f.newUsageMeter(r.Context(), log, a, d.ID(), c.Target).abandoned()
				return nil
			}
			if err == nil {
				err = fmt.Errorf("answer over %d bytes", MaxUpstreamBody)
			}
			tried = append(tried, attempt{c.Target.Name, "reading answer: " + err.Error()})
			continue
		}
		if resp.StatusCode/100 == 2 {
			meter.body(body) // committed before the answer is written
		}
		if disp.vault != nil {
			body = restoreBody(disp.vault, body)
		}
		f.setHeaders(w, resp, disp)
		f.explain(w, c, cands)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		log.Info("routed", zap.String("decision_id", d.ID()), zap.String("target", c.Target.Name), zap.String("tier", c.Target.Tier),
			zap.Int("status", resp.StatusCode), zap.Int("redacted", disp.Redacted()), zap.Duration("duration", time.Since(start)))
		f.observe(a, d, answered{chosen: c, cands: cands, start: start, ttfb: ttfb, status: resp.StatusCode, body: body})
		return nil
	}
	return f.failed(a, noTarget("All allowed targets for model `"+a.Model+"` failed", excluded, tried))
}

func upstreamErr(err error) string {
	var ne interface{ Timeout() bool }
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:] // drop the URL, keep the cause ("connection refused")
	}
	return s
}

func noTarget(msg string, excluded []Exclusion, tried []attempt) *api.Error {
	var parts []string
	for _, e := range excluded {
		parts = append(parts, e.String())
	}
	for _, t := range tried {
		parts = append(parts, t.target+": "+t.err)
	}
	if len(parts) > 0 {
		msg += " (" + strings.Join(parts, "; ") + ")"
	}
	return &api.Error{Status: http.StatusServiceUnavailable, Type: "service_unavailable", Code: "no_target_available",
		Message: msg + ".", RetryAfter: 1}
}

func (f *Forwarder) setHeaders(w http.ResponseWriter, resp *http.Response, d *Dispatch) {
	h := w.Header()
	for _, k := range []string{"Content-Type", "Cache-Control", "X-Request-Id", "Openai-Processing-Ms"} {
		if v := resp.Header.Get(k); v != "" {
			h.Set(k, v)
		}
	}
	h.Set(HeaderTier, d.target.Tier)
	h.Set(HeaderTarget, d.target.Name)
}

func (f *Forwarder) models(w http.ResponseWriter, d *policies.Decision, id *Identity, one string) error {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	list := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range f.Catalogue.Models(d) {
		if !id.allowsModel(m) { // only what the caller's key may use
			continue
		}
		list.Data = append(list.Data, model{ID: m, Object: "model", OwnedBy: "molly"})
	}
	var v any = list
	if one != "" { // GET /v1/models/{model}
		i := slices.IndexFunc(list.Data, func(m model) bool { return m.ID == one })
		if i < 0 {
			return &api.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
				Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", one)}
		}
		v = list.Data[i]
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	return nil
}

// streamTruncated is the SSE event sent when an upstream stream ends before
// its terminal chunk or [DONE]: an explicit error, never a made-up ending.
// OpenAI clients surface a data object with an "error" key as a stream error.
const streamTruncated = "event: error\ndata: {\"error\":{\"message\":\"The upstream stream ended before completion; the answer is incomplete.\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"stream_truncated\"}}\n\n"

// relaySSE copies an SSE stream event by event, flushing after each so the
// client sees tokens as they come, restoring placeholders in each event. It
// returns a non-nil error when the stream did not end properly; the client
// has then received the streamTruncated event.
//
// m sees every chunk: it takes the upstream's usage, drops it
// when the client did not ask for it, and records the usage before [DONE]
// is written (or when the stream ends otherwise). Logprobs a cascade asked
// for (d.dropLogprobs) are set to null in each chunk.
func relaySSE(w http.ResponseWriter, body io.Reader, d *Dispatch, m *usageMeter) error {
	defer m.streamEnd()
	rc := http.NewResponseController(w)
	w.Header().Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	br := bufio.NewReaderSize(body, 64<<10)
	var restore *streamRestore
	if d.vault != nil {
		restore = newStreamRestore(d.vault)
	}
	var event bytes.Buffer
	var sawDone, sawFinish, drop bool
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// An over-long line: keep reading it whole.
			long := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			// io.EOF or a broken upstream; a partial line is dropped.
			if sawDone || sawFinish {
				if event.Len() > 0 {
					_, _ = w.Write(event.Bytes())
					_ = rc.Flush()
				}
				return nil
			}
			_, _ = io.WriteString(w, streamTruncated)
			_ = rc.Flush()
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("upstream stream ended early: %w", err)
		}
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = bytes.TrimSpace(data)
			if bytes.Equal(data, []byte("[DONE]")) {
				sawDone = true
				m.streamEnd()
				if restore != nil {
					if extra := restore.final(); extra != nil {
						fmt.Fprintf(w, "data: %s\n\n", extra)
					}
				}
			} else {
				if fr := gjson.GetBytes(data, "choices.#.finish_reason"); strings.Contains(fr.Raw, `"`) {
					sawFinish = true
				}
				if out, skip := m.event(data); skip {
					drop = true
				} else if m != nil && len(out) != len(data) {
					data = out
					line = append(append([]byte("data: "), data...), '\n')
				}
				if d.dropLogprobs {
					if out := stripLogprobs(data); len(out) != len(data) {
						data = out
						line = append(append([]byte("data: "), data...), '\n')
					}
				}
				if restore != nil && gjson.ValidBytes(data) {
					line = append(append([]byte("data: "), restore.event(data)...), '\n')
				}
			}
		}
		event.Write(line)
		if len(bytes.TrimSpace(line)) == 0 { // blank line: end of event
			if drop { // the usage chunk the client did not ask for
				event.Reset()
				drop = false
				continue
			}
			if _, werr := w.Write(event.Bytes()); werr != nil {
				return werr
			}
			event.Reset()
			if ferr := rc.Flush(); ferr != nil {
				return ferr
			}
		}
	}
}

// ctxKeyDecision carries the policy decision between handlers.
type ctxKeyDecision struct{}

// WithDecision returns ctx carrying d.
func WithDecision(ctx context.Context, d *policies.Decision) context.Context {
	return context.WithValue(ctx, ctxKeyDecision{}, d)
}

// DecisionFrom returns the decision set by the policy step, or nil.
func DecisionFrom(ctx context.Context) *policies.Decision {
	d, _ := ctx.Value(ctxKeyDecision{}).(*policies.Decision)
	return d
}
