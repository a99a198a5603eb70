package envoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/keyauth"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/translate"
)

// DefaultMaxBodyBytes bounds a request body the policy point reads (8 MiB,
// molly_classify's default); a larger one is refused with 413.
const DefaultMaxBodyBytes = 8 << 20

// chunkBytes is the largest body piece in one streamed ext_proc response
// (the 64 KiB Envoy's processing_mode documentation recommends).
const chunkBytes = 64 << 10

// PolicyPoint is the ext_proc ExternalProcessor service (see the package
// documentation). Its fields are set once before it serves; it is safe
// for concurrent use, one gRPC stream per HTTP request.
type PolicyPoint struct {
	Pipeline   *pipeline.Pipeline
	Classifier *classify.Classifier
	// Auth authenticates the API key of the Authorization header, as
	// molly_auth does; nil: every request runs as Anonymous.
	Auth      *keyauth.Authenticator
	Anonymous *identity.Identity
	// MaxBodyBytes bounds a request body (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Buffered is the body mode to assume when Envoy does not say in the
	// stream's protocol_config (Envoy before 1.33): BUFFERED when true,
	// FULL_DUPLEX_STREAMED otherwise. It matches Config.Buffered.
	Buffered bool
	Logger   *zap.Logger
}

// Process serves one HTTP request's exchange: Envoy's messages in the
// order they come (request headers, body pieces, trailers, response
// headers, body pieces, trailers), each answered as its processing mode
// requires. It returns when Envoy closes the stream; a stream that breaks
// off (the client reset the request) ends the request as a client that
// went away.
func (pp *PolicyPoint) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := &exchange{pp: pp, stream: stream, ctx: stream.Context(), log: pp.Logger}
	if x.log == nil {
		x.log = zap.NewNop()
	}
	defer x.close()
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := x.handle(req); err != nil {
			return err
		}
	}
}

// exchange is the state of one request.
type exchange struct {
	pp     *PolicyPoint
	stream extprocv3.ExternalProcessor_ProcessServer
	ctx    context.Context
	log    *zap.Logger

	reqMode, respMode extprocfilter.ProcessingMode_BodySendMode
	configured        bool // the modes are known

	method, path string
	// anthropic: the path is the Messages API's (translate.IsMessagesPath),
	// so errors are answered in Anthropic's shape, as in-Caddy.
	anthropic   bool
	header      http.Header // the client's request header (canonical keys, pseudo-headers apart)
	ep          openai.Endpoint
	id          *identity.Identity
	body        []byte
	headersSent bool // the request headers message was answered
	decided     bool
	finished    bool // an ImmediateResponse ended the exchange

	carried      *pipeline.Carried
	respBody     []byte
	respStreamed bool
}

