package envoy

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/xds"

	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

// backend is a gRPC server standing for a target's endpoint: it answers
// the health service and names itself in the x-served-by header.
func backend(t *testing.T, name string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-served-by", name))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(l)
	t.Cleanup(s.Stop)
	return l.Addr().String()
}

// startControlPlane serves cp on loopback and returns its address.
func startControlPlane(t *testing.T, cp *ControlPlane) string {
	t.Helper()
	srv := NewServer(cp)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Stop(time.Second) })
	return l.Addr().String()
}

func catalogue(t *testing.T, targets ...*route.Target) *route.Catalogue {
	t.Helper()
	cat, err := route.NewCatalogue(targets, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cat
}

func TestGRPCXDSClientResolvesAClusterPerModelAndSeesANewTarget(t *testing.T) {
	lan, ext, lan2 := backend(t, "lan"), backend(t, "external"), backend(t, "lan2")
	lanT := func() *route.Target {
		return &route.Target{Name: "lan", Tier: "T1", Endpoint: "http://" + lan + "/v1", Models: []string{"chat"}}
	}
	extT := func() *route.Target {
		return &route.Target{Name: "external", Tier: "T3", Endpoint: "http://" + ext + "/v1", Models: []string{"chat", "gpt-4o"}}
	}
	cp := NewControlPlane(zap.NewNop())
	v1, err := cp.Update(context.Background(), catalogue(t, lanT(), extT()), Config{})
	if err != nil {
		t.Fatal(err)
	}
	addr := startControlPlane(t, cp)

	// gRPC-Go's own xDS client, bootstrapped to the control plane.
	bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": "molly-test-client", "cluster": "tests"}}`, addr)
	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///"+ListenerName, grpc.WithResolvers(resolver), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)
	servedBy := func(model, cluster string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, HeaderModel, model, HeaderCluster, cluster)
		var md metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md), grpc.WaitForReady(true))
		if err != nil {
			return "", err
		}
		return strings.Join(md.Get("x-served-by"), ","), nil
	}
	// waitServed waits (20 s at most) until the route for (model, cluster)
	// leads to want: xDS updates reach the client asynchronously.
	waitServed := func(model, cluster, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, err := servedBy(model, cluster)
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("model %s, cluster %s: served by %q (%v), want %q", model, cluster, got, err, want)
			}
			time.Sleep(10 * time.Millisecond) // an RPC on a route not there yet fails at once
		}
	}
	waitServed("chat", "lan", "lan")
	waitServed("chat", "external", "external")
	waitServed("gpt-4o", "external", "external")
	// No route leads a model to a cluster that does not serve it: the
	// request falls to the last route, which forwards nothing.
	if got, err := servedBy("gpt-4o", "lan"); err == nil {
		t.Fatalf("gpt-4o on lan was served by %q; the route must not exist", got)
	}

	// A target added to the catalogue is a new snapshot version, and the
	// client routes to it.
	v2, err := cp.Update(context.Background(), catalogue(t, lanT(), extT(),
		&route.Target{Name: "lan2", Tier: "T1", Endpoint: "http://" + lan2 + "/v1", Models: []string{"chat"}}), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if v2 == v1 {
		t.Fatalf("a new target kept the version %s", v1)
	}
	waitServed("chat", "lan2", "lan2")
	waitServed("chat", "lan", "lan")
	// The same catalogue again is the same version.
	if v3, err := cp.Update(context.Background(), catalogue(t, lanT(), extT(),
		&route.Target{Name: "lan2", Tier: "T1", Endpoint: "http://" + lan2 + "/v1", Models: []string{"chat"}}), Config{}); err != nil || v3 != v2 {
		t.Fatalf("an unchanged catalogue: version %s (%v), want %s", v3, err, v2)
	}
}

