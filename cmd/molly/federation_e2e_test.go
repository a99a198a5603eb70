package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
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

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/serving"
)

// fedPKI is the federation's test CA: it signs one certificate per peer,
// named by a DNS SAN and the common name, for 127.0.0.1.
type fedPKI struct {
	dir  string
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	ca   string
	n    int64
}

func newFedPKI(t *testing.T) *fedPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "federation test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	p := &fedPKI{dir: t.TempDir(), key: key, cert: cert, n: 1}
	p.ca = filepath.Join(p.dir, "ca.pem")
	writeFedPEM(t, p.ca, "CERTIFICATE", der)
	return p
}

func writeFedPEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue writes name's certificate and key; it returns the lines of a
// federation block naming them and the CA.
func (p *fedPKI) issue(t *testing.T, name string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p.n++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.n), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert, keyFile := filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+".key")
	writeFedPEM(t, cert, "CERTIFICATE", der)
	writeFedPEM(t, keyFile, "EC PRIVATE KEY", kd)
	return fmt.Sprintf("\t\t\tcert %s\n\t\t\tkey %s\n\t\t\tca %s\n", cert, keyFile, p.ca)
}

// withFederation puts a federation block (and fewer training steps and
// traces) into specialiseCaddyfile's molly app.
func withFederation(caddyfile, block string) string {
	caddyfile = strings.Replace(caddyfile, "\t\tspecialise {", "\t\tfederation {\n"+block+"\t\t}\n\t\tspecialise {", 1)
	caddyfile = strings.Replace(caddyfile, "min_traces 30", "min_traces 20", 1)
	caddyfile = strings.Replace(caddyfile, "learning_rate 0.02", "learning_rate 0.02\n\t\t\tmargin 0.01", 1)
	return strings.Replace(caddyfile, "steps 40", "steps 20", 1)
}