func (x *exchange) handle(req *extprocv3.ProcessingRequest) error {
	if !x.configured {
		x.configured = true
		x.reqMode, x.respMode = extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
		if x.pp.Buffered {
			x.reqMode, x.respMode = extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			x.reqMode, x.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		}
	}
	if x.finished {
		return nil // Envoy ignores anything after an ImmediateResponse
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return x.requestBody(r.RequestBody.GetBody(), r.RequestBody.GetEndOfStream())
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if !x.decided {
			return x.decide(true)
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return x.responseHeaders(r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return x.responseBody(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream(), false)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		if err := x.responseBody(nil, true, true); err != nil {
			return err
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

// requestHeaders reads the request line and headers and authenticates the
// key; the decision waits for the body.
func (x *exchange) requestHeaders(h *extprocv3.HttpHeaders) error {
	x.header = http.Header{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := headerValue(hv)
		switch k := hv.GetKey(); k {
		case ":method":
			x.method = v
		case ":path":
			x.path = v
		default:
			if !strings.HasPrefix(k, ":") {
				x.header.Add(k, v)
			}
		}
	}
	path, _, _ := strings.Cut(x.path, "?")
	x.anthropic = translate.IsMessagesPath(path)
	ep, aerr := openai.EndpointOf(x.method, path)
	if aerr != nil && (!x.anthropic || x.method != http.MethodPost) { // POST .../messages/count_tokens is unsupported, below
		return x.immediate(aerr, nil)
	}
	if ep == openai.EndpointResponses || x.anthropic {
		// In-Caddy, molly_classify translates these to chat completions
		// and the answer back; the policy point does not, and the
		// classifier's "translated before validation" 400 would blame the
		// client's body for it.
		return x.immediate(&openai.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unsupported_endpoint",
			Message: "POST " + path + " is not served in fleet mode (Envoy); use POST /v1/chat/completions, or Molly's own listener, which translates it."}, nil)
	}
	x.ep, x.path = ep, path
	key, hasKey := keyauth.Key(x.header)
	if x.pp.Auth == nil {
		x.id = x.pp.Anonymous
	} else {
		id, hdr, err := x.pp.Auth.Authenticate(x.ctx, key, hasKey)
		if err != nil {
			var refusal *openai.Error
			if !errors.As(err, &refusal) {
				x.log.Error("authenticating a request", zap.Error(err))
			}
			return x.immediate(err, hdr)
		}
		x.id = id
	}
	if h.GetEndOfStream() {
		return x.decide(false)
	}
	switch x.reqMode {
	case extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil // answered once the body is in, before the body (headers, body, trailers order)
	case extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
		// The body comes after this answer; the route is set with the
		// body's (header mutations apply in BUFFERED mode).
		x.headersSent = true
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	default:
		return x.immediate(&openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Code: "ext_proc_misconfigured",
			Message: "Molly's ext_proc filter must send the request body in BUFFERED or FULL_DUPLEX_STREAMED mode, not " + x.reqMode.String() + "."}, nil)
	}
}

// requestBody collects the body; a whole body (BUFFERED, or the last piece)
// is decided.
func (x *exchange) requestBody(b []byte, eos bool) error {
	limit := x.pp.MaxBodyBytes
	if limit <= 0 {
		limit = DefaultMaxBodyBytes
	}
	if int64(len(x.body)+len(b)) > limit {
		return x.immediate(&openai.Error{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", limit)}, nil)
	}
	x.body = append(x.body, b...)
	if eos || x.reqMode != extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED {
		return x.decide(false)
	}
	return nil
}

// decide runs the pipeline on the whole request — classify, the policy,
// the plan and the dispatch — and answers Envoy with the rewritten request
// or an ImmediateResponse. trailers: the request ends with trailers, which
// get their own answer after the body's.
func (x *exchange) decide(trailers bool) error {
	x.decided = true
	p := x.pp.Pipeline
	a, err := x.pp.Classifier.Classify(classify.Input{Endpoint: x.ep, Path: x.path, Body: x.body,
		Declared: strings.Join(x.header.Values("X-Molly-Sensitivity"), ","), Residency: strings.Join(x.header.Values("X-Molly-Residency"), ",")})
	if err != nil {
		return x.immediate(err, nil)
	}
	ctx := identity.With(x.ctx, x.id)
	d := p.Decide(ctx, a, x.id)
	dec := d.Decision()
	decided := http.Header{pipeline.HeaderDecisionID: {dec.ID()}}
	if !dec.Allowed() {
		return x.immediate(p.Denied(a, d, x.id), decided) // recorded as in-Caddy's molly_policy does
	}
	if a.Endpoint() == openai.EndpointModels {
		list, err := p.Models(ctx, a, d)
		if err != nil {
			return x.immediate(err, decided)
		}
		return x.reply(http.StatusOK, http.Header{"Content-Type": {"application/json"}, pipeline.HeaderDecisionID: {dec.ID()}}, list, "molly_models")
	}
	c, err := p.Carry(ctx, a, d, x.header)
	if err != nil {
		return x.immediate(err, decided)
	}
	x.carried = c
	disp, cand := c.Dispatch(), c.Candidate()
	body := disp.Body()
	meta, _ := structpb.NewStruct(map[string]any{MetadataNamespace: map[string]any{
		"cluster": ClusterName(cand.Target), "target": cand.Target.Name, "tier": cand.Target.Tier,
		"model": a.Model(), "upstream_model": cand.Model, "decision_id": dec.ID(), "redacted": float64(disp.Redacted()),
	}})
	mut := x.requestMutation(a.Model(), len(body))
	if x.headersSent { // BUFFERED: headers and body in the body's answer
		err = x.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta, Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true,
				BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}}}}})
	} else {
		mut.SetHeaders = dropHeader(mut.SetHeaders, "content-length")
		mut.RemoveHeaders = append(mut.RemoveHeaders, "content-length")
		err = x.send(&extprocv3.ProcessingResponse{DynamicMetadata: meta, Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}}}})
		if err == nil {
			err = x.streamed(true, body, !trailers)
		}
	}
	if err != nil {
		return err
	}
	c.Started()
	if trailers {
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
	}
	return nil
}

