package serving

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/serving/llama"
)

// embedState is the engine's embeddings context, made on first use (it
// holds its own KV for one input) and used by one request at a time.
type embedState struct {
	mu     sync.Mutex
	emb    *llama.Embedder
	closed bool
}

func (s *embedState) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.emb != nil {
		s.emb.Close()
		s.emb = nil
	}
}

// EmbedMaxTokens is the most tokens one embeddings input may have (the
// embeddings context's size, at most the model's training context).
func (e *Engine) EmbedMaxTokens() int {
	n := min(e.nCtxSeq, 2048)
	if t := e.model.NCtxTrain(); t > 0 {
		n = min(n, t)
	}
	return n
}

// Embed returns the L2-normalised mean-pooled embedding of each input
// (tokens, already tokenized), each NEmbd floats, as OpenAI's and
// llama.cpp's servers return them. Pooling is mean over the input's tokens
// (llama.cpp LLAMA_POOLING_TYPE_MEAN) on the base model. Errors:
// ErrContextLength for an input over EmbedMaxTokens, ErrClosed.
func (e *Engine) Embed(inputs [][]int32) ([][]float32, error) {
	max := e.EmbedMaxTokens()
	for i, in := range inputs {
		if len(in) > max {
			return nil, fmt.Errorf("%w: input %d has %d tokens, at most %d", ErrContextLength, i, len(in), max)
		}
		if len(in) == 0 {
			return nil, badRequest("input", "input %d is empty", i)
		}
	}
	s := &e.emb
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.emb == nil {
		emb, err := llama.NewEmbedder(e.model, max, e.cfg.Threads, llama.PoolingMean)
		if err != nil {
			return nil, err
		}
		s.emb = emb
	}
	out := make([][]float32, len(inputs))
	for i, in := range inputs {
		v, err := s.emb.Embed(in)
		if err != nil {
			return nil, err
		}
		out[i] = normalize(v[0])
	}
	return out, nil
}

// normalize scales v to unit Euclidean length (a zero vector stays zero).
func normalize(v []float32) []float32 {
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		return v
	}
	k := 1 / math.Sqrt(sum)
	for i := range v {
		v[i] = float32(float64(v[i]) * k)
	}
	return v
}

// serveEmbeddings answers POST /v1/embeddings: input a string, an array of
// strings, an array of token ids or an array of such arrays;
// encoding_format float (default) or base64 (little-endian float32, as
// OpenAI sends); dimensions, if given, must be the model's. The model must
// be the base model. An empty string input is a 400 (OpenAI's spec: it
// "cannot be an empty string"), as is an empty token array.
func (e *Engine) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		w.Header().Set("Allow", http.MethodPost) // a 405 lists the path's methods (RFC 9110 §15.5.6)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", "use POST for "+r.URL.Path)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 32<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", "", "reading request body: "+err.Error())
		return
	}
	model, inputs, enc, err := e.parseEmbeddings(body)
	if err == nil {
		var vecs [][]float32
		if vecs, err = e.Embed(inputs); err == nil {
			n := 0
			for _, in := range inputs {
				n += len(in)
			}
			data := make([]map[string]any, len(vecs))
			for i, v := range vecs {
				var emb any = v
				if enc == "base64" {
					b := make([]byte, 4*len(v))
					for j, x := range v {
						binary.LittleEndian.PutUint32(b[4*j:], math.Float32bits(x))
					}
					emb = base64.StdEncoding.EncodeToString(b)
				}
				data[i] = map[string]any{"object": "embedding", "index": i, "embedding": emb}
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "model": model,
				"usage": map[string]any{"prompt_tokens": n, "total_tokens": n}})
			return
		}
	}
	ae := classify(err)
	if ae.param == "messages" {
		ae.param = "input"
	}
	writeError(w, ae.status, ae.typ, ae.param, ae.code, ae.msg)
}

func (e *Engine) parseEmbeddings(body []byte) (string, [][]int32, string, error) {
	if _, aerr := openai.ParseRequest(openai.EndpointEmbeddings, body); aerr != nil {
		return "", nil, "", &apiError{aerr.Status, aerr.Type, aerr.Param, aerr.Code, aerr.Message}
	}
	model := gjson.GetBytes(body, "model").Str
	if model != e.cfg.ModelName {
		msg := fmt.Sprintf("the model %q does not exist; this engine embeds with %q", model, e.cfg.ModelName)
		if base, _, ok := strings.Cut(model, ":"); ok && base == e.cfg.ModelName {
			msg = fmt.Sprintf("embeddings use the base model %q, not an adapter", e.cfg.ModelName)
		}
		return "", nil, "", &apiError{http.StatusNotFound, "invalid_request_error", "model", "model_not_found", msg}
	}
	enc := gjson.GetBytes(body, "encoding_format").Str
	if enc != "" && enc != "float" && enc != "base64" {
		return "", nil, "", badRequest("encoding_format", "encoding_format must be float or base64")
	}
	if d := gjson.GetBytes(body, "dimensions"); d.Exists() && int(d.Int()) != e.model.NEmbd() {
		return "", nil, "", unsupported("dimensions", "this model's embeddings have %d dimensions and cannot be shortened", e.model.NEmbd())
	}
	in := gjson.GetBytes(body, "input")
	var items []gjson.Result
	switch {
	case in.Type == gjson.String:
		items = []gjson.Result{in}
	case in.IsArray() && len(in.Array()) > 0 && in.Array()[0].Type == gjson.Number:
		items = []gjson.Result{in} // one token array
	case in.IsArray():
		items = in.Array()
	default:
		return "", nil, "", badRequest("input", "input must be a string, an array of strings or an array of token arrays")
	}
	if len(items) == 0 || len(items) > 2048 {
		return "", nil, "", badRequest("input", "input must have 1 to 2048 items")
	}
	nv := int64(e.model.NVocab())
	out := make([][]int32, len(items))
	for i, it := range items {
		switch {
		case it.Type == gjson.String:
			if it.Str == "" {
				// OpenAI's CreateEmbeddingRequest: the input "cannot be an
				// empty string" (it would embed the BOS token alone).
				return "", nil, "", badRequest("input", "input %d is an empty string", i)
			}
			if err := e.checkBytes(len(it.Str)); err != nil {
				return "", nil, "", err
			}
			t, err := e.model.Tokenize(it.Str, true, false)
			if err != nil {
				return "", nil, "", err
			}
			out[i] = t
		case it.IsArray():
			for _, x := range it.Array() {
				if x.Type != gjson.Number || x.Int() < 0 || x.Int() >= nv || float64(x.Int()) != x.Num {
					return "", nil, "", badRequest("input", "input %d: token ids must be integers in [0, %d)", i, nv)
				}
				out[i] = append(out[i], int32(x.Int()))
			}
		default:
			return "", nil, "", badRequest("input", "input %d must be a string or an array of token ids", i)
		}
	}
	return model, out, enc, nil
}

// Capabilities are what the engine implements beyond text in and text
// out, in router/route's capability names (route.CapabilityReporter, which
// the T0 target's catalogue entry reads): "tools" (tools, tool_choice
// auto/none/required/function, parallel_tool_calls, tool turns),
// "json_schema" (response_format json_object and json_schema, the schema
// subset of SchemaToGBNF), "embeddings" (POST /v1/embeddings) and
// "logprobs". Not "vision" or "audio": the engine is text-only. Chat and
// completions are endpoints, not capabilities.
func (e *Engine) Capabilities() []string {
	return []string{"tools", "json_schema", "embeddings", "logprobs"}
}
