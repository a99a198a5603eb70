package lora

import (
	"fmt"
	"math"
	"slices"
)

// Pair is one adapted matrix W [Out][In] of the base: the low-rank update
// ΔW = (Alpha/Rank) · B·A with A [Rank][In] and B [Out][Rank], row-major —
// in GGUF the tensors <name>.lora_a of ggml shape [In, Rank] and
// <name>.lora_b of shape [Rank, Out], as llama.cpp's adapter loader wants
// them (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
// 2021).
type Pair struct {
	Name    string // the base tensor, e.g. "blk.0.attn_q.weight"
	Layer   int
	Target  string // "attn_q", ...
	In, Out int
	A, B    []float32
}

// Adapter is a LoRA adapter for a Model: one Pair per adapted matrix.
type Adapter struct {
	Rank    int
	Alpha   float32
	Targets []string
	Pairs   []*Pair
	idx     [][]*Pair // [layer][index in Targets of the package]
}

// Scale is the factor llama.cpp applies to B·A: Alpha / Rank.
func (a *Adapter) Scale() float32 { return a.Alpha / float32(a.Rank) }

// NewAdapter makes an adapter of rank r for the targets of m (nil: attn_q,
// attn_v, ffn_up, ffn_down), initialised as LoRA's paper does: A random
// (Gaussian, standard deviation 1/√In, from seed), B zero, so that the
// adapted model starts as the base. alpha 0 means alpha = r. Errors: a
// rank out of range, an unknown target.
func NewAdapter(m *Model, r int, alpha float32, targets []string, seed uint64) (*Adapter, error) {
	if len(targets) == 0 {
		targets = DefaultTargets
	}
	if r <= 0 || r > m.Cfg.Embd {
		return nil, fmt.Errorf("rank %d must be in 1..%d (the model width)", r, m.Cfg.Embd)
	}
	if alpha == 0 {
		alpha = float32(r)
	}
	a := &Adapter{Rank: r, Alpha: alpha, Targets: slices.Clone(targets)}
	rng := newRand(seed)
	for l := range m.Cfg.Layers {
		for _, t := range targets {
			_, out, in := m.matrix(l, t)
			if out == 0 {
				return nil, fmt.Errorf("unknown LoRA target %q (want one of %v)", t, Targets)
			}
			p := &Pair{Name: fmt.Sprintf("blk.%d.%s.weight", l, t), Layer: l, Target: t, In: in, Out: out,
				A: make([]float32, r*in), B: make([]float32, out*r)}
			std := 1 / math.Sqrt(float64(in))
			for i := range p.A {
				p.A[i] = float32(rng.norm() * std)
			}
			a.Pairs = append(a.Pairs, p)
		}
	}
	a.index(m.Cfg.Layers)
	return a, nil
}

// DefaultTargets are the matrices adapted by default, as serving/gguf's
// demo adapters do.
var DefaultTargets = []string{"attn_q", "attn_v", "ffn_up", "ffn_down"}

func (a *Adapter) index(layers int) {
	a.idx = make([][]*Pair, layers)
	for l := range a.idx {
		a.idx[l] = make([]*Pair, len(Targets))
	}
	for _, p := range a.Pairs {
		a.idx[p.Layer][slices.Index(Targets, p.Target)] = p
	}
}

func (a *Adapter) pair(l int, target int) *Pair {
	if a == nil {
		return nil
	}
	return a.idx[l][target]
}

// Target indexes into Targets.
const (
	tQ = iota
	tK
	tV
	tO
	tG
	tU
	tD
)

// layerActs are one layer's activations kept for the backward pass.
type layerActs struct {
	x         []float32    // the residual input [T][E]
	r1, r2    []float32    // 1/RMS of x and of x2 [T]
	n1, n2    []float32    // normed inputs of attention and FFN [T][E]
	q, k, v   []float32    // q, k after RoPE [T][E], [T][KV], [T][KV]
	p         []float32    // attention probabilities [H][T][T]
	o         []float32    // attention output, heads concatenated [T][E]
	x2        []float32    // residual after attention [T][E]
	g, up, hm []float32    // FFN gate, up, silu(gate)·up [T][F]
	u         [7][]float32 // x·Aᵀ of each adapted matrix [T][r]
	hasLoRA   [7]bool
}

