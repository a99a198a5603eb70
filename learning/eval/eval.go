// Package eval scores LoRA adapters the way the T0 engine will run them:
// per-token negative log-likelihood of reference answers computed from
// llama.cpp's own logits on the same GGUF base (through serving/llama),
// the prompt templated and tokenized as the engine does it, plus greedy
// exact match for templated sets; and the promotion gate over those
// scores (margin on the domain, regression budget on general probes).
package eval

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/serving/llama"
)

// Evaluator holds one base model and a llama.cpp context to score with.
// Its methods are safe for concurrent use (they take turns).
type Evaluator struct {
	mu    sync.Mutex
	model *llama.Model
	ctx   *llama.Context
	batch *llama.Batch
	tmpl  string
	imEnd []int32
}

// Open loads the base model at path for evaluation (a context of 4096
// tokens, one sequence). Errors: the model cannot be loaded.
func Open(path string) (*Evaluator, error) {
	m, err := llama.LoadModel(path)
	if err != nil {
		return nil, err
	}
	ctx, err := llama.NewContext(m, llama.ContextParams{NCtx: 4096, NBatch: 512, NSeqMax: 1, Threads: max(1, runtime.NumCPU())})
	if err != nil {
		m.Close()
		return nil, err
	}
	e := &Evaluator{model: m, ctx: ctx, batch: llama.NewBatch(512), tmpl: m.ChatTemplate()}
	if e.tmpl == "" {
		e.tmpl = "chatml"
	}
	if e.imEnd, err = m.Tokenize("<|im_end|>", false, true); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Close frees the model and context.
func (e *Evaluator) Close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.model == nil {
		return
	}
	e.batch.Free()
	e.ctx.Close()
	e.model.Close()
	e.model = nil
}

// Checksum is the base's general.base_checksum ("" when it records none).
func (e *Evaluator) Checksum() string {
	v, _ := e.model.Meta(lora.KeyBaseChecksum)
	return v
}

// Message is one chat message of a prompt.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Encode tokenizes a chat prompt as the engine does (the model's chat
// template rendered around sentinels, template text tokenized with
// control tokens parsed, message content without, so content cannot forge
// turns) followed by answer and the end-of-turn token: the answer starts
// at Start. Errors: a template llama.cpp does not know, or one that
// rewrites content.
func (e *Evaluator) Encode(msgs []Message, answer string) (lora.Example, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	prompt, err := e.tokenizeChat(msgs)
	if err != nil {
		return lora.Example{}, err
	}
	ans, err := e.model.Tokenize(answer, false, false)
	if err != nil {
		return lora.Example{}, err
	}
	toks := append(append(prompt, ans...), e.imEnd...)
	return lora.Example{Tokens: toks, Start: len(prompt)}, nil
}

func (e *Evaluator) tokenizeChat(msgs []Message) ([]int32, error) {
	cm := make([]llama.ChatMessage, len(msgs))
	for i, m := range msgs {
		cm[i] = llama.ChatMessage{Role: m.Role, Content: m.Content}
	}
	return e.model.TokenizeChat(e.tmpl, cm)
}

// Score is a set's evaluation under one adapter.
type Score struct {
	// NLL is the mean negative log-likelihood per answer token, in nats;
	// Tokens the answer tokens it averages over.
	NLL    float64 `json:"nll"`
	Tokens int     `json:"tokens"`
	// ExactMatch is the share of examples whose greedy answer equals the
	// reference token for token (-1 when not computed).
	ExactMatch float64 `json:"exact_match"`
}

// Quality is the score on the routing priors' scale, [0,1]: e^(−NLL), the
// geometric mean probability the model gives a reference answer's tokens —
// the confidence the pipeline's mixture takes from mean token
// log-probabilities (router/pipeline FusedScore).
func (s Score) Quality() float64 { return math.Exp(-s.NLL) }

