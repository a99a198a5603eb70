package federation

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func apiCode(t *testing.T, err error) (int, string) {
	t.Helper()
	var ae *APIError
	if !errors.As(err, &ae) {
		t.Fatalf("want an aggregator error answer, got %v", err)
	}
	return ae.Status, ae.Code
}

func small(round uint64, samples int64) *Delta {
	return delta(round, samples, 4, 4, func(i int) float32 { return float32(i%5) / 10 }, "blk.0.attn_q.weight")
}

// TestRefusals: unknown peer, a peer of another CA, another base,
// malformed, oversized, mismatched, future and replayed deltas are each
// refused with their error; none joins the round.
func TestRefusals(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	fed := startFederation(t, AggregatorConfig{Base: testBase, Peers: []string{"alice", "bob"}, MinParticipants: 2,
		Deadline: time.Minute, MaxDeltaBytes: 4096, Logger: zap.New(core)})
	ctx := context.Background()
	alice, _ := fed.participant(t, "alice", nil, nil)
	bob, _ := fed.participant(t, "bob", nil, nil)

	// A certificate of the federation's CA whose name is not a peer.
	mallory, _ := fed.participant(t, "mallory", nil, nil)
	if _, err := mallory.Send(ctx, small(1, 5)); err == nil {
		t.Fatal("unknown peer accepted")
	} else if st, code := apiCode(t, err); st != http.StatusForbidden || code != "unknown_peer" {
		t.Fatalf("unknown peer: %d %s", st, code)
	}
	// A certificate named like a peer but from another CA: no handshake.
	impostor, _ := fed.participant(t, "alice", newPKI(t, "other CA"), nil)
	_, err := impostor.Send(ctx, small(1, 5))
	var ae *APIError
	if err == nil || errors.As(err, &ae) {
		t.Fatalf("a peer of another CA reached the handler: %v", err)
	}
	// No client certificate at all: the handshake fails too.
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mustPool(t, fed.pki)}}}
	if _, err := noCert.Get(fed.srv.URL + "/federation/v1/rounds/orders"); err == nil {
		t.Fatal("a client without a certificate was served")
	}

	other := small(1, 5)
	other.Base.Checksum = strings.Repeat("cd", 32)
	if _, err := alice.Send(ctx, other); err == nil {
		t.Fatal("other base accepted")
	} else if st, code := apiCode(t, err); st != http.StatusConflict || code != "other_base" {
		t.Fatalf("other base: %d %s", st, code)
	}
	big := delta(1, 5, 40, 40, func(int) float32 { return 1 }, "blk.0.attn_q.weight") // 6400 bytes > 4096
	if _, err := alice.Send(ctx, big); err == nil {
		t.Fatal("oversized accepted")
	} else if st, code := apiCode(t, err); st != http.StatusRequestEntityTooLarge || code != "delta_too_large" {
		t.Fatalf("oversized: %d %s", st, code)
	}
	if _, err := alice.Send(ctx, small(2, 5)); err == nil {
		t.Fatal("future round accepted")
	} else if st, code := apiCode(t, err); st != http.StatusConflict || code != "round_not_open" {
		t.Fatalf("future round: %d %s", st, code)
	}
	// Malformed bytes, posted raw.
	req, _ := http.NewRequest(http.MethodPost, fed.srv.URL+"/federation/v1/rounds/orders/1/deltas", bytes.NewReader([]byte("MOLLY-FED-DELTA-1\n\x05\x00\x00\x00{oops")))
	resp, err := alice.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("malformed: %d", resp.StatusCode)
	}
	if st := fed.agg.Current("orders"); st.Round != 1 || st.Reported != 0 {
		t.Fatalf("after refusals the round is %+v", st)
	}

	if _, err := alice.Send(ctx, small(1, 5)); err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Send(ctx, small(1, 5)); err == nil {
		t.Fatal("a second report from alice accepted")
	} else if st, code := apiCode(t, err); st != http.StatusConflict || code != "replayed_delta" {
		t.Fatalf("repeat: %d %s", st, code)
	}
	mism := delta(1, 5, 4, 4, func(int) float32 { return 1 }, "blk.1.attn_q.weight")
	if _, err := bob.Send(ctx, mism); err == nil {
		t.Fatal("mismatched delta accepted")
	} else if st, code := apiCode(t, err); st != http.StatusConflict || code != "delta_mismatch" {
		t.Fatalf("mismatch: %d %s", st, code)
	}
	if _, err := bob.Send(ctx, small(1, 15)); err != nil {
		t.Fatal(err)
	}
	// Both peers reported: the round closes without waiting for its deadline.
	agg, err := bob.Pull(ctx, "orders", 1, 30*time.Second, filepath.Join(t.TempDir(), "a.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if agg.Participants != 2 || agg.Samples != 20 {
		t.Fatalf("aggregate %+v", agg)
	}
	// Replaying a round-1 delta once round 2 is open.
	if _, err := alice.Send(ctx, small(1, 5)); err == nil {
		t.Fatal("replayed delta accepted")
	} else if st, code := apiCode(t, err); st != http.StatusConflict || code != "replayed_delta" {
		t.Fatalf("replay: %d %s", st, code)
	}
	if st := fed.agg.Current("orders"); st.Round != 2 || st.Reported != 0 {
		t.Fatalf("round 2 is %+v", st)
	}
	// An aggregator restarted on the same folder still knows round 1 closed.
	again, err := NewAggregator(AggregatorConfig{Base: testBase, Peers: []string{"alice", "bob"}, Dir: fed.agg.cfg.Dir})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := again.Submit("alice", "orders", 1, mustEncode(t, small(1, 5))); !errors.Is(err, ErrReplay) {
		t.Fatalf("after a restart a round-1 delta: %v, want ErrReplay", err)
	}
	if st := again.Current("orders"); st.Round != 2 {
		t.Fatalf("after a restart the open round is %d", st.Round)
	}
	// Every refusal that reached the handler was logged: unknown peer,
	// other base, oversized, future round, malformed, repeat, mismatch,
	// replay.
	if n := logs.FilterMessageSnippet("refused").Len(); n != 8 {
		for _, e := range logs.All() {
			t.Log(e.Message, e.ContextMap())
		}
		t.Fatalf("%d refusals logged, want 8", n)
	}
}

