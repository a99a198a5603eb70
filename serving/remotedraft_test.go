package serving

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/tidwall/sjson"
)

// remotePair is a remote engine ("target", behind an HTTP server) and a
// local drafting engine on a Q4_0 copy of the same model (same tokenizer
// and chat template).
type remotePair struct {
	remote, local *Engine
	srv           *httptest.Server
}

func newRemotePair(t *testing.T) remotePair {
	t.Helper()
	dir := t.TempDir()
	target := writeModel(t, dir, "target.gguf", "small", 7, 0)
	draft := quantizedCopy(t, target, filepath.Join(dir, "draft.gguf"), "q4_0")
	mk := func(path string) *Engine {
		return newEngine(t, func(c *Config) {
			c.ModelPath, c.AdapterDir = path, ""
			c.NSeqMax, c.NCtx = 2, 2*512
		})
	}
	p := remotePair{remote: mk(target), local: mk(draft)}
	p.srv = httptest.NewServer(p.remote)
	t.Cleanup(p.srv.Close)
	return p
}

// drafted runs body through local.ServeRemoteDraft and reports whether it
// answered, with the recorded answer.
func drafted(t *testing.T, local *Engine, d *RemoteDraft, body map[string]any) (bool, *httptest.ResponseRecorder) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(b))
	w := httptest.NewRecorder()
	return local.ServeRemoteDraft(w, req, b, d), w
}

func chatBody(text string, maxTokens int, stream bool) map[string]any {
	b := map[string]any{"model": "target", "temperature": 0, "messages": []map[string]any{{"role": "user", "content": text}}}
	if maxTokens > 0 {
		b["max_tokens"] = maxTokens
	}
	if stream {
		b["stream"], b["stream_options"] = true, map[string]any{"include_usage": true}
	}
	return b
}

