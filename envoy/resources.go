package envoy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	previoushostsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/molly-gateway/molly/router/route"
)

// Names in the xDS resources Molly serves.
const (
	// ListenerName is the listener (Envoy's, and the API listener gRPC
	// clients dial as xds:///molly) and RouteName its route configuration.
	ListenerName = "molly"
	RouteName    = "molly"
	// HeaderCluster is the request header the policy point sets to the
	// cluster (a target's name) the request must go to, and HeaderModel to
	// the client's model name; the routes match both and remove them
	// before the request leaves.
	HeaderCluster = "x-molly-cluster"
	HeaderModel   = "x-molly-model"
	// MetadataNamespace is the dynamic metadata namespace the policy point
	// writes the decision to (cluster, target, tier, model, decision_id),
	// e.g. %DYNAMIC_METADATA(molly:cluster)% in an Envoy access log.
	MetadataNamespace = "molly"
	// DefaultControlPlaneCluster is the static cluster of Envoy's bootstrap
	// that points at Molly's gRPC address (ADS and ext_proc).
	DefaultControlPlaneCluster = "molly_control_plane"
	// DefaultListenerAddress is where Envoy listens for OpenAI traffic.
	DefaultListenerAddress = "0.0.0.0:10000"
	// DefaultRetries is how often Envoy retries a request on another host
	// of its cluster (connect failure, reset, 5xx, 429).
	DefaultRetries = 2
	// DefaultMessageTimeout bounds each ext_proc exchange as Envoy sees it.
	DefaultMessageTimeout = 10 * time.Second
)

// ClusterName is the Envoy cluster of target t: its name.
func ClusterName(t *route.Target) string { return t.Name }

// Config is how Molly's targets become Envoy resources. The zero value
// takes the defaults.
type Config struct {
	// ListenerAddress is the host:port Envoy's listener binds (default
	// DefaultListenerAddress).
	ListenerAddress string
	// ControlPlaneCluster is the bootstrap cluster of Molly's gRPC address,
	// which the listener's ext_proc filter calls (default
	// DefaultControlPlaneCluster).
	ControlPlaneCluster string
	// EngineAddress is host:port of the Molly site serving the T0 engine
	// (molly_serve): the endpoint of every kind engine target's cluster.
	// Required when the catalogue has one.
	EngineAddress string
	// Outlier is the outlier detection of every target's cluster;
	// Targets[name].Outlier replaces it for one.
	Outlier Outlier
	// HealthCheck, when its Path is set, is the active HTTP health check of
	// every target's cluster; Targets[name].HealthCheck replaces it.
	HealthCheck HealthCheck
	// Targets holds per-target settings by target name.
	Targets map[string]TargetConfig
	// Retries is how often Envoy retries a request within its cluster
	// (default DefaultRetries; -1: none).
	Retries int
	// Buffered makes the listener's ext_proc filter use BUFFERED body
	// modes (bodies up to Envoy's buffer limit) instead of
	// FULL_DUPLEX_STREAMED (any size; streamed answers relayed chunk by
	// chunk).
	Buffered bool
	// MessageTimeout bounds each ext_proc exchange (default
	// DefaultMessageTimeout).
	MessageTimeout time.Duration
	// CAFile is the trust store for https targets (default the system's,
	// /etc/ssl/certs/ca-certificates.crt).
	CAFile string
}

// TargetConfig is the Envoy side of one target.
type TargetConfig struct {
	Outlier     *Outlier
	HealthCheck *HealthCheck
}

// Outlier is Envoy's outlier detection (passive health) of a cluster:
// a host is ejected after Consecutive5xx 5xx answers (or connect
// failures) in a row, for BaseEjection × the times it was ejected, with at
// most MaxEjectionPercent of the cluster's hosts out at once, checked
// every Interval. Zero fields take Envoy's defaults (5, 10 s, 30 s, 10 %).
type Outlier struct {
	Consecutive5xx     int
	Interval           time.Duration
	BaseEjection       time.Duration
	MaxEjectionPercent int
}

// HealthCheck is an active HTTP health check: GET Path every Interval
// (default 10 s), answered within Timeout (default 2 s); Unhealthy failures
// in a row mark a host unhealthy (default 3), Healthy successes healthy
// again (default 2).
type HealthCheck struct {
	Path               string
	Interval, Timeout  time.Duration
	Unhealthy, Healthy int
}

