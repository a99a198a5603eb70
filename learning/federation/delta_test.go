package federation

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/learning/lora"
)

var testBase = Base{Arch: "llama", Checksum: strings.Repeat("ab", 32), Quant: "F32"}

// delta is a small synthetic delta: one matrix of shape out×in per name.
func delta(round uint64, samples int64, out, in int, fill func(i int) float32, names ...string) *Delta {
	d := &Delta{Header: Header{Round: round, Domain: "orders", Base: testBase, Samples: samples, Rank: 2, DType: F32}}
	for _, n := range names {
		w := make([]float32, out*in)
		for i := range w {
			w[i] = fill(i)
		}
		d.Tensors = append(d.Tensors, TensorInfo{Name: n, Out: out, In: in})
		d.W = append(d.W, w)
	}
	return d
}

func TestDeltaRoundTrip(t *testing.T) {
	d := delta(3, 17, 4, 3, func(i int) float32 { return float32(i)/7 - 0.5 }, "blk.0.attn_q.weight", "blk.1.ffn_down.weight")
	b, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	// 2 matrices of 12 float32s after the header.
	if want := len(Magic) + 4 + int(binary.LittleEndian.Uint32(b[len(Magic):])) + 2*12*4; len(b) != want {
		t.Fatalf("%d bytes, want %d", len(b), want)
	}
	got, err := DecodeDelta(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Round != 3 || got.Samples != 17 || got.Base != testBase || len(got.W) != 2 {
		t.Fatalf("header %+v", got.Header)
	}
	for i, v := range got.W[1] {
		if v != float32(i)/7-0.5 {
			t.Fatalf("f32 value %d: %g", i, v)
		}
	}
	d.DType = F16
	b16, err := d.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err = DecodeDelta(b16, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range got.W[0] {
		want := float32(i)/7 - 0.5
		// binary16 keeps 11 significant bits: relative error ≤ 2⁻¹¹.
		if math.Abs(float64(v-want)) > math.Abs(float64(want))/2048+1e-7 {
			t.Fatalf("f16 value %d: %g, want %g", i, v, want)
		}
	}
}

func TestDecodeRefusesMalformed(t *testing.T) {
	good, err := delta(1, 5, 2, 2, func(i int) float32 { return 1 }, "blk.0.attn_q.weight").Encode()
	if err != nil {
		t.Fatal(err)
	}
	hl := int(binary.LittleEndian.Uint32(good[len(Magic):]))
	header := string(good[len(Magic)+4 : len(Magic)+4+hl])
	withHeader := func(h string) []byte {
		b := []byte(Magic)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
		return append(append(b, h...), good[len(Magic)+4+hl:]...)
	}
	nan := append([]byte(nil), good...)
	binary.LittleEndian.PutUint32(nan[len(nan)-4:], math.Float32bits(float32(math.NaN())))
	cases := map[string][]byte{
		"bad magic":        append([]byte("GGUF"), good[4:]...),
		"truncated":        good[:len(good)-3],
		"trailing bytes":   append(append([]byte(nil), good...), 0, 0, 0, 0),
		"not finite":       nan,
		"header too long":  append([]byte(Magic), 0xff, 0xff, 0xff, 0x7f),
		"unknown field":    withHeader(strings.Replace(header, `"round"`, `"prompt":"hi","round"`, 1)),
		"text as domain":   withHeader(strings.Replace(header, `"domain":"orders"`, `"domain":"Where is my order?"`, 1)),
		"shape lies":       withHeader(strings.Replace(header, `"out":2`, `"out":3`, 1)),
		"tensor name text": withHeader(strings.Replace(header, `blk.0.attn_q.weight`, `hello world`, 1)),
		"zero samples":     withHeader(strings.Replace(header, `"samples":5`, `"samples":0`, 1)),
	}
	for name, b := range cases {
		if _, err := DecodeDelta(b, 0); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	huge := delta(1, 5, 2, 2, func(i int) float32 { return 7e4 }, "blk.0.attn_q.weight")
	huge.DType = F16
	if _, err := huge.Encode(); err == nil {
		t.Error("a value beyond f16's range was encoded")
	}
	if _, err := DecodeDelta(good, len(good)-1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized: %v", err)
	}
}

// TestFedAvgWeightsBySamples checks the weighted mean by hand: weights
// 1/4 and 3/4.
func TestFedAvgWeightsBySamples(t *testing.T) {
	a := delta(1, 10, 1, 2, func(i int) float32 { return []float32{4, -8}[i] }, "blk.0.attn_q.weight")
	b := delta(1, 30, 1, 2, func(i int) float32 { return []float32{0, 8}[i] }, "blk.0.attn_q.weight")
	avg, n := FedAvg([]*Delta{a, b})
	if n != 40 || avg.W[0][0] != 1 || avg.W[0][1] != 4 {
		t.Fatalf("FedAvg = %v over %d samples, want [1 4] over 40", avg.W[0], n)
	}
}

// TestFactorizeTruncates: a matrix with known singular values 5, 3, 1
// (a signed permutation of diag(5, 3, 1)) re-factorised to rank 2 gives
// B·A equal to the matrix without its smallest component, and keeps
// (25+9)/35 of the energy (Eckart–Young).
func TestFactorizeTruncates(t *testing.T) {
	// W[o][i]: rows (2, 0, 1) and columns (1, 2, 0) carry 5, 3, 1, signs.
	w := make([]float32, 9)
	w[2*3+1], w[0*3+2], w[1*3+0] = 5, -3, 1
	d := &Delta{Header: Header{Samples: 1, Tensors: []TensorInfo{{Name: "blk.0.attn_q.weight", Out: 3, In: 3}}}, W: [][]float32{w}}
	a, kept, err := Factorize(d, 2)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(kept-34.0/35) > 1e-9 {
		t.Errorf("energy kept %g, want %g", kept, 34.0/35)
	}
	want := []float32{0, 0, -3, 0, 0, 0, 0, 5, 0}
	p := a.Pairs[0]
	if a.Rank != 2 || a.Scale() != 1 || p.Layer != 0 || p.Target != "attn_q" {
		t.Fatalf("adapter rank %d scale %g pair %+v", a.Rank, a.Scale(), p)
	}
	for o := range 3 {
		for i := range 3 {
			var v float32
			for k := range 2 {
				v += p.B[o*2+k] * p.A[k*3+i]
			}
			if math.Abs(float64(v-want[o*3+i])) > 1e-5 {
				t.Fatalf("B·A[%d][%d] = %g, want %g", o, i, v, want[o*3+i])
			}
		}
	}
}

// TestFromAdapterIsTheProduct: ΔW = (alpha/r)·B·A, checked by hand on a
// rank-1 pair.
func TestFromAdapterIsTheProduct(t *testing.T) {
	a := &lora.Adapter{Rank: 1, Alpha: 2, Pairs: []*lora.Pair{{Name: "blk.0.attn_v.weight", Layer: 0, Target: "attn_v",
		In: 2, Out: 2, A: []float32{1, 2}, B: []float32{3, -1}}}}
	d, err := FromAdapter(a, 1, "orders", testBase, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{6, 12, -2, -4}
	for i, v := range d.W[0] {
		if v != want[i] {
			t.Fatalf("ΔW = %v, want %v", d.W[0], want)
		}
	}
	if _, err := FromAdapter(a, 1, "Orders of Alice", testBase, 4); err == nil {
		t.Fatal("a domain that is text was accepted")
	}
}

// TestAccountantMatchesClosedForm: for Gaussian releases RDP(α) = αρ, so
// the best conversion over all α > 1 is ρ + 2√(ρ·ln(1/δ)) at
// α = 1 + √(ln(1/δ)/ρ); the grid's ε may only be a little above it.
func TestAccountantMatchesClosedForm(t *testing.T) {
	for _, c := range []struct {
		sigma  float64
		rounds int
	}{{1, 1}, {1, 10}, {4, 3}, {0.5, 1}, {0.01, 1}} {
		var a Accountant
		p := DP{Clip: 3, NoiseMultiplier: c.sigma}
		for range c.rounds {
			a.Spend(p)
		}
		rho := float64(c.rounds) * 2 / (c.sigma * c.sigma) // Δ=2C, s=σC
		want := rho + 2*math.Sqrt(rho*math.Log(1e5))
		got, _ := a.Epsilon(1e-5)
		if got < want-1e-9 || got > want*1.02 {
			t.Errorf("σ=%g, %d rounds: ε %g, closed form %g", c.sigma, c.rounds, got, want)
		}
	}
	if e, _ := (Accountant{}).Epsilon(1e-5); e != 0 {
		t.Errorf("nothing spent: ε %g", e)
	}
}

// TestPrivatizeClips: without noise the result has norm C; the noise's
// empirical standard deviation is σC.
func TestPrivatizeClips(t *testing.T) {
	d := delta(1, 1, 100, 100, func(i int) float32 { return 1 }, "blk.0.attn_q.weight") // norm 100
	DP{Clip: 2, NoiseMultiplier: 1e-12}.Privatize(d, SeededRand(1))
	if n := d.Norm(); math.Abs(n-2) > 1e-6 {
		t.Fatalf("clipped norm %g, want 2", n)
	}
	z := delta(1, 1, 100, 100, func(i int) float32 { return 0 }, "blk.0.attn_q.weight")
	DP{Clip: 2, NoiseMultiplier: 0.5}.Privatize(z, SeededRand(2))
	var ss float64
	for _, v := range z.W[0] {
		ss += float64(v) * float64(v)
	}
	if sd := math.Sqrt(ss / 1e4); math.Abs(sd-1) > 0.03 { // 10⁴ draws: ±3σ/√(2n) ≈ 0.021
		t.Fatalf("noise standard deviation %g, want 1", sd)
	}
}
