package federation

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// DP configures a participant's local differential privacy.
type DP struct {
	// Clip is the L2 bound C of the whole update (all matrices together).
	Clip float64 `json:"clip"`
	// NoiseMultiplier σ: each coordinate gets Gaussian noise of standard
	// deviation σ·C.
	NoiseMultiplier float64 `json:"noise_multiplier"`
	// Delta is the δ of the reported (ε, δ) (default 1e-5).
	Delta float64 `json:"delta,omitempty"`
	// EpsilonBudget stops participation when the next round would take
	// the total ε past it (0: no budget).
	EpsilonBudget float64 `json:"epsilon_budget,omitempty"`
}

// ErrBudget: the next round would spend more ε than the budget left.
var ErrBudget = errors.New("privacy budget spent")

func (p DP) delta() float64 {
	if p.Delta > 0 {
		return p.Delta
	}
	return 1e-5
}

// Validate rejects impossible settings.
func (p DP) Validate() error {
	if p.Clip <= 0 || p.NoiseMultiplier <= 0 {
		return fmt.Errorf("dp: clip (%g) and noise_multiplier (%g) must be positive", p.Clip, p.NoiseMultiplier)
	}
	if p.Delta < 0 || p.Delta >= 1 {
		return fmt.Errorf("dp: delta %g must be in (0, 1)", p.Delta)
	}
	return nil
}

// Sensitivity is the L2 sensitivity of the clipped update when a
// participant's whole data set is replaced: 2C.
func (p DP) Sensitivity() float64 { return 2 * p.Clip }

// Privatize clips d's L2 norm to C (scaling every matrix by
// min(1, C/‖ΔW‖)) and adds N(0, (σC)²) to every coordinate, drawing from
// rng (nil: ChaCha8 seeded from crypto/rand); it records Clip and Sigma
// in the header and returns the norm before clipping.
func (p DP) Privatize(d *Delta, rng *rand.Rand) float64 {
	if rng == nil {
		var seed [32]byte
		_, _ = crand.Read(seed[:])
		rng = rand.New(rand.NewChaCha8(seed))
	}
	n := d.Norm()
	f := 1.0
	if n > p.Clip {
		f = p.Clip / n
	}
	std := p.NoiseMultiplier * p.Clip
	for _, w := range d.W {
		for i, v := range w {
			w[i] = float32(float64(v)*f + std*rng.NormFloat64())
		}
	}
	d.Clip, d.Sigma = p.Clip, p.NoiseMultiplier
	return n
}

// SeededRand is a deterministic source for tests and reproducible runs.
func SeededRand(seed uint64) *rand.Rand {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	return rand.New(rand.NewChaCha8(s))
}

// Alphas are the Rényi orders the accountant tracks: the grid of
// TensorFlow Privacy's and Opacus's RDP accountants (1 + k/10 for
// k = 1..99, then 12..63, then 128, 256, 512) preceded by 1 + k·10⁻⁴,
// 1 + k·10⁻³ and 1 + k·10⁻² for k = 1..9, the orders near 1 that weak
// noise (a large ε) is best converted at.
var Alphas = func() []float64 {
	var a []float64
	for _, step := range []float64{1e-4, 1e-3, 1e-2} {
		for k := 1; k < 10; k++ {
			a = append(a, 1+float64(k)*step)
		}
	}
	for k := 1; k < 100; k++ {
		a = append(a, 1+float64(k)/10)
	}
	for k := 12; k < 64; k++ {
		a = append(a, float64(k))
	}
	return append(a, 128, 256, 512)
}()

// Accountant composes Gaussian-mechanism releases in Rényi differential
// privacy (Mironov 2017). The zero value has spent nothing.
type Accountant struct {
	// RDP[i] is the total Rényi divergence bound at order Alphas[i].
	RDP    []float64 `json:"rdp"`
	Rounds int       `json:"rounds"`
}

// GaussianRDP is the RDP of one Gaussian mechanism at order α with L2
// sensitivity Δ and noise standard deviation s: αΔ²/(2s²) (Mironov 2017,
// Proposition 7).
func GaussianRDP(alpha, sensitivity, std float64) float64 {
	return alpha * sensitivity * sensitivity / (2 * std * std)
}

// Spend adds one release of the Gaussian mechanism with p's clipping and
// noise (sensitivity 2C, standard deviation σC): RDP composes by sum
// (Mironov 2017, Proposition 1).
func (a *Accountant) Spend(p DP) {
	*a = a.after(p)
}

func (a Accountant) after(p DP) Accountant {
	out := Accountant{RDP: make([]float64, len(Alphas)), Rounds: a.Rounds + 1}
	for i, al := range Alphas {
		if i < len(a.RDP) {
			out.RDP[i] = a.RDP[i]
		}
		out.RDP[i] += GaussianRDP(al, p.Sensitivity(), p.NoiseMultiplier*p.Clip)
	}
	return out
}

// Epsilon converts the composed RDP to (ε, δ)-DP: the least over the
// orders of RDP(α) + log(1/δ)/(α−1) (Mironov 2017, Proposition 3), and
// the order that attains it. Zero rounds: ε = 0.
func (a Accountant) Epsilon(delta float64) (eps, order float64) {
	if a.Rounds == 0 || len(a.RDP) == 0 {
		return 0, 0
	}
	eps = math.Inf(1)
	for i, al := range Alphas {
		if e := a.RDP[i] + math.Log(1/delta)/(al-1); e < eps {
			eps, order = e, al
		}
	}
	return eps, order
}