// Resources are one consistent set of xDS resources, by type URL.
type Resources map[resource.Type][]types.Resource

// Build turns the catalogue into the resources of the two node groups
// (NodeGroup): Envoy's — a listener on cfg.ListenerAddress whose HTTP
// connection manager runs the ext_proc filter (the policy point, through
// cfg.ControlPlaneCluster) before the router, the route configuration,
// and a cluster per target (EDS for an IP endpoint, LOGICAL_DNS for a host
// name, TLS for https, connect timeout from the target's timeout, outlier
// detection and health checks from cfg) — and gRPC clients': the same
// clusters (without TLS: gRPC clients bring their own credentials) and an
// API listener holding the same route configuration. Errors name the target: an
// endpoint that is not a URL, an engine target without cfg.EngineAddress.
func Build(cat *route.Catalogue, cfg Config) (envoyRes, grpcRes Resources, err error) {
	cfg = cfg.withDefaults()
	var clusters, grpcClusters, endpoints []types.Resource
	for _, t := range cat.Targets() {
		c, ep, err := cluster(t, cfg, true)
		if err != nil {
			return nil, nil, err
		}
		gc, _, _ := cluster(t, cfg, false)
		clusters, grpcClusters = append(clusters, c), append(grpcClusters, gc)
		if ep != nil {
			endpoints = append(endpoints, ep)
		}
	}
	routes := routeConfig(cat, cfg)
	envoyListener, err := listener(cfg)
	if err != nil {
		return nil, nil, err
	}
	apiListener, err := grpcListener(routes)
	if err != nil {
		return nil, nil, err
	}
	envoyRes = Resources{resource.ClusterType: clusters, resource.EndpointType: endpoints,
		resource.RouteType: {routes}, resource.ListenerType: {envoyListener}}
	grpcRes = Resources{resource.ClusterType: grpcClusters, resource.EndpointType: endpoints,
		resource.ListenerType: {apiListener}}
	return envoyRes, grpcRes, nil
}

