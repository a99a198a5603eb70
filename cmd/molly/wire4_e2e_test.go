package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
)

// wire4Provider plays upstreams seen in other gateways' bug trackers: a
// prompt holding INTERLEAVE streams two parallel tool calls with their
// argument fragments interleaved; WHOLE answers a streamed request with
// one JSON answer (and usage); ABSURD reports a negative completion count.
// Every request body is kept.
type wire4Provider struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
}

func startWire4Provider(t *testing.T) *wire4Provider {
	p := &wire4Provider{}
	chunk := func(delta, finish string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.bodies = append(p.bodies, b)
		p.mu.Unlock()
		prompt := gjson.GetBytes(b, "messages.@reverse.0.content").String()
		usage := `{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}`
		if strings.Contains(prompt, "ABSURD") {
			usage = `{"prompt_tokens":11,"completion_tokens":-7000,"total_tokens":-6989}`
		}
		whole := `{"id":"w","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Whole answer."}}],"usage":` + usage + `}`
		switch {
		case strings.Contains(prompt, "INTERLEAVE") && gjson.GetBytes(b, "stream").Bool():
			w.Header().Set("Content-Type", "text/event-stream")
			call := func(i int, head, fn string) string {
				return chunk(fmt.Sprintf(`{"tool_calls":[{"index":%d%s,"function":{%s}}]}`, i, head, fn), "null")
			}
			io.WriteString(w, chunk(`{"role":"assistant","content":null}`, "null")+
				call(0, `,"id":"call_a","type":"function"`, `"name":"weather","arguments":"{\"ci"`)+
				call(1, `,"id":"call_b","type":"function"`, `"name":"weather","arguments":"{\"ci"`)+
				call(0, ``, `"arguments":"ty\":\"Rome\"}"`)+
				call(1, ``, `"arguments":"ty\":\"Oslo\"}"`)+
				chunk(`{}`, `"tool_calls"`)+
				`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up","choices":[],"usage":`+usage+"}\n\ndata: [DONE]\n\n")
		case strings.Contains(prompt, "INTERLEAVE"):
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"w","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,`+
				`"tool_calls":[{"id":"call_a","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Rome\"}"}},{"id":"call_b","type":"function","function":{"name":"weather","arguments":"{\"city\":\"Oslo\"}"}}]}}],"usage":`+usage+`}`)
		default:
			// WHOLE, ABSURD: one JSON answer, streamed request or not.
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, whole)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *wire4Provider) URL() string { return p.srv.URL + "/v1" }

// last is the last request body the provider got.
func (p *wire4Provider) last() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bodies[len(p.bodies)-1]
}

// TestWireFidelityRound4 drives the real binary with the real SDKs against
// upstreams' odd-but-legal answers: interleaved parallel tool-call
// fragments reach Anthropic's accumulator as two whole tool_use blocks
// (as the non-streamed answer has them); a whole JSON answer to a
// streamed request is a spec-valid stream (chat, and Messages), with the
// usage chunk asked for; a thinking budget never reaches the T1 upstream
// as Molly's max_reasoning_tokens; an upstream's negative usage reaches
// no client.
func TestWireFidelityRound4(t *testing.T) {
	spec := openapitest.Load(t)
	p := startWire4Provider(t)
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint `+p.URL()+`
			models chat=up claude=up
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	ctx := context.Background()
	ac := anthropicClient(g)
	oc := openai.NewClient(option.WithBaseURL(g.URL), option.WithAPIKey("k"), option.WithMaxRetries(0))

	t.Run("interleaved tool-call fragments make whole tool_use blocks", func(t *testing.T) {
		params := anthropic.MessageNewParams{Model: "claude", MaxTokens: 2048, Thinking: anthropic.ThinkingConfigParamOfEnabled(1024),
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("INTERLEAVE"))}}
		whole, err := ac.Messages.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if gjson.GetBytes(p.last(), "max_reasoning_tokens").Exists() {
			t.Fatalf("Molly's extension reached the upstream: %s", p.last())
		}
		st := ac.Messages.NewStreaming(ctx, params)
		var acc anthropic.Message
		for st.Next() {
			if err := acc.Accumulate(st.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Content) != 2 || len(whole.Content) != 2 {
			t.Fatalf("streamed %s\nwhole %s", acc.RawJSON(), whole.RawJSON())
		}
		for i, city := range []string{"Rome", "Oslo"} {
			for _, m := range []anthropic.Message{acc, *whole} {
				var in map[string]string
				if err := json.Unmarshal(m.Content[i].Input, &in); err != nil || in["city"] != city || m.Content[i].ID != []string{"call_a", "call_b"}[i] {
					t.Fatalf("block %d: %s (%v)", i, m.Content[i].RawJSON(), err)
				}
			}
		}
	})
	t.Run("a whole answer to a streamed request is streamed", func(t *testing.T) {
		st := oc.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "chat", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("WHOLE")},
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}})
		var acc openai.ChatCompletionAccumulator
		for st.Next() {
			c := st.Current()
			spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(c.RawJSON()))
			if !acc.AddChunk(c) {
				t.Fatalf("the accumulator refused %s", c.RawJSON())
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != "Whole answer." || acc.Usage.TotalTokens != 18 {
			t.Fatalf("accumulated %s", acc.RawJSON())
		}
		ms := ac.Messages.NewStreaming(ctx, anthropic.MessageNewParams{Model: "claude", MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("WHOLE"))}})
		var m anthropic.Message
		for ms.Next() {
			if err := m.Accumulate(ms.Current()); err != nil {
				t.Fatal(err)
			}
		}
		if err := ms.Err(); err != nil || len(m.Content) != 1 || m.Content[0].Text != "Whole answer." || m.Usage.OutputTokens != 7 {
			t.Fatalf("message %s (%v)", m.RawJSON(), err)
		}
	})
	t.Run("an upstream's negative usage reaches no client", func(t *testing.T) {
		c, err := oc.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("ABSURD")}})
		if err != nil {
			t.Fatal(err)
		}
		spec.Validate(t, "CreateChatCompletionResponse", []byte(c.RawJSON()))
		if u := c.Usage; u.CompletionTokens < 0 || u.PromptTokens < 1 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Fatalf("usage %s", c.RawJSON())
		}
		m, err := ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "claude", MaxTokens: 64,
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("ABSURD"))}})
		if err != nil || m.Usage.OutputTokens < 0 {
			t.Fatalf("message %s (%v)", m.RawJSON(), err)
		}
	})
}
