package lora

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Example is one training pair as tokens: the prompt as the engine
// templates it, then the answer (its tokens and the end-of-turn token).
// Only the answer is supervised: the loss is the NLL of Tokens[Start:]
// given what precedes each token.
type Example struct {
	Tokens []int32
	Start  int // index of the answer's first token; 1 ≤ Start < len(Tokens)
}

// Options configure a training run. Zero values take the defaults noted.
type Options struct {
	Rank    int      // LoRA rank r (default 8)
	Alpha   float32  // LoRA alpha (default r)
	Targets []string // adapted matrices (default DefaultTargets)
	// LR is Adam's learning rate (default 2e-3); Adam's β1, β2, ε are
	// 0.9, 0.999, 1e-8 (Kingma & Ba, "Adam", ICLR 2015).
	LR float64
	// Steps is the number of optimiser steps (default 100); BatchSize the
	// examples per step (default 8), taken in a per-epoch permutation of
	// the data seeded by Seed.
	Steps, BatchSize int
	Seed             uint64
	// MaxTokens truncates each example to this many tokens (default 512).
	MaxTokens int
	// Threads bounds the examples computed at once (default GOMAXPROCS).
	Threads int
	// Checkpoint is a file the run state is saved to every
	// CheckpointEvery steps (default 20), when interrupted, and at the
	// end; a run started with an existing checkpoint of the same run
	// (base, data, options) resumes from it. "": none.
	Checkpoint      string
	CheckpointEvery int
	// Progress is called after every step (nil: nothing).
	Progress func(Progress)
}

func (o *Options) defaults() {
	if o.Rank <= 0 {
		o.Rank = 8
	}
	if o.Alpha == 0 {
		o.Alpha = float32(o.Rank)
	}
	if len(o.Targets) == 0 {
		o.Targets = DefaultTargets
	}
	if o.LR <= 0 {
		o.LR = 2e-3
	}
	if o.Steps <= 0 {
		o.Steps = 100
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 8
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = 512
	}
	if o.Threads <= 0 {
		o.Threads = runtime.GOMAXPROCS(0)
	}
	if o.CheckpointEvery <= 0 {
		o.CheckpointEvery = 20
	}
}

// Progress is a training run's state after a step.
type Progress struct {
	Step, Steps int
	Loss        float64 // mean NLL per answer token of the step's batch, nats
	Tokens      int64   // tokens processed so far in this process (forward and backward)
	TokensPerS  float64 // of this process's steps
	Elapsed     time.Duration
	ETA         time.Duration
	Resumed     int // the step the run resumed from (0: a fresh run)
}

// Result is a finished run.
type Result struct {
	Adapter *Adapter
	Steps   int
	Loss    float64 // last step's loss
	Tokens  int64   // tokens processed by this process
	Elapsed time.Duration
	Resumed int
}

// ErrInterrupted is returned by Train when its context ended before the
// last step; the checkpoint (when set) holds the state to resume from.
var ErrInterrupted = errors.New("training interrupted")

// Train fits a LoRA adapter for m on data by Adam on the answer tokens'
// mean NLL, LoRA's recipe: base weights frozen, only A and B trained (B
// starts at zero). It resumes from o.Checkpoint when that holds a state
// of the same run. Errors: no usable example, bad options, a checkpoint
// of another run or unreadable, ErrInterrupted (ctx ended; the state is
// checkpointed).
func Train(ctx context.Context, m *Model, data []Example, o Options) (Result, error) {
	o.defaults()
	var exs []Example
	for _, ex := range data {
		if ex.Start < 1 || ex.Start >= len(ex.Tokens) {
			continue
		}
		if len(ex.Tokens) > o.MaxTokens {
			if ex.Start >= o.MaxTokens-1 {
				continue // nothing of the answer would be left
			}
			ex.Tokens = ex.Tokens[:o.MaxTokens]
		}
		for _, t := range ex.Tokens {
			if t < 0 || int(t) >= m.Cfg.Vocab {
				return Result{}, fmt.Errorf("token %d outside the vocabulary of %d", t, m.Cfg.Vocab)
			}
		}
		exs = append(exs, ex)
	}
	if len(exs) == 0 {
		return Result{}, errors.New("no example with an answer to train on")
	}
	a, err := NewAdapter(m, o.Rank, o.Alpha, o.Targets, o.Seed^0x6c6f7261)
	if err != nil {
		return Result{}, err
	}
	st := &state{a: a, m1: newGrads(a), m2: newGrads(a), run: runID(m, exs, o)}
	if o.Checkpoint != "" {
		switch err := st.load(o.Checkpoint); {
		case errors.Is(err, errNoCheckpoint):
		case err != nil:
			return Result{}, err
		}
	}
	resumed := st.step
	begin := time.Now()
	var tokens int64
	var loss float64
	save := func() error {
		if o.Checkpoint == "" {
			return nil
		}
		return st.save(o.Checkpoint)
	}
	for st.step < o.Steps {
		if ctx.Err() != nil {
			if err := save(); err != nil {
				return Result{}, fmt.Errorf("%w; saving the checkpoint: %v", ErrInterrupted, err)
			}
			return Result{Adapter: a, Steps: st.step, Loss: loss, Tokens: tokens, Elapsed: time.Since(begin), Resumed: resumed}, ErrInterrupted
		}
		batch := batchOf(len(exs), o.BatchSize, o.Seed, st.step)
		var n int
		loss, n = step(m, a, exs, batch, st, o)
		for _, i := range batch {
			tokens += int64(len(exs[i].Tokens))
		}
		_ = n
		st.step++
		if st.step%o.CheckpointEvery == 0 && st.step < o.Steps {
			if err := save(); err != nil {
				return Result{}, err
			}
		}
		if o.Progress != nil {
			el := time.Since(begin)
			p := Progress{Step: st.step, Steps: o.Steps, Loss: loss, Tokens: tokens, Elapsed: el, Resumed: resumed}
			if s := el.Seconds(); s > 0 {
				p.TokensPerS = float64(tokens) / s
			}
			if done := st.step - resumed; done > 0 {
				p.ETA = time.Duration(float64(el) / float64(done) * float64(o.Steps-st.step))
			}
			o.Progress(p)
		}
	}
	if err := save(); err != nil {
		return Result{}, err
	}
	return Result{Adapter: a, Steps: st.step, Loss: loss, Tokens: tokens, Elapsed: time.Since(begin), Resumed: resumed}, nil
}