// Version is a content hash of the resources of both groups (hex, 16
// characters): the same catalogue gives the same version, any change a
// new one.
func Version(groups ...Resources) string {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	for _, g := range groups {
		for _, typ := range []resource.Type{resource.ClusterType, resource.EndpointType, resource.RouteType, resource.ListenerType} {
			h.Write([]byte(typ))
			for _, r := range g[typ] {
				b, _ := opts.Marshal(r)
				h.Write(strconv.AppendInt(nil, int64(len(b)), 10))
				h.Write(b)
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func (cfg Config) withDefaults() Config {
	if cfg.ListenerAddress == "" {
		cfg.ListenerAddress = DefaultListenerAddress
	}
	if cfg.ControlPlaneCluster == "" {
		cfg.ControlPlaneCluster = DefaultControlPlaneCluster
	}
	if cfg.Retries == 0 {
		cfg.Retries = DefaultRetries
	}
	if cfg.MessageTimeout <= 0 {
		cfg.MessageTimeout = DefaultMessageTimeout
	}
	if cfg.CAFile == "" {
		cfg.CAFile = "/etc/ssl/certs/ca-certificates.crt"
	}
	return cfg
}

// upstream is where a target's cluster sends requests.
type upstream struct {
	host string
	port uint32
	tls  bool
}

func targetUpstream(t *route.Target, cfg Config) (upstream, error) {
	if t.Kind == route.KindEngine {
		host, port, err := net.SplitHostPort(cfg.EngineAddress)
		if err != nil || host == "" {
			return upstream{}, fmt.Errorf("target %s: kind engine is served by Molly's molly_serve site: engine_address %q must be host:port", t.Name, cfg.EngineAddress)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return upstream{}, fmt.Errorf("target %s: engine_address %q: bad port", t.Name, cfg.EngineAddress)
		}
		return upstream{host: host, port: uint32(p)}, nil
	}
	u, err := url.Parse(t.Endpoint)
	if err != nil || u.Hostname() == "" {
		return upstream{}, fmt.Errorf("target %s: endpoint %q is not an http(s) URL", t.Name, t.Endpoint)
	}
	up := upstream{host: u.Hostname(), tls: u.Scheme == "https", port: 80}
	if up.tls {
		up.port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return upstream{}, fmt.Errorf("target %s: endpoint %q: bad port", t.Name, t.Endpoint)
		}
		up.port = uint32(n)
	}
	return up, nil
}

// cluster is the cluster of t and, for an IP endpoint, its load assignment
// (EDS); withTLS adds the TLS transport socket of an https target.
func cluster(t *route.Target, cfg Config, withTLS bool) (*clusterv3.Cluster, *endpointv3.ClusterLoadAssignment, error) {
	up, err := targetUpstream(t, cfg)
	if err != nil {
		return nil, nil, err
	}
	name := ClusterName(t)
	la := &endpointv3.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
		// A weighted locality: gRPC clients drop localities without a weight.
		Locality:            &corev3.Locality{Zone: t.Tier},
		LoadBalancingWeight: wrapperspb.UInt32(1),
		LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
			Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
				Address: up.host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: up.port}}}}}}}},
	}}}
	c := &clusterv3.Cluster{
		Name:             name,
		ConnectTimeout:   durationpb.New(min(t.Timeout(), 10*time.Second)),
		LbPolicy:         clusterv3.Cluster_ROUND_ROBIN,
		OutlierDetection: outlier(cfg, t.Name),
	}
	if hc := healthCheck(cfg, t.Name, up); hc != nil && withTLS {
		c.HealthChecks = []*corev3.HealthCheck{hc}
	}
	if up.tls && withTLS {
		tc, err := anypb.New(&tlsv3.UpstreamTlsContext{Sni: up.host, CommonTlsContext: &tlsv3.CommonTlsContext{
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: &corev3.DataSource{Specifier: &corev3.DataSource_Filename{Filename: cfg.CAFile}}}}}})
		if err != nil {
			return nil, nil, err
		}
		c.TransportSocket = &corev3.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &corev3.TransportSocket_TypedConfig{TypedConfig: tc}}
	}
	if net.ParseIP(up.host) == nil {
		// A host name: Envoy resolves it (an EDS endpoint must be an address).
		c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_LOGICAL_DNS}
		c.DnsLookupFamily = clusterv3.Cluster_V4_PREFERRED
		c.LoadAssignment = la
		return c, nil, nil
	}
	c.ClusterDiscoveryType = &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}
	c.EdsClusterConfig = &clusterv3.Cluster_EdsClusterConfig{EdsConfig: ads()}
	return c, la, nil
}

func ads() *corev3.ConfigSource {
	return &corev3.ConfigSource{ResourceApiVersion: corev3.ApiVersion_V3, ConfigSourceSpecifier: &corev3.ConfigSource_Ads{Ads: &corev3.AggregatedConfigSource{}}}
}

func outlier(cfg Config, target string) *clusterv3.OutlierDetection {
	o := cfg.Outlier
	if tc, ok := cfg.Targets[target]; ok && tc.Outlier != nil {
		o = *tc.Outlier
	}
	od := &clusterv3.OutlierDetection{}
	if o.Consecutive5xx > 0 {
		od.Consecutive_5Xx = wrapperspb.UInt32(uint32(o.Consecutive5xx))
	}
	if o.Interval > 0 {
		od.Interval = durationpb.New(o.Interval)
	}
	if o.BaseEjection > 0 {
		od.BaseEjectionTime = durationpb.New(o.BaseEjection)
	}
	if o.MaxEjectionPercent > 0 {
		od.MaxEjectionPercent = wrapperspb.UInt32(uint32(o.MaxEjectionPercent))
	}
	return od
}

func healthCheck(cfg Config, target string, up upstream) *corev3.HealthCheck {
	h := cfg.HealthCheck
	if tc, ok := cfg.Targets[target]; ok && tc.HealthCheck != nil {
		h = *tc.HealthCheck
	}
	if h.Path == "" {
		return nil
	}
	or := func(d, def time.Duration) *durationpb.Duration {
		if d <= 0 {
			d = def
		}
		return durationpb.New(d)
	}
	orN := func(n, def int) *wrapperspb.UInt32Value {
		if n <= 0 {
			n = def
		}
		return wrapperspb.UInt32(uint32(n))
	}
	return &corev3.HealthCheck{
		Timeout: or(h.Timeout, 2*time.Second), Interval: or(h.Interval, 10*time.Second),
		UnhealthyThreshold: orN(h.Unhealthy, 3), HealthyThreshold: orN(h.Healthy, 2),
		HealthChecker: &corev3.HealthCheck_HttpHealthCheck_{HttpHealthCheck: &corev3.HealthCheck_HttpHealthCheck{Host: up.host, Path: h.Path}},
	}
}

