package serving

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"strings"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/serving/llama"
)

// Verifier is the chain verifier of parallel test-time scaling:
// a linear head over the base model's last hidden state at the end of a
// chain's answer, P(correct) = σ(w·h + b), fitted by logistic regression
// (L2-regularised maximum likelihood, accelerated gradient) from labelled
// chains. It is
// stored as JSON beside the model or adapter it judges (VerifierPath).
type Verifier struct {
	// Type is "logistic".
	Type string `json:"type"`
	// Features is "last_hidden": the base model's final-norm hidden state
	// at the last token of the answer (NEmbd floats); for the switcher's
	// probe (switcher.go) "mean_hidden_difficulty": the mean hidden state
	// of the prompt and the capability difficulty (NEmbd+1).
	Features string `json:"features"`
	// BaseChecksum is the base model's general.base_checksum the weights
	// were fitted on ("" if the base has none); a verifier for another base
	// is refused.
	BaseChecksum string    `json:"base_checksum,omitempty"`
	Weights      []float64 `json:"weights"`
	Bias         float64   `json:"bias"`
	// Examples and TrainAccuracy describe the fit.
	Examples      int     `json:"examples,omitempty"`
	TrainAccuracy float64 `json:"train_accuracy,omitempty"`
}

// Score is σ(w·h + b), in (0, 1). h must have len(Weights) elements.
func (v *Verifier) Score(h []float32) float64 {
	z := v.Bias
	for i, w := range v.Weights {
		z += w * float64(h[i])
	}
	return 1 / (1 + math.Exp(-z))
}

// VerifierPath is where the verifier of the model or adapter GGUF at path
// lives: the same name with ".verifier.json" for ".gguf".
func VerifierPath(path string) string {
	return strings.TrimSuffix(path, ".gguf") + ".verifier.json"
}

// LoadVerifier reads a verifier JSON file. Errors: unreadable file, bad
// JSON, unknown type or features, no weights.
func LoadVerifier(path string) (*Verifier, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v Verifier
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("verifier %s: %w", path, err)
	}
	if v.Type != "logistic" || v.Features != "last_hidden" && v.Features != "mean_hidden_difficulty" || len(v.Weights) == 0 {
		return nil, fmt.Errorf("verifier %s: want type logistic, features last_hidden or mean_hidden_difficulty, and weights", path)
	}
	return &v, nil
}

// FitVerifier fits a logistic-regression verifier to features xs (each of
// the same length) and labels ys (true: a correct chain), minimising the
// mean negative log-likelihood plus l2/2·|w|² (the bias is not
// regularised) by accelerated gradient descent. Errors: no examples, ragged
// features, a single class, the optimiser's failure.
func FitVerifier(xs [][]float32, ys []bool, l2 float64) (*Verifier, error) {
	if len(xs) == 0 || len(xs) != len(ys) {
		return nil, errors.New("verifier: need as many labels as examples, at least one")
	}
	d := len(xs[0])
	pos := 0
	for i, x := range xs {
		if len(x) != d {
			return nil, fmt.Errorf("verifier: example %d has %d features, want %d", i, len(x), d)
		}
		if ys[i] {
			pos++
		}
	}
	if pos == 0 || pos == len(ys) {
		return nil, errors.New("verifier: the examples need both correct and incorrect chains")
	}
	w := fitLogistic(xs, ys, l2)
	v := &Verifier{Type: "logistic", Features: "last_hidden", Weights: w[:d], Bias: w[d], Examples: len(xs)}
	right := 0
	for i, x := range xs {
		if (v.Score(x) >= 0.5) == ys[i] {
			right++
		}
	}
	v.TrainAccuracy = float64(right) / float64(len(xs))
	return v, nil
}

