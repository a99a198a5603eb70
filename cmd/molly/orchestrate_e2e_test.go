package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/serving"
)

// TestOrchestrationOnTheDemoModel runs orchestration as a fresh install
// has it — the demo engine with its adapters, no controller — through the
// real gateway and a real OpenAI client: the answer carries the plan id,
// and the admin API shows the plan with each subtask's tier and target.
func TestOrchestrationOnTheDemoModel(t *testing.T) {
	g, admin := startOrchestrator(t, 0)
	c := client(g)
	params := openai.ChatCompletionNewParams{Model: "molly-orchestrator", MaxTokens: openai.Int(4), Messages: []openai.ChatCompletionMessageParamUnion{
		openai.UserMessage("1. Why was I charged twice on my last invoice?\n2. Is the termination clause of my contract enforceable?")}}
	var resp *http.Response
	out, err := c.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get("X-Molly-Plan-Id")
	if id == "" || resp.Header.Get("X-Molly-Strategy") != "orchestrate" || len(out.Choices) != 1 || !strings.Contains(out.Choices[0].Message.Content, "### ") {
		t.Fatalf("plan id %q, strategy %q, answer %+v", id, resp.Header.Get("X-Molly-Strategy"), out.Choices)
	}
	code, b := adminCall(t, admin, http.MethodGet, "/molly/plans/"+id, nil)
	rec := gjson.Parse(b)
	if code != http.StatusOK || rec.Get("planner").String() != "deterministic" || rec.Get("subtasks.#").Int() != 2 {
		t.Fatalf("GET /molly/plans/%s: %d %s", id, code, b)
	}
	for i, want := range []string{"molly-demo:billing", "molly-demo:legal"} {
		s := rec.Get(fmt.Sprintf("subtasks.%d", i))
		if s.Get("model").String() != want || s.Get("tier").String() != "T0" || s.Get("target").String() != "device" || !s.Get("latency_ms").Exists() {
			t.Errorf("subtask %d: %s, want %s on device (T0)", i, s.Raw, want)
		}
	}
	if code, _ := adminCall(t, admin, http.MethodGet, "/molly/plans/nope", nil); code != http.StatusNotFound {
		t.Errorf("an unknown plan is not a 404")
	}

	// Streamed: the client ignores the progress comments and reads the answer.
	stream := c.Chat.Completions.NewStreaming(context.Background(), params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || len(acc.Choices) != 1 || !strings.Contains(acc.Choices[0].Message.Content, "### ") {
		t.Fatalf("stream: %v, %+v", err, acc.Choices)
	}
}

// TestOrchestrationKeepsToTheClientsMaxTokens: a composite request of two
// parts with max_tokens 16, on the demo engine (which writes until its
// cap) with refinement allowed. Each subtask is sent 16 ÷ 2 = 8
// completion tokens, the answer's usage.completion_tokens (what the
// member is billed) is at most 16, and since the subtasks were cut at
// their budget the finish_reason is "length" (OpenAI: "the maximum number
// of tokens specified in the request was reached"), whole and streamed.
func TestOrchestrationKeepsToTheClientsMaxTokens(t *testing.T) {
	g, admin := startOrchestrator(t, 2)
	c := client(g)
	params := openai.ChatCompletionNewParams{Model: "molly-orchestrator", MaxTokens: openai.Int(16), Messages: []openai.ChatCompletionMessageParamUnion{
		openai.UserMessage("1. Why was I charged twice on my invoice? 2. Is my contract's termination clause enforceable?")}}
	var resp *http.Response
	out, err := c.Chat.Completions.New(context.Background(), params, option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Choices) != 1 || out.Usage.CompletionTokens > 16 || out.Usage.CompletionTokens == 0 || out.Choices[0].FinishReason != "length" {
		t.Fatalf("completion_tokens %d (want 1..16), finish_reason %q (want length), uncertainty %q",
			out.Usage.CompletionTokens, out.Choices[0].FinishReason, resp.Header.Get("X-Molly-Uncertainty"))
	}
	if out.Usage.TotalTokens != out.Usage.PromptTokens+out.Usage.CompletionTokens {
		t.Errorf("usage %+v: total is not prompt + completion", out.Usage)
	}
	code, b := adminCall(t, admin, http.MethodGet, "/molly/plans/"+resp.Header.Get("X-Molly-Plan-Id"), nil)
	rec := gjson.Parse(b)
	if code != http.StatusOK || rec.Get("subtasks.#").Int() != 2 {
		t.Fatalf("plan: %d %s", code, b)
	}
	for i := 0; i < 2; i++ {
		if got := rec.Get(fmt.Sprintf("plan.subtasks.%d.budget.max_tokens", i)).Int(); got != 8 {
			t.Errorf("subtask %d budget %d tokens, want 16/2 = 8 (%s)", i, got, rec.Get("plan").Raw)
		}
	}
	if rec.Get("completion_tokens").Int() != out.Usage.CompletionTokens {
		t.Errorf("the plan record bills %d completion tokens, the answer reports %d", rec.Get("completion_tokens").Int(), out.Usage.CompletionTokens)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(context.Background(), params)
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil || len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" || acc.Usage.CompletionTokens > 16 || acc.Usage.CompletionTokens == 0 {
		t.Fatalf("stream: %v, finish %+v, usage %+v", err, acc.Choices, acc.Usage)
	}
}

// startOrchestrator starts molly as a fresh install orchestrates: the demo
// engine with its adapters as the one T0 target, no controller, at most
// maxRefinements refinement rounds; it returns the gateway and its admin
// socket.
func startOrchestrator(t *testing.T, maxRefinements int) (*gateway, string) {
	t.Helper()
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		engine {
			model `+filepath.Join(models, serving.DemoModelFile)+`
			adapters `+filepath.Join(models, serving.DemoAdapterDir)+`
			n_seq_max 2
			n_ctx 1024
			threads 1
		}
		target device {
			tier T0
			kind engine
		}
		orchestrator {
			max_refinements `+strconv.Itoa(maxRefinements)+`
			max_parallel 2
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	return g, admin
}