// NLL scores exs with the adapter GGUF at adapter ("" for the base): mean
// NLL per answer token from llama.cpp's logits and, with exact, greedy
// exact match. Errors: the adapter is refused, an example does not fit
// the context, a decode fails.
func (e *Evaluator) NLL(adapter string, exs []lora.Example, exact bool) (Score, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.model == nil {
		return Score{}, errors.New("evaluator closed")
	}
	if adapter != "" {
		a, err := llama.LoadAdapter(e.model, adapter)
		if err != nil {
			return Score{}, err
		}
		defer a.Close()
		e.ctx.SetAdapters([]*llama.Adapter{a}, nil)
		defer e.ctx.SetAdapters(nil, nil)
	} else {
		e.ctx.SetAdapters(nil, nil)
	}
	var sum float64
	n, matched := 0, 0
	var logits []float32
	for _, ex := range exs {
		if ex.Start < 1 || ex.Start >= len(ex.Tokens) || len(ex.Tokens)+1 > e.ctx.NCtxSeq() {
			return Score{}, fmt.Errorf("example of %d tokens (answer at %d) does not fit the %d-token context", len(ex.Tokens), ex.Start, e.ctx.NCtxSeq())
		}
		e.ctx.SeqRm(0, 0, -1)
		for lo := 0; lo < len(ex.Tokens); lo += e.batch.Cap() {
			hi := min(lo+e.batch.Cap(), len(ex.Tokens))
			e.batch.Clear()
			for i := lo; i < hi; i++ {
				e.batch.Add(ex.Tokens[i], i, 0, i >= ex.Start-1 && i < len(ex.Tokens)-1)
			}
			if err := e.ctx.Decode(e.batch); err != nil {
				return Score{}, err
			}
			for i := max(lo, ex.Start-1); i < hi && i < len(ex.Tokens)-1; i++ {
				logits = e.ctx.Logits(i-lo, logits)
				sum += nll(logits, ex.Tokens[i+1])
				n++
			}
		}
		if exact {
			ok, err := e.greedyMatches(ex)
			if err != nil {
				return Score{}, err
			}
			if ok {
				matched++
			}
		}
	}
	if n == 0 {
		return Score{}, errors.New("no answer tokens to score")
	}
	s := Score{NLL: sum / float64(n), Tokens: n, ExactMatch: -1}
	if exact {
		s.ExactMatch = float64(matched) / float64(len(exs))
	}
	return s, nil
}

// greedyMatches decodes argmax tokens after the prompt and reports whether
// they reproduce the reference answer.
func (e *Evaluator) greedyMatches(ex lora.Example) (bool, error) {
	e.ctx.SeqRm(0, 0, -1)
	for lo := 0; lo < ex.Start; lo += e.batch.Cap() {
		hi := min(lo+e.batch.Cap(), ex.Start)
		e.batch.Clear()
		for i := lo; i < hi; i++ {
			e.batch.Add(ex.Tokens[i], i, 0, i == ex.Start-1)
		}
		if err := e.ctx.Decode(e.batch); err != nil {
			return false, err
		}
	}
	var logits []float32
	idx := (ex.Start - 1) % e.batch.Cap()
	for pos := ex.Start; pos < len(ex.Tokens); pos++ {
		logits = e.ctx.Logits(idx, logits)
		best := int32(0)
		for v := range logits {
			if logits[v] > logits[best] {
				best = int32(v)
			}
		}
		if best != ex.Tokens[pos] {
			return false, nil
		}
		e.batch.Clear()
		idx = e.batch.Add(best, pos, 0, true)
		if err := e.ctx.Decode(e.batch); err != nil {
			return false, err
		}
	}
	return true, nil
}

// nll is −log softmax(logits)[y], computed stably.
func nll(logits []float32, y int32) float64 {
	mx := logits[0]
	for _, v := range logits {
		mx = max(mx, v)
	}
	var z float64
	for _, v := range logits {
		z += math.Exp(float64(v - mx))
	}
	return float64(mx) + math.Log(z) - float64(logits[y])
}
