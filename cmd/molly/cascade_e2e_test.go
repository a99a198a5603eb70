package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"
)

// TestCascadeEscalatesWithinTheAllowedTiers: with a cascade configured in
// the Caddyfile, an internal request (T0–T2) goes to the free LAN target
// first; its answer's mean logprob is under the threshold, so it escalates
// to the self-hosted T2 target, whose confident answer is returned. The
// external T3 target, best by score and most confident, is never asked.
func TestCascadeEscalatesWithinTheAllowedTiers(t *testing.T) {
	tr := startTiers(t)
	tr.t1.Logprob, tr.t2.Logprob, tr.t3.Logprob = -3, -0.2, -0.05
	g := startMolly(t, tr.caddyfile(`cascade {
			threshold -1.5
			max_attempts 3
			order cheap
		}`, ""))
	var resp *http.Response
	res, err := client(g).Chat.Completions.New(context.Background(), chat("What is the capital of France?"),
		option.WithHeader("X-Molly-Sensitivity", "internal"), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Header.Get("X-Molly-Target"); got != "selfhosted" {
		t.Fatalf("answered by %q, want selfhosted", got)
	}
	if got, want := resp.Header.Get("X-Molly-Cascade"), "lan/small-lan logprob=-3.00<-1.50 -> selfhosted/mid-remote logprob=-0.20"; got != want {
		t.Errorf("X-Molly-Cascade = %q, want %q", got, want)
	}
	if got := res.Choices[0].Message.Content; got != "t2 says: What is the capital of France?" {
		t.Errorf("answer %q", got)
	}
	if n := len(res.Choices[0].Logprobs.Content); n != 0 {
		t.Errorf("the client did not ask for logprobs and got %d", n)
	}
	if tr.t1.Count() != 1 || tr.t2.Count() != 1 || tr.t3.Count() != 0 {
		t.Errorf("requests t1 %d t2 %d t3 %d, want 1 1 0", tr.t1.Count(), tr.t2.Count(), tr.t3.Count())
	}
	if !tr.t1.Contains(`"logprobs":true`) || !tr.t2.Contains(`"logprobs":true`) {
		t.Error("the cascade did not ask the upstreams for logprobs")
	}
	if !g.waitLogs(regexp.MustCompile(`"msg":"cascade".*"answered":"selfhosted/mid-remote"`)) {
		t.Errorf("no cascade route log line naming the answer:\n%s", g.logs.String())
	}
}

// TestCascadeHoldsStreamsWithinTheAllowedTiers: with hold_tokens set, an
// internal streamed request is cascaded too. The LAN target's first two
// chunks score under the threshold, so its stream is dropped unseen and the
// self-hosted T2 target's stream is relayed: the client reads one stream,
// the T2 answer only, without the logprobs it did not ask for. T3 is never
// asked.
func TestCascadeHoldsStreamsWithinTheAllowedTiers(t *testing.T) {
	tr := startTiers(t)
	tr.t1.Logprob, tr.t2.Logprob, tr.t3.Logprob = -3, -0.2, -0.05
	g := startMolly(t, tr.caddyfile(`cascade {
			threshold -1.5
			max_attempts 3
			hold_tokens 2
		}`, ""))
	var resp *http.Response
	stream := client(g).Chat.Completions.NewStreaming(context.Background(), chat("What is the capital of France?"),
		option.WithHeader("X-Molly-Sensitivity", "internal"), option.WithResponseInto(&resp))
	var text strings.Builder
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			text.WriteString(ch.Delta.Content)
			if n := len(ch.Logprobs.Content); n != 0 {
				t.Errorf("the client did not ask for logprobs and got %d in a chunk", n)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := text.String(); got != "t2 says: What is the capital of France?" {
		t.Errorf("streamed answer %q", got)
	}
	if got := resp.Header.Get("X-Molly-Target"); got != "selfhosted" {
		t.Fatalf("answered by %q, want selfhosted", got)
	}
	if got, want := resp.Header.Get("X-Molly-Cascade"), "lan/small-lan logprob=-3.00<-1.50 -> selfhosted/mid-remote logprob=-0.20"; got != want {
		t.Errorf("X-Molly-Cascade = %q, want %q", got, want)
	}
	if tr.t1.Count() != 1 || tr.t2.Count() != 1 || tr.t3.Count() != 0 {
		t.Errorf("requests t1 %d t2 %d t3 %d, want 1 1 0", tr.t1.Count(), tr.t2.Count(), tr.t3.Count())
	}
	if !tr.t1.Contains(`"logprobs":true`) || !tr.t2.Contains(`"logprobs":true`) {
		t.Error("the cascade did not ask the upstreams for logprobs")
	}
	if !g.waitLogs(regexp.MustCompile(`"msg":"cascade".*"answered":"selfhosted/mid-remote"`)) {
		t.Errorf("no cascade log line naming the answer:\n%s", g.logs.String())
	}
}