// mollyRun is mollyCmd for goroutines: it returns the error.
func mollyRun(admin string, args ...string) (string, error) {
	cmd := exec.Command(mollyBin, append(args, "--address", admin)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("molly %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), nil
}

// The differential privacy of participant p2.
const (
	dpClip  = 0.05
	dpSigma = 4.0
	dpDelta = 1e-5
)

type federatedDomain struct {
	Domain       string `json:"domain"`
	Contributed  string `json:"contributed"`
	Round        uint64 `json:"round"`
	Samples      int64  `json:"samples"`
	Participants int    `json:"participants"`
	TotalSamples int64  `json:"total_samples"`
	Version      string `json:"version"`
	Promoted     bool   `json:"promoted"`
	Reason       string `json:"reason"`
	Skipped      string `json:"skipped"`
	Error        string `json:"error"`
}

// TestFederationRoundAcrossThreeMollys: one aggregator Molly and two
// participant Mollys on loopback, each a real binary, mutual TLS with
// certificates of a test CA. Each participant traces its own slice of one
// domain (math), runs a specialisation cycle, which contributes its
// adapter's delta; the round closes with both; `molly federation run
// --once` reports the aggregate each adopted through its gate, and each
// registry holds a version of source "federated" with a verdict. The
// aggregator logs the round closing with the two participants.
func TestFederationRoundAcrossThreeMollys(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: three Mollys train and federate")
	}
	testStart := time.Now()
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(models, serving.DemoModelFile)
	pki := newFedPKI(t)
	fedAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))

	// The aggregator: the same base (deltas are pinned to it), no loop.
	aggState := t.TempDir()
	aggAdmin := adminSocket(t)
	aggBlock := "\t\t\trole aggregator\n\t\t\tlisten " + fedAddr + "\n\t\t\tpeers p1 p2\n" + pki.issue(t, "aggregator") +
		"\t\t\tmin_participants 2\n\t\t\trounds 20s\n\t\t\trank 4\n\t\t\tdir " + filepath.Join(aggState, "federation") + "\n"
	aggCfg := `{
	admin ` + aggAdmin + `|0600
	auto_https off
	persist_config off
	molly {
		registry ` + filepath.Join(aggState, "molly.db") + `
		engine {
			model ` + base + `
			adapters ` + t.TempDir() + `
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
			latency 50ms
			quality 0.05
		}
		federation {
` + aggBlock + `		}
	}
}
http://127.0.0.1:{PORT} {
	handle {
		molly_classify
		molly_policy
		molly_route
	}
}
`
	// A participant without the specialise loop has nothing to contribute.
	bad := filepath.Join(t.TempDir(), "Caddyfile")
	noLoop := strings.Replace(strings.Replace(aggCfg, "role aggregator", "role participant\n\t\t\taggregator https://"+fedAddr, 1),
		"registry "+filepath.Join(aggState, "molly.db"), "registry "+filepath.Join(t.TempDir(), "molly.db"), 1)
	if err := os.WriteFile(bad, []byte(strings.ReplaceAll(noLoop, "{PORT}", "9")), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(mollyBin, "validate", "--config", bad, "--adapter", "caddyfile")
	cmd.Env = mollyEnv(t)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "add a specialise block") {
		t.Fatalf("validate of a participant without the loop: %v\n%s", err, out)
	}

	agg := startMolly(t, aggCfg)
	if !agg.waitLogs(regexp.MustCompile(`federation aggregator serving`)) {
		t.Fatalf("the aggregator did not log its listener")
	}

	type participant struct {
		name, admin string
		g           *gateway
		config      func(admin, dp string) string
		state       string // the registry's folder
	}
	teacher := upstreamtest.Start("t1")
	teacher.Answer = solve
	t.Cleanup(teacher.Close)
	var ps []participant
	for _, name := range []string{"p1", "p2"} {
		state := t.TempDir()
		admin := adminSocket(t)
		block := "\t\t\trole participant\n\t\t\taggregator https://" + fedAddr + "\n" + pki.issue(t, name)
		dir := t.TempDir()
		config := func(admin, dp string) string {
			return withFederation(specialiseCaddyfile(admin, filepath.Join(state, "molly.db"), base, dir, teacher.URL()), block+dp)
		}
		ps = append(ps, participant{name: name, admin: admin, g: startMolly(t, config(admin, "")), config: config, state: state})
	}

	// Each participant's consented traffic is its own slice of the domain.
	const slice = 30
	ctx := context.Background()
	for k, p := range ps {
		c := client(p.g)
		for i := k * slice; i < (k+1)*slice; i++ {
			_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(24),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(mathProblem(i))}},
				option.WithHeader("X-Molly-Trace", "on"))
			if err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the condition
			_, body := adminCall(t, p.admin, http.MethodGet, "/molly/traces", nil)
			var trs []struct{ Category string }
			_ = json.Unmarshal([]byte(body), &trs)
			if len(trs) >= slice {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d traces, want %d", p.name, len(trs), slice)
			}
		}
	}

	// A cycle on each trains an adapter of math; the cycle hands the
	// domain to the federation, which contributes in the background.
	for _, p := range ps {
		out, _ := mollyCmd(t, p.admin, "specialise", "run", "--once")
		var rep cycleReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Domains) != 1 || rep.Domains[0].Version == "" {
			t.Fatalf("%s: cycle report %s (%v)", p.name, out, err)
		}
	}

	// `molly federation run --once` on both at once: each returns when the
	// round its delta joined closed and the aggregate went through its gate.
	outs := make([]string, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for k, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[k], errs[k] = mollyRun(p.admin, "federation", "run", "--once")
		}()
	}
	wg.Wait()
	for k, p := range ps {
		if errs[k] != nil {
			t.Fatal(errs[k])
		}
		var got []federatedDomain
		if err := json.Unmarshal([]byte(outs[k]), &got); err != nil || len(got) != 1 {
			t.Fatalf("%s: federation run %s (%v)", p.name, outs[k], err)
		}
		d := got[0]
		t.Logf("%s: round %d, %d participants, %d of %d samples, aggregate %.12s promoted=%v: %s",
			p.name, d.Round, d.Participants, d.Samples, d.TotalSamples, d.Version, d.Promoted, d.Reason)
		if d.Domain != "math" || d.Error != "" || d.Skipped != "" || d.Round != 1 || d.Participants != 2 || d.Version == "" || d.Reason == "" {
			t.Fatalf("%s: federated %+v", p.name, d)
		}
		if d.Samples <= 0 || d.TotalSamples <= d.Samples {
			t.Fatalf("%s: %d samples of %d in the aggregate; want a share of both participants'", p.name, d.Samples, d.TotalSamples)
		}

		// The registry (not the run's answer) holds the federated version
		// with the gate's verdict, and the history names it.
		code, body := adminCall(t, p.admin, http.MethodGet, "/molly/adapter-versions", nil)
		var entries []struct {
			Name     string
			Serving  string
			Versions []struct{ Version, Source, Verdict string }
			History  []struct{ Version, Action, Reason string }
		}
		if err := json.Unmarshal([]byte(body), &entries); code != http.StatusOK || err != nil {
			t.Fatalf("%s: adapter versions %d %s", p.name, code, body)
		}
		found := false
		for _, e := range entries {
			for _, v := range e.Versions {
				if e.Name == "math" && v.Source == "federated" && v.Version == d.Version {
					want := map[bool]string{true: "promoted", false: "refused"}[d.Promoted]
					if v.Verdict != want {
						t.Fatalf("%s: federated version verdict %q, the run said %q", p.name, v.Verdict, want)
					}
					if d.Promoted != (e.Serving == d.Version) {
						t.Fatalf("%s: math serves %.12s; promoted=%v for the aggregate %.12s", p.name, e.Serving, d.Promoted, d.Version)
					}
					found = true
				}
			}
			for _, h := range e.History {
				if h.Version == d.Version && !strings.HasPrefix(h.Reason, "federated: ") {
					t.Fatalf("%s: history %+v", p.name, h)
				}
			}
		}
		if !found {
			t.Fatalf("%s: no federated version %.12s of math in %s", p.name, d.Version, body)
		}

		// A promoted aggregate is what the engine serves under the domain's
		// alias: the answer's fingerprint is the aggregate's file hash.
		if d.Promoted {
			answer, err := client(p.g).Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "molly-demo:math", MaxTokens: openai.Int(2),
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(mathProblem(1000))}})
			if err != nil || answer.SystemFingerprint != "sha256:"+d.Version {
				t.Fatalf("%s: after adopting %.12s, molly-demo:math answered: %v, version %+v", p.name, d.Version, err, answer)
			}
		}

		// The status names the delta sent, read through the admin socket.
		st, _ := mollyCmd(t, p.admin, "federation", "status")
		if !strings.Contains(st, "role: participant") || !strings.Contains(st, "deltas sent: 1") || !strings.Contains(st, "no noised release") {
			t.Fatalf("%s: status\n%s", p.name, st)
		}
	}
	if !agg.waitLogs(regexp.MustCompile(`federation round aggregated.*"domain": ?"math".*"round": ?1.*"participants": ?\["p1","p2"\]`)) {
		t.Fatalf("the aggregator did not log round 1 of math closing with p1 and p2")
	}

	t.Logf("round 1 done at %v", time.Since(testStart).Round(time.Millisecond))
	// p2 restarts with differential privacy and 20 new traces: its next
	// cycle's delta is clipped and noised before it leaves, and round 2,
	// which p1 does not join, closes at its deadline with too few reports.
	p2 := &ps[1]
	if err := p2.g.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p2.g.cmd.Wait()
	p2.admin = adminSocket(t)
	p2.g = startMolly(t, p2.config(p2.admin, fmt.Sprintf("\t\t\tdp {\n\t\t\t\tclip %g\n\t\t\t\tnoise_multiplier %g\n\t\t\t\tdelta %g\n\t\t\t}\n", dpClip, dpSigma, dpDelta)))
	for i := 2 * slice; i < 2*slice+20; i++ {
		if _, err := client(p2.g).Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(24),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(mathProblem(i))}}, option.WithHeader("X-Molly-Trace", "on")); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the condition
		_, body := adminCall(t, p2.admin, http.MethodGet, "/molly/traces", nil)
		var trs []struct{ Category string }
		_ = json.Unmarshal([]byte(body), &trs)
		if len(trs) >= slice+20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("p2: %d traces, want %d", len(trs), slice+20)
		}
	}
	out, _ := mollyCmd(t, p2.admin, "specialise", "run", "--once")
	var rep cycleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Domains) != 1 || rep.Domains[0].Version == "" {
		t.Fatalf("p2: second cycle report %s (%v)", out, err)
	}
	// The cycle contributed in the background; its run shows in the status
	// once round 2 closed at the aggregator's deadline.
	var second federatedDomain
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) { // polling the condition
		code, body := adminCall(t, p2.admin, http.MethodGet, "/molly/federation/status", nil)
		var st struct{ Runs []federatedDomain }
		if err := json.Unmarshal([]byte(body), &st); code != http.StatusOK || err != nil {
			t.Fatalf("p2: federation status %d %s", code, body)
		}
		if len(st.Runs) == 1 && st.Runs[0].Round == 2 {
			second = st.Runs[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("p2: no run of round 2 in the status: %s", body)
		}
	}
	if d := second; d.Contributed != rep.Domains[0].Version || !strings.Contains(d.Error, "too few participants") || d.Version != "" {
		t.Fatalf("p2: round 2 %+v; want it closed with too few participants and nothing adopted", d)
	}
	if !agg.waitLogs(regexp.MustCompile(`federation round failed.*"round": ?2.*too few participants: 1 reported, 2 needed`)) {
		t.Fatalf("the aggregator did not log round 2 failing with one report")
	}

	// p2's ε, read through the admin socket, is the Gaussian mechanism's
	// RDP bound converted at its best order: sensitivity 2C, noise σC, so
	// RDP(α) = 2α/σ² and ε = min over α of 2α/σ² + ln(1/δ)/(α−1)
	// = 2/σ² + 2·sqrt(2·ln(1/δ))/σ (Mironov 2017, Propositions 3 and 7),
	// which the accountant's grid of orders approaches within 1%.
	st, _ := mollyCmd(t, p2.admin, "federation", "status", "--json")
	var dpStatus struct {
		State struct {
			Epsilon float64 `json:"epsilon"`
			Delta   float64 `json:"delta"`
			Sent    []struct{ Round uint64 }
		} `json:"state"`
	}
	if err := json.Unmarshal([]byte(st), &dpStatus); err != nil {
		t.Fatalf("p2 status %s: %v", st, err)
	}
	wantEps := 2/(dpSigma*dpSigma) + 2*math.Sqrt(2*math.Log(1/dpDelta))/dpSigma
	t.Logf("p2: ε %.4f at δ %g after one noised release (closed form %.4f)", dpStatus.State.Epsilon, dpStatus.State.Delta, wantEps)
	if math.Abs(dpStatus.State.Epsilon-wantEps) > 0.01*wantEps || dpStatus.State.Delta != dpDelta || len(dpStatus.State.Sent) != 2 {
		t.Fatalf("p2 status %s; want ε %.4f at δ %g and two deltas sent", st, wantEps, dpDelta)
	}
	// Offline, the state file says the same.
	cmd = exec.Command(mollyBin, "federation", "status", "--state", filepath.Join(p2.state, "specialise", "federation-state.json"))
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), fmt.Sprintf("ε spent %.4g at δ=1e-05 over 1 releases", dpStatus.State.Epsilon)) ||
		!strings.Contains(string(out), "deltas sent: 2") {
		t.Fatalf("federation status --state: %v\n%s", err, out)
	}
	st, _ = mollyCmd(t, aggAdmin, "federation", "status")
	if !strings.Contains(st, "role: aggregator") || !strings.Contains(st, fedAddr) {
		t.Fatalf("aggregator status\n%s", st)
	}

	// A reload of the aggregator keeps serving on the same address, and
	// its round counter: math's open round is now 3. A certificate of the
	// same CA whose name is not a peer is refused.
	reloaded := filepath.Join(t.TempDir(), "Caddyfile")
	port := strings.TrimSuffix(strings.TrimPrefix(agg.URL, "http://127.0.0.1:"), "/v1")
	if err := os.WriteFile(reloaded, []byte(strings.ReplaceAll(aggCfg, "{PORT}", port)), 0o644); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	mollyCmd(t, aggAdmin, "reload", "--config", reloaded, "--adapter", "caddyfile", "--force")
	t.Logf("the aggregator reloaded in %v", time.Since(began).Round(time.Millisecond))
	pki.issue(t, "mallory")
	for name, want := range map[string]int{"p1": http.StatusOK, "mallory": http.StatusForbidden} {
		cert, err := tls.LoadX509KeyPair(filepath.Join(pki.dir, name+".pem"), filepath.Join(pki.dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(pki.cert)
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots}}}
		resp, err := hc.Get("https://" + fedAddr + "/federation/v1/rounds/math")
		if err != nil {
			t.Fatalf("%s after the reload: %v", name, err)
		}
		var round struct{ Round uint64 }
		_ = json.NewDecoder(resp.Body).Decode(&round)
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusOK && round.Round != 3) {
			t.Fatalf("%s after the reload: %d, round %d; want %d (round 3)", name, resp.StatusCode, round.Round, want)
		}
	}
}