// routeConfig has a route per model name and target serving it, matched
// on the headers the policy point sets, and a last route that refuses
// (403) whatever the policy point did not decide: nothing reaches an
// upstream without a decision.
func routeConfig(cat *route.Catalogue, cfg Config) *routev3.RouteConfiguration {
	type pair struct {
		model string
		t     *route.Target
	}
	var pairs []pair
	for _, t := range cat.Targets() {
		for _, m := range t.ModelNames() {
			pairs = append(pairs, pair{m, t})
		}
	}
	slices.SortStableFunc(pairs, func(a, b pair) int {
		if a.model != b.model {
			if a.model < b.model {
				return -1
			}
			return 1
		}
		return 0
	})
	exact := func(name, v string) *routev3.HeaderMatcher {
		return &routev3.HeaderMatcher{Name: name, HeaderMatchSpecifier: &routev3.HeaderMatcher_StringMatch{
			StringMatch: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: v}}}}
	}
	prev, _ := anypb.New(&previoushostsv3.PreviousHostsPredicate{})
	var routes []*routev3.Route
	for _, p := range pairs {
		up, err := targetUpstream(p.t, cfg)
		if err != nil {
			continue // Build reported it for the cluster
		}
		host := up.host
		if (up.tls && up.port != 443) || (!up.tls && up.port != 80) {
			host = net.JoinHostPort(up.host, strconv.FormatUint(uint64(up.port), 10))
		}
		action := &routev3.RouteAction{
			ClusterSpecifier:     &routev3.RouteAction_Cluster{Cluster: ClusterName(p.t)},
			Timeout:              durationpb.New(0), // streams run as long as they stream
			IdleTimeout:          durationpb.New(p.t.Timeout()),
			HostRewriteSpecifier: &routev3.RouteAction_HostRewriteLiteral{HostRewriteLiteral: host},
		}
		if cfg.Retries > 0 {
			action.RetryPolicy = &routev3.RetryPolicy{
				RetryOn:                       "connect-failure,refused-stream,reset,5xx,retriable-status-codes",
				RetriableStatusCodes:          []uint32{429},
				NumRetries:                    wrapperspb.UInt32(uint32(cfg.Retries)),
				RetryHostPredicate:            []*routev3.RetryPolicy_RetryHostPredicate{{Name: "envoy.retry_host_predicates.previous_hosts", ConfigType: &routev3.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: prev}}},
				HostSelectionRetryMaxAttempts: 3,
			}
		}
		routes = append(routes, &routev3.Route{
			Name:                   p.model + "/" + p.t.Name,
			Match:                  &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}, Headers: []*routev3.HeaderMatcher{exact(HeaderModel, p.model), exact(HeaderCluster, ClusterName(p.t))}},
			Action:                 &routev3.Route_Route{Route: action},
			RequestHeadersToRemove: []string{HeaderCluster, HeaderModel},
		})
	}
	routes = append(routes, &routev3.Route{
		Name:  "undecided_messages",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/v1/messages"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 403, Body: &corev3.DataSource{
			Specifier: &corev3.DataSource_InlineString{InlineString: undecidedMessages}}}},
		ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}}},
	}, &routev3.Route{
		Name:  "undecided",
		Match: &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
		Action: &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 403, Body: &corev3.DataSource{
			Specifier: &corev3.DataSource_InlineString{InlineString: undecided}}}},
		ResponseHeadersToAdd: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "content-type", Value: "application/json"}}},
	})
	return &routev3.RouteConfiguration{Name: RouteName, VirtualHosts: []*routev3.VirtualHost{{Name: "molly", Domains: []string{"*"}, Routes: routes}}}
}

// undecided is the body of the last route: a request the policy point did
// not route (it is not running, or was bypassed).
const undecided = `{"error":{"message":"The request has no Molly policy decision, so it is not routed.","type":"policy_denied","param":null,"code":"no_decision"}}`

