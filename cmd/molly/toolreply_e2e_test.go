package main

import (
	"context"
	"errors"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// TestAToolReplyToNoCallIsRefused: a tool message (chat), a
// function_call_output (Responses) or a tool_result (Messages) whose id
// answers no earlier tool call is a 400 invalid_request_error, as OpenAI
// and Anthropic answer it (their words, read back through their SDKs),
// and nothing reaches the upstream; the same reply to a call that was
// made still serves.
func TestAToolReplyToNoCallIsRefused(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
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
	c := client(g)
	call := openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
		ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
			ID: "call_a", Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "f", Arguments: "{}"}}}}}}
	for _, tc := range []struct {
		name, param, message string
		msgs                 []openai.ChatCompletionMessageParamUnion
	}{
		{"no call before it", "messages.[1].role", "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
			[]openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi"), openai.ToolMessage("42", "call_a")}},
		{"another call's id", "messages.[2].tool_call_id", "Invalid parameter: 'tool_call_id' of 'call_b' not found in 'tool_calls' of previous message.",
			[]openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi"), call, openai.ToolMessage("42", "call_b")}},
	} {
		_, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", Messages: tc.msgs})
		var e *openai.Error
		if !errors.As(err, &e) || e.StatusCode != 400 || e.Type != "invalid_request_error" || e.Param != tc.param || e.Message != tc.message {
			t.Fatalf("chat, %s: %v", tc.name, err)
		}
	}
	if _, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi"), call, openai.ToolMessage("42", "call_a")}}); err != nil {
		t.Fatalf("chat, a reply to the call: %v", err)
	}

	out := responses.ResponseInputItemParamOfFunctionCallOutput("42")
	out.OfFunctionCallOutput.CallID = openai.String("call_b")
	_, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "chat",
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfFunctionCall("{}", "call_a", "f"), out}}})
	var e *openai.Error
	if !errors.As(err, &e) || e.StatusCode != 400 || e.Type != "invalid_request_error" || e.Param != "input" ||
		e.Message != "No tool call found for function call output with call_id call_b." {
		t.Fatalf("responses: %v", err)
	}

	ac := anthropicClient(g)
	_, err = ac.Messages.New(ctx, anthropic.MessageNewParams{Model: "chat", MaxTokens: 16, Messages: []anthropic.MessageParam{
		anthropic.NewUserMessage(anthropic.NewTextBlock("hi")),
		anthropic.NewAssistantMessage(anthropic.NewToolUseBlock("toolu_a", map[string]any{}, "f")),
		anthropic.NewUserMessage(anthropic.NewToolResultBlock("toolu_b", "42", false))}})
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || gjson.Get(ae.RawJSON(), "type").Str != "error" ||
		gjson.Get(ae.RawJSON(), "error.type").Str != "invalid_request_error" ||
		gjson.Get(ae.RawJSON(), "error.message").Str != "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_b. Each `tool_result` block must have a corresponding `tool_use` block in the previous message." {
		t.Fatalf("messages: %v", err)
	}
	if n := lan.Count(); n != 1 {
		t.Fatalf("the upstream got %d requests, want only the valid one", n)
	}
}
