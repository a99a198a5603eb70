package envoy

import (
	"errors"
	"net"
	"runtime"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/molly-gateway/molly/router/pipeline"
)

// Server is Molly's gRPC endpoint for a fleet: the control plane's ADS and
// the policy point's ExternalProcessor on one address, the one Envoy's
// bootstrap names (its static cluster DefaultControlPlaneCluster). The
// policy point can be replaced while serving (a config reload) without
// dropping the Envoys' xDS streams.
type Server struct {
	cp    *ControlPlane
	point atomic.Pointer[PolicyPoint]
	grpc  *grpc.Server
}

// NewServer returns a server for cp; SetPolicyPoint gives it the policy
// point (until then, ext_proc streams are refused as unavailable, and
// Envoy, failing closed, answers 500).
func NewServer(cp *ControlPlane) *Server {
	s := &Server{cp: cp}
	s.grpc = grpc.NewServer(
		// A BUFFERED body comes in one message: an answer up to the
		// pipeline's limit, whatever request limit a config sets.
		grpc.MaxRecvMsgSize(pipeline.MaxUpstreamBody+(1<<20)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Streams run on reused workers: a policy evaluation needs a deep
		// stack, which a new goroutine per stream would grow every time.
		grpc.NumStreamWorkers(uint32(4*runtime.GOMAXPROCS(0))),
	)
	cp.Register(s.grpc)
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	return s
}

// ControlPlane returns the server's control plane.
func (s *Server) ControlPlane() *ControlPlane { return s.cp }

// SetPolicyPoint makes pp serve the ext_proc streams opened from now on.
func (s *Server) SetPolicyPoint(pp *PolicyPoint) { s.point.Store(pp) }

// Process implements extprocv3.ExternalProcessorServer with the current
// policy point.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	pp := s.point.Load()
	if pp == nil {
		return status.Error(codes.Unavailable, "molly: no policy point is configured yet")
	}
	return pp.Process(stream)
}

// Serve accepts connections on l until Stop; it returns nil after Stop.
func (s *Server) Serve(l net.Listener) error {
	err := s.grpc.Serve(l)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Stop closes the listeners and waits up to grace for the streams in
// flight (requests being processed; xDS streams are long-lived and cut
// after grace).
func (s *Server) Stop(grace time.Duration) {
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		s.grpc.Stop()
		<-done
	}
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)
