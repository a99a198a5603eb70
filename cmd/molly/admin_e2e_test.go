package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// attackerEnv carries the admin socket to the helper process that plays
// another local user (TestAdminAttackerHelper).
const attackerEnv = "MOLLY_ADMIN_ATTACKER_SOCKET"

// attackSiteEnv carries the gateway's own base URL to the helper.
const attackSiteEnv = "MOLLY_ADMIN_ATTACKER_SITE"

// nobody is the unprivileged user the attacker runs as.
const nobodyUID, nobodyGID = 65534, 65534

var (
	pluginsOnce sync.Once
	pluginsDir  string
	pluginsErr  error
)

// pluginBin builds the tool plugins once for the package's tests and
// returns the path and SHA-256 of the named one.
func pluginBin(t *testing.T, name string) (path, sum string) {
	t.Helper()
	pluginsOnce.Do(func() {
		pluginsDir, pluginsErr = os.MkdirTemp("", "molly-plugins-")
		if pluginsErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", pluginsDir+string(filepath.Separator), "../../plugins/payments", "../../plugins/billing").CombinedOutput()
		if err != nil {
			pluginsErr = fmt.Errorf("building the plugins: %v\n%s", err, out)
		}
	})
	if pluginsErr != nil {
		t.Fatal(pluginsErr)
	}
	path = filepath.Join(pluginsDir, name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(b)
	return path, hex.EncodeToString(s[:])
}

// attacks are what another local user tries on the admin endpoint: each
// of the abusive actions as one admin API request.
var attacks = []struct{ name, method, path, body string }{
	{"mint a key for alice", "POST", "/molly/keys", `{"member":"alice","name":"stolen"}`},
	{"raise alice's budget", "POST", "/molly/members", `{"name":"alice","budget_usd":1000}`},
	{"create a payment intent as alice", "POST", "/molly/tools/payments",
		`{"member":"alice","scopes":["tool:payments"],"arguments":{"op":"create_intent","amount":99900,"currency":"USD","customer":"mallory"},"idempotency_key":"mallory-1"}`},
	{"forge an invoice line", "POST", "/molly/tools/billing",
		`{"member":"molly-gateway","idempotency_key":"forged-1","arguments":{"op":"record_usage","decision_id":"forged-1","member":"bob","model":"chat","tier":"T1","target":"lan","prompt_tokens":1,"completion_tokens":1,"cost_nano_usd":5000000000}}`},
	{"read alice's invoice", "POST", "/molly/tools/billing", `{"member":"auditor","arguments":{"op":"usage","member":"alice"}}`},
	{"read usage and members", "GET", "/molly/usage", ""},
	{"read the whole config", "GET", "/config/", ""},
	{"read pprof data", "GET", "/debug/pprof/heap", ""},
	{"load another config", "POST", "/load", `{"admin":{"listen":"0.0.0.0:2019"}}`},
	{"probe /etc/shadow through an adapter upload", "POST", "/molly/adapters", `{"name":"x","path":"/etc/shadow"}`},
	{"list the targets", "GET", "/molly/targets", ""},
	{"stop the gateway", "POST", "/stop", ""},
}

// TestAdminAttackerHelper is the other local user: it tries every attack
// on the admin socket, on localhost:2019 and on the gateway's own port,
// printing one line "ATTACK\t<where>\t<name>\t<outcome>" each. It runs only
// as the helper process of TestAnotherLocalUserCannotUseTheAdminEndpoint.
func TestAdminAttackerHelper(t *testing.T) {
	sock := os.Getenv(attackerEnv)
	if sock == "" {
		t.Skip("the helper process of TestAnotherLocalUserCannotUseTheAdminEndpoint: runs only with " + attackerEnv + " set")
	}
	try := func(where string, c *http.Client, base string) {
		for _, a := range attacks {
			var body io.Reader
			if a.body != "" {
				body = strings.NewReader(a.body)
			}
			req, _ := http.NewRequest(a.method, base+a.path, body)
			req.Header.Set("Content-Type", "application/json")
			outcome := ""
			resp, err := c.Do(req)
			if err != nil {
				outcome = "refused: " + err.Error()
			} else {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
				resp.Body.Close()
				outcome = fmt.Sprintf("answered %d %q", resp.StatusCode, b)
			}
			fmt.Printf("ATTACK\t%s\t%s\t%s\n", where, a.name, outcome)
		}
	}
	c, base := adminHTTP("unix/" + sock)
	c.Timeout = 5 * time.Second
	try("socket", c, base)
	try("tcp", &http.Client{Timeout: 5 * time.Second}, "http://localhost:2019")
	try("site", &http.Client{Timeout: 5 * time.Second}, os.Getenv(attackSiteEnv))
}

// TestAnotherLocalUserCannotUseTheAdminEndpoint runs the gateway as root
// with Molly's default admin endpoint and plays another local user
// (nobody, uid 65534) against it: minting a key, raising a budget,
// creating a payment intent, forging an invoice line, reading invoices,
// usage, the config and pprof data, loading a config, probing files
// through an adapter upload and POST /stop are all refused — by the
// socket's mode alone (its folders are opened up for the test), nothing
// listens on localhost:2019, and the gateway's port has no admin routes.
// Afterwards the registry, the billing and payments ledgers are as before
// and the gateway still serves; the same requests from the owner succeed.
// A config with a plaintext TCP admin address is refused by validate and
// run, and binds nothing.
func TestAnotherLocalUserCannotUseTheAdminEndpoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to run a helper process as the unprivileged user nobody (uid 65534)")
	}
	billing, billingSum := pluginBin(t, "billing")
	payments, paymentsSum := pluginBin(t, "payments")
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	data, err := os.MkdirTemp("", "mad")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	ledgers := t.TempDir()
	g := startMollyEnv(t, `{
	auto_https off
	persist_config off
	molly {
		tool billing {
			path `+billing+`
			sha256 `+billingSum+`
			env MOLLY_BILLING_DB `+filepath.Join(ledgers, "billing.db")+`
		}
		tool payments {
			path `+payments+`
			sha256 `+paymentsSum+`
			env MOLLY_PAYMENTS_DB `+filepath.Join(ledgers, "payments.db")+`
		}
		usage_tool billing
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
			price 10 10
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_auth {
		anonymous guest
	}
	molly_classify
	molly_policy
	molly_route
}
`, []string{"XDG_DATA_HOME=" + data})

	sock := filepath.Join(data, "caddy", "molly", "admin.sock")
	admin := "unix/" + sock
	for path, want := range map[string]os.FileMode{sock: 0o600, filepath.Dir(sock): 0o700} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatalf("Molly's default admin endpoint: %v", err)
		}
		if st.Mode().Perm() != want {
			t.Fatalf("%s has mode %04o, want %04o", path, st.Mode().Perm(), want)
		}
	}
	if st, _ := os.Stat(sock); st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s is not a socket", sock)
	}
	if c, err := net.DialTimeout("tcp", "localhost:2019", time.Second); err == nil {
		c.Close()
		t.Fatal("something listens on localhost:2019")
	}
	// Only the socket's own mode stands in the way from here on.
	for _, d := range []string{data, filepath.Join(data, "caddy"), filepath.Dir(sock)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}

	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "alice", "budget_usd": 0.01}); code != http.StatusCreated {
		t.Fatalf("creating alice: %d %s", code, body)
	}
	if _, err := client(g).Chat.Completions.New(t.Context(), chat("Hello billing")); err != nil {
		t.Fatal(err)
	}
	before := ledgerState(t, admin)

	// The attacker: this test binary and the molly binary, where nobody
	// may run them.
	bin, err := os.MkdirTemp("", "mattack")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	self, _ := os.Executable()
	for _, f := range []string{self, mollyBin} {
		if err := copyExecutable(f, filepath.Join(bin, filepath.Base(f))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	asNobody := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = bin
		cmd.Env = []string{"HOME=" + bin, "PATH=/usr/bin:/bin", attackerEnv + "=" + sock, attackSiteEnv + "=" + strings.TrimSuffix(g.URL, "/v1")}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobodyUID, Gid: nobodyGID}}
		return cmd
	}
	out, err := asNobody(filepath.Base(self), "-test.run=^TestAdminAttackerHelper$", "-test.v").CombinedOutput()
	if err != nil {
		t.Fatalf("the attacker: %v\n%s", err, out)
	}
	seen := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 4)
		if len(f) != 4 || f[0] != "ATTACK" {
			continue
		}
		where, name, outcome := f[1], f[2], f[3]
		seen[where]++
		switch where {
		case "socket":
			if !strings.HasPrefix(outcome, "refused") || !strings.Contains(outcome, "permission denied") {
				t.Errorf("as nobody on the admin socket, %q: %s", name, outcome)
			}
		case "tcp":
			if !strings.HasPrefix(outcome, "refused") || !strings.Contains(outcome, "connection refused") {
				t.Errorf("as nobody on localhost:2019, %q: %s", name, outcome)
			}
		case "site":
			if strings.HasPrefix(outcome, "answered 2") || strings.HasPrefix(outcome, "refused") {
				t.Errorf("as nobody on the gateway's port, %q: %s", name, outcome)
			}
		}
		t.Logf("%-6s %-45s %s", where, name, outcome)
	}
	if seen["socket"] != len(attacks) || seen["tcp"] != len(attacks) || seen["site"] != len(attacks) {
		t.Fatalf("the attacker reported %v, want %d attacks in each place:\n%s", seen, len(attacks), out)
	}
	// Molly's own commands, as nobody, fare no better.
	for _, args := range [][]string{
		{"keys", "create", "--member", "alice"},
		{"keys", "member", "alice", "--budget", "1000"},
		{"adapters", "add", "x", "/etc/shadow"},
		{"targets"},
		{"stop"},
	} {
		out, err := asNobody(filepath.Base(mollyBin), append(args, "--address", admin)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "permission denied") {
			t.Errorf("molly %s as nobody: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	if !g.alive() {
		t.Fatal("the gateway stopped")
	}
	if after := ledgerState(t, admin); after != before {
		t.Fatalf("the attacks changed the ledgers:\nbefore %s\nafter  %s", before, after)
	}
	// The owner is served: the refusals above are the socket's permissions.
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/keys", map[string]string{"member": "alice"}); code != http.StatusCreated {
		t.Fatalf("the owner minting a key: %d %s", code, body)
	}
	if code, _ := adminCall(t, admin, http.MethodGet, "/config/", nil); code != http.StatusOK {
		t.Fatalf("the owner reading the config: %d", code)
	}
	// Molly's commands find the default socket as the gateway made it,
	// with no --address (the same data directory).
	for _, args := range [][]string{{"keys", "list", "--member", "alice"}, {"targets"}, {"adapters", "list"}} {
		cmd := exec.Command(mollyBin, args...)
		cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+data)
		out, err := cmd.CombinedOutput()
		want := map[string]string{"keys": "alice", "targets": "lan", "adapters": "no molly engine is running"}[args[0]]
		if args[0] != "adapters" && err != nil || !strings.Contains(string(out), want) {
			t.Errorf("molly %s without --address: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	// Even the owner cannot move the admin endpoint onto TCP at run time.
	port := freePort(t)
	code, body := adminCall(t, admin, http.MethodPost, "/load", map[string]any{"admin": map[string]any{"listen": fmt.Sprintf("127.0.0.1:%d", port)}})
	if code < 400 || !strings.Contains(body, "is plaintext tcp") {
		t.Fatalf("POST /load with a TCP admin address: %d %s", code, body)
	}
	if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
		c.Close()
		t.Fatal("POST /load bound the refused admin address")
	}
	if _, err := client(g).Chat.Completions.New(t.Context(), chat("still here")); err != nil {
		t.Fatalf("after the refused load: %v", err)
	}
	if code, _ := adminCall(t, admin, http.MethodGet, "/molly/targets", nil); code != http.StatusOK {
		t.Fatalf("the admin socket after the refused load: %d", code)
	}

	t.Run("a plaintext TCP admin address is refused at validation and binds nothing", func(t *testing.T) {
		port := freePort(t)
		cfg := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(cfg, []byte("{\n\tadmin 127.0.0.1:"+fmt.Sprint(port)+"\n\tauto_https off\n}\nhttp://127.0.0.1:"+fmt.Sprint(freePort(t))+" {\n\tmolly_classify\n\tmolly_policy\n\tmolly_route\n}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		env := append(os.Environ(), "XDG_DATA_HOME="+t.TempDir(), "HOME="+t.TempDir())
		for _, verb := range []string{"validate", "run"} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			cmd := exec.CommandContext(ctx, mollyBin, verb, "--config", cfg, "--adapter", "caddyfile")
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			cancel()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || !strings.Contains(string(out), "is plaintext tcp, which any local user can reach") {
				t.Fatalf("molly %s with admin 127.0.0.1:%d: %v\n%s", verb, port, err, out)
			}
		}
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			t.Fatal("the refused admin address was bound")
		}
	})
}

// ledgerState is what the attacks would change, read by the owner: the
// members with their budgets, the keys, alice's and bob's billing lines
// and the payment balances.
func ledgerState(t *testing.T, admin string) string {
	t.Helper()
	month := time.Now().UTC().Format("2006-01")
	var parts []string
	for _, q := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/molly/members", nil},
		{"GET", "/molly/keys", nil},
		{"POST", "/molly/tools/billing", map[string]any{"member": "auditor", "arguments": map[string]any{"op": "usage", "member": "alice", "month": month}}},
		{"POST", "/molly/tools/billing", map[string]any{"member": "auditor", "arguments": map[string]any{"op": "usage", "member": "bob", "month": month}}},
		{"POST", "/molly/tools/payments", map[string]any{"member": "auditor", "arguments": map[string]any{"op": "balances"}}},
	} {
		code, body := adminCall(t, admin, q.method, q.path, q.body)
		if code != 200 {
			t.Fatalf("%s %s: %d %s", q.method, q.path, code, body)
		}
		var v any
		if err := json.Unmarshal([]byte(body), &v); err != nil {
			t.Fatalf("%s %s: %v", q.method, q.path, err)
		}
		b, _ := json.Marshal(v)
		parts = append(parts, string(b))
	}
	return strings.Join(parts, "\n")
}

