package envoy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/keyauth"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// fleet is a policy point over real parts — the embedded Rego policies,
// the classifier, the pipeline, a SQLite registry for keys and usage —
// served over gRPC on loopback, reached with go-control-plane's generated
// ext_proc client, and upstreams standing for the targets.
type fleet struct {
	ups      map[string]*upstreamtest.Upstream // by target name
	cat      *route.Catalogue
	pipeline *pipeline.Pipeline
	pp       *PolicyPoint
	reg      *registry.Registry
	res      Resources // Envoy's resources (Build), for routing like Envoy
	client   extprocv3.ExternalProcessorClient
	addr     string
}

// fleetOptions shape a fleet; zero values take the defaults.
type fleetOptions struct {
	targets    []*route.Target // endpoints of targets named in ups are filled in
	ups        []string        // upstreams to start, by target name
	overrides  map[string]classify.Sensitivity
	patterns   map[string][]string
	keys       bool // authenticate keys (keyauth) instead of anonymous requests
	buffered   bool // PolicyPoint.Buffered
	log        *zap.Logger
	policy     *policies.Engine
	configured func(*PolicyPoint)
}

func startFleet(t testing.TB, o fleetOptions) *fleet {
	t.Helper()
	f := &fleet{ups: map[string]*upstreamtest.Upstream{}}
	for _, name := range o.ups {
		u := upstreamtest.Start(name)
		t.Cleanup(u.Close)
		f.ups[name] = u
	}
	for _, tg := range o.targets {
		if u, ok := f.ups[tg.Name]; ok {
			tg.Endpoint = u.URL()
		}
	}
	var err error
	if f.cat, err = route.NewCatalogue(o.targets, nil); err != nil {
		t.Fatal(err)
	}
	eg, err := egress.New(f.cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eg.Close)
	pol := o.policy
	if pol == nil {
		if pol, err = policies.New(context.Background(), policies.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	scanner, err := redaction.NewScanner(redaction.Config{Patterns: o.patterns})
	if err != nil {
		t.Fatal(err)
	}
	log := o.log
	if log == nil {
		log = zap.NewNop()
	}
	f.pipeline = &pipeline.Pipeline{Catalogue: f.cat, Egress: eg, Policy: pol, Weights: route.DefaultWeights, Logger: log}
	if f.reg, err = registry.Open(filepath.Join(t.TempDir(), "molly.db"), registry.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.reg.Close() })
	pp := &PolicyPoint{Pipeline: f.pipeline, Classifier: classify.New(scanner, o.overrides), Buffered: o.buffered, Logger: log,
		Anonymous: &identity.Identity{Member: "anonymous"}}
	if o.keys {
		pp.Auth = &keyauth.Authenticator{Registry: f.reg}
	}
	if o.configured != nil {
		o.configured(pp)
	}
	f.pp = pp
	cp := NewControlPlane(log)
	if _, err := cp.Update(context.Background(), f.cat, Config{}); err != nil {
		t.Fatal(err)
	}
	if f.res, _, err = Build(f.cat, Config{}); err != nil {
		t.Fatal(err)
	}
	srv := NewServer(cp)
	srv.SetPolicyPoint(pp)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = l.Addr().String()
	go srv.Serve(l)
	t.Cleanup(func() { srv.Stop(time.Second) })
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	f.client = extprocv3.NewExternalProcessorClient(conn)
	return f
}

// call is one HTTP request as Envoy sees it.
type call struct {
	method, path string
	header       map[string]string // lower-case names
	body         []byte
	reqPieces    int  // the request body is sent in this many pieces (FULL_DUPLEX_STREAMED; default 1)
	respPieces   int  // the upstream's answer is sent in this many pieces (default 1)
	buffered     bool // BUFFERED body modes instead of FULL_DUPLEX_STREAMED
	// resetAfter, when > 0, cancels the stream once this many response
	// body pieces are sent and a streamed answer came back: a client reset.
	resetAfter int
}

// outcome is what happened to the request on its way through Envoy.
type outcome struct {
	immediate *extprocv3.ImmediateResponse
	meta      map[string]any // dynamic metadata in the molly namespace
	route     string         // the route Envoy matched ("" when answered immediately)
	cluster   string
	sent      []byte      // the body Envoy sent upstream
	sentHead  http.Header // the headers it sent
	status    int         // the answer's status
	header    http.Header // the answer's headers as the client gets them
	body      []byte      // the answer's body as the client gets it
}

// play runs c through the policy point with the message sequence Envoy
// uses in c's body mode — request headers, body pieces (end_of_stream on
// the last), then, after routing the rewritten request as Envoy would by
// the route configuration and sending it to the cluster's endpoint,
// response headers and body pieces — and returns what the client and the
// upstream got.
func (f *fleet) play(t testing.TB, c call) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := f.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	resps := make(chan *extprocv3.ProcessingResponse, 4096)
	go func() {
		defer close(resps)
		for {
			r, err := st.Recv()
			if err != nil {
				return
			}
			resps <- r
		}
	}()
	next := func(what string) *extprocv3.ProcessingResponse {
		t.Helper()
		select {
		case r, ok := <-resps:
			if !ok {
				t.Fatalf("the policy point closed the stream while Envoy waited for %s", what)
			}
			return r
		case <-ctx.Done():
			t.Fatalf("no answer for %s", what)
		}
		return nil
	}
	send := func(r *extprocv3.ProcessingRequest) {
		t.Helper()
		if err := st.Send(r); err != nil {
			t.Fatalf("sending to the policy point: %v", err)
		}
	}
	mode := extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	if c.buffered {
		mode = extprocfilter.ProcessingMode_BUFFERED
	}
	var out outcome
	hdr := map[string]string{":method": c.method, ":path": c.path, ":authority": "gateway.example", ":scheme": "http", "x-request-id": "req-1"}
	for k, v := range c.header {
		hdr[k] = v
	}
	send(&extprocv3.ProcessingRequest{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hdr), EndOfStream: len(c.body) == 0}}})

	// The request: Envoy sends the body and waits for the rewritten one.
	var body []byte
	apply := func(m *extprocv3.HeaderMutation) { mutate(hdr, m) }
	immediate := func(r *extprocv3.ProcessingResponse) bool {
		if ir := r.GetImmediateResponse(); ir != nil {
			out.immediate = ir
			out.status = int(ir.GetStatus().GetCode())
			out.header = http.Header{}
			for _, h := range ir.GetHeaders().GetSetHeaders() {
				out.header.Set(h.GetHeader().GetKey(), headerValue(h.GetHeader()))
			}
			out.body = ir.GetBody()
			return true
		}
		return false
	}
	metadata := func(r *extprocv3.ProcessingResponse) {
		if m := r.GetDynamicMetadata().GetFields()[MetadataNamespace]; m != nil {
			out.meta = m.GetStructValue().AsMap()
		}
	}
	switch {
	case len(c.body) == 0:
		r := next("the request headers")
		if immediate(r) {
			return out
		}
		apply(r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		metadata(r)
	case c.buffered:
		r := next("the request headers")
		if immediate(r) {
			return out
		}
		apply(r.GetRequestHeaders().GetResponse().GetHeaderMutation())
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: c.body, EndOfStream: true}}})
		r = next("the request body")
		if immediate(r) {
			return out
		}
		metadata(r)
		cr := r.GetRequestBody().GetResponse()
		if !cr.GetClearRouteCache() {
			t.Fatal("the body's answer does not clear the route cache")
		}
		apply(cr.GetHeaderMutation())
		body = cr.GetBodyMutation().GetBody()
	default:
		for i, piece := range pieces(c.body, c.reqPieces) {
			send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: piece, EndOfStream: i == max(c.reqPieces, 1)-1}}})
		}
		r := next("the request headers")
		if immediate(r) {
			return out
		}
		metadata(r)
		cr := r.GetRequestHeaders().GetResponse()
		if !cr.GetClearRouteCache() {
			t.Fatal("the headers' answer does not clear the route cache")
		}
		apply(cr.GetHeaderMutation())
		for {
			r := next("the request body")
			if immediate(r) {
				return out
			}
			sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				t.Fatalf("want a streamed body answer, got %v", r)
			}
			body = append(body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				break
			}
		}
	}

	// Envoy routes the rewritten request by its route configuration and
	// sends it to an endpoint of the cluster.
	rt := f.match(hdr)
	if rt == nil {
		t.Fatalf("no route matches %v", hdr)
	}
	out.route, out.sent = rt.GetName(), body
	if dr := rt.GetDirectResponse(); dr != nil {
		out.status, out.body = int(dr.GetStatus()), []byte(dr.GetBody().GetInlineString())
		return out
	}
	out.cluster = rt.GetRoute().GetCluster()
	addr := f.endpoint(t, out.cluster)
	for _, k := range rt.GetRequestHeadersToRemove() {
		delete(hdr, k)
	}
	method := hdr[":method"]
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+hdr[":path"], bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if len(body) == 0 {
		req.Body = nil
	}
	for k, v := range hdr {
		if !strings.HasPrefix(k, ":") && k != "content-length" {
			req.Header.Set(k, v)
		}
	}
	out.sentHead = req.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatalf("the upstream of %s: %v", out.cluster, err)
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}

	// The answer: Envoy sends its headers and body pieces.
	rh := map[string]string{":status": fmt.Sprint(resp.StatusCode)}
	for k := range resp.Header {
		rh[strings.ToLower(k)] = resp.Header.Get(k)
	}
	send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(rh), EndOfStream: len(answer) == 0}}})
	finish := func() outcome {
		out.status, _ = fmtAtoi(rh[":status"])
		out.header = http.Header{}
		for k, v := range rh {
			if !strings.HasPrefix(k, ":") {
				out.header.Set(k, v)
			}
		}
		return out
	}
	if len(answer) == 0 {
		r := next("the response headers")
		if immediate(r) {
			return out
		}
		mutate(rh, r.GetResponseHeaders().GetResponse().GetHeaderMutation())
		return finish()
	}
	if c.buffered {
		r := next("the response headers")
		if immediate(r) {
			return out
		}
		mutate(rh, r.GetResponseHeaders().GetResponse().GetHeaderMutation())
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: answer, EndOfStream: true}}})
		r = next("the response body")
		if immediate(r) {
			return out
		}
		mutate(rh, r.GetResponseBody().GetResponse().GetHeaderMutation())
		out.body = r.GetResponseBody().GetResponse().GetBodyMutation().GetBody()
		return finish()
	}
	ps := pieces(answer, c.respPieces)
	gotHeaders := false
	var streamed [][]byte
	readAnswer := func(until func() bool) bool {
		for !until() {
			r := next("the answer")
			if immediate(r) {
				return false
			}
			switch {
			case r.GetResponseHeaders() != nil:
				if gotHeaders {
					t.Fatal("two answers to the response headers")
				}
				gotHeaders = true
				mutate(rh, r.GetResponseHeaders().GetResponse().GetHeaderMutation())
			case r.GetResponseBody() != nil:
				if !gotHeaders {
					t.Fatal("a body answer before the headers' answer")
				}
				sr := r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse()
				out.body = append(out.body, sr.GetBody()...)
				streamed = append(streamed, sr.GetBody())
				if sr.GetEndOfStream() {
					return true
				}
			default:
				t.Fatalf("unexpected answer %v", r)
			}
		}
		return true
	}
	for i, p := range ps {
		send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: p, EndOfStream: i == len(ps)-1}}})
		if c.resetAfter > 0 && i+1 == c.resetAfter {
			// The client resets once part of the stream reached it.
			if !readAnswer(func() bool { return gotHeaders && len(streamed) > 0 }) {
				return out
			}
			cancel()
			return finish()
		}
	}
	if !readAnswer(func() bool { return false }) {
		return out
	}
	return finish()
}

