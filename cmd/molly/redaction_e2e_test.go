package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"
)

// redactionClassify declares a user-defined type, makes it and e-mail
// addresses public (so T3 is allowed and the default policy redacts them
// for it), and pseudonymises e-mail addresses with a keyed HMAC.
const redactionClassify = "pattern PROJECT_CODE `PRJ-\\d{4}`\n" +
	"		sensitivity PROJECT_CODE public\n" +
	"		sensitivity EMAIL public\n" +
	"		redact_mode EMAIL hash\n" +
	"		hash_key_env MOLLY_TEST_HASH_KEY"

const testHashKey = "0123456789abcdef0123456789abcdef-e2e"

func TestRedactionCustomPatternIsRedactedForT3AndRestored(t *testing.T) {
	t.Setenv("MOLLY_TEST_HASH_KEY", testHashKey)
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", redactionClassify))
	c := client(g)
	prompt := "Summarise the risks of PRJ-4711, then compare PRJ-4711 with PRJ-0815"
	var resp *http.Response
	out, err := c.Chat.Completions.New(context.Background(), chat(prompt), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Molly-Tier") != "T3" {
		t.Fatalf("tier %q, want T3", resp.Header.Get("X-Molly-Tier"))
	}
	got := tr.t3.Received()
	if len(got) != 1 || !strings.Contains(string(got[0]), "Summarise the risks of [PROJECT_CODE_1], then compare [PROJECT_CODE_1] with [PROJECT_CODE_2]") {
		t.Fatalf("T3 received %s, want the codes as placeholders", got)
	}
	if want := "t3 says: " + prompt; out.Choices[0].Message.Content != want {
		t.Fatalf("answer %q, want %q", out.Choices[0].Message.Content, want)
	}
	// Streamed, with the placeholders cut across chunks.
	tr.t3.Chunks = 23
	stream := c.Chat.Completions.NewStreaming(context.Background(), chat(prompt))
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if want := "t3 says: " + prompt; text.String() != want {
		t.Fatalf("streamed %q, want %q", text.String(), want)
	}
	if tr.t3.Contains("PRJ-4711") || tr.t3.Contains("PRJ-0815") {
		t.Fatal("T3 received a project code")
	}
}

func TestRedactionHashModeGivesAStableIrreversibleToken(t *testing.T) {
	t.Setenv("MOLLY_TEST_HASH_KEY", testHashKey)
	tr := startTiers(t)
	cfg := tr.caddyfile("", redactionClassify)
	token := regexp.MustCompile(`\[EMAIL#[0-9a-f]{16}\]`)
	ask := func(g *gateway, prompt string) (sent, answer string) {
		t.Helper()
		n := tr.t3.Count()
		out, err := client(g).Chat.Completions.New(context.Background(), chat(prompt))
		if err != nil {
			t.Fatal(err)
		}
		got := tr.t3.Received()
		if len(got) != n+1 {
			t.Fatalf("T3 got %d requests, want %d", len(got), n+1)
		}
		return string(got[n]), out.Choices[0].Message.Content
	}

	g := startMolly(t, cfg)
	sent1, answer1 := ask(g, "Write to anna@example.org about PRJ-1234")
	tok := token.FindString(sent1)
	if tok == "" || strings.Contains(sent1, "anna@example.org") || !strings.Contains(sent1, "[PROJECT_CODE_1]") {
		t.Fatalf("T3 received %s, want a pseudonym for the address and a placeholder for the code", sent1)
	}
	// The pseudonym is not restored: the answer keeps it, the code comes back.
	if want := "t3 says: Write to " + tok + " about PRJ-1234"; answer1 != want {
		t.Fatalf("answer %q, want %q", answer1, want)
	}
	// Another request, and another Molly process with the same key, give
	// the same pseudonym; another address gets another one.
	sent2, _ := ask(g, "Remind anna@example.org, and cc bob@example.org")
	g2 := startMolly(t, cfg)
	sent3, _ := ask(g2, "anna@example.org again")
	if toks := token.FindAllString(sent2, -1); len(toks) != 2 || toks[0] != tok || toks[1] == tok {
		t.Fatalf("second request sent %s, want %s then another pseudonym", sent2, tok)
	}
	if !strings.Contains(sent3, tok) {
		t.Fatalf("after a restart T3 received %s, want %s", sent3, tok)
	}
	for _, gw := range []*gateway{g, g2} {
		if strings.Contains(gw.logs.String(), testHashKey) || strings.Contains(gw.logs.String(), "anna@example.org") {
			t.Fatal("the logs hold the HMAC key or the address")
		}
	}
}