func TestControlPlaneLogsNACKsWithTheirDetail(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	cp := NewControlPlane(zap.New(core))
	if _, err := cp.Update(context.Background(), catalogue(t, &route.Target{Name: "lan", Tier: "T1", Endpoint: "http://127.0.0.1:9/v1", Models: []string{"chat"}}), Config{}); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(startControlPlane(t, cp), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// go-control-plane's generated ADS client, as an Envoy: subscribe to
	// the listeners, then reject what came.
	ads, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-1", UserAgentName: "envoy"}
	if err := ads.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	resp, err := ads.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVersionInfo() != cp.Version() || len(resp.GetResources()) != 1 {
		t.Fatalf("listeners at version %q (%d), want the snapshot's %q", resp.GetVersionInfo(), len(resp.GetResources()), cp.Version())
	}
	if err := ads.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, ResponseNonce: resp.GetNonce(),
		ErrorDetail: &status.Status{Code: 3, Message: "Error adding/updating listener(s) molly: unknown filter"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for logs.FilterMessage("xDS update rejected (NACK)").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the NACK was not logged")
		}
		time.Sleep(5 * time.Millisecond)
	}
	f := logs.FilterMessage("xDS update rejected (NACK)").All()[0].ContextMap()
	if f["error"] != "Error adding/updating listener(s) molly: unknown filter" || f["node"] != "envoy-1" || f["type"] != resource.ListenerType || f["rejected_nonce"] != resp.GetNonce() {
		t.Fatalf("NACK logged as %v", f)
	}
}