func copyExecutable(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// clientCert is a self-signed client certificate for Caddy's remote admin.
type clientCert struct {
	tls tls.Certificate
	b64 string // base64 DER, as admin.remote.access_control.public_keys wants it
}

func newClientCert(t *testing.T, name string) clientCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return clientCert{tls: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, b64: base64.StdEncoding.EncodeToString(der)}
}

// TestRemoteAdminNeedsAnIdentityAndFollowsItsPermissions: the only way to
// manage Molly over TCP is Caddy's remote admin endpoint. Without a client
// certificate it listed, the TLS handshake fails; an operator identity
// allowed GET on /molly/targets and /molly/usage gets those and 403 for
// minting keys, calling money tools, the config, pprof and POST /stop;
// an identity without restrictions reads the config.
func TestRemoteAdminNeedsAnIdentityAndFollowsItsPermissions(t *testing.T) {
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	ops, owner, mallory := newClientCert(t, "ops"), newClientCert(t, "owner"), newClientCert(t, "mallory")
	data := t.TempDir()
	remote := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	sock := adminSocket(t)
	cfg := `{
  "admin": {
    "listen": "` + sock + `|0600",
    "identity": {"identifiers": ["127.0.0.1"], "issuers": [{"module": "internal"}]},
    "remote": {"listen": "` + remote + `", "access_control": [
      {"public_keys": ["` + ops.b64 + `"], "permissions": [{"paths": ["/molly/targets", "/molly/usage"], "methods": ["GET"]}]},
      {"public_keys": ["` + owner.b64 + `"]}
    ]}
  },
  "apps": {
    "molly": {"targets": [{"name": "lan", "tier": "T1", "endpoint": "` + lan.URL() + `", "models": ["chat=small-lan"]}]},
    "http": {"servers": {"srv0": {"listen": ["127.0.0.1:{PORT}"], "automatic_https": {"disable": true},
      "routes": [{"handle": [{"handler": "molly_classify"}, {"handler": "molly_policy"}, {"handler": "molly_route"}]}]}}}
  }
}`
	g := startMollyConfig(t, cfg, "json", []string{"XDG_DATA_HOME=" + data})

	// The server's identity comes from Caddy's internal CA, in the data dir.
	roots := x509.NewCertPool()
	rootFile := filepath.Join(data, "caddy", "pki", "authorities", "local", "root.crt")
	as := func(c *clientCert) *http.Client {
		tc := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
		if c != nil {
			tc.Certificates = []tls.Certificate{c.tls}
		}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	do := func(c *http.Client, method, path string) (int, error) {
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader(`{"member":"alice"}`)
		}
		req, _ := http.NewRequest(method, "https://"+remote+path, body)
		req.Header.Set("Content-Type", "application/json")
		resp, err := c.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if pem, err := os.ReadFile(rootFile); err == nil && roots.AppendCertsFromPEM(pem) {
			if code, err := do(as(&owner), http.MethodGet, "/molly/targets"); err == nil && code == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the remote admin endpoint did not come up with its identity; logs:\n%s", g.logs.String())
		}
	}
	for _, tc := range []struct {
		who          string
		c            *http.Client
		method, path string
		want         int // 0: the handshake fails
	}{
		{"no certificate", as(nil), "GET", "/molly/targets", 0},
		{"an unknown certificate", as(&mallory), "GET", "/molly/targets", 0},
		{"an unknown certificate", as(&mallory), "POST", "/stop", 0},
		{"ops", as(&ops), "GET", "/molly/targets", 200},
		{"ops", as(&ops), "POST", "/molly/keys", 403},
		{"ops", as(&ops), "POST", "/molly/members", 403},
		{"ops", as(&ops), "POST", "/molly/tools/payments", 403},
		{"ops", as(&ops), "POST", "/molly/targets", 403},
		{"ops", as(&ops), "GET", "/config/", 403},
		{"ops", as(&ops), "GET", "/debug/pprof/heap", 403},
		{"ops", as(&ops), "POST", "/load", 403},
		{"ops", as(&ops), "POST", "/stop", 403},
		// An unknown Molly path: the access control first, then the 404.
		{"ops", as(&ops), "GET", "/molly/nope", 403},
		{"owner", as(&owner), "GET", "/molly/nope", 404},
		{"owner", as(&owner), "GET", "/config/", 200},
	} {
		code, err := do(tc.c, tc.method, tc.path)
		if tc.want == 0 {
			if err == nil {
				t.Errorf("%s: %s %s answered %d, want a refused handshake", tc.who, tc.method, tc.path, code)
			}
			continue
		}
		if err != nil || code != tc.want {
			t.Errorf("%s: %s %s = %d, %v; want %d", tc.who, tc.method, tc.path, code, err, tc.want)
		}
	}
	if !g.alive() {
		t.Fatal("the gateway stopped")
	}
}