// TestRedactionBreakItRound4 runs the leaks a break-it round found through
// the real binary, with a T3 target that redacts e-mail addresses: tool-call
// arguments that are not JSON (the address was sent as it was), and text
// fields of answers the output guard did not read (a streamed refusal, a
// whole answer's reasoning_content, an upstream's own reasoning field, the
// legacy function_call arguments, logprobs tokens spelling a masked
// address, whole or streamed), and the forwarded correlation headers. The oracle is the address's own text in what T3 received and
// in what the client got.
func TestRedactionBreakItRound4(t *testing.T) {
	const client, wrote = "mario.rossi@example.com", "bob.builder@corp-mail.org"
	var mu sync.Mutex
	var received []string
	var ids []string
	t3 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/models" {
			w.Write([]byte(`{"object":"list","data":[]}`))
			return
		}
		mu.Lock()
		received = append(received, string(body))
		ids = append(ids, r.Header.Get("X-Request-Id")+" "+r.Header.Get("Tracestate"))
		mu.Unlock()
		if gjson.GetBytes(body, "stream").Bool() {
			w.Header().Set("Content-Type", "text/event-stream")
			// With logprobs: content whose tokens spell the address;
			// without: a refusal.
			field, lp := "refusal", gjson.GetBytes(body, "logprobs").Bool()
			if lp {
				field = "content"
			}
			for _, part := range []string{"to [EMAIL_1] or bob.buil", "der@corp-mail.org"} {
				choice := map[string]any{"index": 0, "delta": map[string]any{field: part}, "finish_reason": nil}
				if lp {
					choice["logprobs"] = map[string]any{"content": []any{map[string]any{"token": part, "logprob": -1, "bytes": nil, "top_logprobs": []any{}}}, "refusal": nil}
				}
				b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []any{choice}})
				fmt.Fprintf(w, "data: %s\n\n", b)
			}
			fmt.Fprint(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		text := "write " + wrote
		b, _ := json.Marshal(map[string]any{"id": "c", "object": "chat.completion", "created": 1, "model": "m",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"logprobs": map[string]any{"content": []any{
					map[string]any{"token": "write bob", "logprob": -1, "bytes": nil, "top_logprobs": []any{}},
					map[string]any{"token": ".builder@corp-mail.org", "logprob": -1, "bytes": nil, "top_logprobs": []any{}}}, "refusal": nil},
				"message": map[string]any{"role": "assistant", "content": text, "refusal": nil, "reasoning_content": text, "reasoning": text,
					"function_call": map[string]any{"name": "f", "arguments": `{"to":"` + wrote + `"}`}}}},
			"usage": map[string]any{"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}})
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	}))
	defer t3.Close()
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		target external {
			tier T3
			endpoint `+t3.URL+`/v1
			models chat=gpt-4o-mini
			api_key_env MOLLY_TEST_T3_KEY
			price 0.15 0.6
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify {
		sensitivity EMAIL public
	}
	molly_policy
	molly_route
}
`)
	post := func(body string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", g.URL+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		// Correlation headers are forwarded; these must not be.
		req.Header.Set("X-Request-Id", client)
		req.Header.Set("Tracestate", "vendor="+client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("X-Molly-Tier") != "T3" {
			t.Fatalf("status %d, tier %q: %s", resp.StatusCode, resp.Header.Get("X-Molly-Tier"), out)
		}
		return string(out)
	}
	// Tool-call arguments in bare words, not JSON.
	args, _ := json.Marshal("to: " + client + ", subject: hello")
	out := post(`{"model":"chat","logprobs":true,"messages":[{"role":"user","content":"send it"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"send","arguments":` + string(args) + `}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sent"},{"role":"user","content":"again"}]}`)
	mu.Lock()
	sent := received[len(received)-1]
	mu.Unlock()
	if strings.Contains(sent, client) || gjson.Get(sent, "messages.1.tool_calls.0.function.arguments").String() != "to: [EMAIL_1], subject: hello" {
		t.Fatalf("T3 received %s, want the address as a placeholder", sent)
	}
	if strings.Contains(out, "builder") {
		t.Fatalf("the answer carries the address the model wrote: %s", out)
	}
	for _, p := range []string{"content", "reasoning_content", "reasoning"} {
		if got := gjson.Get(out, "choices.0.message."+p).String(); got != "write [EMAIL]" {
			t.Errorf("%s = %q, want write [EMAIL]", p, got)
		}
	}
	// A streamed refusal: the placeholder cut across chunks is restored, the
	// address cut across chunks is masked.
	out = post(`{"model":"chat","stream":true,"messages":[{"role":"user","content":"mail ` + client + `"}]}`)
	var refusal strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			refusal.WriteString(gjson.Get(data, "choices.0.delta.refusal").String())
		}
	}
	if refusal.String() != "to "+client+" or [EMAIL]" {
		t.Fatalf("streamed refusal %q, want %q", refusal.String(), "to "+client+" or [EMAIL]")
	}
	// A stream with logprobs: the tokens would spell the masked address.
	out = post(`{"model":"chat","stream":true,"logprobs":true,"messages":[{"role":"user","content":"mail ` + client + `"}]}`)
	var content strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			content.WriteString(gjson.Get(data, "choices.0.delta.content").String())
		}
	}
	if content.String() != "to "+client+" or [EMAIL]" || strings.Contains(out, "der@corp-mail.org") {
		t.Fatalf("streamed content %q; stream %s", content.String(), out)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range ids {
		if strings.Contains(h, "rossi") || !strings.HasPrefix(h, "req_") {
			t.Fatalf("T3 got the request id and trace state %q", h)
		}
	}
}

