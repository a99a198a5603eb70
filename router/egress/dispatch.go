// Package egress is the only code that sends a request to an upstream or
// the in-process T0 engine. Its one constructor, NewDispatch, takes a
// policies.Decided value bound to the digest of the annotation whose bytes
// are being sent, refuses a target the decision does not allow, and applies
// the tier's redaction before anything leaves (docs/architecture.md, residency
// invariant). A Dispatch has no exported fields; derivations (WithParam)
// are explicit and keep the binding.
package egress

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/route"
)

// Errors of NewDispatch and WithParam; match them with errors.Is.
var (
	// ErrNotAllowed: the decision does not allow the target's tier or region.
	ErrNotAllowed = errors.New("target not allowed by the policy decision")
	// ErrScanFailed: the tier's decision requires redaction, but a detector
	// failed on the request, so the redaction cannot be guaranteed.
	ErrScanFailed = errors.New("content scan failed, so the redaction the policy requires cannot be guaranteed")
	// ErrNotBound: the decision was made for other content than the
	// annotation's (or is the zero Decided).
	ErrNotBound = errors.New("the decision was not made for this content")
	// ErrNotAParam: WithParam was asked to change something other than a
	// request parameter that carries no content.
	ErrNotAParam = errors.New("not a content-free request parameter")
)

// Egress holds the one HTTP client per upstream target and the engine.
// Safe for concurrent use.
type Egress struct {
	clients map[string]*upstream
	probes  probes                     // Health's outcomes (probe.go)
	logger  atomic.Pointer[zap.Logger] // SetLogger (draft.go)
}

type upstream struct {
	client *http.Client
	base   *url.URL
	apiKey string
}

// New makes the clients of the catalogue's targets: an http.Client per
// openai target (no environment proxy, the target's timeout for connecting
// and response headers), and an in-process transport to engine for kind
// engine targets (engine may be nil when there are none). A target with
// DraftWithEngine gets a transport that offers chat completions to the
// engine's drafting first (draft.go); engine must then be a Drafter.
func New(cat *route.Catalogue, engine http.Handler) (*Egress, error) {
	e := &Egress{clients: map[string]*upstream{}}
	for _, t := range cat.Targets() {
		u := &upstream{}
		if t.APIKeyEnv != "" {
			u.apiKey = os.Getenv(t.APIKeyEnv)
		}
		if t.Kind == route.KindEngine {
			if engine == nil {
				return nil, fmt.Errorf("target %s: kind engine needs the molly app's engine, and none is configured", t.Name)
			}
			u.base = &url.URL{Scheme: "http", Host: "engine.molly.internal", Path: "/v1"}
			u.client = &http.Client{Transport: &handlerTransport{h: engine}, CheckRedirect: noRedirect}
			e.clients[t.Name] = u
			continue
		}
		base, err := url.Parse(strings.TrimSuffix(t.Endpoint, "/"))
		if err != nil {
			return nil, fmt.Errorf("target %s: endpoint: %w", t.Name, err)
		}
		u.base = base
		timeout := t.Timeout()
		u.client = &http.Client{Transport: &http.Transport{
			Proxy:                 nil, // upstreams are addressed directly; no environment proxy
			DialContext:           dialWire(&net.Dialer{Timeout: min(timeout, 10*time.Second), KeepAlive: 30 * time.Second}),
			ResponseHeaderTimeout: timeout,
			TLSHandshakeTimeout:   min(timeout, 10*time.Second),
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ForceAttemptHTTP2:     true,
		}, CheckRedirect: noRedirect}
		if t.DraftWithEngine {
			d, ok := engine.(Drafter)
			if !ok {
				return nil, fmt.Errorf("target %s: draft_with_engine needs the molly app's engine, and none is configured", t.Name)
			}
			e.drafting(t.Name, u, d, t.DraftTokens)
		}
		e.clients[t.Name] = u
	}
	return e, nil
}

// noRedirect is the CheckRedirect of every upstream client: a target's
// redirect (3xx and its Location) is its answer, never followed. The
// decision allowed this target, not the host a Location names (another
// tier, another region, an external API); following a 307 or 308 would
// send that host the prompt.
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// Close releases idle upstream connections.
func (e *Egress) Close() {
	for _, u := range e.clients {
		u.client.CloseIdleConnections()
	}
}

// Dispatch is a request ready to leave for one target: the body already
// redacted as the decision requires for the target's tier. Only
// NewDispatch and WithParam make one.
type Dispatch struct {
	egress     *Egress
	target     *route.Target
	model      string
	decisionID string
	endpoint   openai.Endpoint
	body       []byte
	vault      *redaction.Vault
	redacted   int
	stream     bool
	added      []string // parameters WithParam added (not the client's)
	// guard finds values in the forwarded headers of a call to a tier
	// off the device (see Header); nil for T0.
	guard *redaction.Scanner
}

