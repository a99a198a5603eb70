package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aopt "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// rawExchange writes raw to a fresh connection to host — closing its
// write side after when halfClose is set, as a client whose body ends
// early does — and reads the one answer.
func rawExchange(t *testing.T, host, raw string, halfClose bool) (*http.Response, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// Malformed HTTP splits in two: what Go's net/http server answers itself,
// before any handler runs (plain text, the statuses of its conn.serve and
// readRequest, listed in docs/http-errors.md), and what reaches Molly's
// handlers, which must answer OpenAI's error JSON whatever the framing:
// a chunked body with a bad chunk size or cut short, a body shorter than
// its Content-Length, a request line of 64 KB, an absolute-form target.
func TestMalformedHTTPIsAnsweredByTheRightLayer(t *testing.T) {
	lan := upstreamtest.Start("t1")
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
	molly_classify {
		max_body_size 256KiB
	}
	molly_policy
	molly_route
}
`)
	host := strings.TrimPrefix(strings.TrimSuffix(g.URL, "/v1"), "http://")
	const okChat = `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	post := "POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\n"

	// net/http's own answers: plain text (or none), no handler ran.
	for _, c := range []struct {
		name, raw string
		status    int
	}{
		{"a negative Content-Length", post + "Content-Length: -1\r\n\r\n", 400},
		{"a Content-Length that is not a number", post + "Content-Length: abc\r\n\r\n", 400},
		{"two different Content-Lengths", post + "Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", 400},
		{"a header line without a colon", post + "nonsense\r\n\r\n", 400},
		{"a header name with a space", post + "X Y: z\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"a control character in a header value", post + "X-Y: a\x01b\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"a bad percent-escape in the path", "POST /v1/%zz HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"a method with a bad character", "P(ST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"no Host in HTTP/1.1", "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"two Hosts", "POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nHost: " + host + "\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"a malformed Host", "POST /v1/chat/completions HTTP/1.1\r\nHost: a b\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"HTTP/0.9", "GET /v1/models\r\n\r\n", 400},
		{"HTTP/9.9", "POST /v1/chat/completions HTTP/9.9\r\nHost: " + host + "\r\n\r\n", 505},
		{"a Transfer-Encoding other than chunked", post + "Transfer-Encoding: gzip\r\n\r\n{}", 501},
		{"an Expect other than 100-continue", post + "Expect: tea\r\nContent-Length: 2\r\n\r\n{}", 417},
		{"a request line of 64 KB (Caddy's max_header_size, 16 KiB by default)", "GET /" + strings.Repeat("a", 64<<10) + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n", 431},
		{"headers over the server's limit", "GET /v1/models HTTP/1.1\r\nHost: " + host + "\r\nX-Big: " + strings.Repeat("b", 2<<20) + "\r\n\r\n", 431},
	} {
		t.Run("net/http: "+c.name, func(t *testing.T) {
			resp, body := rawExchange(t, host, c.raw, false)
			if resp.StatusCode != c.status || gjson.Valid(body) && body != "" {
				t.Fatalf("%d %q %q, want net/http's own %d in plain text", resp.StatusCode, resp.Header.Get("Content-Type"), truncate(body, 200), c.status)
			}
		})
	}

	// What reaches Molly: OpenAI's error JSON with the cause's status.
	for _, c := range []struct {
		name, raw string
		halfClose bool
		status    int
		code      string
	}{
		{"a chunked body with a bad chunk size", post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", false, 400, "invalid_body"},
		{"a chunked body cut short", post + "Transfer-Encoding: chunked\r\n\r\n100\r\n" + okChat, true, 400, "invalid_body"},
		{"a body shorter than its Content-Length", post + "Content-Length: 500\r\n\r\n" + okChat, true, 400, "invalid_body"},
		{"a chunked body that is not JSON", post + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", false, 400, ""},
		{"Content-Length and chunked both (chunked wins, RFC 9112 §6.3)", post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false, 400, ""},
		{"a request line of 8 KB", "POST /" + strings.Repeat("a", 8<<10) + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 2\r\n\r\n{}", false, 404, "unknown_url"},
		{"a body of JSON and trailing garbage", post + "Content-Length: " + strconv.Itoa(len(okChat)+7) + "\r\n\r\n" + okChat + "garbage", false, 400, ""},
		{"a body with a key twice", post + "Content-Length: 42\r\n\r\n" + `{"model":"chat","model":"x","messages":[]}`, false, 400, ""},
		{"a body with a number of 400 digits", post + "Content-Length: " + strconv.Itoa(len(`{"model":"chat","max_tokens":`)+400+len(`,"messages":[{"role":"user","content":"x"}]}`)) + "\r\n\r\n" +
			`{"model":"chat","max_tokens":` + strings.Repeat("9", 400) + `,"messages":[{"role":"user","content":"x"}]}`, false, 400, ""},
		{"a form body", "POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 7\r\n\r\nmodel=x", false, 400, ""},
	} {
		t.Run("molly: "+c.name, func(t *testing.T) {
			resp, body := rawExchange(t, host, c.raw, c.halfClose)
			e := gjson.Get(body, "error")
			if resp.StatusCode != c.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") ||
				e.Get("message").Str == "" || e.Get("type").Str != "invalid_request_error" || !e.Get("param").Exists() || !e.Get("code").Exists() ||
				(c.code != "" && e.Get("code").Str != c.code) || resp.Header.Get("X-Request-Id") == "" {
				t.Fatalf("%d %q %s, want %d with OpenAI's error JSON (code %q)", resp.StatusCode, resp.Header.Get("Content-Type"), truncate(body, 300), c.status, c.code)
			}
		})
	}
	if !g.alive() {
		t.Fatal("the gateway died")
	}
}

// sdkErrorCaddyfile serves two T2 targets on the upstream up (which
// answers a prompt holding RATE with a 429, Retry-After 1, and one holding
// DOWN with a 503): model chat on selfhosted, model down on flaky, whose
// circuit the 503s may open without closing selfhosted's. They are behind
// molly_auth on the registry db, with a 16 KiB body limit.
func sdkErrorCaddyfile(up, admin, db string) string {
	return `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		registry ` + db + `
		target selfhosted {
			tier T2
			endpoint ` + up + `
			models chat=mid-remote
			price 10 10
		}
		target flaky {
			tier T2
			endpoint ` + up + `
			models down=mid-remote
			price 10 10
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_auth {
		db ` + db + `
	}
	molly_classify {
		max_body_size 16KiB
	}
	molly_policy
	molly_route
}
`
}

// Each error class Molly answers on /v1 reaches openai-go as the typed
// *openai.Error OpenAI's API description and SDK expect — status, type,
// code and param as hand-written here from README's error table — and
// the SDK retries exactly the transient ones: a 429 of the upstreams and
// a 503 with their Retry-After are tried again (the SDK honours
// Retry-After up to 60 s), a 4xx and a spent budget's 429 (x-should-retry:
// false) are not.
func TestOpenAISDKSeesEachErrorClassTyped(t *testing.T) {
	var upHits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upHits.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.Contains(string(body), "RATE"):
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`)
		case strings.Contains(string(body), "MIDSTREAM"):
			// A stream that begins, then fails with an error event: an
			// overload (OpenAI's code) or a rate limit (vLLM's numeric code).
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"mid-remote","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"finish_reason":null}]}`+"\n\n")
			if strings.Contains(string(body), "MIDSTREAM-LIMIT") {
				_, _ = io.WriteString(w, `data: {"error":{"message":"too many","type":"TooManyRequests","param":null,"code":429}}`+"\n\n")
			} else {
				_, _ = io.WriteString(w, `data: {"error":{"message":"overloaded","type":"server_error","param":null,"code":"server_is_overloaded"}}`+"\n\n")
			}
		case strings.Contains(string(body), "DOWN"):
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"message":"maintenance","type":"server_error","param":null,"code":null}}`)
		default:
			_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","created":1700000000,"model":"mid-remote","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"ok","refusal":null}}],"usage":{"prompt_tokens":5,"completion_tokens":5,"total_tokens":10}}`)
		}
	}))
	t.Cleanup(up.Close)
	db := filepath.Join(t.TempDir(), "registry", "molly.db")
	admin := adminSocket(t)
	g := startMolly(t, sdkErrorCaddyfile(up.URL+"/v1", admin, db))
	for _, m := range []map[string]any{{"name": "alice"}, {"name": "broke", "budget_usd": 0.000001}, {"name": "limited", "rpm": 1}, {"name": "narrow", "tpm": 50}} {
		if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", m); code != http.StatusCreated {
			t.Fatalf("creating %v: %d %s", m["name"], code, body)
		}
	}
	keys := map[string]string{}
	for _, m := range []string{"alice", "broke", "limited", "narrow"} {
		keys[m], _ = newKey(t, admin, m)
	}
	keys["wrong"] = keys["alice"][:len(keys["alice"])-4] + "abcd"
	// limited spends its one request of the minute.
	if _, err := keyClient(g, keys["limited"]).Chat.Completions.New(t.Context(), chat("hi")); err != nil {
		t.Fatal(err)
	}

	type want struct {
		status           int
		typ, code, param string
		retryAfter       bool   // a Retry-After of at least 1 s
		shouldRetry      string // the x-should-retry header
		requests         int    // what the SDK sends with 2 retries allowed
	}
	chatWith := func(text string) openai.ChatCompletionNewParams { return chat(text) }
	cases := []struct {
		name   string
		key    string
		call   func(c *openai.Client, opts ...option.RequestOption) error
		expect want
	}{
		{"an invalid body is a 400 naming the parameter", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			p := chatWith("hi")
			p.Temperature = openai.Float(5)
			_, err := c.Chat.Completions.New(t.Context(), p, o...)
			return err
		}, want{400, "invalid_request_error", "decimal_above_max_value", "temperature", false, "", 1}},
		{"a bad key is a 401", "wrong", func(c *openai.Client, o ...option.RequestOption) error {
			_, err := c.Chat.Completions.New(t.Context(), chatWith("hi"), o...)
			return err
		}, want{401, "invalid_request_error", "invalid_api_key", "", false, "", 1}},
		{"a policy denial is a 403", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			_, err := c.Chat.Completions.New(t.Context(), chatWith("hi"), append(o, option.WithHeader("X-Molly-Sensitivity", "restricted"))...)
			return err
		}, want{403, "policy_denied", "target_not_allowed", "", false, "", 1}},
		{"an unknown model is a 404", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			p := chatWith("hi")
			p.Model = "nope"
			_, err := c.Chat.Completions.New(t.Context(), p, o...)
			return err
		}, want{404, "invalid_request_error", "model_not_found", "model", false, "", 1}},
		{"an unknown endpoint is a 404", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			var res map[string]any
			return c.Post(t.Context(), "chat/complete", map[string]any{"model": "chat"}, &res, o...)
		}, want{404, "invalid_request_error", "unknown_url", "", false, "", 1}},
		{"a body over the limit is a 413", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			_, err := c.Chat.Completions.New(t.Context(), chatWith(strings.Repeat("a", 20<<10)), o...)
			return err
		}, want{413, "invalid_request_error", "request_too_large", "", false, "", 1}},
		{"a spent budget is a 429 no retry changes", "broke", func(c *openai.Client, o ...option.RequestOption) error {
			_, err := c.Chat.Completions.New(t.Context(), chatWith("hi"), o...)
			return err
		}, want{429, "insufficient_quota", "insufficient_quota", "", false, "false", 1}},
		{"a member's rate limit is a 429 with Retry-After", "limited", func(c *openai.Client, o ...option.RequestOption) error {
			_, err := c.Chat.Completions.New(t.Context(), chatWith("hi"), append(o, option.WithMaxRetries(0))...)
			return err
			// typed by the limit's kind, as OpenAI's own RPM/TPM errors are ("requests", "tokens")
		}, want{429, "requests", "rate_limit_exceeded", "", true, "", 1}},
		{"a request larger than the member's TPM is a 429 no retry changes", "narrow", func(c *openai.Client, o ...option.RequestOption) error {
			p := chatWith("hi")
			p.MaxTokens = openai.Int(1000)
			_, err := c.Chat.Completions.New(t.Context(), p, o...)
			return err
		}, want{429, "tokens", "rate_limit_exceeded", "", false, "false", 1}},
		{"the upstream's 429 is a 429 the SDK retries after its Retry-After", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			_, err := c.Chat.Completions.New(t.Context(), chatWith("RATE"), o...)
			return err
		}, want{429, "rate_limit_error", "rate_limit_exceeded", "", true, "", 3}},
		{"no capacity is a 503 the SDK retries after its Retry-After", "alice", func(c *openai.Client, o ...option.RequestOption) error {
			p := chatWith("DOWN")
			p.Model = "down"
			_, err := c.Chat.Completions.New(t.Context(), p, o...)
			return err
		}, want{503, "service_unavailable", "no_target_available", "", true, "", 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sent atomic.Int32
			c := openai.NewClient(option.WithBaseURL(g.URL), option.WithAPIKey(keys[tc.key]), option.WithMaxRetries(2),
				option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
					sent.Add(1)
					return next(r)
				}))
			e := apiError(t, tc.call(&c))
			w := tc.expect
			if e.StatusCode != w.status || e.Type != w.typ || e.Code != w.code || e.Param != w.param || e.Message == "" {
				t.Fatalf("%d type %q code %q param %q, want %d %q %q %q: %s", e.StatusCode, e.Type, e.Code, e.Param, w.status, w.typ, w.code, w.param, e.RawJSON())
			}
			// The body's param and code are JSON null when empty, as OpenAI's are.
			for _, f := range []string{"param", "code"} {
				if v := gjson.Get(e.RawJSON(), f); !v.Exists() || (v.Str == "" && v.Type != gjson.Null) {
					t.Fatalf("%s %s in %s", f, v.Raw, e.RawJSON())
				}
			}
			h := e.Response.Header
			if ra, err := strconv.Atoi(h.Get("Retry-After")); w.retryAfter != (err == nil && ra >= 1) {
				t.Fatalf("Retry-After %q", h.Get("Retry-After"))
			}
			if h.Get("X-Should-Retry") != w.shouldRetry || h.Get("X-Request-Id") == "" {
				t.Fatalf("x-should-retry %q (want %q), x-request-id %q", h.Get("X-Should-Retry"), w.shouldRetry, h.Get("X-Request-Id"))
			}
			if int(sent.Load()) != w.requests {
				t.Fatalf("the SDK sent %d requests, want %d", sent.Load(), w.requests)
			}
		})
	}

	// The same classes on /v1/messages, through Anthropic's SDK: Anthropic's
	// status and error type (its errors reference), the same retry rules
	// (Anthropic's SDK, like OpenAI's, retries 408, 409, 429 and 5xx unless
	// x-should-retry says otherwise), and an error inside a stream that
	// began typed by its cause.
	t.Run("the Messages API", func(t *testing.T) {
		msg := func(text string) anthropic.MessageNewParams {
			return anthropic.MessageNewParams{Model: "chat", MaxTokens: 16,
				Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(text))}}
		}
		type awant struct {
			status      int
			typ         string
			retryAfter  bool
			shouldRetry string
			requests    int
		}
		acases := []struct {
			name string
			key  string
			p    func() anthropic.MessageNewParams
			opts []aopt.RequestOption
			want awant
		}{
			{"an invalid body", "alice", func() anthropic.MessageNewParams {
				p := msg("hi")
				p.MaxTokens = -1
				return p
			}, nil, awant{400, "invalid_request_error", false, "", 1}},
			{"a bad key", "wrong", func() anthropic.MessageNewParams { return msg("hi") }, nil, awant{401, "authentication_error", false, "", 1}},
			{"a policy denial", "alice", func() anthropic.MessageNewParams { return msg("hi") },
				[]aopt.RequestOption{aopt.WithHeader("X-Molly-Sensitivity", "restricted")}, awant{403, "permission_error", false, "", 1}},
			{"an unknown model", "alice", func() anthropic.MessageNewParams {
				p := msg("hi")
				p.Model = "nope"
				return p
			}, nil, awant{404, "not_found_error", false, "", 1}},
			{"a body over the limit", "alice", func() anthropic.MessageNewParams { return msg(strings.Repeat("a", 20<<10)) }, nil, awant{413, "request_too_large", false, "", 1}},
			{"a spent budget", "broke", func() anthropic.MessageNewParams { return msg("hi") }, nil, awant{429, "rate_limit_error", false, "false", 1}},
			{"the upstream's 429", "alice", func() anthropic.MessageNewParams { return msg("RATE") }, nil, awant{429, "rate_limit_error", true, "", 3}},
			{"no capacity is Anthropic's 529", "alice", func() anthropic.MessageNewParams {
				p := msg("DOWN")
				p.Model = "down"
				return p
			}, nil, awant{529, "overloaded_error", true, "", 3}},
		}
		for _, tc := range acases {
			t.Run(tc.name, func(t *testing.T) {
				var sent atomic.Int32
				c := anthropic.NewClient(aopt.WithBaseURL(strings.TrimSuffix(g.URL, "/v1")), aopt.WithAPIKey(keys[tc.key]), aopt.WithMaxRetries(2),
					aopt.WithMiddleware(func(r *http.Request, next aopt.MiddlewareNext) (*http.Response, error) {
						sent.Add(1)
						return next(r)
					}))
				_, err := c.Messages.New(t.Context(), tc.p(), tc.opts...)
				var e *anthropic.Error
				if !errors.As(err, &e) {
					t.Fatalf("want *anthropic.Error, got %v", err)
				}
				w := tc.want
				if e.StatusCode != w.status || string(e.Type()) != w.typ || e.Message == "" || gjson.Get(e.RawJSON(), "type").Str != "error" {
					t.Fatalf("%d %q, want %d %q: %s", e.StatusCode, e.Type(), w.status, w.typ, e.RawJSON())
				}
				h := e.Response.Header
				if ra, err := strconv.Atoi(h.Get("Retry-After")); w.retryAfter != (err == nil && ra >= 1) {
					t.Fatalf("Retry-After %q", h.Get("Retry-After"))
				}
				if h.Get("X-Should-Retry") != w.shouldRetry {
					t.Fatalf("x-should-retry %q, want %q", h.Get("X-Should-Retry"), w.shouldRetry)
				}
				if int(sent.Load()) != w.requests {
					t.Fatalf("the SDK sent %d requests, want %d", sent.Load(), w.requests)
				}
			})
		}
		for _, mc := range []struct{ prompt, want string }{{"MIDSTREAM", "overloaded_error"}, {"MIDSTREAM-LIMIT", "rate_limit_error"}} {
			t.Run("an error inside the stream: "+mc.want, func(t *testing.T) {
				c := anthropic.NewClient(aopt.WithBaseURL(strings.TrimSuffix(g.URL, "/v1")), aopt.WithAPIKey(keys["alice"]), aopt.WithMaxRetries(0))
				s := c.Messages.NewStreaming(t.Context(), msg(mc.prompt))
				text := ""
				for s.Next() {
					if ev := s.Current(); ev.Type == "content_block_delta" {
						text += ev.Delta.Text
					}
				}
				var e *anthropic.Error
				if !errors.As(s.Err(), &e) || string(e.Type()) != mc.want || text != "Hel" {
					t.Fatalf("after %q: %v, want a %s", text, s.Err(), mc.want)
				}
			})
		}
	})
}