// batchOf is the example indexes of step k: consecutive slices of a
// permutation per epoch (Fisher–Yates, seeded by seed and the epoch), so
// that a resumed run sees the same batches as an uninterrupted one.
func batchOf(n, size int, seed uint64, k int) []int {
	out := make([]int, 0, size)
	pos := k * size
	var perm []int
	epoch := -1
	for len(out) < size {
		e := pos / n
		if e != epoch {
			epoch = e
			perm = make([]int, n)
			for i := range perm {
				perm[i] = i
			}
			r := newRand(seed*0x9e3779b97f4a7c15 + uint64(e) + 1)
			for i := n - 1; i > 0; i-- {
				j := int(r.next() % uint64(i+1))
				perm[i], perm[j] = perm[j], perm[i]
			}
		}
		out = append(out, perm[pos%n])
		pos++
	}
	return out
}

// step computes the batch's gradient (examples in parallel, summed in
// batch order so that the result does not depend on scheduling) and
// applies one Adam update. It returns the mean NLL per answer token.
func step(m *Model, a *Adapter, exs []Example, batch []int, st *state, o Options) (float64, int) {
	total := 0
	for _, i := range batch {
		total += len(exs[i].Tokens) - exs[i].Start
	}
	weight := float32(1 / float64(total))
	gs := make([]grads, len(batch))
	nll := make([]float64, len(batch))
	var wg sync.WaitGroup
	sem := make(chan struct{}, o.Threads)
	for bi, i := range batch {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ex := exs[i]
			in := ex.Tokens[:len(ex.Tokens)-1]
			target := make([]int32, len(in))
			for t := range target {
				target[t] = -1
				if t+1 >= ex.Start {
					target[t] = ex.Tokens[t+1]
				}
			}
			gs[bi] = newGrads(a)
			nll[bi], _ = m.lossGrad(in, target, a, gs[bi], weight)
		}()
	}
	wg.Wait()
	g := gs[0]
	for _, other := range gs[1:] {
		for j := range g {
			axpy(g[j], 1, other[j])
		}
	}
	var sum float64
	for _, v := range nll {
		sum += v
	}
	st.adam(g, o.LR)
	return sum / float64(total), total
}

// state is a run's trainable state: the adapter, Adam's moments and the
// step count.
type state struct {
	a      *Adapter
	m1, m2 grads
	step   int
	run    string
}

func (st *state) params() [][]float32 {
	out := make([][]float32, 0, 2*len(st.a.Pairs))
	for _, p := range st.a.Pairs {
		out = append(out, p.A, p.B)
	}
	return out
}

// adam applies one bias-corrected Adam update with gradient g.
func (st *state) adam(g grads, lr float64) {
	const b1, b2, eps = 0.9, 0.999, 1e-8
	t := float64(st.step + 1)
	c1, c2 := 1-math.Pow(b1, t), 1-math.Pow(b2, t)
	for j, p := range st.params() {
		m1, m2, gj := st.m1[j], st.m2[j], g[j]
		for i := range p {
			m1[i] = b1*m1[i] + (1-b1)*gj[i]
			m2[i] = b2*m2[i] + (1-b2)*gj[i]*gj[i]
			mh, vh := float64(m1[i])/c1, float64(m2[i])/c2
			p[i] -= float32(lr * mh / (math.Sqrt(vh) + eps))
		}
	}
}

// runID identifies a run for its checkpoint: the base, the data and every
// option that changes the result.
func runID(m *Model, exs []Example, o Options) string {
	h := sha256.New()
	fmt.Fprintf(h, "molly-lora-run-v1 %s %+v r=%d a=%g t=%v lr=%g steps=%d b=%d seed=%d max=%d\n",
		m.Checksum, m.Cfg, o.Rank, o.Alpha, o.Targets, o.LR, o.Steps, o.BatchSize, o.Seed, o.MaxTokens)
	var buf [4]byte
	for _, ex := range exs {
		binary.LittleEndian.PutUint32(buf[:], uint32(ex.Start))
		h.Write(buf[:])
		for _, t := range ex.Tokens {
			binary.LittleEndian.PutUint32(buf[:], uint32(t))
			h.Write(buf[:])
		}
		h.Write([]byte{0xff, 0xff, 0xff, 0xff})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Clone returns a deep copy of a.
func (a *Adapter) Clone() *Adapter {
	b := &Adapter{Rank: a.Rank, Alpha: a.Alpha, Targets: slices.Clone(a.Targets)}
	for _, p := range a.Pairs {
		q := *p
		q.A, q.B = slices.Clone(p.A), slices.Clone(p.B)
		b.Pairs = append(b.Pairs, &q)
	}
	if a.idx != nil {
		b.index(len(a.idx))
	}
	return b
}
