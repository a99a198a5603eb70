package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/serving"
	"github.com/molly-gateway/molly/serving/gguf"
)

// TestT0DraftsForAT1MollyEngine runs two molly processes on loopback: B
// serves a model with molly_serve; A has a Q4_0 copy of it as its engine
// and B as a T1 target with draft_with_engine. A greedy request routed to
// the T1 target is answered by A's engine drafting and B verifying, and
// the answer (streamed or not) equals B's own answer to the same request;
// a request at temperature 0.7 goes to B as usual.
func TestT0DraftsForAT1MollyEngine(t *testing.T) {
	dir := t.TempDir()
	cfg, err := gguf.SizeConfig("small", 7)
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dir, "target.gguf")
	if err := gguf.WriteModel(target, cfg); err != nil {
		t.Fatal(err)
	}
	draft := filepath.Join(dir, "draft.gguf")
	b, err := os.ReadFile(target)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(draft, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := serving.QuantizeModel(draft, "q4_0"); err != nil {
		t.Fatal(err)
	}
	engine := func(model string) string {
		return `engine {
			model ` + model + `
			n_seq_max 2
			n_ctx 1024
			threads 1
		}`
	}
	remote := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		`+engine(target)+`
	}
}
http://127.0.0.1:{PORT} {
	handle /metrics {
		metrics
	}
	handle {
		molly_serve
	}
}
`)
	local := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		`+engine(draft)+`
		target lan {
			tier T1
			endpoint `+remote.URL+`
			models chat=target
			draft_with_engine
			draft_tokens 4
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /metrics {
		metrics
	}
	handle {
		molly_classify
		molly_policy
		molly_route
	}
}
`)
	ctx := context.Background()
	direct := openai.NewClient(option.WithBaseURL(remote.URL), option.WithAPIKey("x"), option.WithMaxRetries(0))
	gw := client(local)
	remoteBase, localBase := strings.TrimSuffix(remote.URL, "/v1"), strings.TrimSuffix(local.URL, "/v1")
	metric := func(base, name string, labels map[string]string) float64 {
		t.Helper()
		v, ok := sample(scrape(t, base), name, labels)
		if !ok {
			t.Fatalf("%s has no %s%v", base, name, labels)
		}
		return v
	}

	prompts := []string{"hello there", "The quick brown fox jumps over the lazy dog", "abc abc abc abc"}
	want := make([]*openai.ChatCompletion, len(prompts))
	for i, p := range prompts {
		params := openai.ChatCompletionNewParams{Model: "target", Temperature: openai.Float(0), MaxTokens: openai.Int(40),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(p)}}
		if want[i], err = direct.Chat.Completions.New(ctx, params); err != nil {
			t.Fatal(err)
		}
		if want[i].Usage.CompletionTokens == 0 {
			t.Fatalf("prompt %d: B generated nothing", i)
		}
	}
	steps := metric(remoteBase, "molly_engine_steps_total", nil)

	for i, p := range prompts {
		params := openai.ChatCompletionNewParams{Model: "chat", Temperature: openai.Float(0), MaxTokens: openai.Int(40),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(p)}}
		var resp *http.Response
		got, err := gw.Chat.Completions.New(ctx, params, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get("X-Molly-Target") != "lan" || resp.Header.Get("X-Molly-Tier") != "T1" || !strings.Contains(resp.Header.Get("X-Molly-Route"), "lan") {
			t.Fatalf("prompt %d: routed %s/%s (%s), want lan/T1", i, resp.Header.Get("X-Molly-Target"), resp.Header.Get("X-Molly-Tier"), resp.Header.Get("X-Molly-Route"))
		}
		if got.Model != "chat" || got.Object != "chat.completion" {
			t.Errorf("prompt %d: model %q object %q, want the client's chat and chat.completion", i, got.Model, got.Object)
		}
		if got.Choices[0].Message.Content != want[i].Choices[0].Message.Content || got.Choices[0].FinishReason != want[i].Choices[0].FinishReason ||
			got.Usage.PromptTokens != want[i].Usage.PromptTokens || got.Usage.CompletionTokens != want[i].Usage.CompletionTokens || got.Usage.TotalTokens != want[i].Usage.TotalTokens {
			t.Errorf("prompt %d through A:\n got %q %s %+v\nwant %q %s %+v", i, got.Choices[0].Message.Content, got.Choices[0].FinishReason, got.Usage,
				want[i].Choices[0].Message.Content, want[i].Choices[0].FinishReason, want[i].Usage)
		}
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := gw.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Choices) != 1 || acc.Choices[0].Message.Content != want[i].Choices[0].Message.Content || acc.Choices[0].FinishReason != want[i].Choices[0].FinishReason ||
			acc.Usage.CompletionTokens != want[i].Usage.CompletionTokens || acc.Usage.PromptTokens != want[i].Usage.PromptTokens {
			t.Errorf("prompt %d streamed through A: %+v usage %+v, want %q %+v", i, acc.Choices, acc.Usage, want[i].Choices[0].Message.Content, want[i].Usage)
		}
	}
	// Every token came from B's verify endpoint, none from B's scheduler.
	rounds := metric(localBase, "molly_engine_remote_draft_rounds_total", nil)
	accepted := metric(localBase, "molly_engine_remote_draft_tokens_total", map[string]string{"kind": "accepted"})
	if drafted := metric(localBase, "molly_engine_remote_draft_requests_total", map[string]string{"outcome": "drafted"}); drafted != float64(2*len(prompts)) {
		t.Errorf("A drafted %v requests, want %d", drafted, 2*len(prompts))
	}
	if rounds == 0 || accepted == 0 {
		t.Errorf("A's drafting: %v rounds, %v accepted tokens", rounds, accepted)
	}
	if calls := metric(remoteBase, "molly_engine_verify_calls_total", nil); calls != rounds {
		t.Errorf("B answered %v verify calls, A counts %v rounds", calls, rounds)
	}
	if acc := metric(remoteBase, "molly_engine_verify_tokens_total", map[string]string{"kind": "accepted"}); acc != accepted {
		t.Errorf("B accepted %v draft tokens, A counts %v", acc, accepted)
	}
	if s := metric(remoteBase, "molly_engine_steps_total", nil); s != steps {
		t.Errorf("B's scheduler ran %v steps for drafted requests", s-steps)
	}

	// Sampling is not drafted: the request goes to B as usual.
	var resp *http.Response
	out, err := gw.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", Temperature: openai.Float(0.7), MaxTokens: openai.Int(5),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello there")}}, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("X-Molly-Target") != "lan" || out.Usage.CompletionTokens == 0 || out.Model != "chat" {
		t.Fatalf("sampled request: target %q, %+v", resp.Header.Get("X-Molly-Target"), out)
	}
	if metric(remoteBase, "molly_engine_steps_total", nil) == steps || metric(remoteBase, "molly_engine_verify_calls_total", nil) != rounds {
		t.Error("the sampled request did not reach B's scheduler, or was verified")
	}
	if d := metric(localBase, "molly_engine_remote_draft_requests_total", map[string]string{"outcome": "declined"}); d != 1 {
		t.Errorf("A declined %v requests, want 1", d)
	}
}
