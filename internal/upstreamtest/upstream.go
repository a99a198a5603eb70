// Package upstreamtest is a small OpenAI-compatible server for tests: it
// plays the upstream APIs Molly cannot reach (LAN, self-hosted, external
// providers), on loopback only, and records every request it receives.
//
// Behaviour is steered by the last user message: it is echoed back as the
// answer (unless ToolCalls asks for tool calls); "FAIL500" makes the server answer 500; "TRUNCATE" makes a stream
// stop after two chunks without a finish_reason or [DONE]. With Logprob set,
// a chat answer to a request with "logprobs": true carries logprobs.content,
// each entry with that logprob: one per word of a non-streamed answer, one
// per content chunk of a stream.
package upstreamtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
)

// Upstream is one fake OpenAI-compatible server.
type Upstream struct {
	Name string
	// ChunkDelay is the pause between streamed chunks.
	ChunkDelay time.Duration
	// Chunks is how many content chunks a stream is cut into (default 4).
	Chunks int
	// Logprob, when non-zero, is the log-probability (nats, ≤ 0) given to
	// every token of a chat answer whose request asked for "logprobs": true,
	// so their mean is Logprob; a stream's content chunk is one token. Set
	// it before requests.
	Logprob float64
	// ToolCalls, when set, is asked about every non-streamed chat request;
	// when it returns calls, the answer carries them as tool_calls
	// (finish_reason "tool_calls", content null) instead of the echo. Set
	// it before requests.
	ToolCalls func(body []byte) []ToolCall
	// Answer, when set, writes the answer to a prompt (the last user
	// message) instead of the echo "<name> says: <prompt>". Set it before
	// requests.
	Answer func(prompt string) string

	srv     *httptest.Server
	mu      sync.Mutex
	bodies  [][]byte
	drained int // bodies before this index were returned by Drain
	paths   []string
	heads   []http.Header
}

// ToolCall is one function call in an answer's tool_calls.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string // JSON text
}

// Start starts an upstream named name on 127.0.0.1.
func Start(name string) *Upstream {
	u := &Upstream{Name: name, Chunks: 4}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	return u
}

// URL is the OpenAI base URL (ending in /v1).
func (u *Upstream) URL() string { return u.srv.URL + "/v1" }

// Close stops the server and drops its open connections.
func (u *Upstream) Close() {
	u.srv.CloseClientConnections()
	u.srv.Close()
}

// Received returns copies of the request bodies received so far.
func (u *Upstream) Received() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([][]byte, len(u.bodies))
	copy(out, u.bodies)
	return out
}

// Drain returns the request bodies received since the last Drain (or the
// start) and forgets them.
func (u *Upstream) Drain() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := u.bodies[u.drained:]
	u.drained = len(u.bodies)
	return append([][]byte(nil), out...)
}

// Headers returns the request headers received so far.
func (u *Upstream) Headers() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.heads...)
}

// Count is the number of requests received.
func (u *Upstream) Count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

