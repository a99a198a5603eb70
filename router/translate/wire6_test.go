package translate

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"

	"github.com/molly-gateway/molly/router/openai"
)

// anthropicServer serves /v1/messages as Molly's classify glue does: the
// request translated, answer written through a Writer. answer writes
// the chat answer (or error) the pipeline would; hits counts requests.
func anthropicServer(t *testing.T, answer func(w http.ResponseWriter, hit int)) (*anthropic.Client, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		n := int(hits.Add(1))
		body, _ := io.ReadAll(r.Body)
		w := NewWriter(rw, r.Context(), APIMessages)
		_, tr, err := FromMessages(body)
		if err != nil {
			t.Errorf("FromMessages: %v", err)
			return
		}
		w.Bind(tr)
		answer(w, n)
		w.Finish()
	}))
	t.Cleanup(srv.Close)
	c := anthropic.NewClient(aopt.WithBaseURL(srv.URL), aopt.WithAPIKey("k"), aopt.WithMaxRetries(0))
	return &c, &hits
}

func messageParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: "m", MaxTokens: 16,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
}

// Each error Molly's pipeline answers reaches an Anthropic SDK client as
// Anthropic's errors reference types it (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 500 api_error, 504
// timeout_error, 529 overloaded_error): with that status — Molly's 503
// (no capacity) is Anthropic's 529 — and, streamed or not, the same type,
// Retry-After and x-should-retry kept.
func TestMessagesErrorsHaveAnthropicsStatusAndType(t *testing.T) {
	cases := []struct {
		name       string
		err        *openai.Error
		wantStatus int
		wantType   string
	}{
		{"an invalid body", openai.InvalidRequest("messages", "bad"), 400, "invalid_request_error"},
		{"a bad key", &openai.Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "bad key"}, 401, "authentication_error"},
		{"a policy denial", &openai.Error{Status: 403, Type: "policy_denied", Code: "policy_denied", Message: "denied"}, 403, "permission_error"},
		{"an unknown model", &openai.Error{Status: 404, Type: "invalid_request_error", Code: "model_not_found", Message: "no model"}, 404, "not_found_error"},
		{"a body over the limit", &openai.Error{Status: 413, Type: "invalid_request_error", Code: "request_too_large", Message: "big"}, 413, "request_too_large"},
		{"the upstreams' 429", &openai.Error{Status: 429, Type: "rate_limit_error", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: 7}, 429, "rate_limit_error"},
		{"a spent budget", &openai.Error{Status: 429, Type: "insufficient_quota", Code: "insufficient_quota", Message: "spent", NoRetry: true}, 429, "rate_limit_error"},
		{"no capacity", &openai.Error{Status: 503, Type: "service_unavailable", Code: "no_target_available", Message: "none", RetryAfter: 1}, 529, "overloaded_error"},
		{"an upstream timeout", &openai.Error{Status: 504, Type: "timeout_error", Code: "upstream_timeout", Message: "late"}, 504, "timeout_error"},
		{"a bad upstream answer", &openai.Error{Status: 502, Type: "upstream_error", Code: "bad_upstream_answer", Message: "junk"}, 502, "api_error"},
	}
	for _, tc := range cases {
		for _, stream := range []bool{false, true} {
			name := tc.name
			if stream {
				name += ", streamed"
			}
			t.Run(name, func(t *testing.T) {
				c, _ := anthropicServer(t, func(w http.ResponseWriter, _ int) { tc.err.Write(w) })
				var err error
				if stream {
					s := c.Messages.NewStreaming(context.Background(), messageParams())
					for s.Next() {
						t.Fatalf("an event before the error: %s", s.Current().RawJSON())
					}
					err = s.Err()
				} else {
					_, err = c.Messages.New(context.Background(), messageParams())
				}
				var e *anthropic.Error
				if !errors.As(err, &e) {
					t.Fatalf("want *anthropic.Error, got %v", err)
				}
				if e.StatusCode != tc.wantStatus || string(e.Type()) != tc.wantType || e.Message != tc.err.Message {
					t.Fatalf("%d %q %q, want %d %q: %s", e.StatusCode, e.Type(), e.Message, tc.wantStatus, tc.wantType, e.RawJSON())
				}
				if got, want := e.Response.Header.Get("Retry-After"), map[int]string{7: "7", 1: "1"}[tc.err.RetryAfter]; got != want {
					t.Fatalf("Retry-After %q, want %q", got, want)
				}
				if got, want := e.Response.Header.Get("x-should-retry"), map[bool]string{true: "false"}[tc.err.NoRetry]; got != want {
					t.Fatalf("x-should-retry %q, want %q", got, want)
				}
			})
		}
	}
}