func fmtAtoi(s string) (int, error) {
	var n int
	_, err := fmt.Sscanf(s, "%d", &n)
	return n, err
}

// match is Envoy's route matching over the route configuration: the first
// route whose prefix and exact header matchers match hdr.
func (f *fleet) match(hdr map[string]string) *routev3.Route {
	rc := f.res[resource.RouteType][0].(*routev3.RouteConfiguration)
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		if !strings.HasPrefix(hdr[":path"], r.GetMatch().GetPrefix()) {
			continue
		}
		ok := true
		for _, h := range r.GetMatch().GetHeaders() {
			v, present := hdr[h.GetName()]
			ok = ok && present && v == h.GetStringMatch().GetExact()
		}
		if ok {
			return r
		}
	}
	return nil
}

// endpoint is the address of cluster's (one) endpoint in the resources.
func (f *fleet) endpoint(t testing.TB, cluster string) string {
	t.Helper()
	for _, r := range f.res[resource.EndpointType] {
		la := r.(*endpointv3.ClusterLoadAssignment)
		if la.GetClusterName() == cluster {
			sa := la.GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
			return net.JoinHostPort(sa.GetAddress(), fmt.Sprint(sa.GetPortValue()))
		}
	}
	t.Fatalf("cluster %s has no endpoints", cluster)
	return ""
}

// pieces cuts b into n pieces of near-equal size (n ≤ 1: one).
func pieces(b []byte, n int) [][]byte {
	n = max(n, 1)
	n = min(n, max(len(b), 1))
	var out [][]byte
	for i := range n {
		out = append(out, b[i*len(b)/n:(i+1)*len(b)/n])
	}
	return out
}

func headerMap(h map[string]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range h {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return m
}

// mutate applies m to h as Envoy does: removals, then sets.
func mutate(h map[string]string, m *extprocv3.HeaderMutation) {
	for _, k := range m.GetRemoveHeaders() {
		delete(h, k)
	}
	for _, s := range m.GetSetHeaders() {
		h[s.GetHeader().GetKey()] = headerValue(s.GetHeader())
	}
}