// TestRemoteDraftEqualsTheRemotesGreedyAnswer drafts with a Q4_0 copy for
// the full model behind HTTP: the answer (content, finish reason, usage,
// model name), streamed or not, equals the remote engine's own answer to
// the same request, and the verify endpoint accepted drafted tokens.
func TestRemoteDraftEqualsTheRemotesGreedyAnswer(t *testing.T) {
	p := newRemotePair(t)
	d := &RemoteDraft{Verifier: &HTTPVerifier{URL: p.srv.URL + "/molly/engine/verify"}, Tokens: 4}
	// A prompt that leaves 20 tokens of the remote's 512 per request: the
	// answer ends at the remote's context, not at max_tokens.
	long := ""
	for n := 1; ; n++ {
		long = strings.Repeat("word ", n)
		_, req, err := p.remote.parse(mustJSON(t, chatBody(long, 0, false)), true)
		if err != nil {
			t.Fatal(err)
		}
		if len(req.Prompt) >= p.remote.ContextTokens()-20 {
			break
		}
	}
	cases := []struct {
		text      string
		maxTokens int
	}{
		{"hello there", 1},
		{"hello there", 7},
		{"The quick brown fox jumps over the lazy dog", 64},
		{"abc abc abc abc abc abc", 150},
		{long, 0},
	}
	for i, c := range cases {
		for _, stream := range []bool{false, true} {
			body := chatBody(c.text, c.maxTokens, stream)
			want := call(t, p.remote, t.Context(), http.MethodPost, "/v1/chat/completions", body)
			ok, got := drafted(t, p.local, d, body)
			if !ok {
				t.Fatalf("case %d stream=%v: not drafted", i, stream)
			}
			name := fmt.Sprintf("case %d stream=%v", i, stream)
			if stream {
				wc, wf, wu := streamText(t, want)
				gc, gf, gu := streamText(t, got)
				if gc != wc || gf != wf || gu != wu {
					t.Errorf("%s:\n got %q %s %+v\nwant %q %s %+v", name, gc, gf, gu, wc, wf, wu)
				}
				continue
			}
			var wr, gr chatResponse
			if err := json.Unmarshal(want.Body.Bytes(), &wr); err != nil || want.Code != http.StatusOK {
				t.Fatalf("%s: remote %d %s", name, want.Code, want.Body)
			}
			if err := json.Unmarshal(got.Body.Bytes(), &gr); err != nil || got.Code != http.StatusOK {
				t.Fatalf("%s: drafted %d %s", name, got.Code, got.Body)
			}
			if gr.Model != "target" || gr.Object != "chat.completion" || len(gr.Choices) != 1 || gr.Usage == nil {
				t.Fatalf("%s: drafted answer %s", name, got.Body)
			}
			if gr.Choices[0].Message.Content != wr.Choices[0].Message.Content || gr.Choices[0].FinishReason != wr.Choices[0].FinishReason || *gr.Usage != *wr.Usage {
				t.Errorf("%s:\n got %q %s %+v\nwant %q %s %+v", name, gr.Choices[0].Message.Content, gr.Choices[0].FinishReason, *gr.Usage,
					wr.Choices[0].Message.Content, wr.Choices[0].FinishReason, *wr.Usage)
			}
			if i == len(cases)-1 && (wr.Choices[0].FinishReason != "length" || wr.Usage.CompletionTokens != p.remote.ContextTokens()-wr.Usage.PromptTokens) {
				t.Errorf("%s: the remote's answer %+v %s does not end at its context", name, *wr.Usage, wr.Choices[0].FinishReason)
			}
		}
	}
	st, vs := p.local.RemoteDraftStats(), p.remote.VerifyStats()
	if st.Requests != int64(2*len(cases)) || st.Declined != 0 || st.Proposed == 0 || st.Accepted == 0 || st.Accepted > st.Proposed {
		t.Errorf("drafting stats %+v", st)
	}
	if vs.Calls != st.Rounds || vs.Proposed != st.Proposed || vs.Accepted != st.Accepted {
		t.Errorf("the remote verified %+v, the drafter counts %+v", vs, st)
	}
	t.Logf("rounds %d, proposed %d, accepted %d (%.0f%%)", st.Rounds, st.Proposed, st.Accepted, 100*float64(st.Accepted)/float64(st.Proposed))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// streamText is a chat stream's content, finish reason and usage.
func streamText(t *testing.T, w *httptest.ResponseRecorder) (string, string, Usage) {
	t.Helper()
	var content, finish strings.Builder
	var u Usage
	for _, c := range parseSSE(t, w) {
		for _, ch := range c.Choices {
			content.WriteString(ch.Delta.Content)
			if ch.FinishReason != nil {
				finish.WriteString(*ch.FinishReason)
			}
		}
		if c.Usage != nil {
			u = *c.Usage
		}
	}
	return content.String(), finish.String(), u
}

// TestRemoteDraftDeclines: requests drafting cannot reproduce, and remotes
// that do not share the tokenizer or chat template, are declined with
// nothing written (the caller sends them as usual), the reason logged once.
func TestRemoteDraftDeclines(t *testing.T) {
	p := newRemotePair(t)
	d := &RemoteDraft{Verifier: &HTTPVerifier{URL: p.srv.URL + "/molly/engine/verify"}}
	base := chatBody("hello", 4, false)
	with := func(k string, v any) map[string]any {
		b := map[string]any{}
		for key, val := range base {
			b[key] = val
		}
		if v == nil {
			delete(b, k)
		} else {
			b[k] = v
		}
		return b
	}
	for name, body := range map[string]map[string]any{
		"no temperature":   with("temperature", nil),
		"temperature 0.7":  with("temperature", 0.7),
		"n 2":              with("n", 2),
		"stop":             with("stop", "x"),
		"logprobs":         with("logprobs", true),
		"reasoning_effort": with("reasoning_effort", "none"),
		"n_chains":         with("n_chains", 1),
		"response_format":  with("response_format", map[string]any{"type": "json_object"}),
		"tools":            with("tools", []map[string]any{{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"type": "object"}}}}),
		"an adapter":       with("model", "target:support"),
		"another model":    with("model", "other"),
		"no messages":      with("messages", nil),
	} {
		if ok, w := drafted(t, p.local, d, body); ok || w.Body.Len() != 0 {
			t.Errorf("%s: drafted (%v) or wrote %q", name, ok, w.Body)
		}
	}
	if ok, _ := drafted(t, p.local, d, base); !ok {
		t.Fatal("the eligible request was not drafted")
	}
	// One drafted request at a time: another one finds the drafter busy.
	p.local.drafter.mu.Lock()
	ok, w := drafted(t, p.local, d, base)
	p.local.drafter.mu.Unlock()
	if ok || w.Body.Len() != 0 {
		t.Errorf("a request while the drafter is busy: drafted (%v) or wrote %q", ok, w.Body)
	}
	if st := p.local.RemoteDraftStats(); st.Requests != 1 || st.Declined != 13 {
		t.Errorf("stats %+v, want 1 drafted and 13 declined", st)
	}

	// Remotes whose GET answers other hashes, or which are not Molly engines.
	info := p.remote.VerifyInfo()
	for name, edit := range map[string]func([]byte) []byte{
		"vocabulary": func(b []byte) []byte { b, _ = sjson.SetBytes(b, "vocab_sha256", strings.Repeat("0", 64)); return b },
		"chat template": func(b []byte) []byte {
			b, _ = sjson.SetBytes(b, "chat_template_sha256", strings.Repeat("1", 64))
			return b
		},
		"switcher":  func(b []byte) []byte { b, _ = sjson.SetBytes(b, "plain", false); return b },
		"not molly": nil,
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet {
				p.remote.ServeHTTP(w, r)
				return
			}
			if edit == nil {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write(edit(mustJSON(t, info)))
		}))
		var logs []string
		var mu sync.Mutex
		md := &RemoteDraft{Verifier: &HTTPVerifier{URL: srv.URL + "/molly/engine/verify"}, Logf: func(f string, a ...any) {
			mu.Lock()
			logs = append(logs, fmt.Sprintf(f, a...))
			mu.Unlock()
		}}
		calls := p.remote.VerifyStats().Calls
		for range 2 {
			if ok, w := drafted(t, p.local, md, base); ok || w.Body.Len() != 0 {
				t.Errorf("%s: drafted (%v) or wrote %q", name, ok, w.Body)
			}
		}
		if n := p.remote.VerifyStats().Calls; n != calls {
			t.Errorf("%s: %d verify calls", name, n-calls)
		}
		if len(logs) != 1 {
			t.Errorf("%s: logged %q, want one line", name, logs)
		}
		srv.Close()
	}

	// A verify call carrying stale hashes is refused.
	w = call(t, p.remote, t.Context(), http.MethodPost, "/molly/engine/verify", map[string]any{"prefix": []int32{1}, "vocab_sha256": "stale"})
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "verify_mismatch") {
		t.Errorf("stale hash: %d %s", w.Code, w.Body)
	}
	// GET describes the engine.
	w = call(t, p.remote, t.Context(), http.MethodGet, "/molly/engine/verify", nil)
	var got VerifyInfo
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got != info || got.Model != "target" || len(got.VocabSHA256) != 64 || got.ContextTokens != 512 || !got.Plain {
		t.Errorf("GET verify: %d %s", w.Code, w.Body)
	}
	if p.local.VerifyInfo().VocabSHA256 != info.VocabSHA256 {
		t.Error("a Q4_0 copy has another vocabulary hash")
	}
}

