package federation

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/registry"
)

var peers = []string{"alice", "bob", "carol"}

// runRound sends every participant's local adapter into round 1 and
// pulls the aggregate; the aggregator scores it on the union of the
// held-out probes and publishes it in its own store.
func runRound(t *testing.T, f *fixture, dp *DP) (Aggregate, Result, []*Participant, []*recorder) {
	t.Helper()
	reg, err := registry.Open(filepath.Join(t.TempDir(), "aggregator.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	store := &adapters.Store{Registry: reg, Dir: t.TempDir(), Base: adapters.Base{Checksum: f.base.Checksum, Quant: f.base.Quant}}
	fed := startFederation(t, AggregatorConfig{Base: f.base, Peers: peers, MinParticipants: 2, Deadline: time.Minute,
		Evaluator: f.ev, Probes: map[string][]lora.Example{"orders": f.union}, Store: store})
	ctx := context.Background()
	var ps []*Participant
	var recs []*recorder
	for i, name := range peers {
		p, rec := fed.participant(t, name, nil, dp)
		st, err := p.Contribute(ctx, Contribution{Domain: "orders", Adapter: f.local[i], Samples: f.samples[i], Base: f.base})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.Round != 1 || st.Reported != i+1 {
			t.Fatalf("%s: round %+v", name, st)
		}
		ps, recs = append(ps, p), append(recs, rec)
	}
	agg, err := ps[0].Pull(ctx, "orders", 1, 30*time.Second, filepath.Join(t.TempDir(), "aggregate.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if agg.Participants != 3 || agg.Samples != f.samples[0]+f.samples[1]+f.samples[2] {
		t.Fatalf("aggregate of %d participants, %d samples", agg.Participants, agg.Samples)
	}
	res, ok := fed.agg.Result("orders", 1, nil)
	if !ok || res.Err() != nil {
		t.Fatalf("round result %+v", res)
	}
	v, err := reg.AdapterVersion(ctx, res.Version)
	if err != nil || v.Name != "orders" || v.Source != "federated" {
		t.Fatalf("aggregate version %+v: %v", v, err)
	}
	return agg, res, ps, recs
}

// TestFederatedRoundBeatsLocalAdapters: three participants, each with a
// different slice of one synthetic domain, train locally; one FedAvg
// round gives an adapter whose llama.cpp NLL on the union of their
// held-out probes is lower than each participant's own adapter's. With
// DP on it reports ε and the NLL cost of the noise.
func TestFederatedRoundBeatsLocalAdapters(t *testing.T) {
	f := getFixture(t)
	base, err := f.ev.NLL("", f.union, false)
	if err != nil {
		t.Fatal(err)
	}
	var own []float64
	for i, p := range f.localPath {
		s, err := f.ev.NLL(p, f.union, false)
		if err != nil {
			t.Fatal(err)
		}
		own = append(own, s.NLL)
		t.Logf("%s's own adapter: union held-out NLL %.4f (base %.4f)", peers[i], s.NLL, base.NLL)
	}
	agg, res, _, _ := runRound(t, f, nil)
	fed, err := f.ev.NLL(agg.Path, f.union, false)
	if err != nil {
		t.Fatal(err)
	}
	// The file pulled is the one the aggregator scored on its probes.
	if math.Abs(res.ProbeNLL-fed.NLL) > 1e-6 {
		t.Errorf("aggregator's probe NLL %.6f, the pulled file's %.6f", res.ProbeNLL, fed.NLL)
	}
	t.Logf("FedAvg aggregate (rank %d, energy kept %.3f): union held-out NLL %.4f", agg.Rank, agg.EnergyKept, fed.NLL)
	for i, o := range own {
		if !(fed.NLL < o) {
			t.Errorf("aggregate NLL %.4f is not below %s's own %.4f", fed.NLL, peers[i], o)
		}
	}
	if !(fed.NLL < base.NLL) {
		t.Errorf("aggregate NLL %.4f is not below the base's %.4f", fed.NLL, base.NLL)
	}

	t.Run("dp", func(t *testing.T) {
		// Clip at the largest local update's norm so that clipping leaves
		// the updates as they are and the cost measured is the noise's.
		var clip float64
		for i, a := range f.local {
			d, err := FromAdapter(a, 1, "orders", f.base, f.samples[i])
			if err != nil {
				t.Fatal(err)
			}
			clip = max(clip, d.Norm())
		}
		for _, sigma := range []float64{0.002, 0.01} {
			dp := &DP{Clip: clip, NoiseMultiplier: sigma, Delta: 1e-5}
			agg, _, ps, _ := runRound(t, f, dp)
			noisy, err := f.ev.NLL(agg.Path, f.union, false)
			if err != nil {
				t.Fatal(err)
			}
			st := ps[0].State()
			// Oracle: one Gaussian release of sensitivity 2C and standard
			// deviation σC has ρ = 2/σ² zCDP-like RDP slope; the continuous
			// optimum of Mironov's conversion is ρ + 2√(ρ·ln(1/δ)).
			rho := 2 / (sigma * sigma)
			want := rho + 2*sqrt(rho*ln(1/dp.Delta))
			if st.Epsilon < want || st.Epsilon > want*1.02 {
				t.Errorf("σ=%g: ε %.4g, the closed form gives %.4g", sigma, st.Epsilon, want)
			}
			t.Logf("DP σ=%g C=%.3g δ=1e-5: ε=%.4g per participant; union NLL %.4f vs %.4f without DP (cost %+.4f)",
				sigma, clip, st.Epsilon, noisy.NLL, fed.NLL, noisy.NLL-fed.NLL)
		}
	})
}

// TestSentBytesHoldNoTraceText captures everything participants send
// (before TLS) and checks that no training or held-out text, nor any
// 8-character window of it, appears in it.
func TestSentBytesHoldNoTraceText(t *testing.T) {
	f := getFixture(t)
	_, _, _, recs := runRound(t, f, nil)
	for i, rec := range recs {
		sent := rec.sent.Bytes()
		if len(sent) < 10000 {
			t.Fatalf("%s sent only %d bytes", peers[i], len(sent))
		}
		var texts []string
		for _, p := range append(f.train[i], slicePairs(i, trainPerSlice, heldPerSlice)...) {
			for _, m := range p.Messages {
				texts = append(texts, m.Content)
			}
			texts = append(texts, p.Answer)
		}
		grams := 0
		for _, s := range texts {
			for j := 0; j+8 <= len(s); j++ {
				grams++
				if g := s[j : j+8]; strings.Contains(string(sent), g) {
					t.Fatalf("%s's sent bytes contain %q from its text %q", peers[i], g, s)
				}
			}
		}
		if grams < 1000 {
			t.Fatalf("only %d 8-grams checked", grams)
		}
	}
}

// TestAdoptThroughGate: a participant adds the aggregate to its store and
// promotes it only when the gate's margin over its incumbent holds on its
// own held-out probes.
func TestAdoptThroughGate(t *testing.T) {
	f := getFixture(t)
	agg, _, _, _ := runRound(t, f, nil)
	ctx := context.Background()
	gate := eval.Gate{Margin: 0.05, RegressionBudget: 1}
	for i, name := range peers[:2] {
		reg, err := registry.Open(filepath.Join(t.TempDir(), "molly.db"), registry.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		store := &adapters.Store{Registry: reg, Dir: t.TempDir(), Base: adapters.Base{Checksum: f.base.Checksum, Quant: f.base.Quant}}
		incumbent := ""
		if i > 0 { // alice has no local adapter serving; bob does
			v, err := store.Add(ctx, "orders", f.localPath[i], "trained", "", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Promote(ctx, adapters.Promotion{}, "orders", v.Version, "promote", "local"); err != nil {
				t.Fatal(err)
			}
			incumbent = f.localPath[i]
		}
		inc, err := f.ev.NLL(incumbent, f.held[i], false)
		if err != nil {
			t.Fatal(err)
		}
		cand, err := f.ev.NLL(agg.Path, f.held[i], false)
		if err != nil {
			t.Fatal(err)
		}
		wantPromote := 1-cand.NLL/inc.NLL >= gate.Margin
		ad, err := Adopt(ctx, f.ev, store, adapters.Promotion{}, gate, "orders", agg.Path, f.held[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: own held-out NLL incumbent %.4f, aggregate %.4f: %s", name, inc.NLL, cand.NLL, ad.Evaluation.Verdict.Reason)
		if ad.Promoted != wantPromote {
			t.Errorf("%s: promoted %v, want %v", name, ad.Promoted, wantPromote)
		}
		aliases, err := reg.Aliases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got := aliases["orders"] == ad.Version.Version; got != ad.Promoted {
			t.Errorf("%s: alias at the aggregate %v, promoted %v", name, got, ad.Promoted)
		}
		if i == 0 && !ad.Promoted {
			t.Errorf("alice (serving the base) refused an aggregate that lowers her NLL from %.4f to %.4f", inc.NLL, cand.NLL)
		}
	}
	// An aggregate for another base is refused by the store.
	reg, err := registry.Open(filepath.Join(t.TempDir(), "other.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	other := &adapters.Store{Registry: reg, Dir: t.TempDir(), Base: adapters.Base{Checksum: strings.Repeat("0", 64), Quant: f.base.Quant}}
	if _, err := Adopt(ctx, f.ev, other, adapters.Promotion{}, gate, "orders", agg.Path, f.held[0]); !errors.Is(err, adapters.ErrOtherBase) {
		t.Fatalf("aggregate adopted on another base: %v", err)
	}
}

func sqrt(x float64) float64 { return math.Sqrt(x) }
func ln(x float64) float64   { return math.Log(x) }
