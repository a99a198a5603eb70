// Package envoy is the Caddy app "molly_envoy": Molly as the control plane
// and policy point of an Envoy fleet (package envoy). It serves ADS and the
// ext_proc policy point on one gRPC address, with the molly app's catalogue,
// policy, pipeline and registry; the gRPC server outlives config reloads,
// which only bring a new snapshot and a new policy point.
package envoy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/caddy-modules/app"
	classifymod "github.com/molly-gateway/molly/caddy-modules/classify"
	"github.com/molly-gateway/molly/envoy"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/keyauth"
)

// DefaultRefresh is how often the catalogue is read again for the changes
// the admin API makes (engine adapters added or removed).
const DefaultRefresh = 5 * time.Second

// App is the molly_envoy app. JSON: {"apps": {"molly_envoy": {...}}}.
type App struct {
	// Listen is the gRPC address (ADS and ext_proc) Envoy's bootstrap
	// names in its static cluster, e.g. ":18000". Required.
	Listen string `json:"listen"`
	// EnvoyListen is the address Envoy's listener binds for OpenAI traffic
	// (default envoy.DefaultListenerAddress).
	EnvoyListen string `json:"envoy_listen,omitempty"`
	// ControlPlaneCluster is the name of that static cluster (default
	// envoy.DefaultControlPlaneCluster).
	ControlPlaneCluster string `json:"control_plane_cluster,omitempty"`
	// EngineAddress is host:port of this Molly's molly_serve site: the
	// endpoint of the T0 engine's cluster. Required with an engine target.
	EngineAddress string `json:"engine_address,omitempty"`
	// Buffered selects BUFFERED ext_proc body modes instead of
	// FULL_DUPLEX_STREAMED.
	Buffered bool `json:"buffered,omitempty"`
	// Retries is how often Envoy retries within a cluster (default 2; -1: none).
	Retries int `json:"retries,omitempty"`
	// Outlier and HealthCheck apply to every target's cluster; Targets
	// replaces them for one target by name.
	Outlier     *Outlier                 `json:"outlier,omitempty"`
	HealthCheck *HealthCheck             `json:"health_check,omitempty"`
	Targets     map[string]TargetOptions `json:"targets,omitempty"`
	// Refresh is how often the catalogue is read again (default
	// DefaultRefresh); an unchanged one is no new version.
	Refresh caddy.Duration `json:"refresh,omitempty"`
	// Classify is the policy point's classifier, with molly_classify's
	// options (entities, patterns, sensitivity, redact modes, body limit).
	Classify *classifymod.Classify `json:"classify,omitempty"`
	// Auth, when set, authenticates API keys as molly_auth does; without
	// it requests run as the molly app's anonymous member.
	Auth *Auth `json:"auth,omitempty"`

	molly  *app.App
	cfg    envoy.Config
	point  *envoy.PolicyPoint
	server *pooledServer
	logger *zap.Logger
	stop   chan struct{}
	done   *sync.WaitGroup
}

// Outlier is a cluster's outlier detection (envoy.Outlier).
type Outlier struct {
	Consecutive5xx     int            `json:"consecutive_5xx,omitempty"`
	Interval           caddy.Duration `json:"interval,omitempty"`
	BaseEjection       caddy.Duration `json:"base_ejection,omitempty"`
	MaxEjectionPercent int            `json:"max_ejection_percent,omitempty"`
}

// HealthCheck is a cluster's active HTTP health check (envoy.HealthCheck).
type HealthCheck struct {
	Path      string         `json:"path"`
	Interval  caddy.Duration `json:"interval,omitempty"`
	Timeout   caddy.Duration `json:"timeout,omitempty"`
	Unhealthy int            `json:"unhealthy,omitempty"`
	Healthy   int            `json:"healthy,omitempty"`
}

// TargetOptions are one target's cluster settings.
type TargetOptions struct {
	Outlier     *Outlier     `json:"outlier,omitempty"`
	HealthCheck *HealthCheck `json:"health_check,omitempty"`
}