// fitLogistic minimises the L2-regularised mean logistic loss by Nesterov's
// accelerated gradient (Nesterov 1983; FISTA's momentum, Beck & Teboulle
// 2009) with the constant step 1/L, L = Σ|x̃|²/(4n) + l2 (x̃ = (x, 1)) an
// upper bound of the loss's smoothness, so it converges without a line
// search. It stops when the gradient's norm is below 1e-6 or after 20000
// iterations; it returns the weights followed by the bias.
func fitLogistic(xs [][]float32, ys []bool, l2 float64) []float64 {
	d, n := len(xs[0]), float64(len(xs))
	var lip float64
	for _, x := range xs {
		lip++
		for _, v := range x {
			lip += float64(v) * float64(v)
		}
	}
	lip = lip/(4*n) + l2
	w, prev, y, g := make([]float64, d+1), make([]float64, d+1), make([]float64, d+1), make([]float64, d+1)
	t := 1.0
	for range 20000 {
		clear(g)
		for i, x := range xs {
			z := y[d]
			for k, xv := range x {
				z += y[k] * float64(xv)
			}
			r := 1 / (1 + math.Exp(-z))
			if ys[i] {
				r--
			}
			for k, xv := range x {
				g[k] += r * float64(xv) / n
			}
			g[d] += r / n
		}
		var norm float64
		for k := range d {
			g[k] += l2 * y[k]
		}
		for _, v := range g {
			norm += v * v
		}
		if math.Sqrt(norm) < 1e-6 {
			copy(w, y)
			break
		}
		copy(prev, w)
		for k := range w {
			w[k] = y[k] - g[k]/lip
		}
		tn := (1 + math.Sqrt(1+4*t*t)) / 2
		for k := range y {
			y[k] = w[k] + (t-1)/tn*(w[k]-prev[k])
		}
		t = tn
	}
	return w
}

// answerExtractor finds a chain's final answer in its content: the last
// match of a regular expression (its first group if it has one), a JSON
// field of the content (gjson path), or the whole trimmed content.
type answerExtractor struct {
	re    *regexp.Regexp
	field string
}

// extract returns the answer and the byte offset in content where it ends;
// ok is false when nothing matches.
func (x answerExtractor) extract(content string) (answer string, end int, ok bool) {
	switch {
	case x.re != nil:
		ms := x.re.FindAllStringSubmatchIndex(content, -1)
		if len(ms) == 0 {
			return "", 0, false
		}
		m := ms[len(ms)-1]
		s, e := m[0], m[1]
		if len(m) >= 4 && m[2] >= 0 {
			s, e = m[2], m[3]
		}
		return strings.TrimSpace(content[s:e]), e, true
	case x.field != "":
		r := gjson.Get(content, x.field)
		if !gjson.Valid(content) || !r.Exists() {
			return "", 0, false
		}
		return strings.TrimSpace(r.String()), len(content), true
	}
	a := strings.TrimSpace(content)
	return a, len(content), a != ""
}

// verifiers holds the engine's loaded verifiers by file path (nil: none
// there), read once.
type verifiers struct {
	mu     sync.Mutex // byPath
	byPath map[string]*Verifier
	hmu    sync.Mutex // hidden
	hidden *llama.HiddenContext
}

// verifierFor is the verifier beside adapter's file (the base model's for
// ""), or nil. A file that cannot be read as a verifier, or was fitted for
// another base, is an error.
func (e *Engine) verifierFor(adapter string) (*Verifier, error) {
	path := e.cfg.ModelPath
	if adapter != "" {
		entry, ok := e.adapters.lookup(adapter)
		if !ok {
			return nil, fmt.Errorf("%w %q", ErrUnknownAdapter, adapter)
		}
		path = entry.path
	}
	path = VerifierPath(path)
	vs := &e.reasoning.verifiers
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if v, ok := vs.byPath[path]; ok {
		return v, nil
	}
	var v *Verifier
	if _, err := os.Stat(path); err == nil {
		if v, err = LoadVerifier(path); err != nil {
			return nil, err
		}
		if v.Features != "last_hidden" || len(v.Weights) != e.model.NEmbd() {
			return nil, fmt.Errorf("verifier %s: features %s and %d weights; want last_hidden and the model's %d", path, v.Features, len(v.Weights), e.model.NEmbd())
		}
		if v.BaseChecksum != "" && v.BaseChecksum != e.adapters.checksum {
			return nil, fmt.Errorf("verifier %s was fitted on base %s, this base is %s", path, v.BaseChecksum, e.adapters.checksum)
		}
	}
	if vs.byPath == nil {
		vs.byPath = map[string]*Verifier{}
	}
	vs.byPath[path] = v
	return v, nil
}