// TestRedactionBreakItRound5 runs the leaks a fifth break-it round found
// through the real binary: a card number written as a JSON number with an
// exponent (in an extra member and in tool-call arguments), an address cut
// between a message's text and a tool call's arguments, an address with
// its '@' as a \x40 escape, an address under a member named "[0]" (a
// gjson multipath, so the placeholder went beside the value), a card and a key in the forwarded correlation
// headers of a call to T2 (which the body's class allows, the header's
// values were never classified), and a value the client split across two
// messages, which the model writes back as its two placeholders: restored
// whole, it was masked by the output guard. The oracle is the values' own
// text (and the card's digits with the number's '.' removed) in what the
// upstreams received, and the restored text the client got.
func TestRedactionBreakItRound5(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", "sensitivity EMAIL public\n\t\tsensitivity CREDIT_CARD public"))
	post := func(body string, hdr ...string) (string, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", g.URL+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		return string(out), resp.Header.Get("X-Molly-Tier")
	}
	args, _ := json.Marshal(`{"n":4.111111111111111e15}`)
	_, tier := post(`{"model":"chat","x":4111111111111111e0,"metadata":{"[0]":"cc carla.bruni@example.net"},"messages":[{"role":"user","content":"mail mario.rossi@"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"send","arguments":"example.com"}},` +
		`{"id":"c2","type":"function","function":{"name":"pay","arguments":` + string(args) + `}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"sent"},{"role":"tool","tool_call_id":"c2","content":"paid"},` +
		`{"role":"user","content":"and write to anna.verdi\\x40example.org"}]}`)
	got := tr.t3.Drain()
	if tier != "T3" || len(got) != 1 {
		t.Fatalf("tier %s, T3 got %d requests", tier, len(got))
	}
	sent := string(got[0])
	for _, v := range []string{"mario.rossi@", "example.com", "anna.verdi", "carla.bruni", "41111111111111"} {
		if strings.Contains(strings.ReplaceAll(sent, ".", ""), strings.ReplaceAll(v, ".", "")) {
			t.Errorf("T3 received %q: %s", v, sent)
		}
	}

	// A split value comes back whole, not masked, whole and streamed.
	tr.t3.Answer = func(string) string { return "write to [EMAIL_1][EMAIL_2] today" }
	split := `{"model":"chat","messages":[{"role":"user","content":"mail mario.rossi@exam"},{"role":"user","content":"ple.com please"}]}`
	out, _ := post(split)
	if c := gjson.Get(out, "choices.0.message.content").String(); c != "write to mario.rossi@example.com today" {
		t.Errorf("answer %q, want the address restored whole", c)
	}
	out, _ = post(strings.Replace(split, `"model":"chat",`, `"model":"chat","stream":true,`, 1))
	var text strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			text.WriteString(gjson.Get(data, "choices.0.delta.content").String())
		}
	}
	if text.String() != "write to mario.rossi@example.com today" {
		t.Errorf("streamed %q, want the address restored whole", text.String())
	}

	// A phone number keeps the body internal (T2); the headers hold a card
	// and a key the decision never saw.
	_, tier = post(`{"model":"chat","messages":[{"role":"user","content":"call +39 347 123 4567"}]}`,
		"X-Request-Id", "4111 1111 1111 1111", "Tracestate", "vendor=ghp_R4nd0mT0k3nV4lu3Xy2Zq8Wm1Lp9Kd7Hs5Jq")
	heads := tr.t2.Headers()
	if tier != "T2" || len(heads) == 0 {
		t.Fatalf("tier %s, T2 got %d requests", tier, len(heads))
	}
	h := heads[len(heads)-1]
	if id := h.Get("X-Request-Id"); strings.Contains(strings.ReplaceAll(id, " ", ""), "4111111111111111") || !strings.HasPrefix(id, "req_") ||
		strings.Contains(h.Get("Tracestate"), "ghp_") {
		t.Errorf("T2 got X-Request-Id %q, Tracestate %q", id, h.Get("Tracestate"))
	}
}

