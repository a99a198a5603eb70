package serving

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving/llama"
)

type embeddingsResponse struct {
	Object string `json:"object"`
	Model  string `json:"model"`
	Data   []struct {
		Object    string          `json:"object"`
		Index     int             `json:"index"`
		Embedding json.RawMessage `json:"embedding"`
	} `json:"data"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	} `json:"usage"`
}

func embed(t *testing.T, e *Engine, body map[string]any) (int, []byte, embeddingsResponse) {
	t.Helper()
	w := call(t, e, context.Background(), http.MethodPost, "/v1/embeddings", body)
	var r embeddingsResponse
	if w.Code == http.StatusOK {
		if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
	}
	return w.Code, w.Body.Bytes(), r
}

func floats(t *testing.T, raw json.RawMessage) []float32 {
	t.Helper()
	var v []float32
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestEmbeddings(t *testing.T) {
	spec := openapitest.Load(t)
	e := newEngine(t, nil)
	// The dimension from the GGUF metadata, read by ollama's GGUF decoder.
	f, err := os.Open(filepath.Join(demoDir, DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	g, err := ggml.Decode(f, 0)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dim := int(g.KV().EmbeddingLength())

	code, body, r := embed(t, e, map[string]any{"model": "molly-demo", "input": []string{"hello world", "other text", "hello world"}})
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	spec.Validate(t, "CreateEmbeddingResponse", body)
	if len(r.Data) != 3 || r.Model != "molly-demo" {
		t.Fatalf("%s", body)
	}
	vs := make([][]float32, 3)
	for i, d := range r.Data {
		vs[i] = floats(t, d.Embedding)
		if d.Index != i || len(vs[i]) != dim {
			t.Fatalf("item %d: index %d, %d dimensions, want %d", i, d.Index, len(vs[i]), dim)
		}
		var n float64
		for _, x := range vs[i] {
			n += float64(x) * float64(x)
		}
		if math.Abs(math.Sqrt(n)-1) > 1e-5 {
			t.Errorf("item %d: norm %v, want 1", i, math.Sqrt(n))
		}
	}
	for j := range vs[0] {
		if vs[0][j] != vs[2][j] {
			t.Fatal("identical inputs gave different vectors")
		}
	}
	same := true
	for j := range vs[0] {
		same = same && vs[0][j] == vs[1][j]
	}
	if same {
		t.Fatal("different inputs gave the same vector")
	}

	// The oracle: per-token outputs of an unpooled llama.cpp context,
	// averaged and normalised here, match the served (mean-pooled) vector.
	m, err := llama.LoadModel(filepath.Join(demoDir, DemoModelFile))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	toks, err := m.Tokenize("hello world", true, false)
	if err != nil {
		t.Fatal(err)
	}
	un, err := llama.NewEmbedder(m, 64, 1, llama.PoolingNone)
	if err != nil {
		t.Fatal(err)
	}
	defer un.Close()
	per, err := un.Embed(toks)
	if err != nil {
		t.Fatal(err)
	}
	mean := make([]float64, dim)
	for _, v := range per {
		for j, x := range v {
			mean[j] += float64(x) / float64(len(per))
		}
	}
	var n float64
	for _, x := range mean {
		n += x * x
	}
	for j := range mean {
		if d := math.Abs(mean[j]/math.Sqrt(n) - float64(vs[0][j])); d > 1e-4 {
			t.Fatalf("dimension %d: served %v, mean of token outputs %v", j, vs[0][j], mean[j]/math.Sqrt(n))
		}
	}
	if r.Usage.PromptTokens != 2*len(toks)+len(mustTokens(t, m, "other text")) || r.Usage.TotalTokens != r.Usage.PromptTokens {
		t.Errorf("usage %+v", r.Usage)
	}

	// Token arrays and base64 give the same vector.
	code, body, r = embed(t, e, map[string]any{"model": "molly-demo", "input": [][]int32{toks}, "encoding_format": "base64"})
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, body)
	}
	var b64 string
	_ = json.Unmarshal(r.Data[0].Embedding, &b64)
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil || len(raw) != 4*dim {
		t.Fatalf("base64: %v, %d bytes", err, len(raw))
	}
	dec := make([]float32, dim)
	for j := range dim {
		if dec[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:])); dec[j] != vs[0][j] {
			t.Fatalf("base64 of token ids: dimension %d is %v, want %v", j, dec[j], vs[0][j])
		}
	}
	// OpenAI's document types embedding as an array only, though the API
	// sends base64 as a string (the SDKs decode it): validate the rest of
	// the body with the decoded vector in its place.
	var doc map[string]any
	_ = json.Unmarshal(body, &doc)
	doc["data"].([]any)[0].(map[string]any)["embedding"] = dec
	decoded, _ := json.Marshal(doc)
	spec.Validate(t, "CreateEmbeddingResponse", decoded)
	code, body, r = embed(t, e, map[string]any{"model": "molly-demo", "input": toks})
	if code != http.StatusOK || len(r.Data) != 1 || floats(t, r.Data[0].Embedding)[0] != vs[0][0] {
		t.Fatalf("one token array: %d %s", code, body)
	}

	// Errors.
	for _, tc := range []struct {
		body       map[string]any
		status     int
		param, sub string
	}{
		{map[string]any{"model": "molly-demo", "input": strings.Repeat("word ", 3000)}, 400, "input", ""},
		{map[string]any{"model": "molly-demo:support", "input": "x"}, 404, "model", "base model"},
		{map[string]any{"model": "molly-demo", "input": []int{1, 1 << 30}}, 400, "input", "token ids"},
		{map[string]any{"model": "molly-demo", "input": "x", "dimensions": dim - 1}, 400, "dimensions", ""},
		{map[string]any{"model": "molly-demo", "input": "x", "encoding_format": "hex"}, 400, "encoding_format", ""},
		// The input "cannot be an empty string" (CreateEmbeddingRequest.input).
		{map[string]any{"model": "molly-demo", "input": ""}, 400, "input", "empty"},
		{map[string]any{"model": "molly-demo", "input": []string{"x", ""}}, 400, "input", "input 1"},
	} {
		code, body, _ := embed(t, e, tc.body)
		var er chatResponse
		_ = json.Unmarshal(body, &er)
		if code != tc.status || er.Error == nil || er.Error.Param == nil || *er.Error.Param != tc.param || !strings.Contains(er.Error.Message, tc.sub) {
			t.Errorf("%v: %d %s", tc.body["input"], code, body)
		}
	}
}

func mustTokens(t *testing.T, m *llama.Model, s string) []int32 {
	t.Helper()
	toks, err := m.Tokenize(s, true, false)
	if err != nil {
		t.Fatal(err)
	}
	return toks
}

// The catalogue reads the engine's capabilities through
// route.CapabilityReporter; every name must be one the router knows, and a
// T0 target built on the engine serves embeddings and tools.
func TestCapabilitiesReachTheCatalogue(t *testing.T) {
	e := newEngine(t, nil)
	var _ route.CapabilityReporter = e
	for _, c := range e.Capabilities() {
		if !slices.Contains(route.AllCapabilities, c) {
			t.Errorf("capability %q is not one of %v", c, route.AllCapabilities)
		}
	}
	cat, err := route.NewCatalogue([]*route.Target{{Name: "device", Tier: "T0", Kind: route.KindEngine}}, e)
	if err != nil {
		t.Fatal(err)
	}
	tg := cat.Targets()[0]
	for _, c := range []string{route.CapTools, route.CapJSONSchema, route.CapEmbeddings, route.CapLogprobs} {
		if !tg.Supports(c) {
			t.Errorf("the engine's target lacks %s", c)
		}
	}
	if tg.Supports(route.CapVision) || tg.Supports(route.CapAudio) {
		t.Error("the text-only engine's target claims vision or audio")
	}
	if !slices.Contains(tg.Endpoints, "embeddings") {
		t.Errorf("endpoints %v lack embeddings", tg.Endpoints)
	}
}
