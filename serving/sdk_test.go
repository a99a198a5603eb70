package serving

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/param"
)

// TestOfficialClientWorksAgainstTheHandler drives the engine with the
// official openai-go client over a loopback server, streaming and not.
func TestOfficialClientWorksAgainstTheHandler(t *testing.T) {
	e := newEngine(t, nil)
	srv := httptest.NewServer(e)
	defer srv.Close()
	c := openai.NewClient(option.WithBaseURL(srv.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	params := openai.ChatCompletionNewParams{
		Model:       "molly-demo:support",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("hello")},
		Temperature: openai.Float(0),
		MaxTokens:   openai.Int(12),
	}
	res, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Choices) != 1 || res.Choices[0].FinishReason != "length" || res.Usage.CompletionTokens != 12 || res.Model != "molly-demo:support" {
		t.Fatalf("non-streamed response %+v", res)
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: param.NewOpt(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	for stream.Next() {
		acc.AddChunk(stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got, want := acc.Choices[0].Message.Content, res.Choices[0].Message.Content; got != want {
		t.Errorf("streamed %q, non-streamed %q", got, want)
	}
	if acc.Usage.TotalTokens != res.Usage.TotalTokens {
		t.Errorf("streamed usage %+v, non-streamed %+v", acc.Usage, res.Usage)
	}
	page, err := c.Models.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1+len(DemoAdapters) || page.Data[0].ID != "molly-demo" {
		t.Errorf("models %+v", page.Data)
	}
	_, err = c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "molly-demo:nope", Messages: params.Messages})
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Errorf("unknown adapter error %v", err)
	}
}