// TestDeadlineClosesWithoutDroppedPeer: of three peers two report and
// one never does; the round closes at its deadline with the two (≥
// min_participants). A round where only one reports fails at its
// deadline (410) and the next round opens.
func TestDeadlineClosesWithoutDroppedPeer(t *testing.T) {
	fed := startFederation(t, AggregatorConfig{Base: testBase, Peers: []string{"alice", "bob", "carol"}, MinParticipants: 2,
		Deadline: 300 * time.Millisecond})
	ctx := context.Background()
	alice, _ := fed.participant(t, "alice", nil, nil)
	bob, _ := fed.participant(t, "bob", nil, nil)
	for _, p := range []*Participant{alice, bob} {
		if _, err := p.Send(ctx, small(1, 5)); err != nil {
			t.Fatal(err)
		}
	}
	agg, err := alice.Pull(ctx, "orders", 1, 30*time.Second, filepath.Join(t.TempDir(), "a.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if agg.Participants != 2 || agg.Samples != 10 {
		t.Fatalf("aggregate %+v", agg)
	}
	if _, err := alice.Send(ctx, small(2, 5)); err != nil {
		t.Fatal(err)
	}
	_, err = alice.Pull(ctx, "orders", 2, 30*time.Second, filepath.Join(t.TempDir(), "b.gguf"))
	if st, code := apiCode(t, err); st != http.StatusGone || code != "round_failed" {
		t.Fatalf("round with one report: %d %s", st, code)
	}
	if st := fed.agg.Current("orders"); st.Round != 3 {
		t.Fatalf("after the failed round the open round is %d", st.Round)
	}
}

// TestBudgetStopsParticipation: with an ε budget that one release fits
// and two do not, the second Send is refused before any byte leaves.
func TestBudgetStopsParticipation(t *testing.T) {
	fed := startFederation(t, AggregatorConfig{Base: testBase, Peers: []string{"alice", "bob"}, Deadline: time.Minute})
	dp := &DP{Clip: 1, NoiseMultiplier: 2, Delta: 1e-5}
	var one Accountant
	one.Spend(*dp)
	e1, _ := one.Epsilon(1e-5)
	dp.EpsilonBudget = 1.3 * e1 // two releases take ε to about 1.47×ε₁ at σ = 2, δ = 1e-5
	alice, rec := fed.participant(t, "alice", nil, dp)
	ctx := context.Background()
	if _, err := alice.Send(ctx, small(1, 5)); err != nil {
		t.Fatal(err)
	}
	before := rec.sent.Len()
	if _, err := alice.Send(ctx, small(1, 5)); !errors.Is(err, ErrBudget) {
		t.Fatalf("second release: %v, want ErrBudget", err)
	}
	if rec.sent.Len() != before {
		t.Fatal("bytes left after the budget was spent")
	}
	st := alice.State()
	if st.Epsilon != e1 || len(st.Sent) != 1 || st.Accountant.Rounds != 1 {
		t.Fatalf("state %+v", st)
	}
	saved, err := ReadState(alice.cfg.StatePath)
	if err != nil || saved.Epsilon != e1 {
		t.Fatalf("saved state %+v %v", saved, err)
	}
}

func mustPool(t *testing.T, p *pki) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(p.cert)
	return pool
}