// TestRemoteDraftVerifyFailures: a remote whose first verification fails
// is declined (the caller sends the request as usual); one failing later
// ends the answer with 502 upstream_error, and the cached Info is dropped.
func TestRemoteDraftVerifyFailures(t *testing.T) {
	p := newRemotePair(t)
	var mu sync.Mutex
	posts, failFrom := 0, 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			posts++
			fail := posts >= failFrom
			mu.Unlock()
			if fail {
				writeError(w, http.StatusInternalServerError, "server_error", "", "", "verify broke")
				return
			}
		}
		p.remote.ServeHTTP(w, r)
	}))
	defer srv.Close()
	v := &HTTPVerifier{URL: srv.URL + "/molly/engine/verify"}
	d := &RemoteDraft{Verifier: v, Tokens: 2}
	if ok, w := drafted(t, p.local, d, chatBody("hello there", 30, false)); ok || w.Body.Len() != 0 {
		t.Fatalf("a failing first verification: drafted (%v) or wrote %q", ok, w.Body)
	}
	mu.Lock()
	posts, failFrom = 0, 3
	mu.Unlock()
	ok, w := drafted(t, p.local, d, chatBody("hello there", 30, false))
	var r chatResponse
	if !ok || w.Code != http.StatusBadGateway || json.Unmarshal(w.Body.Bytes(), &r) != nil || r.Error == nil || r.Error.Code == nil || *r.Error.Code != "upstream_error" {
		t.Fatalf("a verification failing later: drafted %v, %d %s", ok, w.Code, w.Body)
	}
	if v.info != nil {
		t.Error("the Info survived a failed verify call")
	}
	mu.Lock()
	posts, failFrom = 0, 3
	mu.Unlock()
	ok, w = drafted(t, p.local, d, chatBody("hello there", 30, true))
	if !ok || w.Code != http.StatusOK || !strings.Contains(w.Body.String(), "upstream_error") || strings.Contains(w.Body.String(), "[DONE]") {
		t.Fatalf("a streamed verification failing later: drafted %v, %d %s", ok, w.Code, w.Body)
	}
}
