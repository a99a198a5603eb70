package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// badCase is one input of the corpus: a request (or raw bytes on the
// wire), and whether a 2xx is acceptable (the input is odd but valid).
type badCase struct {
	name    string
	method  string
	path    string
	header  map[string]string
	body    string
	raw     string // bytes on the wire instead of method/path/body
	validOK bool
}

const okChat = `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`

// badCorpus generates the corpus: every truncation of a valid body,
// every top-level parameter with values of the wrong type or out of
// range, broken messages and content parts, encodings (invalid UTF-8,
// NUL, lone surrogates, BOM, duplicate keys, deep nesting, huge
// numbers), wrong methods, paths and media types, Molly's own headers
// with bad values, bad keys, an oversized body and malformed HTTP framing.
func badCorpus() []badCase {
	var cs []badCase
	post := func(name, body string, validOK bool) {
		cs = append(cs, badCase{name: name, method: "POST", path: "/v1/chat/completions", body: body, validOK: validOK})
	}
	for i := 0; i < len(okChat); i++ {
		post(fmt.Sprintf("truncated at byte %d", i), okChat[:i], false)
	}
	values := []string{`null`, `true`, `"x"`, `""`, `0`, `-1`, `1.5`, `1e309`, `-1e309`, `99999999999999999999`, `[]`, `[1]`, `{}`, `{"a":1}`, `"∞"`, `"\u0000"`}
	params := []string{"model", "messages", "max_tokens", "max_completion_tokens", "n", "stream", "temperature", "top_p", "stop", "tools", "tool_choice",
		"logprobs", "top_logprobs", "stream_options", "response_format", "user", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
		"metadata", "functions", "parallel_tool_calls", "modalities", "audio", "store", "prediction"}
	for _, p := range params {
		for _, v := range values {
			body := strings.Replace(okChat, `{"model"`, `{"`+p+`":`+v+`,"model"`, 1)
			if p == "model" || p == "messages" || p == "max_tokens" {
				body = setJSON(okChat, p, v)
			}
			post(fmt.Sprintf("%s = %s", p, v), body, true)
		}
	}
	for _, m := range []string{
		`[]`, `[null]`, `[1]`, `["hello"]`, `[{}]`, `[{"role":"user"}]`, `[{"content":"x"}]`, `[{"role":"wizard","content":"x"}]`,
		`[{"role":"user","content":null}]`, `[{"role":"user","content":1}]`, `[{"role":"user","content":{}}]`, `[{"role":"user","content":[]}]`,
		`[{"role":"user","content":[{}]}]`, `[{"role":"user","content":[{"type":"text"}]}]`, `[{"role":"user","content":[{"type":"text","text":5}]}]`,
		`[{"role":"user","content":[{"type":"image_url"}]}]`, `[{"role":"user","content":[{"type":"image_url","image_url":{"url":5}}]}]`,
		`[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]`, `[{"role":"user","content":[{"type":"file","file":{"file_data":"!!"}}]}]`,
		`[{"role":"user","content":[{"type":"hologram","x":1}]}]`, `[{"role":"tool","content":"x"}]`, `[{"role":"tool","tool_call_id":5,"content":"x"}]`,
		`[{"role":"assistant","tool_calls":[{}]}]`, `[{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":5}}]}]`,
		`[{"role":"assistant","tool_calls":"x"}]`, `[{"role":"user","content":"x","name":{}}]`, `[{"role":"system","content":"` + strings.Repeat("a", 200000) + `"}]`,
	} {
		post("messages "+truncate(m, 60), setJSON(okChat, "messages", m), true)
	}
	enc := map[string]string{
		"invalid UTF-8":              "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
		"a NUL byte in a string":     "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x00b\"}]}",
		"a lone surrogate":           `{"model":"chat","messages":[{"role":"user","content":"\ud800"}]}`,
		"a BOM before the body":      "\xef\xbb\xbf" + okChat,
		"duplicate keys":             `{"model":"chat","model":"other","messages":[{"role":"user","content":"x"}]}`,
		"duplicate nested keys":      `{"model":"chat","messages":[{"role":"user","role":"system","content":"x"}]}`,
		"trailing garbage":           okChat + "garbage",
		"two JSON values":            okChat + okChat,
		"a JSON array":               `[` + okChat + `]`,
		"a JSON string":              `"hello"`,
		"an empty body":              ``,
		"whitespace only":            "  \n\t ",
		"nesting 100000 deep":        `{"model":"chat","messages":[{"role":"user","content":"x"}],"metadata":` + strings.Repeat("[", 100000) + strings.Repeat("]", 100000) + `}`,
		"nesting 65 deep":            `{"model":"chat","messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat(`{"a":`, 65) + `1` + strings.Repeat("}", 65) + `}`,
		"a 10000-digit number":       `{"model":"chat","max_tokens":` + strings.Repeat("9", 10000) + `,"messages":[{"role":"user","content":"x"}]}`,
		"an escaped model name":      `{"model":"\u0063hat","messages":[{"role":"user","content":"x"}]}`,
		"a model name of 10 KB":      `{"model":"` + strings.Repeat("m", 10000) + `","messages":[{"role":"user","content":"x"}]}`,
		"control characters raw":     "{\"model\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"a\x01\x02b\"}]}",
		"100000 messages":            `{"model":"chat","messages":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"x"},`, 100000), ",") + `]}`,
		"5000 tools":                 `{"model":"chat","messages":[{"role":"user","content":"x"}],"tools":[` + strings.TrimSuffix(strings.Repeat(`{"type":"function","function":{"name":"f"}},`, 5000), ",") + `]}`,
		"a tool schema of the wrong": `{"model":"chat","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":"no"}}]}`,
	}
	for name, body := range enc {
		post(name, body, true)
	}
	for _, sh := range []struct{ name, body string }{
		{"n 0", `{"model":"chat","n":0,"messages":[{"role":"user","content":"x"}]}`},
		{"n -5", `{"model":"chat","n":-5,"messages":[{"role":"user","content":"x"}]}`},
		{"n 1000000000", `{"model":"chat","n":1000000000,"messages":[{"role":"user","content":"x"}]}`},
		{"max_tokens 0", `{"model":"chat","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`},
		{"max_tokens -1", `{"model":"chat","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}`},
		{"max_tokens 1e12", `{"model":"chat","max_tokens":1000000000000,"messages":[{"role":"user","content":"x"}]}`},
		{"max_tokens 2.5", `{"model":"chat","max_tokens":2.5,"messages":[{"role":"user","content":"x"}]}`},
		{"temperature 3", `{"model":"chat","temperature":3,"messages":[{"role":"user","content":"x"}]}`},
		{"top_logprobs 21", `{"model":"chat","logprobs":true,"top_logprobs":21,"messages":[{"role":"user","content":"x"}]}`},
		{"stream_options without stream", `{"model":"chat","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`},
		{"an unknown model", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`},
		{"an empty model", `{"model":"","messages":[{"role":"user","content":"x"}]}`},
	} {
		post(sh.name, sh.body, true)
	}
	for _, c := range []struct{ name, path, body string }{
		{"completions: no prompt", "/v1/completions", `{"model":"chat"}`},
		{"completions: prompt an object", "/v1/completions", `{"model":"chat","prompt":{}}`},
		{"completions: best_of under n", "/v1/completions", `{"model":"chat","prompt":"x","n":3,"best_of":2}`},
		{"completions: token ids out of range", "/v1/completions", `{"model":"chat","prompt":[[-1,99999999999]]}`},
		{"completions: best_of 1000", "/v1/completions", `{"model":"chat","prompt":"x","best_of":1000}`},
		{"embeddings: no input", "/v1/embeddings", `{"model":"chat"}`},
		{"embeddings: input an object", "/v1/embeddings", `{"model":"chat","input":{}}`},
		{"embeddings: input of nulls", "/v1/embeddings", `{"model":"chat","input":[null,null]}`},
		{"embeddings: dimensions -1", "/v1/embeddings", `{"model":"chat","input":"x","dimensions":-1}`},
	} {
		cs = append(cs, badCase{name: c.name, method: "POST", path: c.path, body: c.body, validOK: true})
	}
	for _, c := range []struct{ name, method, path string }{
		{"GET chat completions", "GET", "/v1/chat/completions"},
		{"PUT chat completions", "PUT", "/v1/chat/completions"},
		{"DELETE models", "DELETE", "/v1/models"},
		{"POST models", "POST", "/v1/models"},
		{"an unknown path", "POST", "/v1/chat/complete"},
		{"the root", "POST", "/"},
		{"a path with dot segments", "POST", "/v1/../v1/chat/completions"},
		{"a path of 10 KB", "POST", "/" + strings.Repeat("a", 10000)},
		{"a model path with an odd id", "GET", "/v1/models/%00"},
		{"an encoded slash", "POST", "/v1%2Fchat%2Fcompletions"},
	} {
		cs = append(cs, badCase{name: c.name, method: c.method, path: c.path, body: okChat, validOK: true})
	}
	headers := []struct {
		name string
		h    map[string]string
	}{
		{"X-Molly-Max-Cost abc", map[string]string{"X-Molly-Max-Cost": "abc"}},
		{"X-Molly-Max-Cost -1", map[string]string{"X-Molly-Max-Cost": "-1"}},
		{"X-Molly-Max-Cost NaN", map[string]string{"X-Molly-Max-Cost": "NaN"}},
		{"X-Molly-Max-Cost 1e400", map[string]string{"X-Molly-Max-Cost": "1e400"}},
		{"X-Molly-Max-Cost 0", map[string]string{"X-Molly-Max-Cost": "0"}},
		{"X-Molly-Prefer fastest", map[string]string{"X-Molly-Prefer": "fastest"}},
		{"X-Molly-Sensitivity secret", map[string]string{"X-Molly-Sensitivity": "secret"}},
		{"X-Molly-Sensitivity empty list", map[string]string{"X-Molly-Sensitivity": ",,,"}},
		{"X-Molly-Residency Mars", map[string]string{"X-Molly-Residency": "Mars"}},
		{"X-Molly-Residency of 8 KB", map[string]string{"X-Molly-Residency": strings.Repeat("EU,", 2700)}},
		{"a Molly key that does not exist", map[string]string{"Authorization": "Bearer sk-molly-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}},
		{"a bare sk-molly- prefix", map[string]string{"Authorization": "Bearer sk-molly-"}},
		{"an Authorization without scheme", map[string]string{"Authorization": "sk-molly-x"}},
		{"Content-Type text/plain", map[string]string{"Content-Type": "text/plain"}},
		{"Content-Type multipart", map[string]string{"Content-Type": "multipart/form-data; boundary=x"}},
		{"Content-Encoding gzip that is not", map[string]string{"Content-Encoding": "gzip"}},
		{"Expect 100-continue", map[string]string{"Expect": "100-continue"}},
		{"X-Request-Id of 8 KB", map[string]string{"X-Request-Id": strings.Repeat("r", 8000)}},
		{"Traceparent garbage", map[string]string{"Traceparent": "zz-zz"}},
	}
	for _, h := range headers {
		cs = append(cs, badCase{name: h.name, method: "POST", path: "/v1/chat/completions", header: h.h, body: okChat, validOK: true})
	}
	cs = append(cs, badCase{name: "a body over max_body_size", method: "POST", path: "/v1/chat/completions",
		body: `{"model":"chat","messages":[{"role":"user","content":"` + strings.Repeat("a", 300<<10) + `"}]}`})
	for _, r := range []struct{ name, raw string }{
		{"a chunked body with a bad chunk size", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"},
		{"a Content-Length longer than the body", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\nContent-Type: application/json\r\n\r\n" + okChat},
		{"both Content-Length and chunked", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
		{"a negative Content-Length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"},
		{"a header line without a colon", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nnonsense\r\n\r\n"},
		{"HTTP/0.9", "GET /v1/models\r\n\r\n"},
		{"an absurd version", "POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\n\r\n"},
		{"a request line of 64 KB", "GET /" + strings.Repeat("a", 64<<10) + " HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"a header of 2 MB", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 2<<20) + "\r\n\r\n"},
		{"no Host", "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"},
	} {
		cs = append(cs, badCase{name: r.name, raw: r.raw, validOK: true})
	}
	return cs
}

// setJSON replaces the top-level key of body (a flat JSON object written
// as okChat is) with the raw value v.
func setJSON(body, key, v string) string {
	i := strings.Index(body, `"`+key+`":`)
	if i < 0 {
		return body
	}
	start := i + len(key) + 3
	end := start + len(gjson.Get(body, key).Raw)
	return body[:start] + v + body[end:]
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestBadInputsGetClearErrors sends the corpus to the real gateway (behind
// molly_auth with an anonymous member, a 256 KiB body limit): every answer
// is a 2xx for the inputs that are merely odd, or a 4xx carrying an OpenAI
// error object with a message; none is a 5xx, and the process stays up and
// keeps serving.
func TestBadInputsGetClearErrors(t *testing.T) {
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
	molly_auth {
		anonymous guest
	}
	molly_classify {
		max_body_size 256KiB
	}
	molly_policy
	molly_route
}
`)
	base := strings.TrimSuffix(g.URL, "/v1")
	host := strings.TrimPrefix(base, "http://")
	// Bodies over max_body_size are sent as clients that expect a refusal
	// send them (Expect: 100-continue, see sendCase): Molly answers 413
	// before reading, and a client still writing a body the server will
	// not read may see its write fail (broken pipe) before the answer.
	tr := &http.Transport{ExpectContinueTimeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Timeout: 20 * time.Second, Transport: tr}
	cs := badCorpus()
	counts := map[string]int{}
	statuses := map[int]int{}
	for _, c := range cs {
		status, body, err := sendCase(hc, base, host, c)
		var class string
		switch {
		case c.raw != "" && (err != nil || status >= 400):
			class = "http layer" // malformed framing: refused or dropped by Go's HTTP server
		case err != nil:
			class = "error"
			t.Errorf("%s: %v", c.name, err)
		case status >= 500:
			class = "5xx"
			t.Errorf("%s: %d %s", c.name, status, truncate(body, 300))
		case status >= 400 && gjson.Get(body, "error.message").Str != "" && gjson.Get(body, "error.type").Str != "":
			class = "clear 4xx"
		case status >= 400:
			class = "unclear 4xx"
			t.Errorf("%s: %d without an OpenAI error: %s", c.name, status, truncate(body, 300))
		case c.validOK && status < 300:
			class = "2xx"
		default:
			class = "unexpected"
			t.Errorf("%s: %d %s", c.name, status, truncate(body, 300))
		}
		counts[class]++
		statuses[status]++
		if !g.alive() {
			t.Fatalf("the gateway died on %s", c.name)
		}
	}
	keys := make([]int, 0, len(statuses))
	for s := range statuses {
		keys = append(keys, s)
	}
	sort.Ints(keys)
	var by []string
	for _, s := range keys {
		by = append(by, fmt.Sprintf("%d×%d", s, statuses[s]))
	}
	t.Logf("%d bad inputs: %d clear 4xx, %d accepted (2xx), %d refused at the HTTP layer, %d 5xx, %d unclear, crashes: %v; statuses %s",
		len(cs), counts["clear 4xx"], counts["2xx"], counts["http layer"], counts["5xx"], counts["unclear 4xx"], !g.alive(), strings.Join(by, " "))
	if len(cs) < 300 {
		t.Fatalf("the corpus has %d cases, want hundreds", len(cs))
	}
	if _, err := client(g).Chat.Completions.New(t.Context(), chat("still serving")); err != nil {
		t.Fatalf("after the corpus: %v", err)
	}
}