// Contains reports whether any received body contains s.
func (u *Upstream) Contains(s string) bool {
	for _, b := range u.Received() {
		if strings.Contains(string(b), s) {
			return true
		}
	}
	return false
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.bodies = append(u.bodies, body)
	u.paths = append(u.paths, r.URL.Path)
	u.heads = append(u.heads, r.Header.Clone())
	u.mu.Unlock()

	model := gjson.GetBytes(body, "model").String()
	switch r.URL.Path {
	case "/v1/models":
		writeJSON(w, 200, map[string]any{"object": "list", "data": []any{map[string]any{"id": "m", "object": "model", "created": 0, "owned_by": u.Name}}})
		return
	case "/v1/embeddings":
		writeJSON(w, 200, map[string]any{"object": "list", "model": model,
			"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": []float64{0.1, 0.2, 0.3}}},
			"usage": map[string]any{"prompt_tokens": 3, "total_tokens": 3}})
		return
	}
	prompt := lastUser(body)
	if r.URL.Path == "/v1/completions" {
		prompt = gjson.GetBytes(body, "prompt").String()
	}
	if strings.Contains(prompt, "FAIL500") {
		writeJSON(w, 500, map[string]any{"error": map[string]any{"message": "boom", "type": "server_error", "param": nil, "code": nil}})
		return
	}
	answer := u.Name + " says: " + prompt
	if u.Answer != nil {
		answer = u.Answer(prompt)
	}
	if r.URL.Path == "/v1/completions" {
		writeJSON(w, 200, map[string]any{"id": "cmpl-1", "object": "text_completion", "created": time.Now().Unix(), "model": model,
			"choices": []any{map[string]any{"index": 0, "text": answer, "finish_reason": "stop", "logprobs": nil}},
			"usage":   map[string]any{"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})
		return
	}
	if !gjson.GetBytes(body, "stream").Bool() && u.ToolCalls != nil {
		if calls := u.ToolCalls(body); len(calls) > 0 {
			tcs := make([]any, len(calls))
			for i, c := range calls {
				tcs[i] = map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
			}
			writeJSON(w, 200, map[string]any{"id": "chatcmpl-1", "object": "chat.completion", "created": time.Now().Unix(), "model": model,
				"choices": []any{map[string]any{"index": 0, "finish_reason": "tool_calls", "logprobs": nil,
					"message": map[string]any{"role": "assistant", "content": nil, "tool_calls": tcs, "refusal": nil}}},
				"usage": map[string]any{"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})
			return
		}
	}
	// A prompt holding WHOLE is answered with one JSON answer even when a
	// stream was asked for (as servers that do not stream answer), one
	// holding ALWAYSSTREAM with a stream even when none was.
	if (!gjson.GetBytes(body, "stream").Bool() && !strings.Contains(prompt, "ALWAYSSTREAM")) || strings.Contains(prompt, "WHOLE") {
		var logprobs any
		if u.Logprob != 0 && gjson.GetBytes(body, "logprobs").Bool() {
			var content []any
			for _, tok := range strings.SplitAfter(answer, " ") {
				content = append(content, map[string]any{"token": tok, "logprob": u.Logprob, "bytes": byteList(tok), "top_logprobs": []any{}})
			}
			logprobs = map[string]any{"content": content, "refusal": nil}
		}
		writeJSON(w, 200, map[string]any{"id": "chatcmpl-1", "object": "chat.completion", "created": time.Now().Unix(), "model": model,
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "logprobs": logprobs,
				"message": map[string]any{"role": "assistant", "content": answer, "refusal": nil}}},
			"usage": map[string]any{"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(200)
	rc := http.NewResponseController(w)
	parts := split(answer, max(u.Chunks, 1))
	streamLogprobs := u.Logprob != 0 && gjson.GetBytes(body, "logprobs").Bool()
	chunk := func(delta map[string]any, finish any) {
		var logprobs any
		if tok, ok := delta["content"].(string); ok && streamLogprobs {
			logprobs = map[string]any{"content": []any{map[string]any{"token": tok, "logprob": u.Logprob, "bytes": byteList(tok), "top_logprobs": []any{}}}, "refusal": nil}
		}
		b, _ := json.Marshal(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		_ = rc.Flush()
	}
	for i, p := range parts {
		if i > 0 && u.ChunkDelay > 0 {
			time.Sleep(u.ChunkDelay)
		}
		d := map[string]any{"content": p}
		if i == 0 {
			d["role"] = "assistant"
		}
		chunk(d, nil)
		if i == 1 && strings.Contains(prompt, "TRUNCATE") {
			panic(http.ErrAbortHandler) // drop the connection mid-stream
		}
	}
	chunk(map[string]any{}, "stop")
	if gjson.GetBytes(body, "stream_options.include_usage").Bool() {
		b, _ := json.Marshal(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": model,
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": 5, "completion_tokens": len(parts), "total_tokens": 5 + len(parts)}})
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	_ = rc.Flush()
}

func lastUser(body []byte) string {
	msgs := gjson.GetBytes(body, "messages").Array()
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Get("role").Str == "user" {
			c := msgs[i].Get("content")
			if c.IsArray() {
				var b strings.Builder
				for _, p := range c.Array() {
					b.WriteString(p.Get("text").Str)
				}
				return b.String()
			}
			return c.Str
		}
	}
	return ""
}

// split cuts s into n nearly equal parts on byte boundaries that keep UTF-8 whole.
func split(s string, n int) []string {
	var out []string
	r := []rune(s)
	size := (len(r) + n - 1) / n
	for i := 0; i < len(r); i += max(size, 1) {
		out = append(out, string(r[i:min(i+max(size, 1), len(r))]))
	}
	if len(out) == 0 {
		out = []string{""}
	}
	return out
}

// byteList is tok's UTF-8 bytes as numbers, as OpenAI's logprobs give them.
func byteList(tok string) []int {
	out := make([]int, len(tok))
	for i := range len(tok) {
		out[i] = int(tok[i])
	}
	return out
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