// NewDispatch checks c against d and builds the body for c's tier: the model
// name rewritten to the upstream's, the usage chunk asked for on streams,
// and every finding whose type the decision lists for the tier replaced
// (classify.Annotation.Redact). Errors: ErrNotBound when d was not made for
// a; ErrNotAllowed when the tier or region is not allowed; ErrScanFailed
// when the tier requires redaction and a detector failed; a type the
// classifier does not scan for (classify.ErrUnscannedType); a body that
// cannot be rewritten. All wrapped with the target's name.
func (e *Egress) NewDispatch(d policies.Decided, a *classify.Annotation, c route.Candidate) (*Dispatch, error) {
	t := c.Target
	if t == nil {
		return nil, fmt.Errorf("<nil>: %w", ErrNotAllowed)
	}
	if !d.Binds(a) {
		return nil, fmt.Errorf("%s: %w", t.Name, ErrNotBound)
	}
	dec := d.Decision()
	if !dec.AllowsTier(t.Tier) || !route.RegionAllowed(dec, t) {
		return nil, fmt.Errorf("%s (%s): %w", t.Name, t.Tier, ErrNotAllowed)
	}
	if _, ok := e.clients[t.Name]; !ok {
		return nil, fmt.Errorf("%s: no client for this target", t.Name)
	}
	disp := &Dispatch{egress: e, target: t, model: c.Model, decisionID: dec.ID(), endpoint: a.Endpoint(), stream: a.Stream()}
	types := dec.Redact(t.Tier)
	if t.Tier != "T0" {
		// The forwarded headers were never classified: a value in them
		// the decision did not see (a card in a request id, a key in
		// tracestate) must not reach a tier its class forbids, so off
		// the device none with a finding is sent (see Header).
		disp.guard = a.Classifier().Scanner()
	}
	if a.Endpoint() == openai.EndpointModels {
		return disp, nil
	}
	if len(types) > 0 && a.ScanFailed() {
		return nil, fmt.Errorf("%s (%s redacts %s): %w", t.Name, t.Tier, strings.Join(types, ","), ErrScanFailed)
	}
	red, err := a.Redact(types)
	if err != nil {
		return nil, fmt.Errorf("%s (%s): %w", t.Name, t.Tier, err)
	}
	body, err := withModel(red.Body, c.Model)
	if err == nil && a.Stream() && !a.IncludeUsage() && (a.Endpoint() == openai.EndpointChat || a.Endpoint() == openai.EndpointCompletions) {
		// Usage is recorded for streams too: always ask for the usage chunk;
		// the relay strips it again for a client that did not ask.
		body, err = sjson.SetBytes(body, "stream_options.include_usage", true)
	}
	if err == nil && t.Kind != route.KindEngine {
		body, err = stripExtensions(body)
	}
	if err != nil {
		return nil, fmt.Errorf("rewriting the request for %s: %w", t.Name, err)
	}
	disp.body, disp.vault, disp.redacted = body, red.Vault, red.Replaced
	return disp, nil
}

// withModel returns body, a JSON object, with its top-level "model" set to
// model: in one copy of body when the member is there (the usual case:
// every chat request names its model), through sjson otherwise.
func withModel(body, model string) ([]byte, error) {
	r := gjson.Get(body, "model")
	if !r.Exists() || r.Index <= 0 || r.Index+len(r.Raw) > len(body) || body[r.Index:r.Index+len(r.Raw)] != r.Raw {
		return sjson.SetBytes([]byte(body), "model", model)
	}
	out := make([]byte, 0, len(body)-len(r.Raw)+len(model)+2)
	out = append(out, body[:r.Index]...)
	out, err := appendJSONString(out, model)
	if err != nil {
		return nil, err
	}
	return append(out, body[r.Index+len(r.Raw):]...), nil
}

// appendJSONString appends s as encoding/json marshals a string: quoted as
// it is when every byte is printable ASCII that json.Marshal leaves alone
// (not '"', a backslash, '<', '>' or '&'), by json.Marshal otherwise.
func appendJSONString(buf []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, err := json.Marshal(s)
			return append(buf, q...), err
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"'), nil
}

// Extensions are the request parameters of Molly's own (the T0 engine's:
// max_reasoning_tokens, min_reasoning_tokens, n_chains; the Messages API's
// thinking.budget_tokens arrives as max_reasoning_tokens), which no
// OpenAI-compatible upstream knows: they are removed from the body sent
// to a kind openai target (a strict upstream refuses unknown parameters,
// as OpenAI's "Unrecognized request argument" 400 does); the target's own
// reasoning defaults apply there. Other non-spec parameters (top_k,
// vLLM's and Ollama's options) are the client's business and sent as
// they are.
var Extensions = []string{"max_reasoning_tokens", "min_reasoning_tokens", "n_chains"}

