package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateNamesDirectiveAndLine checks that `molly validate` rejects bad
// Molly configuration with a message naming the directive and the line.
func TestValidateNamesDirectiveAndLine(t *testing.T) {
	cases := []struct {
		name, caddyfile string
		want            []string
	}{
		{"an unknown molly_classify setting", "http://127.0.0.1:9 {\n\tmolly_classify {\n\t\tmax_body_size 1MiB\n\t\tsensitivty EMAIL public\n\t}\n\tmolly_policy\n\tmolly_route\n}\n",
			[]string{"molly_classify", `sensitivty`, "Caddyfile:4"}},
		{"a bad sensitivity class", "http://127.0.0.1:9 {\n\tmolly_classify {\n\t\tsensitivity EMAIL secretish\n\t}\n}\n",
			[]string{"molly_classify", "secretish", "Caddyfile:3"}},
		{"arguments to molly_route", "http://127.0.0.1:9 {\n\tmolly_route somewhere\n}\n",
			[]string{"molly_route", "Caddyfile:2"}},
		{"a target with an unknown tier", "{\n\tmolly {\n\t\ttarget x {\n\t\t\ttier T7\n\t\t\tendpoint http://127.0.0.1:1/v1\n\t\t\tmodels m\n\t\t}\n\t}\n}\nhttp://127.0.0.1:9 {\n\tmolly_route\n}\n",
			[]string{"molly", "target x", "tier", "T7", "Caddyfile:4"}},
		{"a target without models", "{\n\tmolly {\n\t\ttarget x {\n\t\t\ttier T1\n\t\t\tendpoint http://127.0.0.1:1/v1\n\t\t}\n\t}\n}\n",
			[]string{"molly", "target x", "models", "Caddyfile:3"}},
		{"a bad price", "{\n\tmolly {\n\t\ttarget x {\n\t\t\ttier T1\n\t\t\tprice cheap 1\n\t\t}\n\t}\n}\n",
			[]string{"molly", "target x", "price", "Caddyfile:5"}},
		{"draft_with_engine without an engine", "{\n\tmolly {\n\t\ttarget x {\n\t\t\ttier T1\n\t\t\tendpoint http://127.0.0.1:1/v1\n\t\t\tmodels m\n\t\t\tdraft_with_engine\n\t\t}\n\t}\n}\n",
			[]string{"molly", "target x", "draft_with_engine needs the molly app's engine"}},
		{"draft_with_engine on an external API", "{\n\tmolly {\n\t\ttarget x {\n\t\t\ttier T3\n\t\t\tendpoint http://127.0.0.1:1/v1\n\t\t\tmodels m\n\t\t\tdraft_with_engine\n\t\t}\n\t}\n}\n",
			[]string{"molly", "target x", "draft_with_engine", "T1 or T2", "Caddyfile:3"}},
		{"an unknown global subdirective", "{\n\tmolly {\n\t\tpolicy_dri x\n\t}\n}\n",
			[]string{"molly", `policy_dri`, "Caddyfile:3"}},
		{"a cascade threshold above zero", "{\n\tmolly {\n\t\tcascade {\n\t\t\tthreshold 0.5\n\t\t}\n\t}\n}\n",
			[]string{"molly", "cascade", "threshold 0.5", "Caddyfile:4"}},
		{"a console without members", "http://127.0.0.1:9 {\n\thandle /console* {\n\t\tmolly_console\n\t}\n}\n",
			[]string{"molly_console", "members", "Caddyfile:3"}},
		{"a mixture of one", "{\n\tmolly {\n\t\tmixture {\n\t\t\tentropy 0.6\n\t\t\tk 1\n\t\t}\n\t}\n}\n",
			[]string{"molly", "mixture", "k must be", "Caddyfile:5"}},
		{"a federation participant without an aggregator", "{\n\tmolly {\n\t\tfederation {\n\t\t\trole participant\n\t\t\tcert c.pem\n\t\t\tkey k.pem\n\t\t\tca ca.pem\n\t\t}\n\t}\n}\n",
			[]string{"molly", "federation", "a participant needs aggregator https://", "Caddyfile:"}},
		{"a federation without the engine its deltas are pinned to", "{\n\tmolly {\n\t\tfederation {\n\t\t\trole participant\n\t\t\taggregator https://127.0.0.1:1\n\t\t\tcert c.pem\n\t\t\tkey k.pem\n\t\t\tca ca.pem\n\t\t}\n\t}\n}\n",
			[]string{"molly", "federation", "configure an engine"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(cfg, []byte(tc.caddyfile), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(mollyBin, "validate", "--config", cfg, "--adapter", "caddyfile")
			cmd.Env = mollyEnv(t) // provisioning opens the registry under the data directory: not the user's
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("validate accepted:\n%s", tc.caddyfile)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

// TestHelpNamesMolly: help and usage lines name the binary the user ran.
func TestHelpNamesMolly(t *testing.T) {
	for _, args := range [][]string{{"keys", "--help"}, {"keys", "create", "--help"}, {"help"}} {
		out, err := exec.Command(mollyBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("molly %v: %v\n%s", args, err, out)
		}
		want := "molly " + args[0]
		if args[0] == "help" {
			want = "molly [command]"
		}
		if !strings.Contains(string(out), want) || strings.Contains(string(out), "caddy "+args[0]) {
			t.Fatalf("molly %v: want %q, no %q:\n%s", args, want, "caddy "+args[0], out)
		}
	}
}

// TestValidateRefusesATCPAdminAddressWithoutMollysApp: `molly validate`
// refuses a plaintext TCP admin address, as `molly run` does, also in a
// config with no Molly module (where no molly app is provisioned to check
// it), and accepts the same config on a private socket or with the admin
// endpoint off.
func TestValidateRefusesATCPAdminAddressWithoutMollysApp(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name, admin string
		refused     bool
	}{
		{"plaintext TCP", "admin 127.0.0.1:9", true},
		{"every interface", "admin :9", true},
		{"a socket every user may write to", "admin unix/" + filepath.Join(dir, "a.sock") + "|0666", true},
		{"a private socket", "admin unix/" + filepath.Join(dir, "b.sock") + "|0600", false},
		{"no admin endpoint", "admin off", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(cfg, []byte("{\n\t"+tc.admin+"\n}\nhttp://127.0.0.1:9 {\n\trespond ok\n}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(mollyBin, "validate", "--config", cfg, "--adapter", "caddyfile")
			cmd.Env = mollyEnv(t)
			out, err := cmd.CombinedOutput()
			if tc.refused {
				if err == nil || !strings.Contains(string(out), "molly validate: admin:") || strings.Contains(string(out), "Valid configuration") {
					t.Fatalf("validate with %q: %v\n%s", tc.admin, err, out)
				}
				return
			}
			if err != nil || !strings.Contains(string(out), "Valid configuration") {
				t.Fatalf("validate with %q: %v\n%s", tc.admin, err, out)
			}
		})
	}
}
