package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/internal/pgtest"
	"github.com/molly-gateway/molly/serving"
)

// mollyBin is the real binary, built once for the package's tests.
var mollyBin string

func TestMain(m *testing.M) {
	if os.Getenv(attackerEnv) != "" {
		// A helper process of TestAnotherLocalUserCannotUseTheAdminEndpoint,
		// run as another OS user: it builds nothing.
		os.Exit(m.Run())
	}
	if addr := os.Getenv(benchUpstreamEnv); addr != "" {
		serveStaticUpstream(addr) // BenchmarkGateway's upstream process
	}
	dir, err := os.MkdirTemp("", "molly-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mollyBin = filepath.Join(dir, "molly")
	build := exec.Command("go", "build", "-o", mollyBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building molly:", err)
		os.Exit(1)
	}
	code := m.Run()
	pgtest.Stop() // the PostgreSQL cluster of the registry tests, if one started
	os.RemoveAll(dir)
	os.Exit(code)
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// adminSocket returns "unix/<path>" for an admin socket in a fresh short
// folder (socket paths are limited to about 104 bytes, test folders can
// be longer), removed after the test.
func adminSocket(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return "unix/" + filepath.Join(dir, "admin.sock")
}

// adminHTTP returns a client and base URL for an admin address:
// "unix/<path>" dials the socket, anything else is http://<address>.
func adminHTTP(addr string) (*http.Client, string) {
	path, ok := strings.CutPrefix(addr, "unix/")
	if !ok {
		return http.DefaultClient, "http://" + strings.TrimPrefix(addr, "http://")
	}
	path, _, _ = strings.Cut(path, "|")
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}, "http://127.0.0.1"
}

// syncBuffer collects the process's log output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// gateway is a running molly process.
type gateway struct {
	URL    string // base URL ending in /v1
	Config string // the config file it runs
	cmd    *exec.Cmd
	logs   *syncBuffer
}

// startMolly writes caddyfile (with {PORT} replaced) and runs `molly run` on
// it, waiting until it serves. The process is killed at the end of the test.
func startMolly(t testing.TB, caddyfile string) *gateway {
	t.Helper()
	return startMollyEnv(t, caddyfile, nil)
}

// t3Key is the upstream key of the tiers' external target
// (tiers.caddyfile's api_key_env MOLLY_TEST_T3_KEY), set for every molly
// process: a target whose variable is unset is never routed to.
const t3Key = "sk-upstream-secret-t3"

// startMollyEnv is startMolly with env added to the process's environment
// (after the defaults, so it wins).
func startMollyEnv(t testing.TB, caddyfile string, env []string) *gateway {
	t.Helper()
	return startMollyConfig(t, caddyfile, "caddyfile", env)
}

// startMollyConfig is startMollyEnv for a config in the named adapter's
// format ("caddyfile" or "json").
func startMollyConfig(t testing.TB, config, adapter string, env []string) *gateway {
	t.Helper()
	port := freePort(t)
	cfg := filepath.Join(t.TempDir(), "Caddyfile")
	if adapter == "json" {
		cfg = filepath.Join(filepath.Dir(cfg), "caddy.json")
	}
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(config, "{PORT}", fmt.Sprint(port))), 0o644); err != nil {
		t.Fatal(err)
	}
	g := &gateway{URL: fmt.Sprintf("http://127.0.0.1:%d/v1", port), Config: cfg, logs: &syncBuffer{}}
	args := []string{"run", "--config", cfg}
	if adapter != "json" {
		args = append(args, "--adapter", adapter)
	}
	g.cmd = exec.Command(mollyBin, args...)
	g.cmd.Stdout, g.cmd.Stderr = g.logs, g.logs
	g.cmd.Env = append(append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir(),
		"MOLLY_TEST_T3_KEY="+t3Key), env...)
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = g.cmd.Process.Kill()
		_ = g.cmd.Wait()
		if t.Failed() {
			t.Logf("molly logs:\n%s", g.logs.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.URL+"/models", nil)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			return g
		}
		if g.cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("molly did not start serving; logs:\n%s", g.logs.String())
	return nil
}

// startEngineMolly starts molly with the demo model of size (generated in a
// temporary folder) as its only target: T0 "device" serving "chat", two
// sequences of nCtx/2 cells, one thread. extra goes into the global options.
func startEngineMolly(t *testing.T, size string, nCtx int, extra string) *gateway {
	t.Helper()
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, size); err != nil {
		t.Fatal(err)
	}
	return startMolly(t, `{
	`+extra+`
	auto_https off
	persist_config off
	molly {
		engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			n_seq_max 2
			n_ctx `+fmt.Sprint(nCtx)+`
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
}

// alive reports whether the process is still running.
func (g *gateway) alive() bool {
	return g.cmd.Process.Signal(syscallZero()) == nil
}

// waitLogs reports whether the process's logs match re within 5 s: some
// lines (route decisions, cascades) are written after the answer is sent.
func (g *gateway) waitLogs(re *regexp.Regexp) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if re.MatchString(g.logs.String()) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