// acts are one sequence's activations.
type acts struct {
	T      int
	layers []layerActs
	xL, rf []float32 // final residual and its 1/RMS
	nf     []float32 // final normed hidden [T][E]
}

// rope holds cos and sin of RoPE's angles for positions 0..T-1: angle
// pos·base^(−2i/d) for pair i of the d rotated dimensions (Su et al.,
// "RoFormer", 2021), in ggml's "normal" mode that rotates adjacent pairs
// (x[2i], x[2i+1]), as llama.cpp does for the llama architecture.
type rope struct {
	cos, sin []float32 // [T][d/2]
	half     int
}

func newRope(T int, c Config) rope {
	half := c.RopeDims / 2
	r := rope{cos: make([]float32, T*half), sin: make([]float32, T*half), half: half}
	scale := math.Pow(float64(c.RopeBase), -2/float64(c.RopeDims))
	for p := range T {
		theta := float64(p)
		for i := range half {
			r.cos[p*half+i] = float32(math.Cos(theta))
			r.sin[p*half+i] = float32(math.Sin(theta))
			theta *= scale
		}
	}
	return r
}

// apply rotates x [T][heads·hd] in place; inverse rotates by −angle (the
// backward pass).
func (r rope) apply(x []float32, T, heads, hd int, inverse bool) {
	for t := range T {
		cs, sn := r.cos[t*r.half:(t+1)*r.half], r.sin[t*r.half:(t+1)*r.half]
		for h := range heads {
			v := x[(t*heads+h)*hd:]
			for i := range r.half {
				c, s := cs[i], sn[i]
				if inverse {
					s = -s
				}
				x0, x1 := v[2*i], v[2*i+1]
				v[2*i] = x0*c - x1*s
				v[2*i+1] = x0*s + x1*c
			}
		}
	}
}

// rmsnorm writes y = x/RMS(x)·g per row (Zhang & Sennrich, "Root Mean
// Square Layer Normalization", 2019) and keeps 1/RMS in r.
func rmsnorm(y, r, x, g []float32, T, n int, eps float32) {
	for t := range T {
		row := x[t*n : (t+1)*n]
		var ss float64
		for _, v := range row {
			ss += float64(v) * float64(v)
		}
		inv := float32(1 / math.Sqrt(ss/float64(n)+float64(eps)))
		r[t] = inv
		out := y[t*n : (t+1)*n]
		for i, v := range row {
			out[i] = v * inv * g[i]
		}
	}
}

// rmsnormBack adds to dx the gradient of rmsnorm given dy:
// dx = r·(g⊙dy − x̂·mean(g⊙dy⊙x̂)) with x̂ = r·x.
func rmsnormBack(dx, dy, x, r, g []float32, T, n int) {
	for t := range T {
		xr, dyr, dxr := x[t*n:(t+1)*n], dy[t*n:(t+1)*n], dx[t*n:(t+1)*n]
		inv := r[t]
		var dot float64
		for i := range xr {
			dot += float64(g[i]*dyr[i]) * float64(xr[i]*inv)
		}
		m := float32(dot / float64(n))
		for i := range xr {
			dxr[i] += inv * (g[i]*dyr[i] - xr[i]*inv*m)
		}
	}
}

// lin computes y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ for x [T][in] and W [out][in]; with a
// pair, u gets x·Aᵀ [T][r] for the backward pass.
func lin(y, x, w []float32, T, in, out int, p *Pair, s float32, u []float32, r int) {
	mulT(y, x, w, T, in, out)
	if p == nil {
		return
	}
	mulT(u, x, p.A, T, in, r)
	for t := range T {
		ut, yt := u[t*r:(t+1)*r], y[t*out:(t+1)*out]
		for o := range out {
			yt[o] += s * dot(ut, p.B[o*r:(o+1)*r])
		}
	}
}