// TestRedactionBreakItRound6: the evasions of the sixth round, through the
// real binary; the oracle is each value's characters (letters and digits
// only), searched in what the T3 upstream received, also with its
// separators and encodings undone.
func TestRedactionBreakItRound6(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", "sensitivity EMAIL public\n\t\tsensitivity CREDIT_CARD public\n\t\tsensitivity IT_FISCAL_CODE public"))
	post := func(path, body string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", g.URL+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		return resp.Header.Get("X-Molly-Tier")
	}
	alnum := func(s string) string {
		return strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				return r
			}
			if r >= 'A' && r <= 'Z' {
				return r + 'a' - 'A'
			}
			return -1
		}, s)
	}
	// What the upstream received, with escapes undone the way a reader
	// (or a model) undoes them.
	undo := func(b []byte) string {
		s := string(b)
		for _, r := range [][2]string{{"%25", "%"}, {"%40", "@"}, {"=40", "@"}, {"=\r\n", ""}, {"&amp;", "&"}, {"&#64;", "@"}, {"·", ""}} {
			s = strings.ReplaceAll(s, r[0], r[1])
		}
		return alnum(s)
	}
	content := strings.Join([]string{
		"write to john . doe @ example . com",
		"or to anna.verdi=40exam=\r\nple.org",
		"or to carla%2540bruni.example.net",
		"codice fiscale RSS MRA 80A01 H501U",
		"卡号4111111111111111谢谢",
		"card 5555·5555·5555·4444",
	}, "\n")
	c, _ := json.Marshal(content)
	if tier := post("/chat/completions", `{"model":"chat","messages":[{"role":"user","content":`+string(c)+`}]}`); tier != "T3" {
		t.Fatalf("tier %s, want T3", tier)
	}
	if tier := post("/completions", `{"model":"chat","prompt":"my other card is 4012 8888","suffix":"8888 1881 thanks","max_tokens":5}`); tier != "T3" {
		t.Fatalf("completions tier %s, want T3", tier)
	}
	got := tr.t3.Drain()
	if len(got) != 2 {
		t.Fatalf("T3 got %d requests, want 2", len(got))
	}
	for _, b := range got {
		sent := undo(b)
		for _, v := range []string{"johndoe", "annaverdi", "carla", "rssmra80a01h501u", "4111111111111111", "5555555555554444", "4012888888881881", "40128888", "88881881"} {
			if strings.Contains(sent, v) {
				t.Errorf("T3 received %q: %s", v, b)
			}
		}
	}
}
