package main

import (
	"context"
	"os/exec"
	"regexp"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"
)

// TestReloadLetsT0RequestsInFlightFinish reloads the configuration (`molly
// reload --force`) while a stream and a plain request are being answered
// by the T0 engine: both must end as if nothing happened — the stream with
// its finish_reason and every token, the plain request with 200 and its
// usage — because the replaced configuration keeps its engine until its
// requests end. New requests are served by the new configuration.
func TestReloadLetsT0RequestsInFlightFinish(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Molly with the engine")
	}
	g := startEngineMolly(t, "small", 4096, "grace_period 10s")
	c := client(g)
	ctx := context.Background()
	const tokens = 1500
	params := openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(tokens), Temperature: openai.Float(0),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me a long story")}}

	started := make(chan struct{})
	var wg sync.WaitGroup
	var streamErr, plainErr error
	var streamFinish string
	var streamChunks int
	var plain *openai.ChatCompletion
	wg.Add(2)
	go func() {
		defer wg.Done()
		s := c.Chat.Completions.NewStreaming(ctx, params)
		once := sync.OnceFunc(func() { close(started) })
		defer once()
		for s.Next() {
			ch := s.Current()
			once()
			for _, choice := range ch.Choices {
				if choice.Delta.Content != "" {
					streamChunks++
				}
				if choice.FinishReason != "" {
					streamFinish = choice.FinishReason
				}
			}
		}
		streamErr = s.Err()
	}()
	go func() {
		defer wg.Done()
		plain, plainErr = c.Chat.Completions.New(ctx, params)
	}()
	<-started // the stream's first chunk: both requests are on the engine
	reload := exec.Command(mollyBin, "reload", "--config", g.Config, "--force")
	reload.Env = g.cmd.Env
	if out, err := reload.CombinedOutput(); err != nil {
		t.Fatalf("molly reload: %v\n%s", err, out)
	}
	// The old configuration's cleanup ran with both requests in flight.
	if !g.waitLogs(regexp.MustCompile(`keeps its engine and connections for its requests in flight`)) {
		t.Fatal("the reload did not find the requests in flight (they ended before it: the test proves nothing)")
	}
	// A new request is served by the new configuration meanwhile.
	if out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil || len(out.Choices) != 1 {
		t.Fatalf("a request after the reload: %v", err)
	}
	wg.Wait()
	if streamErr != nil || streamFinish != "length" {
		t.Errorf("the stream in flight during the reload: error %v, finish_reason %q after %d content chunks", streamErr, streamFinish, streamChunks)
	}
	if plainErr != nil {
		t.Fatalf("the plain request in flight during the reload: %v", plainErr)
	}
	if plain.Choices[0].FinishReason != "length" || plain.Usage.CompletionTokens != tokens {
		t.Errorf("the plain request in flight: finish %q, %d completion tokens, want length and %d", plain.Choices[0].FinishReason, plain.Usage.CompletionTokens, tokens)
	}
}
