package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// hygieneCaddyfile serves one priced LAN target behind molly_auth (every
// request without a Molly key counts as member guest), with an access log
// in logFile and the body limits given.
func hygieneCaddyfile(lan *upstreamtest.Upstream, admin, logFile, limits string) string {
	return `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint ` + lan.URL() + `
			models chat=small-lan
			price 10 10
		}
	}
}
http://127.0.0.1:{PORT} {
	log {
		output file ` + logFile + `
		format molly
	}
	molly_auth {
		anonymous guest
	}
	molly_classify {
		` + limits + `
	}
	molly_policy
	molly_route
}
`
}

// rawRequest is a chat request as bytes on the wire.
func rawRequest(host, prompt string) string {
	body := `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " +
		fmt.Sprint(len(body)) + "\r\n\r\n" + body
}

// TestClientsThatLeaveAreNeverBilledForWhatNoUpstreamSaw: a client that
// sends its request and half-closes its socket, or resets it, gets no 403
// and no empty 200 (a half-closed one may get its whole answer); the
// requests no upstream received are not billed, and every one an upstream
// received is billed once. One that leaves halfway through its body is
// logged as gone before the policy decided, and not billed.
func TestClientsThatLeaveAreNeverBilledForWhatNoUpstreamSaw(t *testing.T) {
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	admin := adminSocket(t)
	g := startMolly(t, hygieneCaddyfile(lan, admin, filepath.Join(t.TempDir(), "access.log"), ""))
	host := strings.TrimPrefix(strings.TrimSuffix(g.URL, "/v1"), "http://")
	const rounds = 20
	var prompts []string
	for i := range rounds {
		for _, how := range []string{"half-close", "reset"} {
			prompt := fmt.Sprintf("leaving %s #%d#", how, i)
			prompts = append(prompts, prompt)
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, rawRequest(host, prompt)); err != nil {
				t.Fatal(err)
			}
			if how == "reset" {
				_ = c.(*net.TCPConn).SetLinger(0)
				c.Close()
				continue
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				// A client that half-closed may still read: a whole answer
				// is fine (and billed); a 403 or an empty 200 is not.
				if resp.StatusCode == 403 || resp.StatusCode == 200 && !strings.Contains(gjson.GetBytes(b, "choices.0.message.content").Str, prompt) {
					t.Errorf("a half-closed client got %d %s", resp.StatusCode, b)
				}
			}
			c.Close()
		}
	}
	// Whether the gateway notices the clients above before or after the
	// policy decided is up to the scheduler; one that leaves halfway
	// through its body is always noticed before (its body read fails).
	midBody := "leaving mid-body#"
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	req := rawRequest(host, midBody)
	if _, err := io.WriteString(c, req[:strings.Index(req, midBody)]); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	c.Close()
	if !g.waitLogs(regexp.MustCompile(`client went away before the policy decided.*sending its body`)) {
		t.Fatal("no log line says the client went away while sending its body")
	}
	// One request that stays, so the log and the ledger have caught up to here.
	if _, err := client(g).Chat.Completions.New(t.Context(), chat("a client that stays")); err != nil {
		t.Fatal(err)
	}
	// A leaving client's request may still be on its way to the upstream
	// after the one that stayed was answered: count the upstream's
	// receipts again at each look, until they and the ledger agree.
	seen := 0
	countSeen := func() int {
		n := 0
		for _, p := range prompts {
			if lan.Contains(p) {
				n++
			}
		}
		return n
	}
	waitFor := func(cond func() bool) bool {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if cond() {
				return true
			}
			if time.Now().After(deadline) {
				return false
			}
		}
	}
	var got usageSummary
	if !waitFor(func() bool { got = usageOf(t, admin, "guest"); seen = countSeen(); return got.Requests == seen+1 }) {
		t.Fatalf("%d of %d leaving clients reached the upstream, and %d requests were billed; want %d (each of those once, and the one that stayed)",
			seen, len(prompts), got.Requests, seen+1)
	}
	t.Logf("%d clients left: %d reached an upstream (billed), %d were stopped before (not billed)", len(prompts), seen, len(prompts)-seen)
}

// TestASlowBodyIsCutOff: a body that trickles in below min_body_rate, or
// takes longer than body_timeout, gets 408 request_timeout and the
// connection is closed, while a body that arrives in time is served.
func TestASlowBodyIsCutOff(t *testing.T) {
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	g := startMolly(t, hygieneCaddyfile(lan, adminSocket(t), filepath.Join(t.TempDir(), "access.log"), "body_timeout 3s\n\t\tmin_body_rate 1KiB 500ms"))
	host := strings.TrimPrefix(strings.TrimSuffix(g.URL, "/v1"), "http://")
	for _, tc := range []struct {
		name  string
		every time.Duration // one byte each
	}{
		{"one byte every 100ms, under the minimum rate after its grace", 100 * time.Millisecond},
		{"one byte every 400ms", 400 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req := rawRequest(host, strings.Repeat("slow ", 40))
			head, body, _ := strings.Cut(req, "\r\n\r\n")
			if _, err := io.WriteString(c, head+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { // the trickle, until the gateway gives up on it
				defer close(done)
				for i := 0; i < len(body); i++ {
					if _, err := c.Write([]byte{body[i]}); err != nil {
						return
					}
					time.Sleep(tc.every)
				}
			}()
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer to a trickled body: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestTimeout || gjson.GetBytes(b, "error.code").Str != "request_timeout" || !resp.Close {
				t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, b)
			}
			<-done
		})
	}
	if lan.Count() != 0 {
		t.Fatalf("the upstream got %d trickled requests", lan.Count())
	}
	if _, err := client(g).Chat.Completions.New(t.Context(), chat("a body in time")); err != nil {
		t.Fatal(err)
	}
}

// TestAccessLogsHoldNoCredentials: keys sent in Authorization, X-Api-Key,
// Api-Key, any header holding a bearer token and in api_key= or key= of
// the query are REDACTED in the access log; the requests are logged.
func TestAccessLogsHoldNoCredentials(t *testing.T) {
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	logFile := filepath.Join(t.TempDir(), "access.log")
	g := startMolly(t, hygieneCaddyfile(lan, adminSocket(t), logFile, ""))
	secrets := map[string]string{
		"Authorization":  "Bearer upstream-style-secret-0001",
		"X-Api-Key":      "x-api-key-secret-0002",
		"Api-Key":        "api-key-secret-0003",
		"X-Forwarded-Id": "Bearer forwarded-secret-0004",
	}
	query := url.Values{"api_key": {"query-api-key-secret-0005"}, "key": {"query-key-secret-0006"}, "trace": {"keep-me"}}
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/chat/completions?"+query.Encode(),
		strings.NewReader(`{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"log me"}]}`))
	for k, v := range secrets {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var logged string
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logged, "trace=keep-me"); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(logFile)
		logged = string(b)
		if time.Now().After(deadline) {
			t.Fatalf("the request is not in the access log:\n%s", logged)
		}
	}
	for _, s := range append([]string{"query-api-key-secret-0005", "query-key-secret-0006"}, secrets["X-Api-Key"], secrets["Api-Key"], "upstream-style-secret-0001", "forwarded-secret-0004") {
		if strings.Contains(logged, s) || strings.Contains(g.logs.String(), s) {
			t.Errorf("a log holds %s", s)
		}
	}
	for _, want := range []string{"api_key=REDACTED", "key=REDACTED", `"X-Api-Key":["REDACTED"]`, `"X-Forwarded-Id":["REDACTED"]`} {
		if !strings.Contains(logged, want) {
			t.Errorf("the access log lacks %s:\n%s", want, logged)
		}
	}
}

// TestAnUpstreamEchoingItsKeyRevealsItToNoClient: an external API (or a
// proxy before it) that echoes the Authorization header it got — in a 400
// error object, a 401 of plain text, a 500, a header, an answer's text and
// a stream's chunk whose bytes arrive in two writes — never gives a client or a log the target's key: the
// client sees REDACTED where the key was. The upstream checks it was sent
// the key, so the echo is real.
func TestAnUpstreamEchoingItsKeyRevealsItToNoClient(t *testing.T) {
	const key = "sk-echoed-upstream-secret-0042"
	var sawKey atomic.Int32
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		auth := r.Header.Get("Authorization")
		if auth == "Bearer "+key {
			sawKey.Add(1)
		}
		w.Header().Set("X-Echo", auth)
		prompt := gjson.GetBytes(b, "messages.0.content").Str
		switch {
		case strings.Contains(prompt, "E400"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(400)
			fmt.Fprintf(w, `{"error":{"message":"Incorrect API key provided: %s","type":"invalid_request_error"}}`, auth)
		case strings.Contains(prompt, "E401"):
			w.WriteHeader(401)
			fmt.Fprintf(w, `you sent Authorization: %s`, auth)
		case strings.Contains(prompt, "E500"):
			w.WriteHeader(500)
			fmt.Fprintf(w, `{"error":"proxy failed with header %s"}`, auth)
		case gjson.GetBytes(b, "stream").Bool():
			w.Header().Set("Content-Type", "text/event-stream")
			// an event holding the key, its bytes split across two writes
			c, _ := json.Marshal(map[string]any{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
				"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": "echo " + auth}}}})
			event := "data: " + string(c) + "\n\n"
			at := strings.Index(event, key) + 10
			fmt.Fprint(w, event[:at])
			w.(http.Flusher).Flush()
			fmt.Fprint(w, event[at:])
			w.(http.Flusher).Flush()
			fmt.Fprint(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			c, _ := json.Marshal(map[string]any{"id": "x", "object": "chat.completion", "created": 1, "model": "m",
				"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": "echo " + auth}}},
				"usage":   map[string]any{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
			w.Write(c)
		}
	}))
	t.Cleanup(echo.Close)
	logFile := filepath.Join(t.TempDir(), "access.log")
	g := startMollyEnv(t, `{
	admin `+adminSocket(t)+`|0600
	auto_https off
	persist_config off
	molly {
		target ext {
			tier T3
			endpoint `+echo.URL+`/v1
			models chat=m
			api_key_env MOLLY_ECHO_KEY
			outlier_detection off
		}
	}
}
http://127.0.0.1:{PORT} {
	log {
		output file `+logFile+`
		format molly
	}
	molly_classify
	molly_policy
	molly_route
}
`, []string{"MOLLY_ECHO_KEY=" + key})
	cases := []struct {
		prompt string
		stream bool
		status int
	}{{"hello E400", false, 400}, {"hello E401", false, 502}, {"hello E500", false, 503}, {"hello", false, 200}, {"hello", true, 200}}
	for _, c := range cases {
		body := fmt.Sprintf(`{"model":"chat","max_tokens":4,"stream":%v,"messages":[{"role":"user","content":%q}]}`, c.stream, c.prompt)
		resp, err := http.Post(g.URL+"/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s (stream %v): %d %s, want %d", c.prompt, c.stream, resp.StatusCode, out, c.status)
		}
		var head strings.Builder
		resp.Header.Write(&head)
		if strings.Contains(string(out)+head.String(), key) {
			t.Errorf("%s (stream %v): the client got the upstream's key:\n%s\n%s", c.prompt, c.stream, head.String(), out)
		}
		// A 5xx is Molly's own error (an upstream's 401 refuses its key:
		// 502 upstream_auth_failed), without the upstream's body.
		if c.status < 500 && !strings.Contains(string(out), "REDACTED") {
			t.Errorf("%s (stream %v): the echo is not in the answer as REDACTED: %s", c.prompt, c.stream, out)
		}
	}
	if int(sawKey.Load()) != len(cases) {
		t.Fatalf("the upstream was sent its key %d times, want %d", sawKey.Load(), len(cases))
	}
	var logged string
	for deadline := time.Now().Add(5 * time.Second); strings.Count(logged, `"uri":"/v1/chat/completions"`) < len(cases); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(logFile)
		logged = string(b)
		if time.Now().After(deadline) {
			t.Fatalf("the requests are not in the access log:\n%s", logged)
		}
	}
	if strings.Contains(logged, key) || strings.Contains(g.logs.String(), key) {
		t.Errorf("a log holds the upstream's key")
	}
}

// TestAClientThatLeavesAWholeAnswerIsBilledWhatTheUpstreamReports: a
// provider (a priced target) generates, and bills, a non-streamed answer
// whether or not the client still waits for it. A client that goes away
// after its request
// reached the upstream (and before the answer, which takes the model two
// seconds) is billed the usage the upstream reports — prompt and
// completion tokens, not an estimate — so leaving early is not a way to
// spend past a budget.
func TestAClientThatLeavesAWholeAnswerIsBilledWhatTheUpstreamReports(t *testing.T) {
	got, done := make(chan struct{}, 1), make(chan bool, 1)
	var billedPrompt, billedCompletion atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		prompt := int64(len(gjson.GetBytes(b, "messages.0.content").Str))
		completion := gjson.GetBytes(b, "max_tokens").Int()
		// The provider's bill: the request was accepted and is generated.
		billedPrompt.Store(prompt)
		billedCompletion.Store(completion)
		got <- struct{}{}
		canceled := false
		select {
		case <-r.Context().Done():
			canceled = true
		case <-time.After(2 * time.Second): // the model's generation time
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"length","message":{"role":"assistant","content":"word"}}],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			prompt, completion, prompt+completion)
		done <- canceled
	}))
	t.Cleanup(up.Close)
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint `+up.URL+`/v1
			models chat=m
			price 100 100
			outlier_detection off
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_auth {
		anonymous guest
	}
	molly_classify
	molly_policy
	molly_route
}
`)
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		// 请 is three bytes and about a third of a token by Molly's estimate.
		body := `{"model":"chat","max_tokens":700,"messages":[{"role":"user","content":"` + strings.Repeat("请联系客服", 40) + `"}]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-got
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the client got an answer before it left")
	}
	canceled := <-done
	var s usageSummary
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s = usageOf(t, admin, "guest")
		if s.Requests > 0 || time.Now().After(deadline) {
			break
		}
	}
	if s.Requests != 1 || len(s.Recent) != 1 {
		t.Fatalf("%d records for the request that left (upstream call canceled: %v), want 1: %+v", s.Requests, canceled, s)
	}
	r := s.Recent[0]
	if r.PromptTokens != int(billedPrompt.Load()) || r.CompletionTokens != int(billedCompletion.Load()) || r.Estimated {
		t.Errorf("billed %d prompt + %d completion tokens (estimated %v; upstream call canceled: %v); the upstream billed %d + %d",
			r.PromptTokens, r.CompletionTokens, r.Estimated, canceled, billedPrompt.Load(), billedCompletion.Load())
	}
}

// TestAHandlerFailureLogsNoCredentials: when a Molly handler cannot serve
// a request (here molly_route without molly_classify before it, as a
// misordered config has it), the client gets a 500 server_error in
// OpenAI's shape and the log says why — without the request's X-Api-Key or
// api_key= (Caddy's error log, which Molly's failures no longer go to,
// prints both as they came when the default log is not Molly's encoder).
func TestAHandlerFailureLogsNoCredentials(t *testing.T) {
	g := startMolly(t, `{
	admin `+adminSocket(t)+`|0600
	auto_https off
	persist_config off
}
http://127.0.0.1:{PORT} {
	handle /v1/models {
		molly_classify
		molly_policy
		molly_route
	}
	handle {
		molly_route
	}
}
`)
	req, _ := http.NewRequest(http.MethodPost, g.URL+"/chat/completions?api_key=query-secret-0007", strings.NewReader(`{"model":"chat","messages":[]}`))
	req.Header.Set("X-Api-Key", "header-secret-0008")
	req.Header.Set("X-Request-Id", "req-misordered")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !g.waitLogs(regexp.MustCompile(`req-misordered`)) {
		t.Fatalf("the failure is not logged:\n%s", g.logs.String())
	}
	for _, s := range []string{"query-secret-0007", "header-secret-0008"} {
		if strings.Contains(g.logs.String(), s) {
			t.Errorf("the log holds %s:\n%s", s, g.logs.String())
		}
	}
	if !regexp.MustCompile(`request not served.*req-misordered.*put molly_classify and molly_policy before molly_route`).MatchString(g.logs.String()) {
		t.Errorf("no log line says why the request was not served:\n%s", g.logs.String())
	}
	if resp.StatusCode != 500 || gjson.GetBytes(b, "error.type").Str != "server_error" {
		t.Errorf("a misordered chain answered %d %s, want a 500 server_error", resp.StatusCode, b)
	}
}

// TestRevokingByTheWholeKeyLogsNoKey: DELETE /molly/keys/<whole key> on
// the admin socket (the route documents a prefix; a script may send the
// key) revokes the key — a request with it is then a 401 — and neither the
// admin endpoint's "received request" line nor any other line of the log
// (the default log through the molly encoder, as the default Caddyfile
// has it) holds the key's secret part.
func TestRevokingByTheWholeKeyLogsNoKey(t *testing.T) {
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	admin := adminSocket(t)
	logFile := filepath.Join(t.TempDir(), "molly.log")
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	log {
		output file `+logFile+`
		format molly
		level DEBUG
	}
	molly {
		registry `+filepath.Join(t.TempDir(), "molly.db")+`
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_auth
	molly_classify
	molly_policy
	molly_route
}
`)
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "ann"}); code != http.StatusCreated {
		t.Fatalf("member: %d %s", code, body)
	}
	key, prefix := newKey(t, admin, "ann")
	if _, err := keyClient(g, key).Chat.Completions.New(t.Context(), chat("before")); err != nil {
		t.Fatalf("the new key: %v", err)
	}
	if code, body := adminCall(t, admin, http.MethodDelete, "/molly/keys/"+key, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE /molly/keys/<key>: %d %s", code, body)
	}
	// An unknown whole key (another prefix): refused, naming its prefix only.
	other := "sk-molly-zzzzzzzz" + key[len(prefix):]
	if code, body := adminCall(t, admin, http.MethodDelete, "/molly/keys/"+other, nil); code != http.StatusNotFound || strings.Contains(body, other[len(prefix):]) {
		t.Fatalf("DELETE /molly/keys/<unknown key>: %d %s", code, body)
	}
	resp, b := do(t, g, http.MethodPost, "/v1/chat/completions", `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"after"}]}`,
		"Authorization", "Bearer "+key)
	if resp.StatusCode != http.StatusUnauthorized || gjson.GetBytes(b, "error.code").Str != "invalid_api_key" {
		t.Fatalf("the revoked key: %d %s", resp.StatusCode, b)
	}
	var logs []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		logs, _ = os.ReadFile(logFile)
		if strings.Count(string(logs), `"received request"`) >= 4 || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(string(logs), `"received request"`) {
		t.Fatalf("the admin endpoint logged no request:\n%s", logs)
	}
	for _, secret := range []string{key[len(prefix):], other[len(prefix):]} {
		if strings.Contains(string(logs), secret) || strings.Contains(g.logs.String(), secret) {
			t.Fatalf("the log holds a key's secret part %q:\n%s", secret, logs)
		}
	}
}

