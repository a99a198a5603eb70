package federation

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestParseCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`federation {
		role both
		aggregator https://agg.lan:8443
		listen :8443
		peers alice bob
		peers carol
		cert c.pem
		key k.pem
		ca ca.pem
		rounds 90s
		min_participants 2
		rank 8
		max_delta_size 64MiB
		dir /var/lib/molly/federation
		dp {
			clip 1.5
			noise_multiplier 1.1
			epsilon_budget 8
		}
	}`)
	d.Next()
	c, err := ParseCaddyfile(d)
	if err != nil {
		t.Fatal(err)
	}
	if c.Role != RoleBoth || len(c.Peers) != 3 || c.Peers[2] != "carol" || c.RoundDeadline != 90*time.Second ||
		c.MinParticipants != 2 || c.Rank != 8 || c.MaxDeltaBytes != 64<<20 || c.DP == nil || c.DP.Clip != 1.5 ||
		c.DP.NoiseMultiplier != 1.1 || c.DP.EpsilonBudget != 8 || c.TLS.CA != "ca.pem" {
		t.Fatalf("parsed %+v dp %+v", c, c.DP)
	}
	block := func(lines ...string) string { return "federation {\n" + strings.Join(lines, "\n") + "\n}" }
	tlsLines := []string{"cert c", "key k", "ca a"}
	for in, want := range map[string]string{
		block("role judge"): "role",
		block(append(tlsLines, "role participant", "aggregator http://agg")...):                                             "https",
		block(append(tlsLines, "role aggregator", "listen :1", "dir d")...):                                                 "peers",
		block(append(tlsLines, "role participant", "aggregator https://a", "dp {", "clip 0", "noise_multiplier 1", "}")...): "clip",
		block("colour blue"):                              "unknown setting",
		block("role participant", "aggregator https://a"): "cert, key and ca",
	} {
		d := caddyfile.NewTestDispenser(in)
		d.Next()
		if _, err := ParseCaddyfile(d); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error naming %q", in, err, want)
		}
	}
}
