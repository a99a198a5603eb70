package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/serving"
)

// lastBody is the last request body u received.
func lastBody(t *testing.T, bodies [][]byte) gjson.Result {
	t.Helper()
	if len(bodies) == 0 {
		t.Fatal("the upstream received nothing")
	}
	return gjson.ParseBytes(bodies[len(bodies)-1])
}

func TestResponsesAPIWithTheOpenAIClient(t *testing.T) {
	spec := openapitest.Load(t)
	tr := startTiers(t)
	// E-mail addresses are public here, so T3 may get them, redacted.
	g := startMolly(t, tr.caddyfile("", "sensitivity EMAIL public"))
	c := client(g)
	ctx := context.Background()
	prompt := "Write to anna@example.org about lunch"

	var first *responses.Response
	t.Run("a response: instructions and input, redacted for T3 and restored", func(t *testing.T) {
		var hr *http.Response
		var err error
		first, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", Instructions: openai.String("Be brief."),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}}, option.WithResponseInto(&hr))
		if err != nil {
			t.Fatal(err)
		}
		spec.Validate(t, "Response", []byte(first.RawJSON()))
		if got, want := first.OutputText(), "t3 says: "+prompt; got != want || first.Status != "completed" || first.Model != "chat" {
			t.Fatalf("output %q status %q model %q, want %q", got, first.Status, first.Model, want)
		}
		if hr.Header.Get("X-Molly-Tier") != "T3" || len(hr.Header.Get("X-Molly-Decision-Id")) != 36 || first.Usage.TotalTokens != 10 {
			t.Fatalf("tier %q usage %+v", hr.Header.Get("X-Molly-Tier"), first.Usage)
		}
		sent := lastBody(t, tr.t3.Received())
		if tr.t3.Contains("anna@example.org") || sent.Get("messages.0.role").Str != "system" || sent.Get("messages.0.content").Str != "Be brief." ||
			!strings.Contains(sent.Get("messages.1.content").Str, "[EMAIL_1]") {
			t.Fatalf("T3 received %s", sent.Raw)
		}
	})
	t.Run("GET /v1/responses/{id} returns the stored response as it was sent", func(t *testing.T) {
		got, err := c.Responses.Get(ctx, first.ID, responses.ResponseGetParams{})
		if err != nil {
			t.Fatal(err)
		}
		spec.Validate(t, "Response", []byte(got.RawJSON()))
		if got.RawJSON() != first.RawJSON() {
			t.Fatalf("retrieved\n%s\nsent\n%s", got.RawJSON(), first.RawJSON())
		}
		_, err = c.Responses.Get(ctx, "resp_unknown", responses.ResponseGetParams{})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Type != "invalid_request_error" {
			t.Fatalf("an unknown id: %v", err)
		}
		resp, b := do(t, g, "GET", "/v1/responses/resp_unknown", "")
		spec.Validate(t, "ErrorResponse", b)
		if resp.StatusCode != 404 {
			t.Fatalf("an unknown id: %d %s", resp.StatusCode, b)
		}
	})
	t.Run("previous_response_id continues the stored conversation, on T0-T2 only", func(t *testing.T) {
		var hr *http.Response
		next, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", PreviousResponseID: openai.String(first.ID),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("and shorter?")}}, option.WithResponseInto(&hr))
		if err != nil {
			t.Fatal(err)
		}
		if hr.Header.Get("X-Molly-Tier") != "T2" || next.PreviousResponseID != first.ID || next.OutputText() != "t2 says: and shorter?" {
			t.Fatalf("tier %q previous %q output %q", hr.Header.Get("X-Molly-Tier"), next.PreviousResponseID, next.OutputText())
		}
		sent := lastBody(t, tr.t2.Received())
		// The earlier turn as the client saw it (restored), without its instructions.
		want := []string{"user", prompt, "assistant", "t3 says: " + prompt, "user", "and shorter?"}
		var got []string
		for _, m := range sent.Get("messages").Array() {
			got = append(got, m.Get("role").Str, m.Get("content").Str)
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("T2 received %v, want %v", got, want)
		}
		_, err = c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", PreviousResponseID: openai.String("resp_unknown"),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "previous_response_id" {
			t.Fatalf("an unknown previous_response_id: %v", err)
		}
	})
	t.Run("a streamed response: the Responses events, each spec-valid", func(t *testing.T) {
		tr.t3.Chunks = 5
		stream := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "chat",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Stream to anna@example.org")}})
		var deltas strings.Builder
		var types []string
		var done responses.Response
		for stream.Next() {
			ev := stream.Current()
			spec.Validate(t, "ResponseStreamEvent", []byte(ev.RawJSON()))
			types = append(types, ev.Type)
			switch ev.Type {
			case "response.output_text.delta":
				deltas.WriteString(ev.Delta)
			case "response.completed":
				done = ev.Response
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		want := "t3 says: Stream to anna@example.org"
		if deltas.String() != want || done.OutputText() != want || done.Usage.OutputTokens != 5 {
			t.Fatalf("deltas %q completed %q usage %+v; events %v", deltas.String(), done.OutputText(), done.Usage, types)
		}
		if types[0] != "response.created" || types[len(types)-1] != "response.completed" {
			t.Fatalf("events %v", types)
		}
	})
	t.Run("function tools: a call, then its output in the next turn", func(t *testing.T) {
		tr.t3.ToolCalls = func(body []byte) []upstreamtest.ToolCall {
			if gjson.GetBytes(body, `messages.#(role=="tool")`).Exists() {
				return nil
			}
			return []upstreamtest.ToolCall{{ID: "call_w", Name: "weather", Arguments: `{"city":"Rome"}`}}
		}
		defer func() { tr.t3.ToolCalls = nil }()
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("weather in Rome?")},
			Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("weather", map[string]any{"type": "object"}, false)}})
		if err != nil {
			t.Fatal(err)
		}
		spec.Validate(t, "Response", []byte(r.RawJSON()))
		call := r.Output[0]
		if len(r.Output) != 1 || call.Type != "function_call" || call.CallID != "call_w" || call.Name != "weather" || call.Arguments.OfString != `{"city":"Rome"}` {
			t.Fatalf("output %s", r.RawJSON())
		}
		out := responses.ResponseInputItemParamOfFunctionCallOutput("sunny")
		out.OfFunctionCallOutput.CallID = openai.String("call_w")
		r2, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", PreviousResponseID: openai.String(r.ID),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{out}},
			Tools: []responses.ToolUnionParam{responses.ToolParamOfFunction("weather", map[string]any{"type": "object"}, false)}})
		if err != nil {
			t.Fatal(err)
		}
		sent := lastBody(t, tr.t2.Received()) // a stored conversation: T0-T2
		msgs := sent.Get("messages").Array()
		if len(msgs) != 3 || msgs[1].Get("tool_calls.0.id").Str != "call_w" || msgs[2].Get("role").Str != "tool" || msgs[2].Get("content").Str != "sunny" {
			t.Fatalf("T2 received %s (answer %s)", sent.Raw, r2.RawJSON())
		}
	})
	t.Run("DELETE /v1/responses/{id} deletes it: retrieving or continuing it is then a 404", func(t *testing.T) {
		r, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("forget me")}})
		if err != nil {
			t.Fatal(err)
		}
		resp, b := do(t, g, "DELETE", "/v1/responses/"+r.ID, "")
		if resp.StatusCode != 200 || gjson.GetBytes(b, "id").Str != r.ID || gjson.GetBytes(b, "object").Str != "response" || !gjson.GetBytes(b, "deleted").Bool() {
			t.Fatalf("DELETE: %d %s", resp.StatusCode, b)
		}
		var apiErr *openai.Error
		if _, err := c.Responses.Get(ctx, r.ID, responses.ResponseGetParams{}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Fatalf("GET after DELETE: %v", err)
		}
		if _, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", PreviousResponseID: openai.String(r.ID),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("again")}}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Fatalf("previous_response_id of a deleted response: %v", err)
		}
		// The SDK's own delete, and deleting twice.
		r2, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("forget me too")}})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Responses.Delete(ctx, r2.ID); err != nil {
			t.Fatalf("the SDK's Delete: %v", err)
		}
		if err := c.Responses.Delete(ctx, r2.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Fatalf("deleting twice: %v", err)
		}
		resp, b = do(t, g, "DELETE", "/v1/responses/resp_unknown", "")
		spec.Validate(t, "ErrorResponse", b)
		if resp.StatusCode != 404 {
			t.Fatalf("deleting an unknown id: %d %s", resp.StatusCode, b)
		}
	})
}

