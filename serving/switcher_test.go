package serving

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/serving/llama"
)

func TestSwitcherActivatesTheReasoningAdapterForHardPrompts(t *testing.T) {
	e := newEngine(t, func(c *Config) { c.Reasoning.Adapter = "support"; c.Reasoning.Medium = 16 })
	sig := func(z float64) float64 { return 1 / (1 + math.Exp(-z)) }
	// Difficulties computed by hand from router/capability's features (as
	// its own tests do): the greeting is easy, the proof hard.
	const easy, hard = "hello", "Prove step by step that the sum must be even for all n > 1"
	easyScore := sig(-1.6 + 0.5*math.Log1p(2.0/40) + 0.2 - 0.4)
	hardScore := sig(-1.6 + 0.5*math.Log1p(15.0/40) + 0.8*2 + 0.3*1 + 0.6)
	post := func(body map[string]any) (string, reasoningResponse) {
		t.Helper()
		w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", body)
		var r reasoningResponse
		if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || w.Code != http.StatusOK {
			t.Fatalf("status %d %q: %v", w.Code, w.Body.String(), err)
		}
		return w.Header().Get(HeaderReasoning), r
	}
	same := func(name string, got, want reasoningResponse) {
		t.Helper()
		g, w := got.Choices[0].Message, want.Choices[0].Message
		if g.Content != w.Content || (g.ReasoningContent == nil) != (w.ReasoningContent == nil) ||
			(g.ReasoningContent != nil && *g.ReasoningContent != *w.ReasoningContent) {
			t.Errorf("%s: answer %+v differs from the reference %+v", name, g, w)
		}
	}

	h, r := post(reasoningBody(hard, 30, nil))
	if want := fmt.Sprintf("on adapter=support score=%.4f threshold=0.5000 by=difficulty", hardScore); h != want {
		t.Errorf("hard prompt: header %q, want %q", h, want)
	}
	b := reasoningBody(hard, 30, map[string]any{"reasoning_effort": "medium"})
	b["model"] = "molly-demo:support"
	_, ref := post(b)
	same("hard prompt", r, ref)
	if d := r.Usage.CompletionTokensDetails; d == nil || d.ReasoningTokens != 17 {
		t.Errorf("hard prompt: usage %+v, want the medium budget 16 + </think>", r.Usage)
	}

	h, r = post(reasoningBody(easy, 10, nil))
	if want := fmt.Sprintf("off score=%.4f threshold=0.5000 by=difficulty", easyScore); h != want {
		t.Errorf("easy prompt: header %q, want %q", h, want)
	}
	plain := newEngine(t, nil)
	_, ref = reasoningChat(t, plain, reasoningBody(easy, 10, nil))
	same("easy prompt", r, ref)

	// reasoning_effort decides over the score, both ways.
	h, r = post(reasoningBody(easy, 30, map[string]any{"reasoning_effort": "low", "max_reasoning_tokens": 5}))
	if want := fmt.Sprintf("on adapter=support score=%.4f threshold=0.5000 by=reasoning_effort", easyScore); h != want {
		t.Errorf("effort low: header %q, want %q", h, want)
	}
	if d := r.Usage.CompletionTokensDetails; d == nil || d.ReasoningTokens != 6 {
		t.Errorf("effort low: usage %+v", r.Usage)
	}
	h, r = post(reasoningBody(hard, 10, map[string]any{"reasoning_effort": "none"}))
	if want := fmt.Sprintf("off score=%.4f threshold=0.5000 by=reasoning_effort", hardScore); h != want {
		t.Errorf("effort none: header %q, want %q", h, want)
	}
	_, ref = reasoningChat(t, plain, reasoningBody(hard, 10, map[string]any{"reasoning_effort": "none"}))
	same("effort none", r, ref)

	// A named adapter is never switched, and no switcher means no header.
	b = reasoningBody(hard, 5, nil)
	b["model"] = "molly-demo:billing"
	if h, _ := post(b); h != "" {
		t.Errorf("named adapter: header %q", h)
	}
	w := call(t, plain, context.Background(), http.MethodPost, "/v1/chat/completions", reasoningBody(hard, 5, nil))
	if h := w.Header().Get(HeaderReasoning); h != "" {
		t.Errorf("no switcher: header %q", h)
	}
}

func TestSwitcherProbeDecidesFromThePromptsHiddenState(t *testing.T) {
	trainer := newEngine(t, nil)
	hard := []string{"zebra", "a zebra", "zebra zebra"}
	easy := []string{"hello", "hello there", "hi"}
	var ex []ProbeExample
	for i := range hard {
		ex = append(ex, ProbeExample{Messages: []llama.ChatMessage{{Role: "user", Content: hard[i]}}, Hard: true},
			ProbeExample{Messages: []llama.ChatMessage{{Role: "user", Content: easy[i]}}})
	}
	probe, err := trainer.TrainProbe(ex, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	if probe.TrainAccuracy != 1 {
		t.Fatalf("probe train accuracy %v", probe.TrainAccuracy)
	}
	path := filepath.Join(t.TempDir(), "probe.json")
	js, _ := json.Marshal(probe)
	if err := os.WriteFile(path, js, 0o644); err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, func(c *Config) { c.Reasoning.Adapter, c.Reasoning.Probe, c.Reasoning.Medium = "support", path, 4 })
	// Oracle: the features read by a separate hidden-state context from the
	// rendered prompt, and router/capability's difficulty.
	h, err := llama.NewHiddenContext(e.model, 256, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	est := capability.NewEstimator(nil)
	for _, p := range []string{"zebra", "hello", "zebra zebra"} {
		toks, _ := e.model.Tokenize("<|im_start|>user\n"+p+"<|im_end|>\n<|im_start|>assistant\n", true, true)
		mean, err := h.MeanState(toks)
		if err != nil {
			t.Fatal(err)
		}
		score := probe.Score(append(mean, float32(est.Estimate(p, false).Difficulty)))
		state := map[bool]string{true: "on adapter=support ", false: "off "}[score >= 0.5]
		want := fmt.Sprintf("%sscore=%.4f threshold=0.5000 by=probe", state, score)
		w := call(t, e, context.Background(), http.MethodPost, "/v1/chat/completions", reasoningBody(p, 8, nil))
		if got := w.Header().Get(HeaderReasoning); got != want || w.Code != http.StatusOK {
			t.Errorf("%q: status %d header %q, want %q", p, w.Code, got, want)
		}
		if (score >= 0.5) != strings.HasPrefix(p, "zebra") {
			t.Errorf("%q: probe score %.4f", p, score)
		}
	}
}