// requestMutation is the request as the dispatch makes it: its path, the
// headers egress sends (Dispatch.Header) and nothing else of the
// client's, the route headers (HeaderCluster, HeaderModel) and the length
// of the rewritten body. The request's x-envoy-* headers are removed too:
// a client's would steer Envoy's router (x-envoy-max-retries,
// x-envoy-retry-on, x-envoy-upstream-rq-timeout-ms on a request Envoy
// deems internal) and reach the target, which the in-Caddy path never
// sends; the router adds its own after this filter.
func (x *exchange) requestMutation(model string, n int) *extprocv3.HeaderMutation {
	disp := x.carried.Dispatch()
	up := disp.Header(x.header)
	m := &extprocv3.HeaderMutation{}
	set := func(k, v string) {
		m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	set(":path", disp.URL().RequestURI())
	set(HeaderCluster, ClusterName(x.carried.Candidate().Target))
	set(HeaderModel, model)
	for k, vs := range up {
		set(strings.ToLower(k), strings.Join(vs, ", "))
	}
	set("content-length", strconv.Itoa(n))
	for k := range x.header {
		lk := strings.ToLower(k)
		if _, keep := up[k]; keep || lk == "host" || lk == "content-length" || lk == HeaderCluster || lk == HeaderModel {
			continue // set above (a client's own x-molly-cluster is overwritten)
		}
		m.RemoveHeaders = append(m.RemoveHeaders, lk)
	}
	return m
}

// responseHeaders takes the upstream's status: a failure becomes Molly's
// OpenAI error, a stream starts relaying, a whole answer waits for its body.
func (x *exchange) responseHeaders(h *extprocv3.HttpHeaders) error {
	c := x.carried
	if c == nil {
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	}
	status := 0
	hdr := http.Header{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			status, _ = strconv.Atoi(headerValue(hv))
		} else if !strings.HasPrefix(hv.GetKey(), ":") {
			hdr.Add(hv.GetKey(), headerValue(hv))
		}
	}
	if err := c.Respond(status, hdr); err != nil {
		return x.immediate(err, http.Header{pipeline.HeaderDecisionID: {c.Header().Get(pipeline.HeaderDecisionID)}})
	}
	switch {
	case c.Streaming():
		x.respStreamed = true
		return x.sendResponseHeaders(c.StartStream(), false)
	case h.GetEndOfStream():
		out, _ := c.Whole(nil)
		return x.sendResponseHeaders(out, true)
	case x.respMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
		return nil // answered with the body: Molly's headers depend on it (Content-Length)
	default: // BUFFERED: the header mutation comes with the body's answer
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}})
	}
}

// responseBody relays the answer: a stream piece by piece, a whole answer
// once complete. trailers: the body ended with trailers (answered after).
func (x *exchange) responseBody(b []byte, eos, trailers bool) error {
	c := x.carried
	if c == nil {
		if trailers {
			return nil
		}
		return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}})
	}
	full := x.respMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	if x.respStreamed {
		out := c.Chunk(b)
		end := eos || !full
		if end {
			out = append(out, c.EndStream()...)
		}
		if !full {
			return x.send(bodyResponse(false, out, nil))
		}
		if len(out) == 0 && !end {
			return nil
		}
		return x.streamed(false, out, end && !trailers)
	}
	if len(x.respBody)+len(b) > pipeline.MaxUpstreamBody {
		return x.immediate(&openai.Error{Status: http.StatusBadGateway, Type: "upstream_error", Code: "answer_too_large",
			Message: fmt.Sprintf("The upstream answer is larger than %d bytes.", pipeline.MaxUpstreamBody)}, nil)
	}
	x.respBody = append(x.respBody, b...)
	if full && !eos {
		return nil
	}
	hdr, out := c.Whole(x.respBody)
	if !full {
		return x.send(bodyResponse(false, out, headerMutation(hdr, true)))
	}
	if err := x.sendResponseHeaders(hdr, false); err != nil {
		return err
	}
	return x.streamed(false, out, !trailers)
}

