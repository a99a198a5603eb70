package envoy

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	classifymod "github.com/molly-gateway/molly/caddy-modules/classify"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("molly_envoy", parseGlobal)
}

// parseGlobal parses the global option:
//
//	molly_envoy {
//		listen <host:port>                 # gRPC: ADS and ext_proc, e.g. :18000
//		envoy_listen <host:port>           # Envoy's listener, default 0.0.0.0:10000
//		control_plane_cluster <name>       # the bootstrap's static cluster, default molly_control_plane
//		engine_address <host:port>         # this Molly's molly_serve site, the T0 cluster
//		buffered                           # BUFFERED body modes instead of FULL_DUPLEX_STREAMED
//		retries <n>                        # within a cluster, default 2; -1: none
//		refresh <duration>                 # re-read the catalogue, default 5s
//		outlier {
//			consecutive_5xx <n>
//			interval <duration>
//			base_ejection <duration>
//			max_ejection_percent <n>
//		}
//		health_check <path> {
//			interval <duration>
//			timeout <duration>
//			unhealthy <n>
//			healthy <n>
//		}
//		target <name> {                    # per target: outlier { … }, health_check <path> { … }
//			…
//		}
//		classify {                         # molly_classify's settings, for the policy point
//			…
//		}
//		auth [{
//			anonymous <member>
//		}]
//	}
func parseGlobal(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("molly_envoy: the global option may appear only once")
	}
	a := new(App)
	d.Next() // "molly_envoy"
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "listen", "envoy_listen", "control_plane_cluster", "engine_address":
			dst := map[string]*string{"listen": &a.Listen, "envoy_listen": &a.EnvoyListen, "control_plane_cluster": &a.ControlPlaneCluster,
				"engine_address": &a.EngineAddress}[d.Val()]
			if !d.AllArgs(dst) {
				return nil, d.ArgErr()
			}
		case "buffered":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			a.Buffered = true
		case "retries":
			n, err := intArg(d)
			if err != nil {
				return nil, err
			}
			a.Retries = n
		case "refresh":
			v, err := durationArg(d)
			if err != nil {
				return nil, err
			}
			a.Refresh = caddy.Duration(v)
		case "outlier":
			o, err := parseOutlier(d)
			if err != nil {
				return nil, err
			}
			a.Outlier = o
		case "health_check":
			h, err := parseHealthCheck(d)
			if err != nil {
				return nil, err
			}
			a.HealthCheck = h
		case "target":
			var name string
			if !d.Args(&name) {
				return nil, d.ArgErr()
			}
			var t TargetOptions
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				switch d.Val() {
				case "outlier":
					o, err := parseOutlier(d)
					if err != nil {
						return nil, err
					}
					t.Outlier = o
				case "health_check":
					h, err := parseHealthCheck(d)
					if err != nil {
						return nil, err
					}
					t.HealthCheck = h
				default:
					return nil, d.Errf("molly_envoy: target %s: unknown setting %q (outlier, health_check)", name, d.Val())
				}
			}
			if a.Targets == nil {
				a.Targets = map[string]TargetOptions{}
			}
			a.Targets[name] = t
		case "classify":
			c := new(classifymod.Classify)
			if err := c.UnmarshalCaddyfile(d.NewFromNextSegment()); err != nil {
				return nil, err
			}
			a.Classify = c
		case "auth":
			a.Auth = &Auth{}
			for nesting := d.Nesting(); d.NextBlock(nesting); {
				if d.Val() != "anonymous" || !d.AllArgs(&a.Auth.Anonymous) {
					return nil, d.Errf("molly_envoy: auth: want `anonymous <member>`, got %q", d.Val())
				}
			}
		default:
			return nil, d.Errf("molly_envoy: unknown setting %q", d.Val())
		}
	}
	return httpcaddyfile.App{Name: "molly_envoy", Value: caddyconfig.JSON(a, nil)}, nil
}

func parseOutlier(d *caddyfile.Dispenser) (*Outlier, error) {
	o := new(Outlier)
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "consecutive_5xx":
			o.Consecutive5xx, err = intArg(d)
		case "max_ejection_percent":
			o.MaxEjectionPercent, err = intArg(d)
		case "interval", "base_ejection":
			name := d.Val()
			var v time.Duration
			if v, err = durationArg(d); err == nil {
				if name == "interval" {
					o.Interval = caddy.Duration(v)
				} else {
					o.BaseEjection = caddy.Duration(v)
				}
			}
		default:
			return nil, d.Errf("molly_envoy: outlier: unknown setting %q (consecutive_5xx, interval, base_ejection, max_ejection_percent)", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return o, nil
}

func parseHealthCheck(d *caddyfile.Dispenser) (*HealthCheck, error) {
	h := new(HealthCheck)
	if !d.Args(&h.Path) {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch d.Val() {
		case "interval", "timeout":
			name := d.Val()
			var v time.Duration
			if v, err = durationArg(d); err == nil {
				if name == "interval" {
					h.Interval = caddy.Duration(v)
				} else {
					h.Timeout = caddy.Duration(v)
				}
			}
		case "unhealthy":
			h.Unhealthy, err = intArg(d)
		case "healthy":
			h.Healthy, err = intArg(d)
		default:
			return nil, d.Errf("molly_envoy: health_check: unknown setting %q (interval, timeout, unhealthy, healthy)", d.Val())
		}
		if err != nil {
			return nil, err
		}
	}
	return h, nil
}

func intArg(d *caddyfile.Dispenser) (int, error) {
	name := d.Val()
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, d.Errf("molly_envoy: %s %q is not a whole number", name, s)
	}
	return n, nil
}

func durationArg(d *caddyfile.Dispenser) (time.Duration, error) {
	name := d.Val()
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	v, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, d.Errf("molly_envoy: %s %q is not a duration such as 10s", name, s)
	}
	return v, nil
}