// An error inside a stream that has begun reaches the Anthropic SDK as an
// "event: error" whose type is the cause's, as the status would type it
// whole: the SDK's stream ends with a typed *anthropic.Error. Without the
// mapping every such event was api_error (an upstream's overload looked
// like Anthropic's own fault, a rate limit like a bug).
func TestMessagesStreamErrorEventsAreTypedByCause(t *testing.T) {
	first := `{"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}`
	cases := []struct {
		name, event, want string
	}{
		{"an upstream's rate limit (OpenAI's shape)", `{"error":{"message":"Rate limit reached","type":"requests","param":null,"code":"rate_limit_exceeded"}}`, "rate_limit_error"},
		{"an upstream's rate limit (vLLM's numeric code)", `{"error":{"message":"too many","type":"TooManyRequests","param":null,"code":429}}`, "rate_limit_error"},
		{"an upstream's 503 as a string code", `{"error":{"message":"busy","type":"ServiceUnavailable","param":null,"code":"503"}}`, "overloaded_error"},
		{"an upstream's overload (OpenAI's server_is_overloaded)", `{"error":{"message":"overloaded","type":"server_error","param":null,"code":"server_is_overloaded"}}`, "overloaded_error"},
		{"an Anthropic-speaking upstream's overload", `{"error":{"message":"Overloaded","type":"overloaded_error"}}`, "overloaded_error"},
		{"a timeout", `{"error":{"message":"late","type":"timeout_error","param":null,"code":"upstream_timeout"}}`, "timeout_error"},
		{"the output rule's refusal", `{"error":{"message":"withheld","type":"policy_denied","param":null,"code":"output_blocked","decision_id":"d"}}`, "permission_error"},
		{"a spent budget", `{"error":{"message":"spent","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}`, "rate_limit_error"},
		{"a context overflow", `{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, "invalid_request_error"},
		{"a stream that broke off", `{"error":{"message":"The upstream stream ended before completion; the answer is incomplete.","type":"upstream_error","param":null,"code":"stream_truncated"}}`, "api_error"},
		{"an error of no known cause", `{"error":{"message":"?","type":"weird","param":null,"code":null}}`, "api_error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := anthropicServer(t, func(w http.ResponseWriter, _ int) { writeSSE(first, tc.event)(w) })
			s := c.Messages.NewStreaming(context.Background(), messageParams())
			var text string
			for s.Next() {
				if ev := s.Current(); ev.Type == "content_block_delta" {
					text += ev.Delta.Text
				}
			}
			var e *anthropic.Error
			if !errors.As(s.Err(), &e) {
				t.Fatalf("want *anthropic.Error, got %v", s.Err())
			}
			if string(e.Type()) != tc.want || e.Message == "" || text != "Hel" {
				t.Fatalf("type %q message %q after %q, want %q: %s", e.Type(), e.Message, text, tc.want, e.RawJSON())
			}
		})
	}
}

// The Anthropic SDK retries Molly's transient errors and no others: a 529
// (Molly's 503, Retry-After 1) and an upstream's 429 are tried again, a
// spent budget's 429 (x-should-retry: false) and a policy denial are not.
func TestMessagesErrorsRetryAsAnthropicsSDKExpects(t *testing.T) {
	ok := `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`
	cases := []struct {
		name     string
		err      *openai.Error
		wantHits int32
	}{
		{"no capacity is retried", &openai.Error{Status: 503, Type: "service_unavailable", Code: "no_target_available", Message: "none", RetryAfter: 1}, 2},
		{"an upstream rate limit is retried", &openai.Error{Status: 429, Type: "rate_limit_error", Code: "rate_limit_exceeded", Message: "slow", RetryAfter: 1}, 2},
		{"a spent budget is not", &openai.Error{Status: 429, Type: "insufficient_quota", Code: "insufficient_quota", Message: "spent", NoRetry: true}, 1},
		{"a policy denial is not", &openai.Error{Status: 403, Type: "policy_denied", Code: "policy_denied", Message: "no"}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, hits := anthropicServer(t, func(w http.ResponseWriter, hit int) {
				if hit > 1 {
					w.Header().Set("Content-Type", "application/json")
					_, _ = io.WriteString(w, ok)
					return
				}
				tc.err.Write(w)
			})
			m, err := c.Messages.New(context.Background(), messageParams(), aopt.WithMaxRetries(1))
			if hits.Load() != tc.wantHits {
				t.Fatalf("%d requests, want %d (err %v)", hits.Load(), tc.wantHits, err)
			}
			if (tc.wantHits == 2) != (err == nil) {
				t.Fatalf("err %v", err)
			}
			if err == nil && (len(m.Content) != 1 || m.Content[0].Text != "hi") {
				t.Fatalf("message %s", m.RawJSON())
			}
		})
	}
}
