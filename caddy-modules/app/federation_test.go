package app

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/molly-gateway/molly/learning/federation"
)

func TestCaddyfileFederation(t *testing.T) {
	d := caddyfile.NewTestDispenser(`molly {
		federation {
			role both
			aggregator https://agg.lan:8443
			listen :8443
			peers alice bob
			cert /etc/molly/fed.pem
			key /etc/molly/fed.key
			ca /etc/molly/ca.pem
			rounds 5m
			min_participants 2
			rank 4
			max_delta_size 64MiB
			dir /var/lib/molly/federation
			state /var/lib/molly/federation.json
			dp {
				clip 1
				noise_multiplier 1.1
				delta 1e-5
				epsilon_budget 8
			}
		}
	}`)
	v, err := parseGlobal(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	var a App
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &a); err != nil {
		t.Fatal(err)
	}
	want := federation.Config{Role: "both", Aggregator: "https://agg.lan:8443", Listen: ":8443", Peers: []string{"alice", "bob"},
		TLS:           federation.TLSFiles{Cert: "/etc/molly/fed.pem", Key: "/etc/molly/fed.key", CA: "/etc/molly/ca.pem"},
		RoundDeadline: 5 * time.Minute, MinParticipants: 2, Rank: 4, MaxDeltaBytes: 64 << 20,
		Dir: "/var/lib/molly/federation", StatePath: "/var/lib/molly/federation.json",
		DP: &federation.DP{Clip: 1, NoiseMultiplier: 1.1, Delta: 1e-5, EpsilonBudget: 8}}
	if a.Federation == nil || !reflect.DeepEqual(*a.Federation, want) {
		t.Fatalf("federation %+v\nwant %+v", a.Federation, want)
	}
}

func TestCaddyfileFederationErrors(t *testing.T) {
	certs := "cert c.pem\n key k.pem\n ca ca.pem\n"
	for _, tc := range []struct{ block, want string }{
		{"role observer\n" + certs, `role "observer" must be participant, aggregator or both`},
		{"role participant\n aggregator https://a:1\n", "cert, key and ca are required"},
		{"role participant\n" + certs, "a participant needs aggregator https://"},
		{"role participant\n aggregator http://a:1\n" + certs, "must be an https:// URL"},
		{"role aggregator\n listen :1\n dir d\n" + certs, "an aggregator needs peers"},
		{"role aggregator\n peers a b\n dir d\n" + certs, "an aggregator needs listen"},
		{"role aggregator\n listen :1\n peers a\n dir d\n min_participants 3\n" + certs, "min_participants 3 must be in 0..1"},
		{"role participant\n colour blue", `unknown setting "colour"`},
	} {
		d := caddyfile.NewTestDispenser("molly {\n federation {\n " + tc.block + "\n }\n}")
		if _, err := parseGlobal(d, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.block, err, tc.want)
		}
	}
}