// linBack adds to dx the gradient dy·W + s·(dy·B)·A and, with a pair, to
// gA and gB the gradients s·(dy·B)ᵀ·x and s·dyᵀ·u. tmp holds T·r floats.
func linBack(dx, dy, x, w []float32, T, in, out int, p *Pair, s float32, u []float32, r int, gA, gB, tmp []float32) {
	mulAdd(dx, dy, w, T, in, out)
	if p == nil {
		return
	}
	dyB := tmp[:T*r]
	clear(dyB)
	for t := range T {
		dyt, db := dy[t*out:(t+1)*out], dyB[t*r:(t+1)*r]
		ut := u[t*r : (t+1)*r]
		for o, g := range dyt {
			if g == 0 {
				continue
			}
			axpy(db, g, p.B[o*r:(o+1)*r])
			axpy(gB[o*r:(o+1)*r], s*g, ut)
		}
	}
	for t := range T {
		db, xt := dyB[t*r:(t+1)*r], x[t*in:(t+1)*in]
		dxt := dx[t*in : (t+1)*in]
		for k, g := range db {
			if g == 0 {
				continue
			}
			axpy(gA[k*in:(k+1)*in], s*g, xt)
			axpy(dxt, s*g, p.A[k*in:(k+1)*in])
		}
	}
}

// mulT computes y[t][o] = x[t]·w[o] for x [T][in], w [out][in].
func mulT(y, x, w []float32, T, in, out int) {
	for t := range T {
		xt, yt := x[t*in:(t+1)*in], y[t*out:(t+1)*out]
		for o := range out {
			yt[o] = dot(xt, w[o*in:(o+1)*in])
		}
	}
}

// mulAdd adds dy·w to dx for dy [T][out], w [out][in].
func mulAdd(dx, dy, w []float32, T, in, out int) {
	for t := range T {
		dxt, dyt := dx[t*in:(t+1)*in], dy[t*out:(t+1)*out]
		for o, g := range dyt {
			if g != 0 {
				axpy(dxt, g, w[o*in:(o+1)*in])
			}
		}
	}
}

func dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += a * x[i]
	}
}