// sendCase sends c and returns the status and body (0 when the server
// closed the connection without an answer).
func sendCase(hc *http.Client, base, host string, c badCase) (int, string, error) {
	if c.raw != "" {
		conn, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			return 0, "", err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(conn, c.raw); err != nil {
			return 0, "", err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return 0, "", err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), nil
	}
	req, err := http.NewRequest(c.method, base+c.path, bytes.NewReader([]byte(c.body)))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if len(c.body) > 64<<10 {
		req.Header.Set("Expect", "100-continue")
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestEncodedBodies: a gzip or deflate body is decoded under the body limit
// (a small body inflating past it is a 413, not read whole); another
// Content-Encoding is a 415 naming it, in OpenAI's error shape (the
// OpenAPI document's ErrorResponse is the oracle).
func TestEncodedBodies(t *testing.T) {
	spec := openapitest.Load(t)
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
	molly_auth {
		anonymous guest
	}
	molly_classify {
		max_body_size 64KiB
	}
	molly_policy
	molly_route
}
`)
	gz := func(s string) string {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = io.WriteString(w, s)
		_ = w.Close()
		return b.String()
	}
	zl := func(s string) string {
		var b bytes.Buffer
		w := zlib.NewWriter(&b)
		_, _ = io.WriteString(w, s)
		_ = w.Close()
		return b.String()
	}
	// 1 MiB of spaces inside a valid chat body: about 1 KiB gzipped.
	bomb := gz(`{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hello` + strings.Repeat(" ", 1<<20) + `"}]}`)
	if len(bomb) > 64<<10 {
		t.Fatalf("the bomb is %d bytes compressed", len(bomb))
	}
	for _, c := range []struct {
		name, encoding, body string
		status               int
		code                 string
	}{
		{"plain", "", okChat, 200, ""},
		{"gzip", "gzip", gz(okChat), 200, ""},
		{"x-gzip", "x-gzip", gz(okChat), 200, ""},
		{"deflate", "deflate", zl(okChat), 200, ""},
		{"identity", "identity", okChat, 200, ""},
		{"brotli", "br", okChat, 415, "unsupported_media_type"},
		{"two codings", "gzip, gzip", gz(gz(okChat)), 415, "unsupported_media_type"},
		{"not gzip", "gzip", okChat, 400, "invalid_body"},
		{"a gzip bomb", "gzip", bomb, 413, "request_too_large"},
	} {
		var hdr []string
		if c.encoding != "" {
			hdr = []string{"Content-Encoding", c.encoding}
		}
		resp, b := do(t, g, "POST", "/v1/chat/completions", c.body, hdr...)
		if resp.StatusCode != c.status {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, b)
		}
		if c.status == 200 {
			spec.Validate(t, "CreateChatCompletionResponse", b)
			if got := lan.Drain(); len(got) != 1 || gjson.GetBytes(got[0], "messages.0.content").Str != "hello" {
				t.Fatalf("%s: the upstream received %q", c.name, got)
			}
			if h := lan.Headers(); h[len(h)-1].Get("Content-Encoding") != "" {
				t.Fatalf("%s: the upstream was told Content-Encoding %q", c.name, h[len(h)-1].Get("Content-Encoding"))
			}
			continue
		}
		spec.Validate(t, "ErrorResponse", b)
		if sent := lan.Drain(); gjson.GetBytes(b, "error.code").Str != c.code || len(sent) != 0 {
			t.Fatalf("%s: %d %s (upstream saw %d)", c.name, resp.StatusCode, b, len(sent))
		}
		if c.status == 415 && !strings.Contains(gjson.GetBytes(b, "error.message").Str, `"`+c.encoding+`"`) {
			t.Fatalf("%s: the message does not name the encoding: %s", c.name, b)
		}
	}
	if !g.alive() {
		t.Fatal("the gateway died")
	}
}

// TestADeclaredOversizeBodyIsRefusedUnread: a request whose Content-Length
// is over max_body_size gets 413 request_too_large at once, before any of
// its body is sent: with Expect: 100-continue the first answer is the 413,
// not 100 Continue (RFC 9110 §10.1.1), and without it the 413 comes
// while the client has sent no byte of the body (not a 408 after the
// body's grace period); the connection is closed. A body of exactly the
// limit is still asked for (100 Continue) and served.
func TestADeclaredOversizeBodyIsRefusedUnread(t *testing.T) {
	spec := openapitest.Load(t)
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	const limit = 64 << 10
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
		max_body_size 64KiB
	}
	molly_policy
	molly_route
}
`)
	host := strings.TrimPrefix(strings.TrimSuffix(g.URL, "/v1"), "http://")
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/embeddings"} {
		for _, expect := range []bool{true, false} {
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			head := "POST " + path + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " + fmt.Sprint(limit+1) + "\r\n"
			if expect {
				head += "Expect: 100-continue\r\n"
			}
			if _, err := io.WriteString(c, head+"\r\n"); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s (expect %v): no answer: %v", path, expect, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			c.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
				t.Fatalf("%s (expect %v): %d (close %v) %s", path, expect, resp.StatusCode, resp.Close, b)
			}
			spec.Validate(t, "ErrorResponse", b)
			if gjson.GetBytes(b, "error.code").Str != "request_too_large" {
				t.Fatalf("%s (expect %v): %s", path, expect, b)
			}
		}
	}
	// A body of exactly the limit: asked for, and served.
	body := `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	body = body[:len(body)-1] + strings.Repeat(" ", limit-len(body)) + "}"
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: "+host+"\r\nContent-Type: application/json\r\nContent-Length: "+
		fmt.Sprint(len(body))+"\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("a body of the limit was not asked for: %v %v", resp, err)
	}
	if _, err := io.WriteString(c, body); err != nil {
		t.Fatal(err)
	}
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a body of the limit: %v %v", resp, err)
	}
	resp.Body.Close()
	if n := lan.Count(); n != 1 {
		t.Fatalf("the upstream got %d requests, want the one within the limit", n)
	}
}