// TestReloadAndStopRefuseATCPAdminAddress: `molly reload` and `molly stop`
// with a config whose admin address is plaintext TCP refuse before sending
// anything: a server that answers there (here, one that records what it
// gets) is not a Molly and must not receive the config.
func TestReloadAndStopRefuseATCPAdminAddress(t *testing.T) {
	var got atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got.Add(1) }))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	cfg := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(cfg, []byte("{\n\tadmin "+host+"\n}\n:0 {\n\trespond ok\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"reload", "--config", cfg}, {"reload", "-c", cfg, "--force"}, {"stop", "--config", cfg}, {"reload", "--config", cfg, "--address", host}} {
		cmd := exec.Command(mollyBin, args...)
		cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "XDG_DATA_HOME="+t.TempDir())
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "is not a Unix socket") {
			t.Errorf("molly %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if n := got.Load(); n != 0 {
		t.Fatalf("the TCP admin address received %d requests", n)
	}
}

// TestAnInheritedTCPSocketIsRefusedAsTheAdminEndpoint: socket activation
// (admin fd/3) hands the gateway a listener it did not bind; when that is a
// TCP socket, the admin endpoint would be as open as localhost:2019, so
// `molly run` refuses the config (and no admin request is answered on it),
// while an inherited Unix socket is accepted.
func TestAnInheritedTCPSocketIsRefusedAsTheAdminEndpoint(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tcpFile, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer tcpFile.Close()
	ul, err := net.Listen("unix", filepath.Join(strings.TrimPrefix(adminSocket(t), "unix/")))
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	unixFile, err := ul.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer unixFile.Close()
	run := func(f *os.File) (*exec.Cmd, *syncBuffer, int) {
		port := freePort(t)
		cfg := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(cfg, []byte("{\n\tadmin fd/3\n\tauto_https off\n\tpersist_config off\n}\nhttp://127.0.0.1:"+fmt.Sprint(port)+" {\n\tmolly_classify\n\tmolly_policy\n\tmolly_route\n}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		logs := &syncBuffer{}
		cmd := exec.Command(mollyBin, "run", "--config", cfg, "--adapter", "caddyfile")
		cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+t.TempDir(), "HOME="+t.TempDir())
		cmd.ExtraFiles = []*os.File{f}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, logs, port
	}
	// TCP: refused; the process exits without answering on the socket.
	cmd, logs, _ := run(tcpFile)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(logs.String(), "inherited TCP socket") {
			t.Fatalf("molly run with an inherited TCP admin socket: %v\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		resp, err := http.Get("http://" + l.Addr().String() + "/config/")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("molly serves its admin endpoint on the inherited TCP socket: GET /config/ = %d %s", resp.StatusCode, b)
		}
		t.Fatalf("molly run with an inherited TCP admin socket neither exited nor answered: %v\n%s", err, logs.String())
	}
	// Unix: accepted, and the gateway serves.
	_, logs, port := run(unixFile)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/models", port))
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("molly run with an inherited Unix admin socket does not serve:\n%s", logs.String())
		}
	}
}
