package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// freshMolly serves model chat on the T2 target remote (the upstream u),
// with feedback and metrics routes beside the gateway's.
func freshMolly(t *testing.T, u *wire7Upstream) *gateway {
	return startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		target remote {
			tier T2
			endpoint `+u.srv.URL+`/v1
			models chat=up
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /v1/feedback {
		molly_feedback
	}
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
}

// openai-go closes a stream's connection as soon as it reads [DONE]. A
// stream delivered to its [DONE] is a routed answer all the same: it can
// be given feedback (its decision is remembered) and counts as routed in
// the metrics, never as a client that went away (client_closed).
func TestAStreamReadToItsDoneIsRoutedEvenIfTheClientClosesAtOnce(t *testing.T) {
	u := startWire7Upstream(t)
	g := freshMolly(t, u)
	c := client(g)
	const streams = 200
	for i := range streams {
		var resp *http.Response
		s := c.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "chat",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello")}}, option.WithResponseInto(&resp))
		text := ""
		for s.Next() {
			for _, ch := range s.Current().Choices {
				text += ch.Delta.Content
			}
		}
		if err := s.Err(); err != nil || text != "Hello" {
			t.Fatalf("stream %d: %q, %v", i, text, err)
		}
		id := resp.Header.Get("X-Molly-Decision-Id")
		if status, out := feedback(t, g, `{"decision_id":"`+id+`","score":1}`); status != 200 {
			t.Fatalf("stream %d: feedback on its decision %s: %d %v, want 200 (the answer was delivered)", i, id, status, out)
		}
	}
	resp, err := http.Get(strings.TrimSuffix(g.URL, "/v1") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	routed := regexp.MustCompile(`(?m)^molly_requests_total\{[^}]*decision="routed"[^}]*target="remote"[^}]*\} 200$`)
	if !routed.Match(b) || strings.Contains(string(b), `decision="client_closed"`) {
		t.Fatalf("metrics: want 200 routed requests and no client_closed:\n%s", grepLines(string(b), "molly_requests_total"))
	}
}

// GET /v1/models/{model} of a model not listed is a 404, and counts as
// model_not_found in molly_outcomes_total (as an unknown model on chat
// completions does), not as routed.
func TestAnUnknownModelsLookupCountsAsModelNotFound(t *testing.T) {
	u := startWire7Upstream(t)
	g := freshMolly(t, u)
	c := client(g)
	var apiErr *openai.Error
	if _, err := c.Models.Get(context.Background(), "nope"); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("GET /v1/models/nope: %v, want 404 model_not_found", err)
	}
	if m, err := c.Models.Get(context.Background(), "chat"); err != nil || m.ID != "chat" {
		t.Fatalf("GET /v1/models/chat: %v %v", m, err)
	}
	resp, err := http.Get(strings.TrimSuffix(g.URL, "/v1") + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// The models looked up by name (the list, gen_ai_request_model "", is
	// what startMolly polls).
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, `molly_outcomes_total{gen_ai_operation_name="models",gen_ai_request_model="`) && !strings.Contains(l, `gen_ai_request_model=""`) {
			lines = append(lines, l)
		}
	}
	got := strings.Join(lines, "\n")
	want := `molly_outcomes_total{gen_ai_operation_name="models",gen_ai_request_model="chat",outcome="routed",tier=""} 1` + "\n" +
		`molly_outcomes_total{gen_ai_operation_name="models",gen_ai_request_model="nope",outcome="model_not_found",tier=""} 1`
	if got != want {
		t.Fatalf("models outcomes:\n%s\nwant:\n%s", got, want)
	}
}

// A body that is not what its Content-Encoding says is a 400 invalid_body
// naming the encoding once.
func TestABodyThatIsNotItsEncodingIsNamedOnce(t *testing.T) {
	u := startWire7Upstream(t)
	g := freshMolly(t, u)
	for _, c := range []struct{ enc, want string }{
		{"gzip", "The request body could not be read: gzip: invalid header."},
		{"deflate", "The request body could not be read: deflate: invalid header."},
	} {
		req, _ := http.NewRequest(http.MethodPost, g.URL+"/chat/completions", strings.NewReader(`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Content-Encoding", c.enc)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Error struct{ Message, Code, Type string }
		}
		if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 400 || out.Error.Code != "invalid_body" ||
			out.Error.Type != "invalid_request_error" || out.Error.Message != c.want {
			t.Fatalf("%s: %d %s\nwant 400 invalid_body %q", c.enc, resp.StatusCode, b, c.want)
		}
	}
}

// OpenAI's API description sets max_output_tokens' minimum at 16
// (CreateResponse): 15 is a 400 integer_below_min_value naming it, 16 is
// served.
func TestMaxOutputTokensBelowSixteenIsRefused(t *testing.T) {
	u := startWire7Upstream(t)
	g := freshMolly(t, u)
	c := client(g)
	params := func(n int64) responses.ResponseNewParams {
		return responses.ResponseNewParams{Model: "chat", MaxOutputTokens: openai.Int(n), Store: openai.Bool(false),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello")}}
	}
	var apiErr *openai.Error
	_, err := c.Responses.New(context.Background(), params(15))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Code != "integer_below_min_value" || apiErr.Param != "max_output_tokens" ||
		apiErr.Message != "Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got 15 instead." {
		t.Fatalf("max_output_tokens 15: %v, want 400 integer_below_min_value", err)
	}
	if r, err := c.Responses.New(context.Background(), params(16)); err != nil || r.OutputText() != "fine" {
		t.Fatalf("max_output_tokens 16: %v %v", r, err)
	}
	if got := u.last(t).Get("max_completion_tokens").Int(); got != 16 {
		t.Fatalf("the upstream got max_completion_tokens %d, want 16", got)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