// TestParametersOutsideTheirSchemaAreRefused: parameters the gateway reads
// or echoes, of a type or value their API's description does not allow
// (OpenAI's OpenAPI document for chat completions and Responses,
// Anthropic's Messages reference), are a 400 naming the parameter —
// never dropped, read as something else, or sent on — and nothing reaches
// the upstream. A valid value of each still serves.
func TestParametersOutsideTheirSchemaAreRefused(t *testing.T) {
	spec := openapitest.Load(t)
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
	molly_classify
	molly_policy
	molly_route
}
`)
	const msgs = `"messages":[{"role":"user","content":"hello"}]`
	for _, c := range []struct{ name, path, body, param string }{
		{"chat: an unknown tool_choice mode", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"tool_choice":"always"}`, "tool_choice"},
		{"chat: a function tool_choice without a name", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{}}}`, "tool_choice.function.name"},
		{"chat: a tool_choice without a type", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"tool_choice":{}}`, "tool_choice.type"},
		{"chat: modalities as a string", "/v1/chat/completions", `{"model":"chat",` + msgs + `,"modalities":"audio"}`, "modalities"},
		{"embeddings: a numeric encoding_format", "/v1/embeddings", `{"model":"chat","input":"hello","encoding_format":5}`, "encoding_format"},
		{"embeddings: a string dimensions", "/v1/embeddings", `{"model":"chat","input":"hello","dimensions":"x"}`, "dimensions"},
		{"responses: a string top_logprobs", "/v1/responses", `{"model":"chat","input":"hello","top_logprobs":"3"}`, "top_logprobs"},
		{"responses: a string text", "/v1/responses", `{"model":"chat","input":"hello","text":"json"}`, "text"},
		{"responses: a string text.format", "/v1/responses", `{"model":"chat","input":"hello","text":{"format":"json_object"}}`, "text.format"},
		{"responses: a numeric user", "/v1/responses", `{"model":"chat","input":"hello","user":7}`, "user"},
		{"responses: an unknown include", "/v1/responses", `{"model":"chat","input":"hello","include":["logprobs"]}`, "include[0]"},
		{"responses: an unknown tool_choice mode", "/v1/responses", `{"model":"chat","input":"hello","tool_choice":"x"}`, "tool_choice"},
		{"responses: a numeric input_text", "/v1/responses", `{"model":"chat","input":[{"role":"user","content":[{"type":"input_text","text":5}]}]}`, "input[0].content[0].text"},
		{"responses: a function_call_output without call_id", "/v1/responses", `{"model":"chat","input":[{"role":"user","content":"hello"},{"type":"function_call_output","output":"ok"}]}`, "input[1].call_id"},
		{"messages: a string top_k", "/v1/messages", `{"model":"chat","max_tokens":4,` + msgs + `,"top_k":"5"}`, "top_k"},
		{"messages: a numeric system block", "/v1/messages", `{"model":"chat","max_tokens":4,` + msgs + `,"system":[1]}`, "system.0"},
		{"messages: a tool_choice without a type", "/v1/messages", `{"model":"chat","max_tokens":4,` + msgs + `,"tool_choice":{}}`, "tool_choice.type"},
	} {
		resp, b := do(t, g, "POST", c.path, c.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: %d %s", c.name, resp.StatusCode, b)
		}
		if c.path == "/v1/messages" {
			// Anthropic's error body: {"type":"error","error":{"type","message"}}.
			if gjson.GetBytes(b, "type").Str != "error" || gjson.GetBytes(b, "error.type").Str != "invalid_request_error" ||
				!strings.Contains(gjson.GetBytes(b, "error.message").Str, c.param) {
				t.Fatalf("%s: %s", c.name, b)
			}
		} else {
			spec.Validate(t, "ErrorResponse", b)
			if gjson.GetBytes(b, "error.param").Str != c.param {
				t.Fatalf("%s: param %q, want %q: %s", c.name, gjson.GetBytes(b, "error.param").Str, c.param, b)
			}
		}
		if n := lan.Count(); n != 0 {
			t.Fatalf("%s: the upstream got %d requests", c.name, n)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"chat",` + msgs + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}}`},
		{"/v1/responses", `{"model":"chat","input":"hello","tool_choice":"none","include":["reasoning.encrypted_content"],"text":{"format":{"type":"text"}},"user":"u"}`},
		{"/v1/messages", `{"model":"chat","max_tokens":4,` + msgs + `,"top_k":5,"system":[{"type":"text","text":"be brief"}],"tool_choice":{"type":"auto"}}`},
	} {
		if resp, b := do(t, g, "POST", c.path, c.body); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.path, resp.StatusCode, b)
		}
	}
}