// Auth configures key authentication.
type Auth struct {
	// Anonymous, when set, serves requests without a Molly key as this
	// member (created without limits if missing), as molly_auth's option.
	Anonymous string `json:"anonymous,omitempty"`
}

func init() { caddy.RegisterModule(App{}) }

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "molly_envoy", New: func() caddy.Module { return new(App) }}
}

// Provision builds the policy point over the molly app's pipeline and
// checks that the catalogue makes valid Envoy resources; nothing listens
// before Start (so `molly validate` binds no port).
func (a *App) Provision(ctx caddy.Context) error {
	a.logger = ctx.Logger()
	var err error
	if a.molly, err = app.Load(ctx, "molly_envoy"); err != nil {
		return err
	}
	if a.Classify == nil {
		a.Classify = &classifymod.Classify{}
	}
	if err := a.Classify.Provision(ctx); err != nil {
		return fmt.Errorf("molly_envoy: classify: %w", err)
	}
	a.cfg = a.config()
	if _, _, err := envoy.Build(a.molly.Catalogue(), a.cfg); err != nil {
		return fmt.Errorf("molly_envoy: %w", err)
	}
	a.point = &envoy.PolicyPoint{Pipeline: a.molly.Pipeline(), Classifier: a.Classify.Classifier(), Anonymous: a.molly.AnonymousIdentity(),
		MaxBodyBytes: a.Classify.MaxBodyBytes, Buffered: a.Buffered, Logger: a.logger.Named("policy_point")}
	if a.Auth != nil {
		reg := a.molly.Registry()
		if a.Auth.Anonymous != "" {
			if _, err := reg.Member(ctx, a.Auth.Anonymous); errors.Is(err, registry.ErrNotFound) {
				if _, _, err := reg.PutMember(ctx, registry.Member{Name: a.Auth.Anonymous}); err != nil {
					return fmt.Errorf("molly_envoy: auth anonymous: %w", err)
				}
			} else if err != nil {
				return fmt.Errorf("molly_envoy: auth anonymous: %w", err)
			}
		}
		a.point.Auth = &keyauth.Authenticator{Registry: reg, Anonymous: a.Auth.Anonymous}
	}
	return nil
}

func (a *App) config() envoy.Config {
	cfg := envoy.Config{ListenerAddress: a.EnvoyListen, ControlPlaneCluster: a.ControlPlaneCluster, EngineAddress: a.EngineAddress,
		Retries: a.Retries, Buffered: a.Buffered, Targets: map[string]envoy.TargetConfig{}}
	if a.Outlier != nil {
		cfg.Outlier = a.Outlier.envoy()
	}
	if a.HealthCheck != nil {
		cfg.HealthCheck = a.HealthCheck.envoy()
	}
	for name, t := range a.Targets {
		var tc envoy.TargetConfig
		if t.Outlier != nil {
			o := t.Outlier.envoy()
			tc.Outlier = &o
		}
		if t.HealthCheck != nil {
			h := t.HealthCheck.envoy()
			tc.HealthCheck = &h
		}
		cfg.Targets[name] = tc
	}
	return cfg
}

func (o *Outlier) envoy() envoy.Outlier {
	return envoy.Outlier{Consecutive5xx: o.Consecutive5xx, Interval: time.Duration(o.Interval), BaseEjection: time.Duration(o.BaseEjection),
		MaxEjectionPercent: o.MaxEjectionPercent}
}

func (h *HealthCheck) envoy() envoy.HealthCheck {
	return envoy.HealthCheck{Path: h.Path, Interval: time.Duration(h.Interval), Timeout: time.Duration(h.Timeout),
		Unhealthy: h.Unhealthy, Healthy: h.Healthy}
}

