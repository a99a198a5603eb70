package serving

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/molly-gateway/molly/serving/llama"
)

// oracleGreedy decodes n tokens greedily after prompt with llama.cpp
// directly, one token per decode (the reference for Verify).
func oracleGreedy(t *testing.T, modelPath string, prompt []int32, n int) []int32 {
	t.Helper()
	m, err := llama.LoadModel(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	c, err := llama.NewContext(m, llama.ContextParams{NCtx: 512, NBatch: 512, NSeqMax: 1, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := llama.NewBatch(512)
	defer b.Free()
	for i, tok := range prompt {
		b.Add(tok, i, 0, i == len(prompt)-1)
	}
	var out []int32
	for len(out) < n {
		if err := c.Decode(b); err != nil {
			t.Fatal(err)
		}
		next := argmax(c.LogitsView(b.Len() - 1))
		out = append(out, next)
		b.Clear()
		b.Add(next, len(prompt)+len(out)-1, 0, true)
	}
	return out
}

func TestVerifyAcceptsTheTargetsGreedyPrefix(t *testing.T) {
	e := newEngine(t, nil)
	prompt, err := e.Tokenize("verify me please")
	if err != nil {
		t.Fatal(err)
	}
	g := oracleGreedy(t, DemoConfig(demoDir).ModelPath, prompt, 12)
	wrong := (g[2] + 1) % int32(e.model.NVocab())
	cases := []struct {
		prefix, draft []int32
		acc           int
		next          int32
	}{
		{prompt, g[:6], 6, g[6]},
		{prompt, []int32{g[0], g[1], wrong, g[3]}, 2, g[2]},
		{prompt, nil, 0, g[0]},
		{append(append([]int32{}, prompt...), g[:4]...), g[4:8], 4, g[8]}, // extends the cached prefix
		{prompt, []int32{wrong}, 0, g[0]},                                 // goes back before it
	}
	for i, c := range cases {
		body := map[string]any{"prefix": c.prefix, "draft": c.draft}
		rec := call(t, e, context.Background(), http.MethodPost, "/molly/engine/verify", body)
		if rec.Code != http.StatusOK {
			t.Fatalf("case %d: status %d: %s", i, rec.Code, rec.Body)
		}
		var got struct {
			Accepted int   `json:"accepted"`
			Next     int32 `json:"next"`
			EOG      bool  `json:"eog"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatal(err)
		}
		if got.Accepted != c.acc || got.Next != c.next {
			t.Errorf("case %d: accepted %d next %d, want %d and %d", i, got.Accepted, got.Next, c.acc, c.next)
		}
	}
	for _, bad := range []map[string]any{
		{"prefix": []int32{}},
		{"prefix": []int32{1, int32(e.model.NVocab())}},
		{"prefix": "1 2 3"},
		{"prefix": []any{1, 2.5}},
		{"prefix": make([]int32, e.ContextTokens())},
	} {
		rec := call(t, e, context.Background(), http.MethodPost, "/molly/engine/verify", bad)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%v: status %d, want 400: %s", fmt.Sprint(bad)[:min(40, len(fmt.Sprint(bad)))], rec.Code, rec.Body)
		}
	}
}