// chainTokens is what follows a (reasoning-opened) prompt in a chain, up
// to the end of its answer: the reasoning, the end delimiter and the
// content up to answerEnd; the content alone for a chain without
// reasoning.
func (e *Engine) chainTokens(reasoning *string, content string, answerEnd int) ([]int32, error) {
	var sb strings.Builder
	if reasoning != nil {
		sb.WriteString(*reasoning)
		sb.WriteString(e.reasoning.end)
	}
	sb.WriteString(content[:answerEnd])
	return e.model.Tokenize(sb.String(), false, false)
}

// lastHiddenStates runs prompt and each continuation through the base
// model's hidden-state context (created on first use; calls are
// serialised) and returns the state at each continuation's last token.
func (e *Engine) lastHiddenStates(prompt []int32, conts [][]int32) ([][]float32, error) {
	h, unlock, err := e.hiddenContext()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return h.LastStates(prompt, conts)
}

// hiddenContext returns the hidden-state context, created on first use,
// locked until unlock is called.
func (e *Engine) hiddenContext() (*llama.HiddenContext, func(), error) {
	vs := &e.reasoning.verifiers
	vs.hmu.Lock()
	if vs.hidden == nil {
		h, err := llama.NewHiddenContext(e.model, e.nCtxSeq, e.cfg.NBatch, e.cfg.Threads)
		if err != nil {
			vs.hmu.Unlock()
			return nil, nil, err
		}
		vs.hidden = h
	}
	return vs.hidden, vs.hmu.Unlock, nil
}

// closeVerifiers frees the hidden-state context.
func (e *Engine) closeVerifiers() {
	if e.reasoning == nil {
		return
	}
	vs := &e.reasoning.verifiers
	vs.hmu.Lock()
	defer vs.hmu.Unlock()
	if vs.hidden != nil {
		vs.hidden.Close()
		vs.hidden = nil
	}
}

// VerifierExample is one labelled chain for FitVerifier: a chat prompt,
// the chain's reasoning (nil: none) and content, and whether its answer
// was correct.
type VerifierExample struct {
	Messages  []llama.ChatMessage `json:"messages"`
	Reasoning *string             `json:"reasoning,omitempty"`
	Content   string              `json:"content"`
	Correct   bool                `json:"correct"`
}

// VerifierFeatures is the verifier's input for one chain, computed as the
// engine computes it when voting: the base model's last hidden state at
// the end of the chain's extracted answer (the end of the content when no
// answer is extracted), after the templated prompt (opened with the start
// delimiter when the chain has reasoning). Errors: tokenization, a chain
// longer than a sequence's context, llama.cpp failures.
func (e *Engine) VerifierFeatures(ex VerifierExample) ([]float32, error) {
	prompt, err := e.tokenizeChat(ex.Messages)
	if err != nil {
		return nil, err
	}
	if ex.Reasoning != nil {
		prompt = append(prompt, e.reasoning.startToks...)
	}
	end := len(ex.Content)
	if _, at, ok := e.reasoning.answers.extract(ex.Content); ok {
		end = at
	}
	cont, err := e.chainTokens(ex.Reasoning, ex.Content, end)
	if err != nil {
		return nil, err
	}
	hs, err := e.lastHiddenStates(prompt, [][]int32{cont})
	if err != nil {
		return nil, err
	}
	return hs[0], nil
}

// TrainVerifier fits a verifier on examples with the engine's features
// (VerifierFeatures) and records the base checksum. Errors: as
// VerifierFeatures and FitVerifier.
func (e *Engine) TrainVerifier(examples []VerifierExample, l2 float64) (*Verifier, error) {
	xs := make([][]float32, len(examples))
	ys := make([]bool, len(examples))
	for i, ex := range examples {
		x, err := e.VerifierFeatures(ex)
		if err != nil {
			return nil, fmt.Errorf("example %d: %w", i, err)
		}
		xs[i], ys[i] = x, ex.Correct
	}
	v, err := FitVerifier(xs, ys, l2)
	if err != nil {
		return nil, err
	}
	v.BaseChecksum = e.adapters.checksum
	return v, nil
}

// ReadVerifierExamples reads labelled chains, one JSON VerifierExample per
// line (blank lines skipped). Errors: a line that is not such an object,
// with its line number.
func ReadVerifierExamples(r io.Reader) ([]VerifierExample, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var out []VerifierExample
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var ex VerifierExample
		if err := json.Unmarshal(b, &ex); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if len(ex.Messages) == 0 {
			return nil, fmt.Errorf("line %d: no messages", line)
		}
		out = append(out, ex)
	}
	return out, sc.Err()
}