// TestStatusShowsSpentEpsilon: the status text carries the accountant's
// ε and the budget left, read back from the state file.
func TestStatusShowsSpentEpsilon(t *testing.T) {
	fed := startFederation(t, AggregatorConfig{Base: testBase, Peers: []string{"alice", "bob"}, Deadline: time.Minute})
	dp := &DP{Clip: 1, NoiseMultiplier: 1, Delta: 1e-5, EpsilonBudget: 100}
	alice, _ := fed.participant(t, "alice", nil, dp)
	if _, err := alice.Send(context.Background(), small(1, 5)); err != nil {
		t.Fatal(err)
	}
	st, err := ReadState(alice.cfg.StatePath)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := st.WriteStatus(&b); err != nil {
		t.Fatal(err)
	}
	// One release at σ=1: ρ = 2, ε = 2 + 2√(2·ln 10⁵) ≈ 11.6 (closed form).
	want := 2 + 2*math.Sqrt(2*math.Log(1e5))
	if math.Abs(st.Epsilon-want) > 0.02*want {
		t.Fatalf("ε %g, closed form %g", st.Epsilon, want)
	}
	out := b.String()
	for _, s := range []string{fmt.Sprintf("ε spent %.4g at δ=1e-05 over 1 releases", st.Epsilon), fmt.Sprintf("%.4g left", 100-st.Epsilon), "orders"} {
		if !strings.Contains(out, s) {
			t.Errorf("status lacks %q:\n%s", s, out)
		}
	}
}

func mustEncode(t *testing.T, d *Delta) []byte {
	t.Helper()
	b, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestUnroutedAnswersOpenAIErrors: a path the API does not have is 404
// and a method its path does not serve is 405 with Allow, both in
// OpenAI's error JSON (the mux's own answers are plain text).
func TestUnroutedAnswersOpenAIErrors(t *testing.T) {
	fed := startFederation(t, AggregatorConfig{Base: testBase, Peers: []string{"alice"}, MinParticipants: 1,
		Deadline: time.Minute, MaxDeltaBytes: 4096})
	c := fed.client(t, "alice")
	for _, tc := range []struct {
		name, method, path string
		status             int
		code, allow        string
	}{
		{"an unknown path is 404", http.MethodGet, "/federation/v1/nothing", http.StatusNotFound, "not_found", ""},
		{"DELETE on a round is 405 naming GET", http.MethodDelete, "/federation/v1/rounds/orders", http.StatusMethodNotAllowed, "method_not_supported", "GET"},
		{"GET on deltas is 405 naming POST", http.MethodGet, "/federation/v1/rounds/orders/1/deltas", http.StatusMethodNotAllowed, "method_not_supported", "POST"},
		{"POST on an aggregate is 405 naming GET", http.MethodPost, "/federation/v1/rounds/orders/1/aggregate", http.StatusMethodNotAllowed, "method_not_supported", "GET"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, fed.srv.URL+tc.path, nil)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error map[string]any `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatalf("%d body is not JSON: %v", resp.StatusCode, err)
			}
			if resp.StatusCode != tc.status || body.Error["code"] != tc.code || resp.Header.Get("Allow") != tc.allow {
				t.Fatalf("got %d %v Allow %q, want %d %s Allow %q", resp.StatusCode, body.Error, resp.Header.Get("Allow"), tc.status, tc.code, tc.allow)
			}
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := body.Error[k]; !ok {
					t.Fatalf("error object lacks %q: %v", k, body.Error)
				}
			}
		})
	}
}

// TestDeltaPostedToAnotherRoundIsRefused: a delta whose header names
// round 1 of orders, posted to round 2 or to another domain's path, is
// 400 round_mismatch and joins no round.
func TestDeltaPostedToAnotherRoundIsRefused(t *testing.T) {
	fed := startFederation(t, AggregatorConfig{Base: testBase, Peers: []string{"alice", "bob"}, MinParticipants: 2,
		Deadline: time.Minute, MaxDeltaBytes: 4096})
	c := fed.client(t, "alice")
	body := mustEncode(t, small(1, 5))
	for _, path := range []string{"/federation/v1/rounds/orders/2/deltas", "/federation/v1/rounds/billing/1/deltas"} {
		resp, err := c.Post(fed.srv.URL+path, "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.Error.Code != "round_mismatch" {
			t.Fatalf("%s: got %d %q, want 400 round_mismatch", path, resp.StatusCode, e.Error.Code)
		}
	}
	if st := fed.agg.Current("orders"); st.Reported != 0 {
		t.Fatalf("a mis-posted delta joined round %d: %v", st.Round, st.Reported)
	}
	if st := fed.agg.Current("billing"); st.Reported != 0 {
		t.Fatalf("a mis-posted delta joined billing: %v", st.Reported)
	}
}