// sendResponseHeaders answers the response headers message with Molly's
// headers; withLength keeps Content-Length (a body Envoy will not stream).
func (x *exchange) sendResponseHeaders(h http.Header, withLength bool) error {
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: headerMutation(h, withLength)}}}})
}

// headerMutation sets every header of h (Content-Length only withLength;
// otherwise removed: Envoy streams the body).
func headerMutation(h http.Header, withLength bool) *extprocv3.HeaderMutation {
	m := &extprocv3.HeaderMutation{}
	for k, vs := range h {
		lk := strings.ToLower(k)
		if lk == "content-length" && !withLength {
			continue
		}
		m.SetHeaders = append(m.SetHeaders, &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: lk, RawValue: []byte(strings.Join(vs, ", "))},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	if !withLength {
		m.RemoveHeaders = append(m.RemoveHeaders, "content-length")
	}
	return m
}

func dropHeader(hs []*corev3.HeaderValueOption, key string) []*corev3.HeaderValueOption {
	out := hs[:0]
	for _, h := range hs {
		if h.GetHeader().GetKey() != key {
			out = append(out, h)
		}
	}
	return out
}

// bodyResponse is a body answer replacing the whole (BUFFERED) body.
func bodyResponse(request bool, body []byte, mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut,
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}}}
	if request {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
}

// streamed sends b as FULL_DUPLEX_STREAMED body answers of at most
// chunkBytes each, the last with end_of_stream eos.
func (x *exchange) streamed(request bool, b []byte, eos bool) error {
	for first := true; first || len(b) > 0; first = false {
		n := min(len(b), chunkBytes)
		piece := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b[:n], EndOfStream: eos && n == len(b)}}}}}
		b = b[n:]
		resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: piece}}
		if request {
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: piece}}
		}
		if err := x.send(resp); err != nil {
			return err
		}
	}
	return nil
}

// immediate ends the exchange with err as the OpenAI error JSON —
// Anthropic's, with Anthropic's status, for a Messages API path — (an
// error that is not an *openai.Error is a 500 that says nothing of it),
// its Retry-After, x-should-retry and Allow headers, and the headers in
// extra.
func (x *exchange) immediate(err error, extra http.Header) error {
	var ae *openai.Error
	if !errors.As(err, &ae) {
		x.log.Error("policy point", zap.Error(err))
		ae = &openai.Error{Status: http.StatusInternalServerError, Type: "server_error", Message: "internal error"}
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for k, v := range extra {
		h[k] = v
	}
	if ae.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(ae.RetryAfter))
	}
	if ae.NoRetry {
		h.Set(openai.HeaderShouldRetry, "false")
	}
	if ae.Allow != "" {
		h.Set("Allow", ae.Allow)
	}
	details := "molly_" + ae.Code
	if ae.Code == "" {
		details = "molly_" + ae.Type
	}
	status, body := ae.Status, ae.Body()
	if x.anthropic {
		status, body = translate.MessagesError(ae)
	}
	return x.reply(status, h, body, details)
}

// reply answers the request in Envoy's place (ImmediateResponse).
func (x *exchange) reply(status int, h http.Header, body []byte, details string) error {
	x.finished = true
	return x.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode(status)}, Headers: headerMutation(h, false), Body: body, Details: details}}})
}

func (x *exchange) send(resp *extprocv3.ProcessingResponse) error { return x.stream.Send(resp) }

// close ends the request: the reservation is released, and a request
// whose answer did not come through is a client that went away.
func (x *exchange) close() {
	if x.carried != nil {
		x.carried.Close()
	}
}

// headerValue is the value of an ext_proc header: raw_value, which Envoy
// sends, or value.
func headerValue(hv *corev3.HeaderValue) string {
	if rv := hv.GetRawValue(); len(rv) > 0 {
		return string(rv)
	}
	return hv.GetValue()
}
