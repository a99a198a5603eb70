package pipeline

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// benchAnswer is cmd/molly's bench upstream answer (staticAnswer): a chat
// completion in the spec's shape, with usage, naming the upstream's model.
const benchAnswer = `{"id":"chatcmpl-bench","object":"chat.completion","created":1767225600,"model":"small-lan",` +
	`"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant",` +
	`"content":"Thank you for the details. We will check the routing rules and the latency targets and reply by Friday.","refusal":null}}],` +
	`"usage":{"prompt_tokens":512,"completion_tokens":24,"total_tokens":536}}`

// BenchmarkWholeAnswer measures what an attempt and deliver do with a
// whole 2xx chat answer between reading it and writing it (checked,
// metered, scored, normalised for a client that asked for another model
// name), as now ("read-once": one openai.ReadJSON whose Doc the later
// stages use) and as before ("reparse": each stage reading the body
// again, kept below as it was), in the same run.
func BenchmarkWholeAnswer(b *testing.B) {
	body := []byte(benchAnswer)
	resp := &http.Response{Header: http.Header{"Content-Type": {"application/json"}}}
	target := &route.Target{Name: "lan", Tier: "T1"}
	ans := relay.Answer{Endpoint: openai.EndpointChat, Model: "chat", Created: 1767225600}
	opts := meter.Options{Target: target, PromptEstimate: 512, Base: meter.Usage{Model: "chat", Target: "lan", Tier: "T1"}}
	ctx := context.Background()
	b.Run("reparse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if kind, _ := wholeAnswerBefore(openai.EndpointChat, resp, body); kind != failNone {
				b.Fatal(kind)
			}
			m := meter.New(ctx, opts)
			m.Body(validUTF8(body))
			MeanLogprob(body)
			u := m.Final()
			a := ans
			a.Usage = &relay.Counts{Prompt: u.PromptTokens, Completion: u.CompletionTokens}
			if out := relay.NormaliseBody(a, body); len(out) == 0 {
				b.Fatal("empty")
			}
		}
	})
	b.Run("read-once", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			d, kind, _ := wholeAnswer(openai.EndpointChat, resp, body)
			if kind != failNone {
				b.Fatal(kind)
			}
			m := meter.New(ctx, opts)
			m.BodyUsage(validUTF8(body), usageMember(&d))
			meanLogprob(&d, body)
			u := m.Final()
			a := ans
			a.Usage = &relay.Counts{Prompt: u.PromptTokens, Completion: u.CompletionTokens}
			if out := relay.NormaliseRead(a, &d, body); len(out) == 0 {
				b.Fatal("empty")
			}
		}
	})
}

// wholeAnswerBefore is wholeAnswer as it was before it kept what it read
// (with its misshapen), for BenchmarkWholeAnswer and the tests comparing
// the two.
func wholeAnswerBefore(ep openai.Endpoint, resp *http.Response, body []byte) (failure, string) {
	valid, why := checkJSON(body)
	switch {
	case !valid:
		return failBadAnswer, "a 200 answer that is not JSON (" + contentType(resp) + ")"
	case why != "":
		return failBadAnswer, "a 200 answer " + why
	case misshapenBefore(ep, body) != "":
		return failBadAnswer, "a 200 answer " + misshapenBefore(ep, body)
	}
	if e := gjson.GetBytes(body, "error"); e.Exists() && e.Type != gjson.Null {
		kind := failServer
		if strings.Contains(e.Get("code").String()+e.Get("type").String(), "rate_limit") || e.Get("code").Int() == 429 {
			kind = failRateLimited
		}
		return kind, "an error object in a 200 answer: " + truncate(e.Get("message").String(), 200)
	}
	return failNone, ""
}

func misshapenBefore(ep openai.Endpoint, b []byte) string {
	if ep != openai.EndpointChat && ep != openai.EndpointCompletions {
		return ""
	}
	root := gjson.ParseBytes(b)
	if !root.IsObject() {
		return "that is not a JSON object"
	}
	ch := root.Get("choices")
	if !ch.Exists() || ch.Type == gjson.Null {
		return ""
	}
	if !ch.IsArray() {
		return `whose "choices" is not an array`
	}
	bad := ""
	ch.ForEach(func(_, c gjson.Result) bool {
		if !c.IsObject() {
			bad = `with a choice that is not an object`
		}
		return bad == ""
	})
	return bad
}