// TestAnUpstreamsAbsurdUsageIsNotBilled: an upstream whose usage report is
// no count of tokens — a negative completion_tokens (which, priced, would
// credit the member's budget), 10^30 tokens (which would overflow the
// ledger's integers), a string — is billed as an answer without usage is,
// by Molly's estimate: every record's tokens and cost are non-negative and
// within MaxReportedTokens, the spend is their sum, the usage report keeps
// answering and the member keeps being served.
func TestAnUpstreamsAbsurdUsageIsNotBilled(t *testing.T) {
	usage := map[string]string{
		"negative": `{"prompt_tokens":5,"completion_tokens":-1000000,"total_tokens":-999995}`,
		"huge":     `{"prompt_tokens":1e30,"completion_tokens":1e30,"total_tokens":1e30}`,
		"maxint":   `{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775807,"total_tokens":1}`,
		"string":   `{"prompt_tokens":"7","completion_tokens":"-9","total_tokens":"0"}`,
		"honest":   `{"prompt_tokens":6,"completion_tokens":3,"total_tokens":9}`,
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p := gjson.GetBytes(b, "messages.@reverse.0.content").Str
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,`+
			`"message":{"role":"assistant","content":"fine","refusal":null}}],"usage":`+usage[p]+`}`)
	}))
	t.Cleanup(up.Close)
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		registry `+filepath.Join(t.TempDir(), "molly.db")+`
		target lan {
			tier T1
			endpoint `+up.URL+`/v1
			models chat=m
			price 1 2
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_auth
	molly_classify
	molly_policy
	molly_route
}
`)
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "ann", "budget_usd": 1, "period": "month"}); code != http.StatusCreated {
		t.Fatalf("member: %d %s", code, body)
	}
	key, _ := newKey(t, admin, "ann")
	order := []string{"negative", "huge", "maxint", "string", "honest"}
	for _, p := range order {
		resp, b := do(t, g, http.MethodPost, "/v1/chat/completions", `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"`+p+`"}]}`,
			"Authorization", "Bearer "+key)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	var u struct {
		Spent    float64 `json:"spent_usd"`
		Requests int     `json:"requests"`
		Recent   []struct {
			Prompt     int64   `json:"prompt_tokens"`
			Completion int64   `json:"completion_tokens"`
			Cost       float64 `json:"cost_usd"`
		} `json:"recent"`
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body := adminCall(t, admin, http.MethodGet, "/molly/usage?member=ann", nil)
		if code != http.StatusOK {
			t.Fatalf("the usage report: %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &u); err != nil {
			t.Fatal(err)
		}
		if u.Requests == len(order) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests recorded: %s", u.Requests, len(order), body)
		}
	}
	sum := 0.0
	for _, r := range u.Recent {
		if r.Prompt < 0 || r.Completion < 0 || r.Prompt > 1<<31-1 || r.Completion > 1<<31-1 || r.Cost < 0 {
			t.Fatalf("a record of %d prompt and %d completion tokens costing %v USD", r.Prompt, r.Completion, r.Cost)
		}
		if want := (float64(r.Prompt)*1 + float64(r.Completion)*2) / 1e6; math.Abs(r.Cost-want) > 1e-9 {
			t.Fatalf("a record of %d+%d tokens costs %v USD, want %v", r.Prompt, r.Completion, r.Cost, want)
		}
		sum += r.Cost
	}
	if len(u.Recent) != len(order) || u.Spent < 0 || math.Abs(u.Spent-sum) > 1e-9 {
		t.Fatalf("spent %v USD over %d records summing to %v", u.Spent, len(u.Recent), sum)
	}
	if resp, b := do(t, g, http.MethodPost, "/v1/chat/completions", `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"honest"}]}`,
		"Authorization", "Bearer "+key); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the absurd reports: %d %s", resp.StatusCode, b)
	}
}