// stripExtensions removes the top-level Extensions from a JSON body.
func stripExtensions(body []byte) ([]byte, error) {
	if !bytes.Contains(body, []byte(`_reasoning_tokens"`)) && !bytes.Contains(body, []byte(`"n_chains"`)) {
		return body, nil // the common case: nothing to look for
	}
	for _, f := range Extensions {
		if !gjson.GetBytes(body, f).Exists() {
			continue
		}
		var err error
		if body, err = sjson.DeleteBytes(body, f); err != nil {
			return nil, err
		}
	}
	return body, nil
}

// contentFreeParams are the request parameters WithParam may set: they
// change how the upstream answers, never what it is told.
var contentFreeParams = map[string]bool{
	"logprobs": true, "top_logprobs": true, "stream_options.include_usage": true,
}

// WithParam returns a copy of d with the request parameter path set to
// value (sjson path; only content-free parameters: logprobs,
// top_logprobs, stream_options.include_usage). The copy keeps d's
// decision, tier and vault. Errors: ErrNotAParam.
func (d *Dispatch) WithParam(path string, value any) (*Dispatch, error) {
	if !contentFreeParams[path] {
		return nil, fmt.Errorf("%s: %w", path, ErrNotAParam)
	}
	body, err := sjson.SetBytes(slices.Clone(d.body), path, value)
	if err != nil {
		return nil, err
	}
	c := *d
	c.body = body
	c.added = append(slices.Clone(d.added), path)
	return &c, nil
}

// WithMaxTokens returns a copy of d that asks the upstream for at most n
// completion tokens per choice (max_tokens; a number carries no content),
// for a request that set no limit of its own: the caller's admission held
// that many, and the upstream must not produce more. Added reports it.
func (d *Dispatch) WithMaxTokens(n int) (*Dispatch, error) {
	body, err := sjson.SetBytes(slices.Clone(d.body), "max_tokens", n)
	if err != nil {
		return nil, err
	}
	c := *d
	c.body = body
	c.added = append(slices.Clone(d.added), "max_tokens")
	return &c, nil
}

// Added reports whether path was set by WithParam, not by the client.
func (d *Dispatch) Added(path string) bool { return slices.Contains(d.added, path) }

// Target returns the target the dispatch goes to.
func (d *Dispatch) Target() *route.Target { return d.target }

// Model is the upstream model name sent.
func (d *Dispatch) Model() string { return d.model }

// DecisionID is the decision the dispatch was made under.
func (d *Dispatch) DecisionID() string { return d.decisionID }

// Stream reports a streamed request.
func (d *Dispatch) Stream() bool { return d.stream }

// Body returns a copy of the bytes that will be sent (after redaction).
func (d *Dispatch) Body() []byte { return slices.Clone(d.body) }

// Vault restores placeholders in the answer; nil when nothing restorable
// was replaced.
func (d *Dispatch) Vault() *redaction.Vault { return d.vault }

// Redacted reports how many distinct values were replaced, by placeholders,
// masks or pseudonyms (a value split across fields counts once per part).
func (d *Dispatch) Redacted() int { return d.redacted }

// ForwardHeaders are the client request headers sent on to upstreams:
// request correlation and W3C trace context, nothing that identifies the
// client to an external API. They are free text the classifier never
// reads (the decision did not see them), so to every tier but T0 a value
// in which the detectors find anything is not forwarded (Header).
var ForwardHeaders = []string{"X-Request-Id", "Traceparent", "Tracestate"}

// Send performs the upstream call with the headers in hdr that
// ForwardHeaders lists. It is the only place that builds a request to an
// upstream. The answer's headers and body carry no copy of the target's
// API key (scrubKey: replaced by REDACTED, so an upstream echoing the
// Authorization header in an error reveals it to no client or log).
func (d *Dispatch) Send(ctx context.Context, hdr http.Header) (*http.Response, error) {
	var body io.Reader
	if d.endpoint != openai.EndpointModels {
		body = bytes.NewReader(d.body)
	}
	req, err := http.NewRequestWithContext(ctx, d.Method(), d.URL().String(), body)
	if err != nil {
		return nil, err
	}
	req.Header = d.Header(hdr)
	u := d.egress.clients[d.target.Name]
	// The client's transport, not Client.Do: no redirect is followed
	// (noRedirect), so Client.Do's redirect bookkeeping (a copy of the
	// headers per request) buys nothing. Errors are wrapped as Client.Do
	// wraps them (*url.Error: the method, the URL, the cause).
	resp, err := u.client.Transport.RoundTrip(req)
	if err != nil {
		return nil, &url.Error{Op: urlErrorOp(req.Method), URL: req.URL.String(), Err: err}
	}
	scrubKey(resp, u.apiKey)
	return resp, nil
}

// urlErrorOp is the Op of the *url.Error net/http's Client.Do returns for
// method: "Post" for POST, "Get" for GET.
func urlErrorOp(method string) string {
	if method == "" {
		return "Get"
	}
	return method[:1] + strings.ToLower(method[1:])
}