// validate checks m and the typed configs inside it against Envoy's own
// field rules (the protoc-gen-validate rules generated with the API).
func validate(t *testing.T, name string, m interface{ ValidateAll() error }) {
	t.Helper()
	if err := m.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestBuildMakesValidResourcesForEveryKindOfTarget(t *testing.T) {
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	cfg := serving.DemoConfig(dir)
	cfg.NSeqMax, cfg.Threads = 1, 1
	eng, err := serving.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	targets := func() []*route.Target {
		return []*route.Target{
			{Name: "t0", Tier: "T0", Kind: route.KindEngine},
			{Name: "lan", Tier: "T1", Endpoint: "http://10.0.0.5:8000/v1", Models: []string{"chat=small"}, TimeoutMS: 5000},
			{Name: "openai", Tier: "T3", Endpoint: "https://api.openai.com/v1", Models: []string{"chat=gpt-4o-mini"}},
		}
	}
	pc := Config{EngineAddress: "127.0.0.1:8081", HealthCheck: HealthCheck{Path: "/v1/models"},
		Outlier: Outlier{Consecutive5xx: 3, BaseEjection: 20 * time.Second}, Targets: map[string]TargetConfig{"openai": {Outlier: &Outlier{Consecutive5xx: 9}}}}
	cat, err := route.NewCatalogue(targets(), eng)
	if err != nil {
		t.Fatal(err)
	}
	envoyRes, grpcRes, err := Build(cat, pc)
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, r := range envoyRes[resource.ClusterType] {
		c := r.(*clusterv3.Cluster)
		validate(t, c.GetName(), c)
		clusters[c.GetName()] = c
	}
	// T0 is a cluster of the Molly host; an IP endpoint is EDS, a host name
	// LOGICAL_DNS with TLS; outlier detection and health checks as configured.
	if la := clusters["t0"]; la.GetType() != clusterv3.Cluster_EDS {
		t.Fatalf("t0 cluster type %v, want EDS", la.GetType())
	}
	if c := clusters["openai"]; c.GetType() != clusterv3.Cluster_LOGICAL_DNS || c.GetTransportSocket() == nil ||
		c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue() != 443 {
		t.Fatalf("the https target's cluster: %v", c)
	}
	if got := clusters["lan"].GetOutlierDetection().GetConsecutive_5Xx().GetValue(); got != 3 {
		t.Fatalf("lan consecutive_5xx %d, want 3", got)
	}
	if got := clusters["openai"].GetOutlierDetection().GetConsecutive_5Xx().GetValue(); got != 9 {
		t.Fatalf("openai consecutive_5xx %d, want the per-target 9", got)
	}
	if got := clusters["lan"].GetConnectTimeout().AsDuration(); got != 5*time.Second {
		t.Fatalf("lan connect timeout %v, want its 5 s", got)
	}
	if hc := clusters["lan"].GetHealthChecks(); len(hc) != 1 || hc[0].GetHttpHealthCheck().GetPath() != "/v1/models" {
		t.Fatalf("lan health checks %v", hc)
	}
	var t0Addr string
	for _, r := range envoyRes[resource.EndpointType] {
		validate(t, "endpoints", r.(interface{ ValidateAll() error }))
		if la := r.(interface {
			GetClusterName() string
		}); la.GetClusterName() == "t0" {
			t0Addr = fmt.Sprint(r)
		}
	}
	if !strings.Contains(t0Addr, "127.0.0.1") || !strings.Contains(t0Addr, "8081") {
		t.Fatalf("t0 endpoints %s, want the engine address", t0Addr)
	}
	// Routes: every engine model (adapters too) and alias, and the last
	// route refusing what was not decided.
	rc := envoyRes[resource.RouteType][0].(*routev3.RouteConfiguration)
	validate(t, "routes", rc)
	var names []string
	for _, r := range rc.GetVirtualHosts()[0].GetRoutes() {
		names = append(names, r.GetName())
	}
	want := []string{"chat/lan", "chat/openai"}
	for _, m := range eng.Models() {
		want = append(want, m+"/t0")
	}
	slices.Sort(want)
	if got := names[:len(names)-2]; !slices.Equal(got, want) || !slices.Equal(names[len(names)-2:], []string{"undecided_messages", "undecided"}) {
		t.Fatalf("routes %v, want %v then undecided_messages and undecided", names, want)
	}
	// What was not decided is refused in the shape its client reads:
	// Anthropic's on the Messages API's paths, OpenAI's elsewhere.
	routes := rc.GetVirtualHosts()[0].GetRoutes()
	for i, w := range []struct{ prefix, typ string }{{"/v1/messages", "permission_error"}, {"/", "policy_denied"}} {
		r := routes[len(routes)-2+i]
		body := r.GetDirectResponse().GetBody().GetInlineString()
		if r.GetMatch().GetPrefix() != w.prefix || r.GetDirectResponse().GetStatus() != 403 || gjson.Get(body, "error.type").Str != w.typ ||
			(w.prefix == "/v1/messages") != (gjson.Get(body, "type").Str == "error") {
			t.Fatalf("route %s: prefix %q, %d %s", r.GetName(), r.GetMatch().GetPrefix(), r.GetDirectResponse().GetStatus(), body)
		}
	}
	// The listener: ext_proc before the router, fail closed, full duplex.
	l := envoyRes[resource.ListenerType][0].(*listenerv3.Listener)
	validate(t, "listener", l)
	hcm := &hcmv3.HttpConnectionManager{}
	if err := l.GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	validate(t, "http connection manager", hcm)
	if f := hcm.GetHttpFilters(); len(f) != 2 || f[0].GetName() != "envoy.filters.http.ext_proc" || f[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http filters %v", f)
	}
	ep := &extprocfilter.ExternalProcessor{}
	if err := hcm.GetHttpFilters()[0].GetTypedConfig().UnmarshalTo(ep); err != nil {
		t.Fatal(err)
	}
	validate(t, "ext_proc", ep)
	if ep.GetFailureModeAllow() || ep.GetProcessingMode().GetRequestBodyMode() != extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED ||
		ep.GetProcessingMode().GetRequestTrailerMode() != extprocfilter.ProcessingMode_SEND || ep.GetGrpcService().GetEnvoyGrpc().GetClusterName() != DefaultControlPlaneCluster {
		t.Fatalf("ext_proc filter %v", ep)
	}
	// gRPC clients get no TLS sockets (they bring their own credentials).
	for _, r := range grpcRes[resource.ClusterType] {
		if r.(*clusterv3.Cluster).GetTransportSocket() != nil {
			t.Fatalf("the gRPC group's cluster %s has a TLS socket", r.(*clusterv3.Cluster).GetName())
		}
	}

	// An adapter removed through the engine's admin API changes the routes:
	// a new version without its route.
	v1 := Version(envoyRes, grpcRes)
	if err := eng.RemoveAdapter(serving.DemoAdapters[0]); err != nil {
		t.Fatal(err)
	}
	e2, g2, err := Build(cat, pc)
	if err != nil {
		t.Fatal(err)
	}
	if v2 := Version(e2, g2); v2 == v1 || routeCount(e2) != routeCount(envoyRes)-1 {
		t.Fatalf("after removing an adapter: version %s (was %s), %d routes (were %d)", v2, v1, routeCount(e2), routeCount(envoyRes))
	}
	// An engine target without the engine's address is refused by name.
	if _, _, err := Build(cat, Config{}); err == nil || !strings.Contains(err.Error(), "target t0") {
		t.Fatalf("Build without engine_address: %v", err)
	}
}