func silu(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// forward runs tokens through m with adapter a (nil: the base) and returns
// the activations; logits are computed for the positions where want is
// true (nil: every position) into logits [T][V].
func (m *Model) forward(tokens []int32, a *Adapter, logits []float32, want []bool) *acts {
	c := m.Cfg
	T, E, KV, F, H, HKV, hd := len(tokens), c.Embd, c.KVDim(), c.FFN, c.Heads, c.HeadsKV, c.HeadDim
	r := 0
	var s float32
	if a != nil {
		r, s = a.Rank, a.Scale()
	}
	ac := &acts{T: T, layers: make([]layerActs, c.Layers)}
	x := make([]float32, T*E)
	for t, tok := range tokens {
		copy(x[t*E:(t+1)*E], m.TokEmbd[int(tok)*E:(int(tok)+1)*E])
	}
	rp := newRope(T, c)
	scale := float32(1 / math.Sqrt(float64(hd)))
	for l := range c.Layers {
		ly := &m.Layers[l]
		la := &ac.layers[l]
		la.x = x
		la.r1, la.n1 = make([]float32, T), make([]float32, T*E)
		rmsnorm(la.n1, la.r1, x, ly.AttnNorm, T, E, c.Eps)
		la.q, la.k, la.v = make([]float32, T*E), make([]float32, T*KV), make([]float32, T*KV)
		linU := func(ti int, y, in, w []float32, nin, nout int) {
			p := a.pair(l, ti)
			if p != nil {
				la.u[ti] = make([]float32, T*r)
				la.hasLoRA[ti] = true
			}
			lin(y, in, w, T, nin, nout, p, s, la.u[ti], r)
		}
		linU(tQ, la.q, la.n1, ly.Wq, E, E)
		linU(tK, la.k, la.n1, ly.Wk, E, KV)
		linU(tV, la.v, la.n1, ly.Wv, E, KV)
		rp.apply(la.q, T, H, hd, false)
		rp.apply(la.k, T, HKV, hd, false)
		la.p, la.o = make([]float32, H*T*T), make([]float32, T*E)
		group := H / HKV
		for h := range H {
			g := h / group
			P := la.p[h*T*T:]
			for t := range T {
				qt := la.q[t*E+h*hd : t*E+(h+1)*hd]
				row := P[t*T : t*T+t+1]
				mx := float32(math.Inf(-1))
				for j := range row {
					row[j] = dot(qt, la.k[j*KV+g*hd:j*KV+(g+1)*hd]) * scale
					mx = max(mx, row[j])
				}
				var sum float64
				for j := range row {
					e := float32(math.Exp(float64(row[j] - mx)))
					row[j] = e
					sum += float64(e)
				}
				inv := float32(1 / sum)
				ot := la.o[t*E+h*hd : t*E+(h+1)*hd]
				for j := range row {
					row[j] *= inv
					axpy(ot, row[j], la.v[j*KV+g*hd:j*KV+(g+1)*hd])
				}
			}
		}
		attn := make([]float32, T*E)
		linU(tO, attn, la.o, ly.Wo, E, E)
		la.x2 = make([]float32, T*E)
		for i := range attn {
			la.x2[i] = x[i] + attn[i]
		}
		la.r2, la.n2 = make([]float32, T), make([]float32, T*E)
		rmsnorm(la.n2, la.r2, la.x2, ly.FFNNorm, T, E, c.Eps)
		la.g, la.up, la.hm = make([]float32, T*F), make([]float32, T*F), make([]float32, T*F)
		linU(tG, la.g, la.n2, ly.Wg, E, F)
		linU(tU, la.up, la.n2, ly.Wu, E, F)
		for i, gv := range la.g {
			la.hm[i] = silu(gv) * la.up[i]
		}
		f := make([]float32, T*E)
		linU(tD, f, la.hm, ly.Wd, F, E)
		next := make([]float32, T*E)
		for i := range f {
			next[i] = la.x2[i] + f[i]
		}
		x = next
	}
	ac.xL, ac.rf, ac.nf = x, make([]float32, T), make([]float32, T*E)
	rmsnorm(ac.nf, ac.rf, x, m.OutNorm, T, E, c.Eps)
	if logits != nil {
		V := c.Vocab
		for t := range T {
			if want != nil && !want[t] {
				continue
			}
			mulT(logits[t*V:(t+1)*V], ac.nf[t*E:(t+1)*E], m.Out, 1, E, V)
		}
	}
	return ac
}

// Logits runs tokens through the model with adapter a (nil: the base) and
// returns the logits of every position, [len(tokens)][Vocab].
func (m *Model) Logits(tokens []int32, a *Adapter) []float32 {
	out := make([]float32, len(tokens)*m.Cfg.Vocab)
	m.forward(tokens, a, out, nil)
	return out
}

// grads holds one gradient slice per adapter matrix, in Pair order (A then
// B of each pair).
type grads [][]float32

func newGrads(a *Adapter) grads {
	g := make(grads, 0, 2*len(a.Pairs))
	for _, p := range a.Pairs {
		g = append(g, make([]float32, len(p.A)), make([]float32, len(p.B)))
	}
	return g
}

// lossGrad runs one example forward and backward: it returns the summed
// negative log-likelihood (nats) of the tokens at positions where target
// is ≥ 0 (the next token to predict; -1 elsewhere) and their count, and
// adds the gradient of the summed NLL times weight to g.
func (m *Model) lossGrad(tokens, target []int32, a *Adapter, g grads, weight float32) (float64, int) {
	c := m.Cfg
	T, E, KV, F, H, HKV, hd, V := len(tokens), c.Embd, c.KVDim(), c.FFN, c.Heads, c.HeadsKV, c.HeadDim, c.Vocab
	want := make([]bool, T)
	n := 0
	for t, y := range target {
		if y >= 0 {
			want[t] = true
			n++
		}
	}
	if n == 0 {
		return 0, 0
	}
	logits := make([]float32, T*V)
	ac := m.forward(tokens, a, logits, want)
	// d(loss)/d(logits) = softmax − onehot, on the wanted positions.
	var nll float64
	dnf := make([]float32, T*E)
	for t := range T {
		if !want[t] {
			continue
		}
		row := logits[t*V : (t+1)*V]
		mx := slices.Max(row)
		var sum float64
		for _, v := range row {
			sum += math.Exp(float64(v - mx))
		}
		lse := float64(mx) + math.Log(sum)
		nll += lse - float64(row[target[t]])
		for v := range row {
			row[v] = float32(math.Exp(float64(row[v])-lse)) * weight
		}
		row[target[t]] -= weight
		mulAdd(dnf[t*E:(t+1)*E], row, m.Out, 1, E, V)
	}
	dx := make([]float32, T*E)
	rmsnormBack(dx, dnf, ac.xL, ac.rf, m.OutNorm, T, E)
	r, s := a.Rank, a.Scale()
	tmp := make([]float32, T*r)
	rp := newRope(T, c)
	scale := float32(1 / math.Sqrt(float64(hd)))
	gi := make(map[*Pair]int, len(a.Pairs))
	for i, p := range a.Pairs {
		gi[p] = 2 * i
	}
	back := func(l, ti int, dxIn, dy, x, w []float32, nin, nout int, u []float32) {
		p := a.pair(l, ti)
		var gA, gB []float32
		if p != nil {
			gA, gB = g[gi[p]], g[gi[p]+1]
		}
		linBack(dxIn, dy, x, w, T, nin, nout, p, s, u, r, gA, gB, tmp)
	}
	for l := c.Layers - 1; l >= 0; l-- {
		ly, la := &m.Layers[l], &ac.layers[l]
		// x3 = x2 + FFN(norm(x2)): dx is d x3.
		dx2 := slices.Clone(dx)
		dhm := make([]float32, T*F)
		back(l, tD, dhm, dx, la.hm, ly.Wd, F, E, la.u[tD])
		dg, dup := make([]float32, T*F), make([]float32, T*F)
		for i, gv := range la.g {
			sg := float32(1 / (1 + math.Exp(float64(-gv))))
			dup[i] = dhm[i] * gv * sg
			dg[i] = dhm[i] * la.up[i] * sg * (1 + gv*(1-sg))
		}
		dn2 := make([]float32, T*E)
		back(l, tG, dn2, dg, la.n2, ly.Wg, E, F, la.u[tG])
		back(l, tU, dn2, dup, la.n2, ly.Wu, E, F, la.u[tU])
		rmsnormBack(dx2, dn2, la.x2, la.r2, ly.FFNNorm, T, E)
		// x2 = x + Wo·attn(norm(x)).
		dxl := slices.Clone(dx2)
		do := make([]float32, T*E)
		back(l, tO, do, dx2, la.o, ly.Wo, E, E, la.u[tO])
		dq, dk, dv := make([]float32, T*E), make([]float32, T*KV), make([]float32, T*KV)
		group := H / HKV
		dp := make([]float32, T)
		for h := range H {
			gk := h / group
			P := la.p[h*T*T:]
			for t := range T {
				dOt := do[t*E+h*hd : t*E+(h+1)*hd]
				row := P[t*T : t*T+t+1]
				var sum float32
				for j := range row {
					vj := la.v[j*KV+gk*hd : j*KV+(gk+1)*hd]
					dp[j] = dot(dOt, vj)
					sum += row[j] * dp[j]
					axpy(dv[j*KV+gk*hd:j*KV+(gk+1)*hd], row[j], dOt)
				}
				qt := la.q[t*E+h*hd : t*E+(h+1)*hd]
				dqt := dq[t*E+h*hd : t*E+(h+1)*hd]
				for j := range row {
					ds := row[j] * (dp[j] - sum) * scale
					if ds == 0 {
						continue
					}
					axpy(dqt, ds, la.k[j*KV+gk*hd:j*KV+(gk+1)*hd])
					axpy(dk[j*KV+gk*hd:j*KV+(gk+1)*hd], ds, qt)
				}
			}
		}
		rp.apply(dq, T, H, hd, true)
		rp.apply(dk, T, HKV, hd, true)
		dn1 := make([]float32, T*E)
		back(l, tQ, dn1, dq, la.n1, ly.Wq, E, E, la.u[tQ])
		back(l, tK, dn1, dk, la.n1, ly.Wk, E, KV, la.u[tK])
		back(l, tV, dn1, dv, la.n1, ly.Wv, E, KV, la.u[tV])
		rmsnormBack(dxl, dn1, la.x, la.r1, ly.AttnNorm, T, E)
		dx = dxl
	}
	return nll, n
}

// splitmix64-based generator: deterministic across Go versions (the
// checkpoint format depends on it), normal variates by Box–Muller.
type rand struct{ s uint64 }

func newRand(seed uint64) *rand { return &rand{s: seed} }

func (r *rand) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (r *rand) float() float64 { return float64(r.next()>>11) / (1 << 53) }

func (r *rand) norm() float64 {
	u1 := r.float()
	for u1 == 0 {
		u1 = r.float()
	}
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*r.float())
}