// Validate rejects settings Envoy or the policy point would refuse; the
// message names the field.
func (a *App) Validate() error {
	if _, _, err := net.SplitHostPort(a.Listen); err != nil {
		return fmt.Errorf("molly_envoy: listen %q must be host:port such as :18000", a.Listen)
	}
	if a.EnvoyListen != "" {
		if _, _, err := net.SplitHostPort(a.EnvoyListen); err != nil {
			return fmt.Errorf("molly_envoy: envoy_listen %q must be host:port such as 0.0.0.0:10000", a.EnvoyListen)
		}
	}
	if a.Retries < -1 {
		return fmt.Errorf("molly_envoy: retries %d must be -1 (none) or more", a.Retries)
	}
	if a.Refresh < 0 {
		return fmt.Errorf("molly_envoy: refresh must not be negative")
	}
	check := func(where string, o *Outlier, h *HealthCheck) error {
		if o != nil && (o.Consecutive5xx < 0 || o.MaxEjectionPercent < 0 || o.MaxEjectionPercent > 100 || o.Interval < 0 || o.BaseEjection < 0) {
			return fmt.Errorf("molly_envoy: %soutlier: counts must not be negative and max_ejection_percent at most 100", where)
		}
		if h != nil && (len(h.Path) == 0 || h.Path[0] != '/') {
			return fmt.Errorf("molly_envoy: %shealth_check path %q must start with /", where, h.Path)
		}
		return nil
	}
	if err := check("", a.Outlier, a.HealthCheck); err != nil {
		return err
	}
	for name, t := range a.Targets {
		if err := check("target "+name+": ", t.Outlier, t.HealthCheck); err != nil {
			return err
		}
	}
	return nil
}

// Start takes the gRPC server of the listen address (opening it, or the
// one the previous config left), puts this config's policy point and
// snapshot in effect and keeps the snapshot up to date with the catalogue.
func (a *App) Start() error {
	var err error
	if a.server, err = acquireServer(a.Listen, a.logger); err != nil {
		return fmt.Errorf("molly_envoy: listen %s: %w", a.Listen, err)
	}
	a.server.srv.SetPolicyPoint(a.point)
	if err := a.update(); err != nil {
		return err
	}
	every := time.Duration(a.Refresh)
	if every <= 0 {
		every = DefaultRefresh
	}
	a.stop, a.done = make(chan struct{}), &sync.WaitGroup{}
	a.done.Add(1)
	go func() {
		defer a.done.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-a.stop:
				return
			case <-t.C:
				if err := a.update(); err != nil {
					a.logger.Error("xDS snapshot not updated", zap.Error(err))
				}
			}
		}
	}()
	a.logger.Info("serving Envoy", zap.String("listen", a.server.addr), zap.String("version", a.server.srv.ControlPlane().Version()))
	return nil
}

func (a *App) update() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := a.server.srv.ControlPlane().Update(ctx, a.molly.Catalogue(), a.cfg)
	if err != nil {
		return fmt.Errorf("molly_envoy: %w", err)
	}
	return nil
}

// Stop stops refreshing; the gRPC server keeps serving for the next config.
func (a *App) Stop() error {
	if a.stop != nil {
		close(a.stop)
		a.done.Wait()
		a.stop = nil
	}
	return nil
}

// Cleanup gives back the gRPC server; the last config using its address
// stops it.
func (a *App) Cleanup() error {
	if a.server == nil {
		return nil
	}
	_, err := servers.Delete(a.Listen)
	a.server = nil
	return err
}

// servers holds the gRPC servers by listen address, across config reloads
// (the new config provisions before the old one is cleaned up).
var servers = caddy.NewUsagePool()

type pooledServer struct {
	srv  *envoy.Server
	addr string
}

func (p *pooledServer) Destruct() error {
	p.srv.Stop(5 * time.Second)
	return nil
}

func acquireServer(listen string, log *zap.Logger) (*pooledServer, error) {
	v, _, err := servers.LoadOrNew(listen, func() (caddy.Destructor, error) {
		l, err := net.Listen("tcp", listen)
		if err != nil {
			return nil, err
		}
		srv := envoy.NewServer(envoy.NewControlPlane(log.Named("xds")))
		go func() {
			if err := srv.Serve(l); err != nil {
				log.Error("gRPC server", zap.Error(err))
			}
		}()
		return &pooledServer{srv: srv, addr: l.Addr().String()}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*pooledServer), nil
}

// Interface guards.
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
)
