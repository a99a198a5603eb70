package pipeline

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/route"
)

// writer is an upstream whose answer says its text, in one piece or
// streamed in chunks of chunk bytes (the text is what the "model" wrote).
func writer(t *testing.T, text string, chunk int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream bool `json:"stream"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion", "created": 1, "model": "m",
				"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "logprobs": nil,
					"message": map[string]any{"role": "assistant", "content": text, "refusal": nil}}},
				"usage": map[string]any{"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
			w.Write(b)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < len(text); i += chunk {
			part := text[i:min(i+chunk, len(text))]
			b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
				"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": part}, "finish_reason": nil}}})
			fmt.Fprintf(w, "data: %s\n\n", b)
		}
		fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestAnswersAreGuardedAsTheOutputRuleSays: entity types a model wrote
// in its answer are masked (whole answers and streams, values split across
// chunks too) or make the answer refused, per tier, as the decision's
// output rule says; values the client sent and Molly restored are not
// flagged; a tier without a rule passes answers as they are.
func TestAnswersAreGuardedAsTheOutputRuleSays(t *testing.T) {
	const wrote = "Write to bob.builder@example.org or call Maria Rossi."
	rules := map[string]any{
		"T3": map[string]any{"mask": []any{"*"}, "block": []any{}},
		"T2": map[string]any{"mask": []any{}, "block": []any{"EMAIL"}},
	}
	gateway := func(tier string, text string) string {
		up := writer(t, text, 7)
		gw, _ := startGateway(t, setup{
			targets: []*route.Target{{Name: "up", Tier: tier, Endpoint: up.URL + "/v1", Models: []string{"m"}}},
			policy:  policytest.Literal(t, policytest.Allow([]string{tier}, map[string][]string{tier: {"EMAIL"}}, map[string]any{"output": rules})),
		})
		return gw.URL + "/v1/chat/completions"
	}
	t.Run("a T3 answer is masked of every type the model wrote", func(t *testing.T) {
		r := post(t, gateway("T3", wrote), chatBody("hello"))
		got := gjson.Get(r.body, "choices.0.message.content").String()
		if r.status != 200 || got != "Write to [EMAIL] or call [PERSON]." {
			t.Fatalf("status %d content %q", r.status, got)
		}
	})
	t.Run("a T3 stream is masked, values cut across chunks included", func(t *testing.T) {
		r := post(t, gateway("T3", wrote), `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`)
		if got := sseContent(t, r.body); r.status != 200 || got != "Write to [EMAIL] or call [PERSON]." {
			t.Fatalf("status %d streamed %q", r.status, got)
		}
		if strings.Contains(r.body, "bob.builder") || strings.Contains(r.body, "Rossi") {
			t.Fatalf("a masked value reached the client: %s", r.body)
		}
	})
	t.Run("a value the client sent comes back restored, not masked", func(t *testing.T) {
		// The upstream says what it was sent: the placeholder Molly put in
		// place of the client's address, which Molly restores.
		echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			raw, _ := io.ReadAll(r.Body)
			body := string(raw)
			w.Header().Set("Content-Type", "application/json")
			b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion", "created": 1, "model": "m",
				"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant",
					"content": "noted: " + gjson.Get(body, "messages.0.content").String()}}}})
			w.Write(b)
		}))
		defer echo.Close()
		gw, _ := startGateway(t, setup{
			targets: []*route.Target{{Name: "up", Tier: "T3", Endpoint: echo.URL + "/v1", Models: []string{"m"}}},
			policy:  policytest.Literal(t, policytest.Allow([]string{"T3"}, map[string][]string{"T3": {"EMAIL"}}, map[string]any{"output": rules})),
		})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("mail ann@example.com"))
		if got := gjson.Get(r.body, "choices.0.message.content").String(); got != "noted: mail ann@example.com" {
			t.Fatalf("content %q", got)
		}
	})
	t.Run("a blocked type refuses the answer with the type, never the value", func(t *testing.T) {
		r := post(t, gateway("T2", wrote), chatBody("hello"))
		if r.status != 403 || gjson.Get(r.body, "error.code").String() != "output_blocked" || strings.Contains(r.body, "bob.builder") ||
			!strings.Contains(gjson.Get(r.body, "error.message").String(), "EMAIL") {
			t.Fatalf("status %d body %s", r.status, r.body)
		}
		r = post(t, gateway("T2", wrote), `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`)
		if r.status != 200 || !strings.Contains(r.body, "event: error") || !strings.Contains(r.body, `"code":"output_blocked"`) ||
			strings.Contains(r.body, "bob.builder") || strings.Contains(r.body, "[DONE]") {
			t.Fatalf("stream: status %d body %s", r.status, r.body)
		}
	})
	t.Run("a tier without a rule passes the answer", func(t *testing.T) {
		r := post(t, gateway("T1", wrote), chatBody("hello"))
		if got := gjson.Get(r.body, "choices.0.message.content").String(); r.status != 200 || got != wrote {
			t.Fatalf("status %d content %q", r.status, got)
		}
	})
}

// TestGuardBodyCoversEveryMessageText: every text of a whole answer's
// message is guarded, not only content and refusal: reasoning_content,
// an upstream's own reasoning field, audio.transcript and the legacy
// function_call arguments; identifiers and audio data are left alone, and
// a choice whose content was masked loses its logprobs (their tokens spell
// the address). The oracle is the answer written by hand.
func TestGuardBodyCoversEveryMessageText(t *testing.T) {
	sc, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	g := sc.NewGuard(redaction.GuardPolicy{Default: redaction.GuardMask})
	const addr = "bob.builder@corp-mail.org"
	body := `{"choices":[{"index":0,"finish_reason":"stop",` +
		`"logprobs":{"content":[{"token":"bob","logprob":-1,"bytes":[98,111,98],"top_logprobs":[]},{"token":".builder@corp-mail.org","logprob":-1,"bytes":[46],"top_logprobs":[]}],"refusal":null},` +
		`"message":{"role":"assistant","name":"` + addr + `","content":"` + addr + `","reasoning_content":"` + addr + `","reasoning":"` + addr + `",` +
		`"audio":{"id":"` + addr + `","data":"` + addr + `","transcript":"` + addr + `"},` +
		`"function_call":{"name":"f","arguments":"{\"to\":\"` + addr + `\"}"}}}]}`
	out, err := guardBody(g, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	m := gjson.GetBytes(out, "choices.0.message")
	for _, p := range []string{"content", "reasoning_content", "reasoning", "audio.transcript"} {
		if got := m.Get(p).String(); got != "[EMAIL]" {
			t.Errorf("%s = %q, want [EMAIL]", p, got)
		}
	}
	if got := m.Get("function_call.arguments").String(); got != `{"to":"[EMAIL]"}` {
		t.Errorf("function_call.arguments = %q", got)
	}
	for _, p := range []string{"name", "audio.id", "audio.data"} {
		if got := m.Get(p).String(); got != addr {
			t.Errorf("%s = %q, want it as it was", p, got)
		}
	}
	if lp := gjson.GetBytes(out, "choices.0.logprobs"); lp.Type != gjson.Null {
		t.Errorf("logprobs = %s, want null", lp.Raw)
	}
}

// TestGuardBodyMembersNamedLikePathSyntax: an answer's members whose names
// gjson/sjson read as path syntax ("[0]", "{a}", "a,b", ":x") are guarded
// in place: the mask used to go into a new member beside the text, which
// reached the client as the model wrote it. The oracle is the address's
// text in the guarded answer.
func TestGuardBodyMembersNamedLikePathSyntax(t *testing.T) {
	sc, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	g := sc.NewGuard(redaction.GuardPolicy{Default: redaction.GuardMask})
	const addr = "bob.builder@corp-mail.org"
	for _, k := range []string{"[0]", "{a}", "a,b", ":x", "@this"} {
		body := `{"choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi","` + k + `":"` + addr + `","extra":{"` + k + `":"` + addr + `"}}}]}`
		out, err := guardBody(g, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(out), "bob.builder") || !gjson.ValidBytes(out) {
			t.Errorf("member %q: guarded %s", k, out)
		}
	}
}
