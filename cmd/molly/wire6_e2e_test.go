package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

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
