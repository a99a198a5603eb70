package app

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/router/health"
)

// provisionHealth builds the targets' outlier detection: each target's
// outlier_detection over the app's over health's defaults; its state is
// exported to the config's metrics registry.
func (a *App) provisionHealth(ctx caddy.Context) (*health.Tracker, error) {
	base := health.Config{}
	if a.OutlierDetection != nil {
		base = *a.OutlierDetection
	}
	cfg := make(map[string]health.Config, len(a.Targets))
	for _, t := range a.Targets {
		c := base
		if t.OutlierDetection != nil {
			c = t.OutlierDetection.Merge(base)
		}
		cfg[t.Name] = c
	}
	tr, err := health.New(cfg, health.Options{})
	if err != nil {
		return nil, err
	}
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := reg.Register(tr.Collector()); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return tr, nil
}

// parseOutlierDetection reads `outlier_detection off` or a block of
// health.Config's knobs (durations as Caddy durations, the rest integers).
func parseOutlierDetection(d *caddyfile.Dispenser) (*health.Config, error) {
	c := &health.Config{}
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return nil, d.Errf("molly: outlier_detection takes a block or off, not %q", d.Val())
		}
		c.Disabled = true
		return c, nil
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		switch sub {
		case "interval", "base_ejection_time", "max_ejection_time", "latency_threshold":
			dur, err := durationArg(d)
			if err != nil {
				return nil, err
			}
			*map[string]*health.Duration{"interval": &c.Interval, "base_ejection_time": &c.BaseEjectionTime,
				"max_ejection_time": &c.MaxEjectionTime, "latency_threshold": &c.LatencyThreshold}[sub] = health.Duration(dur)
		case "consecutive_5xx", "max_ejection_percent", "failure_percentage_threshold", "failure_percentage_request_volume":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return nil, d.Errf("molly: outlier_detection %s %q: want a positive integer", sub, s)
			}
			*map[string]*int{"consecutive_5xx": &c.Consecutive5xx, "max_ejection_percent": &c.MaxEjectionPercent,
				"failure_percentage_threshold": &c.FailurePercentageThreshold, "failure_percentage_request_volume": &c.FailurePercentageRequestVolume}[sub] = n
		default:
			return nil, d.Errf("molly: outlier_detection: unrecognized subdirective %q", sub)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, d.Errf("molly: %v", err)
	}
	return c, nil
}

// TargetsAdmin is the admin API module admin.api.molly_targets:
//
//	GET /molly/targets   every target with its circuit: [{"target", "tier", "kind", "state" (closed|open|half_open),
//	                     "consecutive_failures", "interval_attempts", "interval_failures", "ejections",
//	                     "ejected_at", "until", "reason", "last_failure", "ejections_total": {reason: n},
//	                     "excluded" (why routing never picks it, e.g. its API key is not set; absent otherwise)}]
//
// Like every Molly admin route it answers only on the Unix socket or the
// mutual-TLS remote admin endpoint (admin.Guard).
type TargetsAdmin struct{}

func init() { caddy.RegisterModule(TargetsAdmin{}) }

// CaddyModule returns the Caddy module information.
func (TargetsAdmin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_targets", New: func() caddy.Module { return new(TargetsAdmin) }}
}

// Routes returns the admin routes.
func (TargetsAdmin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{{Pattern: "/molly/targets", Handler: admin.Guard(caddy.AdminHandlerFunc(serveTargets))}}
}

type targetStatus struct {
	health.Status
	Tier string `json:"tier"`
	Kind string `json:"kind"`
	// Excluded, when set, is why routing never picks the target whatever
	// its circuit (its API key is not set).
	Excluded string `json:"excluded,omitempty"`
}

func serveTargets(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return admin.MethodNotAllowed(r, http.MethodGet)
	}
	cur := Current()
	if cur == nil || cur.pipeline == nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("no molly app is running")}
	}
	byName := map[string]health.Status{}
	for _, s := range cur.pipeline.Health.Snapshot() {
		byName[s.Target] = s
	}
	out := []targetStatus{}
	for _, t := range cur.catalogue.Targets() {
		s, ok := byName[t.Name]
		if !ok {
			s = health.Status{Target: t.Name, State: health.StateClosed, EjectionsTotal: map[string]uint64{}}
		}
		st := targetStatus{Status: s, Tier: t.Tier, Kind: kindName(t.Kind)}
		if why := t.MissingKey(); why != "" {
			st.Excluded = "no API key: " + why // as routing's X-Molly-Route says it
		}
		out = append(out, st)
	}
	return writeJSON(w, http.StatusOK, out)
}

func kindName(k string) string {
	if k == "" {
		return "openai"
	}
	return k
}

// Interface guard.
var _ caddy.AdminRouter = TargetsAdmin{}