// undecidedMessages is undecided in Anthropic's error shape, for the
// Messages API's paths (/v1/messages, /v1/messages/count_tokens), whose
// clients read that shape.
const undecidedMessages = `{"type":"error","error":{"type":"permission_error","message":"The request has no Molly policy decision, so it is not routed."}}`

// ExtProcFilter is the ext_proc filter configuration of the listener: the
// policy point at cfg.ControlPlaneCluster, fail closed, headers and
// trailers sent, bodies FULL_DUPLEX_STREAMED (or BUFFERED), decisions
// accepted as dynamic metadata in MetadataNamespace.
func ExtProcFilter(cfg Config) *extprocv3.ExternalProcessor {
	cfg = cfg.withDefaults()
	mode := &extprocv3.ProcessingMode{
		RequestHeaderMode:   extprocv3.ProcessingMode_SEND,
		ResponseHeaderMode:  extprocv3.ProcessingMode_SEND,
		RequestBodyMode:     extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		ResponseBodyMode:    extprocv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		RequestTrailerMode:  extprocv3.ProcessingMode_SEND, // required by FULL_DUPLEX_STREAMED
		ResponseTrailerMode: extprocv3.ProcessingMode_SEND,
	}
	if cfg.Buffered {
		mode.RequestBodyMode, mode.ResponseBodyMode = extprocv3.ProcessingMode_BUFFERED, extprocv3.ProcessingMode_BUFFERED
		mode.RequestTrailerMode, mode.ResponseTrailerMode = extprocv3.ProcessingMode_SKIP, extprocv3.ProcessingMode_SKIP
	}
	return &extprocv3.ExternalProcessor{
		GrpcService:      &corev3.GrpcService{TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cfg.ControlPlaneCluster}}},
		FailureModeAllow: false,
		ProcessingMode:   mode,
		MessageTimeout:   durationpb.New(cfg.MessageTimeout),
		MetadataOptions: &extprocv3.MetadataOptions{ReceivingNamespaces: &extprocv3.MetadataOptions_MetadataNamespaces{
			Untyped: []string{MetadataNamespace}}},
	}
}

func listener(cfg Config) (*listenerv3.Listener, error) {
	host, port, err := net.SplitHostPort(cfg.ListenerAddress)
	if err != nil {
		return nil, fmt.Errorf("listener address %q must be host:port: %w", cfg.ListenerAddress, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("listener address %q: bad port", cfg.ListenerAddress)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	extproc, err := anypb.New(ExtProcFilter(cfg))
	if err != nil {
		return nil, err
	}
	router, _ := anypb.New(&routerv3.Router{})
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: "molly",
		CodecType:  hcmv3.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcmv3.HttpConnectionManager_Rds{Rds: &hcmv3.Rds{
			ConfigSource: ads(), RouteConfigName: RouteName}},
		HttpFilters: []*hcmv3.HttpFilter{
			{Name: "envoy.filters.http.ext_proc", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: extproc}},
			{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}},
		},
	})
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{
		Name: ListenerName,
		Address: &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
			Address: host, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(p)}}}},
		FilterChains: []*listenerv3.FilterChain{{Filters: []*listenerv3.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}}}},
	}, nil
}

// grpcListener is the API listener gRPC clients resolve xds:///molly to:
// the same route configuration, inline (go-control-plane's consistency
// check follows RDS names only from a listener's filter chains), and the
// router filter only.
func grpcListener(routes *routev3.RouteConfiguration) (*listenerv3.Listener, error) {
	router, _ := anypb.New(&routerv3.Router{})
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: routes},
		HttpFilters:    []*hcmv3.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcmv3.HttpFilter_TypedConfig{TypedConfig: router}}},
	})
	if err != nil {
		return nil, err
	}
	return &listenerv3.Listener{Name: ListenerName, ApiListener: &listenerv3.ApiListener{ApiListener: hcm}}, nil
}

// routeCount is the number of routes in the route configurations of r.
func routeCount(r Resources) int {
	n := 0
	for _, rc := range r[resource.RouteType] {
		for _, vh := range rc.(*routev3.RouteConfiguration).GetVirtualHosts() {
			n += len(vh.GetRoutes())
		}
	}
	return n
}
