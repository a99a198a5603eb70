package federation

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/dustin/go-humanize"
)

// Roles of a Molly in a federation.
const (
	RoleParticipant = "participant"
	RoleAggregator  = "aggregator"
	RoleBoth        = "both"
)

// Config is the federation block of the molly app:
//
//	federation {
//		role participant|aggregator|both
//		aggregator https://agg.lan:8443   # participant: where to send
//		listen :8443                       # aggregator: where to serve
//		peers alice bob carol              # aggregator: allowed certificate names
//		cert /etc/molly/fed.pem
//		key  /etc/molly/fed.key
//		ca   /etc/molly/fed-ca.pem
//		rounds 10m                         # a round's deadline after its first report
//		min_participants 2
//		rank 8                             # re-factorisation rank (0: the deltas')
//		max_delta_size 256MiB
//		dir   /var/lib/molly/federation    # aggregates
//		state /var/lib/molly/federation.json
//		dp {
//			clip 1
//			noise_multiplier 1.1
//			delta 1e-5
//			epsilon_budget 8
//		}
//	}
type Config struct {
	Role            string        `json:"role"`
	Aggregator      string        `json:"aggregator,omitempty"`
	Listen          string        `json:"listen,omitempty"`
	Peers           []string      `json:"peers,omitempty"`
	TLS             TLSFiles      `json:"tls"`
	RoundDeadline   time.Duration `json:"round_deadline,omitempty"`
	MinParticipants int           `json:"min_participants,omitempty"`
	Rank            int           `json:"rank,omitempty"`
	MaxDeltaBytes   int           `json:"max_delta_bytes,omitempty"`
	Dir             string        `json:"dir,omitempty"`
	StatePath       string        `json:"state,omitempty"`
	DP              *DP           `json:"dp,omitempty"`
}

// Validate rejects impossible settings with a sentence naming the field.
func (c Config) Validate() error {
	agg := c.Role == RoleAggregator || c.Role == RoleBoth
	part := c.Role == RoleParticipant || c.Role == RoleBoth
	switch {
	case !agg && !part:
		return fmt.Errorf("federation: role %q must be participant, aggregator or both", c.Role)
	case c.TLS.Cert == "" || c.TLS.Key == "" || c.TLS.CA == "":
		return errors.New("federation: cert, key and ca are required (mutual TLS between peers)")
	case part && c.Aggregator == "":
		return errors.New("federation: a participant needs aggregator https://...")
	case agg && len(c.Peers) == 0:
		return errors.New("federation: an aggregator needs peers (the certificate names it accepts)")
	case agg && c.Listen == "":
		return errors.New("federation: an aggregator needs listen <address>")
	case agg && c.Dir == "":
		return errors.New("federation: an aggregator needs dir <folder> for aggregates")
	case c.MinParticipants < 0 || (agg && c.MinParticipants > len(c.Peers)):
		return fmt.Errorf("federation: min_participants %d must be in 0..%d (the peers)", c.MinParticipants, len(c.Peers))
	case c.Rank < 0 || c.MaxDeltaBytes < 0 || c.RoundDeadline < 0:
		return errors.New("federation: rank, max_delta_size and rounds must not be negative")
	}
	if part {
		if u, err := url.Parse(c.Aggregator); err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("federation: aggregator %q must be an https:// URL", c.Aggregator)
		}
	}
	if c.DP != nil {
		if err := c.DP.Validate(); err != nil {
			return fmt.Errorf("federation: %w", err)
		}
		if c.DP.EpsilonBudget < 0 {
			return errors.New("federation: dp epsilon_budget must not be negative")
		}
	}
	return nil
}

// AggregatorConfig is the aggregator part of c for base.
func (c Config) AggregatorConfig(base Base) AggregatorConfig {
	return AggregatorConfig{Base: base, Peers: c.Peers, MinParticipants: c.MinParticipants, Deadline: c.RoundDeadline,
		Rank: c.Rank, MaxDeltaBytes: c.MaxDeltaBytes, Dir: c.Dir}
}

// ParticipantConfig is the participant part of c.
func (c Config) ParticipantConfig() ParticipantConfig {
	return ParticipantConfig{Aggregator: c.Aggregator, TLS: c.TLS, DP: c.DP, StatePath: c.StatePath}
}

// Server is an HTTPS server of a's API on addr with mutual TLS from
// files (ServerTLS); run it with ListenAndServeTLS("", "").
func (a *Aggregator) Server(addr string, files TLSFiles) (*http.Server, error) {
	tc, err := ServerTLS(files)
	if err != nil {
		return nil, err
	}
	return &http.Server{Addr: addr, Handler: a.Handler(), TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second}, nil
}

// ParseCaddyfile reads a federation block (the dispenser at the
// "federation" token) into a Config and validates it.
func ParseCaddyfile(d *caddyfile.Dispenser) (Config, error) {
	var c Config
	if d.NextArg() {
		return c, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		key := d.Val()
		one := func() (string, error) {
			var v string
			if !d.AllArgs(&v) {
				return "", d.ArgErr()
			}
			return v, nil
		}
		var err error
		var v string
		switch key {
		case "role":
			c.Role, err = one()
		case "aggregator":
			c.Aggregator, err = one()
		case "listen":
			c.Listen, err = one()
		case "peers":
			c.Peers = append(c.Peers, d.RemainingArgs()...)
			if len(c.Peers) == 0 {
				err = d.ArgErr()
			}
		case "cert":
			c.TLS.Cert, err = one()
		case "key":
			c.TLS.Key, err = one()
		case "ca":
			c.TLS.CA, err = one()
		case "dir":
			c.Dir, err = one()
		case "state":
			c.StatePath, err = one()
		case "rounds", "round_deadline":
			if v, err = one(); err == nil {
				if c.RoundDeadline, err = time.ParseDuration(v); err != nil {
					err = d.Errf("%s: %v", key, err)
				}
			}
		case "min_participants", "rank":
			if v, err = one(); err == nil {
				n, perr := strconv.Atoi(v)
				if perr != nil {
					err = d.Errf("%s %q is not an integer", key, v)
				} else if key == "rank" {
					c.Rank = n
				} else {
					c.MinParticipants = n
				}
			}
		case "max_delta_size":
			if v, err = one(); err == nil {
				n, perr := humanize.ParseBytes(v)
				if perr != nil || n > 1<<40 {
					err = d.Errf("max_delta_size %q is not a size", v)
				}
				c.MaxDeltaBytes = int(n)
			}
		case "dp":
			c.DP = &DP{}
			for inner := d.Nesting(); d.NextBlock(inner); {
				k := d.Val()
				var s string
				if !d.AllArgs(&s) {
					return c, d.ArgErr()
				}
				f, perr := strconv.ParseFloat(s, 64)
				if perr != nil {
					return c, d.Errf("dp %s %q is not a number", k, s)
				}
				switch k {
				case "clip":
					c.DP.Clip = f
				case "noise_multiplier":
					c.DP.NoiseMultiplier = f
				case "delta":
					c.DP.Delta = f
				case "epsilon_budget":
					c.DP.EpsilonBudget = f
				default:
					return c, d.Errf("dp: unknown setting %q", k)
				}
			}
		default:
			return c, d.Errf("federation: unknown setting %q", key)
		}
		if err != nil {
			return c, err
		}
	}
	if err := c.Validate(); err != nil {
		return c, d.Err(err.Error())
	}
	return c, nil
}
