package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/serving/gguf"
)

// For a model only the T0 engine serves, /v1/messages/count_tokens is the
// engine's own count: the input_tokens the same Messages request reports in
// its usage (system prompt, several turns, tools); a prompt past the
// context is still counted, past the window the refusal names.
func TestCountTokensOnTheEngineIsTheMessagesUsage(t *testing.T) {
	g := startEngineMolly(t, "tiny", 2048, "")
	tools := `"tools":[{"name":"get_weather","description":"Weather of a city","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}]`
	bodies := []string{
		`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"chat","system":"Be brief and exact.","messages":[{"role":"user","content":"What is the capital of France? Answer in one word."}]}`,
		`{"model":"chat","messages":[{"role":"user","content":"Name a colour."},{"role":"assistant","content":"Blue."},{"role":"user","content":[{"type":"text","text":"Another one, "},{"type":"text","text":"please."}]}]}`,
		`{"model":"chat",` + tools + `,"messages":[{"role":"user","content":"Weather in Oslo?"}]}`,
	}
	seen := map[int64]bool{}
	for _, body := range bodies {
		resp, b := do(t, g, "POST", "/v1/messages/count_tokens", body, "anthropic-version", "2023-06-01")
		if resp.StatusCode != 200 {
			t.Fatalf("count_tokens %s: %d %s", body, resp.StatusCode, b)
		}
		count := gjson.GetBytes(b, "input_tokens")
		if count.Type != gjson.Number || count.Int() <= 0 {
			t.Fatalf("count_tokens %s: %s", body, b)
		}
		msg := strings.Replace(body, `{"model":"chat",`, `{"model":"chat","max_tokens":1,`, 1)
		resp, b = do(t, g, "POST", "/v1/messages", msg, "anthropic-version", "2023-06-01")
		if resp.StatusCode != 200 {
			t.Fatalf("messages %s: %d %s", msg, resp.StatusCode, b)
		}
		if used := gjson.GetBytes(b, "usage.input_tokens").Int(); used != count.Int() {
			t.Errorf("%s: count_tokens %d, the answer's usage.input_tokens %d", body, count.Int(), used)
		}
		seen[count.Int()] = true
	}
	if len(seen) != len(bodies) {
		t.Errorf("the four prompts got %d distinct counts", len(seen))
	}

	long := `{"model":"chat","messages":[{"role":"user","content":"` + strings.Repeat("tokens upon tokens ", 800) + `"}]}`
	resp, b := do(t, g, "POST", "/v1/messages/count_tokens", long, "anthropic-version", "2023-06-01")
	if resp.StatusCode != 200 {
		t.Fatalf("count_tokens of a prompt past the context: %d %s", resp.StatusCode, b)
	}
	count := gjson.GetBytes(b, "input_tokens").Int()
	// The router refuses it, naming the context window it does not fit.
	msg := strings.Replace(long, `{"model":"chat",`, `{"model":"chat","max_tokens":1,`, 1)
	resp, b = do(t, g, "POST", "/v1/messages", msg, "anthropic-version", "2023-06-01")
	m := regexp.MustCompile(`context window (\d+) tokens`).FindSubmatch([]byte(gjson.GetBytes(b, "error.message").String()))
	if resp.StatusCode != 400 || m == nil {
		t.Fatalf("messages past the context: %d %s, want a 400 naming the context window", resp.StatusCode, b)
	}
	if window, _ := strconv.ParseInt(string(m[1]), 10, 64); count <= window {
		t.Errorf("count_tokens %d for a prompt the %d-token window cannot hold", count, window)
	}
}

// Sampling parameters reach the T0 engine through the gateway: logit_bias
// +100 on the token a greedy answer starts with keeps the answer on that
// token (every token of it the same, as its logprobs show), and -100 on it
// moves the first token to the unbiased runner-up.
func TestLogitBiasReachesTheEngine(t *testing.T) {
	g := startEngineMolly(t, "tiny", 2048, "")
	ask := func(bias string) []gjson.Result {
		t.Helper()
		body := `{"model":"chat","temperature":0,"max_tokens":4,"logprobs":true,"top_logprobs":2,"messages":[{"role":"user","content":"say anything"}]` + bias + `}`
		resp, b := do(t, g, "POST", "/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", body, resp.StatusCode, b)
		}
		return gjson.GetBytes(b, "choices.0.logprobs.content").Array()
	}
	plain := ask("")
	if len(plain) != 4 {
		t.Fatalf("%d logprobs", len(plain))
	}
	// The id comes from the demo vocabulary (a token per byte).
	first := plain[0].Get("token").String()
	id, ok := demoTokenID(t, first)
	if !ok {
		t.Fatalf("the first token %q is not a single demo-vocabulary piece", first)
	}
	forced := ask(`,"logit_bias":{"` + strconv.Itoa(id) + `":100}`)
	for i, c := range forced {
		if c.Get("token").String() != first {
			t.Errorf("with +100 on %q, token %d is %q", first, i, c.Get("token").String())
		}
	}
	banned := ask(`,"logit_bias":{"` + strconv.Itoa(id) + `":-100}`)
	if got, want := banned[0].Get("token").String(), plain[0].Get("top_logprobs.1.token").String(); got != want {
		t.Errorf("with -100 on %q the first token is %q, want the runner-up %q", first, got, want)
	}
}

// demoTokenID is the id of a one-byte token text in the demo vocabulary
// (gguf.Vocab: a byte token per byte, and "▁" for a space).
func demoTokenID(t *testing.T, text string) (int, bool) {
	t.Helper()
	switch {
	case text == " ":
		return gguf.TokenSpace, true
	case len(text) == 1:
		return gguf.TokenByte0 + int(text[0]), true
	}
	return 0, false
}