func TestMessagesAPI(t *testing.T) {
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", "sensitivity EMAIL public"))
	base := strings.TrimSuffix(g.URL, "/v1")

	t.Run("the recorded tool round is translated and answered as a Message", func(t *testing.T) {
		req, err := os.ReadFile("../../router/translate/testdata/anthropic/tool_use_request.json")
		if err != nil {
			t.Fatal(err)
		}
		body := strings.Replace(string(req), `"claude-sonnet-4-5"`, `"chat"`, 1)
		resp, b := do(t, g, "POST", "/v1/messages", body, "anthropic-version", "2023-06-01")
		m := gjson.ParseBytes(b)
		if resp.StatusCode != 200 || m.Get("type").Str != "message" || m.Get("role").Str != "assistant" || m.Get("model").Str != "chat" ||
			m.Get("content.0.type").Str != "text" || m.Get("content.0.text").Str != "t3 says: And in Celsius?" || m.Get("stop_reason").Str != "end_turn" ||
			m.Get("usage.input_tokens").Int() != 5 || !strings.HasPrefix(resp.Header.Get("X-Request-Id"), "req_") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		sent := lastBody(t, tr.t3.Received())
		if sent.Get("messages.0.role").Str != "system" || sent.Get("messages.2.tool_calls.0.id").Str != "toolu_01A09q90qw90lq917835lq9" ||
			sent.Get("messages.3.role").Str != "tool" || sent.Get("tools.0.function.name").Str != "get_weather" || sent.Get("max_tokens").Int() != 1024 {
			t.Fatalf("T3 received %s", sent.Raw)
		}
	})
	t.Run("redacted for T3 and restored, streamed", func(t *testing.T) {
		tr.t3.Chunks = 6
		resp, b := do(t, g, "POST", "/v1/messages", `{"model":"chat","max_tokens":50,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"mail bob@example.net now"}]}]}`)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || tr.t3.Contains("bob@example.net") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		var types []string
		var text strings.Builder
		inputs := map[string]gjson.Result{}
		for _, ev := range sseEvents(t, b) {
			types = append(types, ev.Type)
			switch ev.Type {
			case "message_start":
				inputs[ev.Type] = gjson.GetBytes(ev.Data, "message.usage.input_tokens")
			case "message_delta":
				inputs[ev.Type] = gjson.GetBytes(ev.Data, "usage.input_tokens")
			}
			if gjson.GetBytes(ev.Data, "type").Str != ev.Type {
				t.Fatalf("event %q with data %s", ev.Type, ev.Data)
			}
			text.WriteString(gjson.GetBytes(ev.Data, "delta.text").Str)
		}
		if text.String() != "t3 says: mail bob@example.net now" || types[0] != "message_start" || types[len(types)-2] != "message_delta" || types[len(types)-1] != "message_stop" {
			t.Fatalf("text %q events %v", text.String(), types)
		}
		// message_start comes before the upstream's count (its usage chunk
		// is last): an estimate. message_delta, the whole message's usage,
		// has the upstream's 5 prompt and 6 completion tokens (one per chunk).
		if st, d := inputs["message_start"], inputs["message_delta"]; st.Type != gjson.Number || st.Int() <= 0 || d.Int() != 5 || d.Type != gjson.Number {
			t.Fatalf("input_tokens: message_start %s, message_delta %s", st.Raw, d.Raw)
		}
		if out := gjson.GetBytes(sseEvents(t, b)[len(types)-2].Data, "usage.output_tokens"); out.Int() != 6 {
			t.Fatalf("message_delta output_tokens %s", out.Raw)
		}
	})
	t.Run("errors are Anthropic's", func(t *testing.T) {
		for _, c := range []struct {
			body, typ string
			status    int
		}{
			{`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, "invalid_request_error", 400},
			{`{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, "not_found_error", 404},
			{`{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}` + "x", "invalid_request_error", 400},
			{"GET", "invalid_request_error", 405},
		} {
			method, body := "POST", c.body
			if c.body == "GET" {
				method, body = "GET", ""
			}
			resp, b := do(t, g, method, "/v1/messages", body)
			if resp.StatusCode != c.status || gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != c.typ || gjson.GetBytes(b, "error.message").Str == "" {
				t.Fatalf("%s: %d %s", c.body, resp.StatusCode, b)
			}
		}
	})
	t.Run("count_tokens estimates the prompt without sending it", func(t *testing.T) {
		before := len(tr.t3.Received()) + len(tr.t2.Received()) + len(tr.t1.Received())
		count := func(text string) int64 {
			t.Helper()
			resp, b := do(t, g, "POST", "/v1/messages/count_tokens", `{"model":"chat","system":"Be brief.","messages":[{"role":"user","content":"`+text+`"}]}`)
			n := gjson.GetBytes(b, "input_tokens")
			if resp.StatusCode != 200 || n.Type != gjson.Number {
				t.Fatalf("count_tokens: %d %s", resp.StatusCode, b)
			}
			return n.Int()
		}
		short, long := "hello there", strings.Repeat("the quick brown fox jumps over the lazy dog ", 40)
		ns, nl := count(short), count(long)
		// Any tokenizer of English text makes between one token per 8
		// bytes and one per byte.
		if nl < int64(len(long))/8 || nl > int64(len(long)) || ns >= nl || ns < 1 {
			t.Fatalf("input_tokens %d for %d bytes and %d for %d bytes", ns, len(short), nl, len(long))
		}
		if after := len(tr.t3.Received()) + len(tr.t2.Received()) + len(tr.t1.Received()); after != before {
			t.Fatalf("count_tokens reached an upstream (%d requests before, %d after)", before, after)
		}
		for _, c := range []struct {
			method, body string
			status       int
			typ          string
		}{{"POST", `{"model":"chat"}`, 400, "invalid_request_error"}, {"POST", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}x`, 400, "invalid_request_error"},
			{"GET", "", 405, "invalid_request_error"}, {"POST", `{"model":"no-such-model","messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"}} {
			resp, b := do(t, g, c.method, "/v1/messages/count_tokens", c.body)
			if resp.StatusCode != c.status || gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != c.typ {
				t.Fatalf("%s %s: %d %s", c.method, c.body, resp.StatusCode, b)
			}
		}
	})
	t.Run("Anthropic's TypeScript SDK", func(t *testing.T) {
		sdk, _ := filepath.Abs("testdata/node/node_modules")
		if _, err := os.Stat(filepath.Join(sdk, "@anthropic-ai", "sdk")); err != nil {
			t.Skipf("@anthropic-ai/sdk is not installed in %s (make sdk installs it from npm)", sdk)
		}
		node, err := exec.LookPath("node")
		if err != nil {
			t.Skip("node is not installed")
		}
		cmd := exec.Command(node, "testdata/anthropic_sdk.cjs", base)
		cmd.Env = append(os.Environ(), "NODE_PATH="+sdk)
		out, err := cmd.Output()
		if err != nil {
			var ee *exec.ExitError
			errors.As(err, &ee)
			t.Fatalf("node: %v\n%s", err, ee.Stderr)
		}
		r := gjson.ParseBytes(out)
		if r.Get("message.type").Str != "message" || r.Get("message.text").Str != "t3 says: Reply to anna@example.org please" || r.Get("message.stop_reason").Str != "end_turn" ||
			r.Get("message.usage.output_tokens").Int() != 5 {
			t.Fatalf("message: %s", out)
		}
		if r.Get("stream.deltas").Str != "t3 says: Stream a haiku about tea" || r.Get("stream.text").Str != r.Get("stream.deltas").Str || r.Get("stream.stop_reason").Str != "end_turn" {
			t.Fatalf("stream: %s", out)
		}
		// The SDK's final message has the upstream's usage, as the
		// non-streamed message does: 5 prompt tokens, an answer of 6 chunks
		// (tr.t3.Chunks, one completion token each).
		if u := r.Get("stream.usage"); u.Get("input_tokens").Int() != 5 || u.Get("output_tokens").Int() != 6 || r.Get("message.usage.input_tokens").Int() != 5 {
			t.Fatalf("stream usage %s, message usage %s", u.Raw, r.Get("message.usage").Raw)
		}
		if r.Get("error.status").Int() != 404 || r.Get("error.type").Str != "not_found_error" || r.Get("error.name").Str != "NotFoundError" {
			t.Fatalf("error: %s", out)
		}
		if tr.t3.Contains("anna@example.org") {
			t.Fatal("T3 received the address")
		}
	})
}

// TestMessagesAPIAdmissionErrors checks molly_auth's refusals on the
// Messages API against Anthropic's documented error shapes
// (https://docs.anthropic.com/en/api/errors): 401 authentication_error,
// 429 rate_limit_error, {"type":"error","error":{"type","message"}}.
func TestMessagesAPIAdmissionErrors(t *testing.T) {
	tr := startTiers(t)
	db := filepath.Join(t.TempDir(), "registry", "molly.db")
	admin := adminSocket(t)
	g := startMolly(t, authCaddyfile(tr, admin, db, ""))
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "frank", "rpm": 1}); code != http.StatusCreated {
		t.Fatalf("creating frank: %d %s", code, body)
	}
	key, _ := newKey(t, admin, "frank")
	body := `{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
	check := func(name string, resp *http.Response, b []byte, status int, typ string) {
		t.Helper()
		m := gjson.ParseBytes(b)
		if resp.StatusCode != status || m.Get("type").Str != "error" || m.Get("error.type").Str != typ || m.Get("error.message").Str == "" ||
			m.Get("error.code").Exists() || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, b)
		}
	}
	resp, b := do(t, g, "POST", "/v1/messages", body, "anthropic-version", "2023-06-01")
	check("no key", resp, b, 401, "authentication_error")
	resp, b = do(t, g, "POST", "/v1/messages/count_tokens", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`, "anthropic-version", "2023-06-01")
	check("count_tokens without a key", resp, b, 401, "authentication_error")
	resp, b = do(t, g, "POST", "/v1/messages", body, "x-api-key", key[:len(key)-4]+"abcd")
	check("a wrong key", resp, b, 401, "authentication_error")
	if strings.Contains(string(b), key[:len(key)-4]) {
		t.Fatalf("the refusal echoes the key: %s", b)
	}
	resp, b = do(t, g, "POST", "/v1/messages", body, "x-api-key", key)
	if resp.StatusCode != 200 || gjson.GetBytes(b, "type").Str != "message" {
		t.Fatalf("the first request: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "POST", "/v1/messages", body, "x-api-key", key)
	check("past the RPM limit", resp, b, 429, "rate_limit_error")
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a rate-limited Message has no Retry-After: %v", resp.Header)
	}
	// The chat completions path keeps OpenAI's shape.
	resp, b = do(t, g, "POST", "/v1/chat/completions", `{"model":"chat","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 401 || gjson.GetBytes(b, "error.code").Str != "invalid_api_key" {
		t.Fatalf("chat without a key: %d %s", resp.StatusCode, b)
	}
}

// TestTranslatedAPIsRefuseInvalidUTF8: a body with a string that is not
// UTF-8 gets the 400 a chat completions body gets — OpenAI's error JSON on
// /v1/responses, Anthropic's error on /v1/messages — and nothing is sent
// upstream (a translation would have carried U+FFFD in its place).
func TestTranslatedAPIsRefuseInvalidUTF8(t *testing.T) {
	spec := openapitest.Load(t)
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	resp, b := do(t, g, "POST", "/v1/chat/completions", "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9 au lait\"}]}")
	chatMsg := gjson.GetBytes(b, "error.message").Str
	if resp.StatusCode != 400 || !strings.Contains(chatMsg, "UTF-8") {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "POST", "/v1/responses", "{\"model\":\"chat\",\"input\":\"caf\xe9 au lait\"}")
	spec.Validate(t, "ErrorResponse", b)
	if e := gjson.GetBytes(b, "error"); resp.StatusCode != 400 || e.Get("type").Str != "invalid_request_error" || e.Get("message").Str != chatMsg {
		t.Fatalf("responses: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "POST", "/v1/messages", "{\"model\":\"chat\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"caf\xe9 au lait\"}]}]}",
		"anthropic-version", "2023-06-01")
	if m := gjson.ParseBytes(b); resp.StatusCode != 400 || m.Get("type").Str != "error" || m.Get("error.type").Str != "invalid_request_error" || m.Get("error.message").Str != chatMsg {
		t.Fatalf("messages: %d %s", resp.StatusCode, b)
	}
	for _, u := range []*upstreamtest.Upstream{tr.t1, tr.t2, tr.t3} {
		if n := u.Count(); n != 0 {
			t.Fatalf("%s received %d requests", u.Name, n)
		}
	}
}

// TestTranslatedAPIsOnTheEngine runs the Responses and Messages APIs on the
// T0 engine (the demo model, whose chat template has reasoning delimiters)
// with chat completions on the same model as the oracle: the same prompt
// at temperature 0 gives the same tokens, so the translated answers must
// report the counts and the reasoning the chat answer has.
func TestTranslatedAPIsOnTheEngine(t *testing.T) {
	spec := openapitest.Load(t)
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			n_seq_max 2
			n_ctx 2048
			threads 1
			reasoning_budget 6 12 24
		}
		target local {
			tier T0
			kind engine
			models gpt-4o-mini=molly-demo
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	c := client(g)
	ctx := context.Background()

	t.Run("a Messages stream reports the engine's input and output tokens", func(t *testing.T) {
		// The chat answer's usage is the oracle: the engine's count of the templated prompt.
		want, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "gpt-4o-mini", MaxTokens: openai.Int(2),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}})
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"gpt-4o-mini","max_tokens":2,"messages":[{"role":"user","content":"Hello"}]}`
		resp, b := do(t, g, "POST", "/v1/messages", body, "anthropic-version", "2023-06-01")
		if resp.StatusCode != 200 || gjson.GetBytes(b, "usage.input_tokens").Int() != want.Usage.PromptTokens || gjson.GetBytes(b, "usage.output_tokens").Int() != 2 {
			t.Fatalf("message %d %s; chat usage %+v", resp.StatusCode, b, want.Usage)
		}
		resp, b = do(t, g, "POST", "/v1/messages", strings.Replace(body, `"max_tokens":2`, `"max_tokens":2,"stream":true`, 1), "anthropic-version", "2023-06-01")
		evs := sseEvents(t, b)
		if resp.StatusCode != 200 || len(evs) < 3 || evs[len(evs)-2].Type != "message_delta" {
			t.Fatalf("stream %d %s", resp.StatusCode, b)
		}
		start := gjson.GetBytes(evs[0].Data, "message.usage.input_tokens")
		delta := gjson.GetBytes(evs[len(evs)-2].Data, "usage")
		// message_start is sent before the engine's count exists (an
		// estimate); message_delta is the message's usage the SDKs keep.
		if start.Type != gjson.Number || start.Int() <= 0 || delta.Get("input_tokens").Int() != want.Usage.PromptTokens || delta.Get("output_tokens").Int() != 2 {
			t.Fatalf("message_start input_tokens %s, message_delta usage %s; the chat answer counts %d prompt tokens", start.Raw, delta.Raw, want.Usage.PromptTokens)
		}
	})

	t.Run("Responses reasoning.effort reasons, as chat reasoning_effort does", func(t *testing.T) {
		const prompt = "Why is the sky blue?"
		var chatResp struct {
			Choices []struct {
				Message struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"message"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens        int64 `json:"completion_tokens"`
				CompletionTokensDetails struct {
					ReasoningTokens int64 `json:"reasoning_tokens"`
				} `json:"completion_tokens_details"`
			} `json:"usage"`
		}
		resp, b := do(t, g, "POST", "/v1/chat/completions", `{"model":"gpt-4o-mini","temperature":0,"max_completion_tokens":16,"reasoning_effort":"low","messages":[{"role":"user","content":"`+prompt+`"}]}`)
		if err := json.Unmarshal(b, &chatResp); err != nil || resp.StatusCode != 200 || len(chatResp.Choices) != 1 {
			t.Fatalf("chat: %d %s", resp.StatusCode, b)
		}
		oracle := chatResp.Choices[0].Message
		reasoningTokens := chatResp.Usage.CompletionTokensDetails.ReasoningTokens
		// The low budget (6) and the end delimiter.
		if oracle.ReasoningContent == "" || reasoningTokens < 7 {
			t.Fatalf("the chat oracle has no reasoning: %s", b)
		}
		params := responses.ResponseNewParams{Model: "gpt-4o-mini", Temperature: openai.Float(0), MaxOutputTokens: openai.Int(16),
			Reasoning: shared.ReasoningParam{Effort: shared.ReasoningEffortLow},
			Input:     responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}}
		check := func(t *testing.T, r *responses.Response) {
			t.Helper()
			spec.Validate(t, "Response", []byte(r.RawJSON()))
			if r.Reasoning.Effort != shared.ReasoningEffortLow || len(r.Output) < 1 || r.Output[0].Type != "reasoning" {
				t.Fatalf("response %s", r.RawJSON())
			}
			item := r.Output[0].AsReasoning()
			if len(item.Content) != 1 || item.Content[0].Text != oracle.ReasoningContent || r.OutputText() != oracle.Content ||
				r.Usage.OutputTokensDetails.ReasoningTokens != reasoningTokens || r.Usage.OutputTokens != chatResp.Usage.CompletionTokens {
				t.Fatalf("response %s\nwant the chat answer's reasoning %q, content %q, %d reasoning of %d tokens",
					r.RawJSON(), oracle.ReasoningContent, oracle.Content, reasoningTokens, chatResp.Usage.CompletionTokens)
			}
		}
		r, err := c.Responses.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		check(t, r)

		stream := c.Responses.NewStreaming(ctx, params)
		var deltas strings.Builder
		var done *responses.Response
		for stream.Next() {
			ev := stream.Current()
			spec.Validate(t, "ResponseStreamEvent", []byte(ev.RawJSON()))
			switch ev.Type {
			case "response.reasoning_text.delta":
				deltas.WriteString(ev.Delta)
			case "response.completed", "response.incomplete":
				done = &ev.Response
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if done == nil || deltas.String() != oracle.ReasoningContent {
			t.Fatalf("reasoning deltas %q, want %q", deltas.String(), oracle.ReasoningContent)
		}
		check(t, done)
	})
}

