// Package envoy is Molly's scale-out (docs/architecture.md): an xDS control plane
// and an ext_proc policy point for a fleet of Envoy proxies, both calling
// the same pipeline as the in-Caddy path.
//
// The control plane (ControlPlane) serves ADS over gRPC with
// go-control-plane's snapshot cache, the single seam every change flows
// through: Update turns the target catalogue into one consistent snapshot
// (Build: a cluster per target, a listener whose ext_proc filter calls
// Molly, a route per model name and target) whose version is a content
// hash, so a changed catalogue — a config reload, an adapter added through
// the admin API — is a new version and an unchanged one is not. Envoys
// and gRPC clients get their own node group (NodeGroup). A NACK is logged
// with its error detail.
//
// The policy point (PolicyPoint) is an ExternalProcessor service: for each
// request Envoy sends it the headers and body, it authenticates the API
// key (keyauth), classifies (classify), asks the policy (policies, through
// pipeline.Pipeline.Decide), plans and reserves and makes the dispatch
// (pipeline.Pipeline.Carry, egress.NewDispatch: the body redacted for the
// chosen tier) and answers Envoy with that body, the cluster to route to
// (HeaderCluster) and Molly's headers — or an OpenAI error as an
// ImmediateResponse. On the way back it restores placeholders in the body
// or in each streamed chunk, meters the usage and records the outcome
// through the pipeline's own delivery.
package envoy

import (
	"context"
	"fmt"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/molly-gateway/molly/router/route"
)

// Node groups: every Envoy gets GroupEnvoy's snapshot, every other xDS
// client (gRPC-Go, whose user agent is "gRPC Go") GroupGRPC's.
const (
	GroupEnvoy = "envoy"
	GroupGRPC  = "grpc"
)

// NodeGroup is the snapshot cache's node hash: nodes are grouped by the
// kind of client, not by their id, so N Envoys share one snapshot.
type NodeGroup struct{}

// ID returns the node's group.
func (NodeGroup) ID(node *corev3.Node) string {
	if ua := node.GetUserAgentName(); ua == "" || ua == "envoy" {
		return GroupEnvoy
	}
	return GroupGRPC
}

// ControlPlane is the xDS server. Safe for concurrent use.
type ControlPlane struct {
	cache  cache.SnapshotCache
	server server.Server
	log    *zap.Logger

	mu      sync.Mutex
	version string
}

// NewControlPlane returns a control plane with an empty cache; Update
// gives it its first snapshot. log (nil: none) receives NACKs and updates.
func NewControlPlane(log *zap.Logger) *ControlPlane {
	if log == nil {
		log = zap.NewNop()
	}
	cp := &ControlPlane{log: log}
	cp.cache = cache.NewSnapshotCache(true, NodeGroup{}, zapLogger{log.Named("xds").Sugar()})
	cp.server = server.NewServer(context.Background(), cp.cache, server.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discoverygrpc.DiscoveryRequest) error {
			if d := req.GetErrorDetail(); d != nil {
				cp.log.Warn("xDS update rejected (NACK)", zap.String("node", req.GetNode().GetId()), zap.String("type", req.GetTypeUrl()),
					zap.String("rejected_nonce", req.GetResponseNonce()), zap.String("version_in_use", req.GetVersionInfo()),
					zap.Int32("code", d.GetCode()), zap.String("error", d.GetMessage()))
			}
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, req *discoverygrpc.DeltaDiscoveryRequest) error {
			if d := req.GetErrorDetail(); d != nil {
				cp.log.Warn("xDS update rejected (NACK)", zap.String("node", req.GetNode().GetId()), zap.String("type", req.GetTypeUrl()),
					zap.String("rejected_nonce", req.GetResponseNonce()), zap.Int32("code", d.GetCode()), zap.String("error", d.GetMessage()))
			}
			return nil
		},
	})
	return cp
}

// Register adds the aggregated (ADS) and the per-type discovery services
// to s.
func (cp *ControlPlane) Register(s *grpc.Server) {
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(s, cp.server)
	clusterservice.RegisterClusterDiscoveryServiceServer(s, cp.server)
	endpointservice.RegisterEndpointDiscoveryServiceServer(s, cp.server)
	listenerservice.RegisterListenerDiscoveryServiceServer(s, cp.server)
	routeservice.RegisterRouteDiscoveryServiceServer(s, cp.server)
}

// Update builds the resources of cat under cfg (Build) and, when they
// differ from the current snapshot's, sets a new consistent snapshot for
// both node groups; it returns the version in effect. Errors: Build's, or
// a snapshot that is not consistent (a cluster without its endpoints, a
// listener without its routes); the previous snapshot then stays.
func (cp *ControlPlane) Update(ctx context.Context, cat *route.Catalogue, cfg Config) (string, error) {
	envoyRes, grpcRes, err := Build(cat, cfg)
	if err != nil {
		return "", fmt.Errorf("envoy: %w", err)
	}
	version := Version(envoyRes, grpcRes)
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if version == cp.version {
		return version, nil
	}
	for group, res := range map[string]Resources{GroupEnvoy: envoyRes, GroupGRPC: grpcRes} {
		snap, err := cache.NewSnapshot(version, res)
		if err != nil {
			return "", fmt.Errorf("envoy: snapshot: %w", err)
		}
		if err := snap.Consistent(); err != nil {
			return "", fmt.Errorf("envoy: snapshot %s for %s is not consistent: %w", version, group, err)
		}
		if err := cp.cache.SetSnapshot(ctx, group, snap); err != nil {
			return "", fmt.Errorf("envoy: snapshot: %w", err)
		}
	}
	cp.log.Info("xDS snapshot", zap.String("version", version), zap.Int("clusters", len(envoyRes[resource.ClusterType])),
		zap.Int("routes", routeCount(envoyRes)))
	cp.version = version
	return version, nil
}

// Version is the version of the current snapshot ("" before Update).
func (cp *ControlPlane) Version() string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return cp.version
}

// zapLogger adapts zap to go-control-plane's logger.
type zapLogger struct{ s *zap.SugaredLogger }

func (l zapLogger) Debugf(format string, args ...any) { l.s.Debugf(format, args...) }
func (l zapLogger) Infof(format string, args ...any)  { l.s.Debugf(format, args...) }
func (l zapLogger) Warnf(format string, args ...any)  { l.s.Warnf(format, args...) }
func (l zapLogger) Errorf(format string, args ...any) { l.s.Errorf(format, args...) }