// TestAnAmbiguousUpstreamAnswerIsNotRelayed: an upstream answer with a key
// twice in one object ("content" once harmless, once with an address) is
// read one way by Molly's output guard and the other by the client's parser
// (Go's encoding/json, the oracle here, keeps the last value, as
// JavaScript's does): a whole answer is a failed attempt (502
// bad_upstream_answer, nothing of it relayed), a stream event is dropped;
// an answer nested deeper than any of the API, or whose "choices" is a
// string, is refused alike, and invalid UTF-8 reaches the client as U+FFFD. The T3 target's answers are
// masked by the default output rule, so no address may reach the client.
func TestAnAmbiguousUpstreamAnswerIsNotRelayed(t *testing.T) {
	const addr = "bob.secret@example.com"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p := gjson.GetBytes(b, "messages.@reverse.0.content").Str
		if gjson.GetBytes(b, "stream").Bool() {
			w.Header().Set("Content-Type", "text/event-stream")
			for _, ev := range []string{
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":null}]}`,
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" fine","content":" ` + addr + `"},"finish_reason":null}]}`,
				`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
				`[DONE]`,
			} {
				_, _ = io.WriteString(w, "data: "+ev+"\n\n")
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if p == "choices" {
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":"`+addr+`","usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
			return
		}
		msg := map[string]string{
			"dup":  `{"role":"assistant","content":"nothing to see","content":"write to ` + addr + `"}`,
			"deep": `{"role":"assistant","content":"deep","x":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`,
			"utf8": "{\"role\":\"assistant\",\"content\":\"caf\xe9 ok\"}",
		}[p]
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":`+msg+`}],`+
			`"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`)
	}))
	t.Cleanup(up.Close)
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		target cloud {
			tier T3
			endpoint `+up.URL+`/v1
			api_key_env MOLLY_TEST_T3_KEY
			models chat=m
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	for _, p := range []string{"dup", "deep", "choices"} {
		resp, b := do(t, g, http.MethodPost, "/v1/chat/completions", `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"`+p+`"}]}`)
		if resp.StatusCode != http.StatusBadGateway || gjson.GetBytes(b, "error.code").Str != "bad_upstream_answer" || strings.Contains(string(b), addr) {
			t.Fatalf("%s: %d %s", p, resp.StatusCode, b)
		}
	}
	resp, b := do(t, g, http.MethodPost, "/v1/chat/completions", `{"model":"chat","max_tokens":4,"messages":[{"role":"user","content":"utf8"}]}`)
	var whole struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if resp.StatusCode != http.StatusOK || !utf8.Valid(b) || json.Unmarshal(b, &whole) != nil || len(whole.Choices) != 1 || whole.Choices[0].Message.Content != "caf\uFFFD ok" {
		t.Fatalf("invalid UTF-8: %d %q", resp.StatusCode, b)
	}
	resp, b = do(t, g, http.MethodPost, "/v1/chat/completions", `{"model":"chat","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"stream"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	var text strings.Builder
	done := false
	for _, ev := range sseEvents(t, b) {
		if ev.IsDone() {
			done = true
			continue
		}
		var chunk struct {
			Choices []struct{ Delta struct{ Content string } }
		}
		if err := json.Unmarshal(ev.Data, &chunk); err != nil {
			t.Fatalf("stream event %q: %v", ev.Data, err)
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Delta.Content)
		}
	}
	if strings.Contains(string(b), addr) || strings.Contains(text.String(), "example.com") || text.String() != "ok" || !done {
		t.Fatalf("stream: the client read %q (done %v) from %s", text.String(), done, b)
	}
}