// TestAnthropicModelsAPI: GET /v1/models from an Anthropic client (its
// anthropic-version header) is Anthropic's Models API
// (https://docs.anthropic.com/en/api/models): a list of ModelInfo
// {"type": "model", "id", "display_name", "created_at"} with has_more,
// first_id and last_id (null on an empty page), paged by limit and
// after_id (the config lists one model: chat); GET /v1/models/{id}
// one ModelInfo or a not_found_error; a refusal of molly_auth Anthropic's
// authentication_error body; all with Anthropic's request-id header. An
// OpenAI client on the same paths keeps OpenAI's list.
func TestAnthropicModelsAPI(t *testing.T) {
	tr := startTiers(t)
	db := filepath.Join(t.TempDir(), "registry", "molly.db")
	admin := adminSocket(t)
	g := startMolly(t, authCaddyfile(tr, admin, db, ""))
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "ines"}); code != http.StatusCreated {
		t.Fatalf("creating ines: %d %s", code, body)
	}
	key, _ := newKey(t, admin, "ines")
	anthropic := []string{"anthropic-version", "2023-06-01", "x-api-key", key}
	resp, b := do(t, g, "GET", "/v1/models", "", "anthropic-version", "2023-06-01")
	if m := gjson.ParseBytes(b); resp.StatusCode != 401 || m.Get("type").Str != "error" || m.Get("error.type").Str != "authentication_error" ||
		resp.Header.Get("request-id") == "" || m.Get("request_id").Str != resp.Header.Get("request-id") {
		t.Fatalf("no key: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	resp, b = do(t, g, "GET", "/v1/models", "", "Authorization", "Bearer "+key)
	openaiIDs := gjson.GetBytes(b, "data.#.id").Array()
	if resp.StatusCode != 200 || gjson.GetBytes(b, "object").Str != "list" || len(openaiIDs) != 1 {
		t.Fatalf("OpenAI's list: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "GET", "/v1/models?limit=1", "", anthropic...)
	m := gjson.ParseBytes(b)
	first := openaiIDs[0].Str
	if resp.StatusCode != 200 || m.Get("data.#").Int() != 1 || m.Get("has_more").Type != gjson.False || m.Get("first_id").Str != first ||
		m.Get("last_id").Str != first || m.Get("object").Exists() || resp.Header.Get("request-id") == "" {
		t.Fatalf("Anthropic's first page: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	var info map[string]any
	if err := json.Unmarshal([]byte(m.Get("data.0").Raw), &info); err != nil {
		t.Fatal(err)
	}
	if want := map[string]any{"type": "model", "id": first, "display_name": first, "created_at": "1970-01-01T00:00:00Z"}; !reflect.DeepEqual(info, want) {
		t.Fatalf("ModelInfo %v, want %v", info, want)
	}
	resp, b = do(t, g, "GET", "/v1/models?limit=1000&after_id="+first, "", anthropic...)
	if m := gjson.ParseBytes(b); resp.StatusCode != 200 || m.Get("data").Raw != "[]" || m.Get("has_more").Type != gjson.False ||
		m.Get("first_id").Type != gjson.Null || m.Get("last_id").Type != gjson.Null {
		t.Fatalf("Anthropic's next page: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "GET", "/v1/models/"+first, "", anthropic...)
	if m := gjson.ParseBytes(b); resp.StatusCode != 200 || m.Get("type").Str != "model" || m.Get("id").Str != first || m.Get("owned_by").Exists() {
		t.Fatalf("one model: %d %s", resp.StatusCode, b)
	}
	resp, b = do(t, g, "GET", "/v1/models/no-such-model", "", anthropic...)
	if m := gjson.ParseBytes(b); resp.StatusCode != 404 || m.Get("type").Str != "error" || m.Get("error.type").Str != "not_found_error" ||
		m.Get("error.code").Exists() || m.Get("request_id").Str != resp.Header.Get("request-id") {
		t.Fatalf("an unknown model: %d %s", resp.StatusCode, b)
	}
}

// TestResponsesInputTokens: POST /v1/responses/input_tokens (OpenAI's
// input token count) answers a TokenCountsResource {"object":
// "response.input_tokens", "input_tokens": n} without sending anything
// upstream — n Molly's estimate of the prompt, the count
// /v1/messages/count_tokens gives the same prompt; a previous_response_id
// counts the stored conversation too; an unknown model is a 404, GET a 405
// (it was read as retrieving a response named input_tokens); POST
// /v1/responses/compact a 404 unknown_url.
func TestResponsesInputTokens(t *testing.T) {
	spec := openapitest.Load(t)
	tr := startTiers(t)
	g := startMolly(t, tr.caddyfile("", ""))
	text := "Count the tokens of this sentence, please."
	resp, b := do(t, g, "POST", "/v1/responses/input_tokens", `{"model":"chat","input":"`+text+`"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	spec.Validate(t, "TokenCountsResource", b)
	_, mb := do(t, g, "POST", "/v1/messages/count_tokens", `{"model":"chat","messages":[{"role":"user","content":"`+text+`"}]}`, "anthropic-version", "2023-06-01")
	n := gjson.GetBytes(b, "input_tokens")
	if gjson.GetBytes(b, "object").Str != "response.input_tokens" || n.Int() <= 0 || n.Int() != gjson.GetBytes(mb, "input_tokens").Int() {
		t.Fatalf("input_tokens %s, count_tokens %s", b, mb)
	}
	for _, up := range []*upstreamtest.Upstream{tr.t1, tr.t2, tr.t3} {
		if n := up.Count(); n != 0 {
			t.Fatalf("an upstream got %d requests", n)
		}
	}
	_, rb := do(t, g, "POST", "/v1/responses", `{"model":"chat","input":"`+text+`"}`)
	id := gjson.GetBytes(rb, "id").Str
	_, cb := do(t, g, "POST", "/v1/responses/input_tokens", `{"model":"chat","previous_response_id":"`+id+`","input":"`+text+`"}`)
	if id == "" || gjson.GetBytes(cb, "input_tokens").Int() <= n.Int() {
		t.Fatalf("with previous_response_id %q: %s (alone: %d)", id, cb, n.Int())
	}
	resp, b = do(t, g, "POST", "/v1/responses/input_tokens", `{"model":"no-such-model","input":"hi"}`)
	if resp.StatusCode != 404 || gjson.GetBytes(b, "error.code").Str != "model_not_found" {
		t.Fatalf("an unknown model: %d %s", resp.StatusCode, b)
	}
	spec.Validate(t, "ErrorResponse", b)
	resp, b = do(t, g, "GET", "/v1/responses/input_tokens", "")
	if resp.StatusCode != 405 || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	// POST /v1/responses/compact, OpenAI's compaction, is not a response
	// id either: an unknown URL here, not a 405 asking for GET.
	resp, b = do(t, g, "POST", "/v1/responses/compact", `{"model":"chat","input":"hi"}`)
	if resp.StatusCode != 404 || gjson.GetBytes(b, "error.code").Str != "unknown_url" {
		t.Fatalf("compact: %d %s", resp.StatusCode, b)
	}
}
