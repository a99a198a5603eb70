package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/registry/sqlite"
)

// runawayModel is an OpenAI-compatible chat model that ignores max_tokens
// and never reports usage: a stream goes on with a "word " chunk at a
// time until its client closes it (or runawayLimit chunks), a whole answer
// is runawayLimit words. A prompt containing "FLAKY" fails: streamed, after
// a first chunk reporting its prompt tokens (a token per byte of message
// content: a failed attempt that is billed), with an error event; whole,
// with a 500 (not billed).
type runawayModel struct {
	srv *httptest.Server
}

const runawayLimit = 20000

func startRunawayModel(t *testing.T) *runawayModel {
	m := &runawayModel{}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *runawayModel) URL() string { return m.srv.URL + "/v1" }

func (m *runawayModel) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	text, prompt := "", 0
	for _, msg := range gjson.GetBytes(body, "messages").Array() {
		prompt += len(msg.Get("content").String())
		text = msg.Get("content").String()
	}
	flaky := strings.Contains(text, "FLAKY")
	if !gjson.GetBytes(body, "stream").Bool() {
		if flaky {
			http.Error(w, `{"error":{"message":"boom","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":%q}}]}`,
			strings.Repeat("word ", runawayLimit))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	if flaky {
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":0,\"total_tokens\":%d}}\n\n", prompt, prompt)
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\",\"code\":null}}\n\n")
		return
	}
	for range runawayLimit {
		if r.Context().Err() != nil {
			return
		}
		if _, err := fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"},\"finish_reason\":null}]}\n\n"); err != nil {
			return
		}
		fl.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// asked is one request of the test as its client saw it.
type asked struct {
	decision string
	cap      int // the completion tokens it may be billed: max_tokens, else Molly's default
	stream   bool
	flaky    bool
	status   int
	body     string
	target   string // X-Molly-Target
}

// TestNoUpstreamTakesAMemberPastItsBudget is the budget's guarantee end to
// end, with an upstream that does not keep to it: 24 concurrent clients
// send chat requests — streamed or whole, max_tokens from unset to 300,
// some failing on the first target — through the real gateway (whole
// answers cascade over two targets, streams fall back) on behalf of alice,
// whose budget is 1 USD. The first target ignores max_tokens and never
// reports usage; a failing stream there is billed (it reported its prompt)
// before the fallback answers. The second answers exactly max_tokens with
// usage. Read from the registry once the gateway stopped, alice's usage
// records, priced at the targets' prices by the test, add up to at most
// her budget and to what Molly says she spent; no record bills more
// completion tokens than its request's cap; the second target was billed
// exactly what it counted; every runaway stream reached its client ended as
// one at its max_tokens (finish_reason "length", [DONE]; stop_reason
// "max_tokens" through the Messages API) after no more text deltas than
// the cap; and every refusal is a 429 insufficient_quota
// in OpenAI's error shape.
func TestNoUpstreamTakesAMemberPastItsBudget(t *testing.T) {
	const (
		budget  = 1.0
		clients = 24
		each    = 6
	)
	runaway := startRunawayModel(t)
	honest := startWorstCase(t, 150, 150, "")
	admin := adminSocket(t)
	db := filepath.Join(t.TempDir(), "registry", "molly.db")
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		registry `+db+`
		cascade {
			threshold -1
			max_attempts 2
		}
		target runaway {
			tier T1
			endpoint `+runaway.URL()+`
			models chat=m
			price 100 100
			quality 0.9
			outlier_detection off
		}
		target honest {
			tier T2
			endpoint `+honest.URL()+`
			models chat=m
			price 150 150
			quality 0.5
			outlier_detection off
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
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "alice", "budget_usd": budget}); code != http.StatusCreated {
		t.Fatalf("member: %d %s", code, body)
	}
	key, _ := newKey(t, admin, "alice")

	var mu sync.Mutex
	var all []asked

	// Anthropic's Messages API, streamed to the runaway target: the
	// translated stream ends as one at its max_tokens.
	{
		hr, _ := http.NewRequest(http.MethodPost, g.URL+"/messages", strings.NewReader(
			`{"model":"chat","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"alice: tell me everything"}]}`))
		hr.Header.Set("Authorization", "Bearer "+key)
		hr.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		deltas, stop, stopped := 0, "", false
		for _, line := range strings.Split(string(out), "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			switch gjson.Get(data, "type").Str {
			case "content_block_delta":
				if gjson.Get(data, "delta.text").Str != "" {
					deltas++
				}
			case "message_delta":
				stop = gjson.Get(data, "delta.stop_reason").Str
			case "message_stop":
				stopped = true
			case "error":
				t.Errorf("an error event: %s", data)
			}
		}
		if resp.StatusCode != 200 || resp.Header.Get("X-Molly-Target") != "runaway" || stop != "max_tokens" || !stopped || deltas == 0 || deltas > 5 {
			t.Fatalf("Messages stream: status %d target %q, %d text deltas, stop_reason %q, message_stop %v:\n%.2000s",
				resp.StatusCode, resp.Header.Get("X-Molly-Target"), deltas, stop, stopped, out)
		}
		all = append(all, asked{decision: resp.Header.Get("X-Molly-Decision-Id"), cap: 5, stream: true, status: 200, target: "runaway", body: "messages"})
	}
	var wg sync.WaitGroup
	for i := range clients {
		rng := rand.New(rand.NewPCG(7, uint64(i)))
		wg.Go(func() {
			for range each {
				a := asked{stream: rng.IntN(2) == 0, flaky: rng.IntN(5) == 0}
				maxTokens := []int{0, 1, 16, 64, 300}[rng.IntN(5)]
				a.cap = maxTokens
				if maxTokens == 0 {
					a.cap = 256 // route.DefaultCompletionTokens, what a budgeted caller is capped at
				}
				prompt := "alice: " + strings.Repeat("lorem ipsum ", 1+rng.IntN(20))
				if a.flaky {
					prompt += " FLAKY"
				}
				req := map[string]any{"model": "chat", "messages": []any{map[string]any{"role": "user", "content": prompt}}}
				if maxTokens > 0 {
					req["max_tokens"] = maxTokens
				}
				if a.stream {
					req["stream"] = true
					req["stream_options"] = map[string]any{"include_usage": true}
				}
				b, _ := json.Marshal(req)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.URL+"/chat/completions", strings.NewReader(string(b)))
				hr.Header.Set("Authorization", "Bearer "+key)
				hr.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(hr)
				if err != nil {
					cancel()
					t.Errorf("request: %v", err)
					return
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				a.status, a.body, a.decision, a.target = resp.StatusCode, string(out), resp.Header.Get("X-Molly-Decision-Id"), resp.Header.Get("X-Molly-Target")
				mu.Lock()
				all = append(all, a)
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	outcomes := map[string]int{}
	caps := map[string]int{}
	for _, a := range all {
		caps[a.decision] = a.cap
		switch {
		case a.status == http.StatusOK:
			outcomes["200 "+a.target]++
			if a.stream && a.target == "runaway" && a.body != "messages" {
				deltas, finish, done := readSSE(t, a.body)
				if !done || finish != "length" || deltas == 0 || deltas > a.cap {
					t.Errorf("a runaway stream capped at %d reached its client with %d text deltas, finish %q, [DONE] %v", a.cap, deltas, finish, done)
				}
			}
		case a.status == http.StatusTooManyRequests:
			e := gjson.Get(a.body, "error")
			if e.Get("code").Str != "insufficient_quota" || e.Get("type").Str != "insufficient_quota" || e.Get("message").Str == "" || !e.Get("param").Exists() {
				t.Errorf("a 429 that is not OpenAI's insufficient_quota: %s", a.body)
			}
			outcomes["429"]++
		case a.status == http.StatusServiceUnavailable && a.flaky && strings.Contains(a.body, "over the remaining budget"):
			// The failing first target, and the fallback left out of the
			// plan as over what is left of the budget: no overshoot.
			outcomes["503 fallback over budget"]++
		default:
			t.Errorf("status %d (flaky %v, stream %v): %.500s", a.status, a.flaky, a.stream, a.body)
		}
	}
	t.Logf("outcomes: %v", outcomes)
	if outcomes["200 runaway"] == 0 || outcomes["200 honest"] == 0 || outcomes["429"] == 0 {
		t.Fatalf("the load did not reach both targets and the budget: %v", outcomes)
	}
	spentByMolly := usageOf(t, admin, "alice").SpentUSD

	// The gateway stops (committing its usage journal); its book of record
	// is then read as it is on disk.
	_ = g.cmd.Process.Signal(syscall.SIGINT)
	_ = g.cmd.Wait()
	rdb, err := sqlite.Open(db, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	rows, err := rdb.Query(`SELECT decision_id, target, prompt_tokens, completion_tokens FROM usage WHERE member = 'alice'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	prices := map[string]float64{"runaway": 100, "honest": 150} // USD per 1M tokens, in and out
	var usd float64
	honestBilled, records := 0, 0
	for rows.Next() {
		var decision, target string
		var prompt, completion int
		if err := rows.Scan(&decision, &target, &prompt, &completion); err != nil {
			t.Fatal(err)
		}
		records++
		usd += float64(prompt+completion) * prices[target] / 1e6
		if target == "honest" {
			honestBilled += prompt + completion
		}
		if c, ok := caps[decision]; !ok || completion > c {
			t.Errorf("a record of %s bills %d completion tokens, its request's cap %d (known: %v)", target, completion, c, ok)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records: %.6f USD of alice's %.2f; Molly says %.6f", records, usd, budget, spentByMolly)
	if usd > budget+1e-9 {
		t.Errorf("alice's records cost %.9f USD at the targets' prices, over her budget %.2f", usd, budget)
	}
	if usd < budget/2 {
		t.Errorf("the load did not press on the budget: %.6f USD", usd)
	}
	if math.Abs(usd-spentByMolly) > 1e-9*float64(records+1) {
		t.Errorf("the records add up to %.9f USD, Molly's summary says %.9f", usd, spentByMolly)
	}
	_, answered := honest.spend("alice")
	counted := 0
	for _, a := range answered {
		counted += a.prompt + a.completion
	}
	if counted != honestBilled {
		t.Errorf("the honest target counted %d tokens for alice, Molly billed %d", counted, honestBilled)
	}
}

// readSSE reads a chat completion stream: its text deltas, the last
// finish_reason of choice 0, and whether it ended with [DONE] and nothing
// after it (an error event fails the test).
func readSSE(t *testing.T, body string) (deltas int, finish string, done bool) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		data := strings.TrimPrefix(line, "data: ")
		if done {
			t.Errorf("data after [DONE]: %s", data)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		if e := gjson.Get(data, "error"); e.Exists() {
			t.Errorf("an error event: %s", data)
		}
		gjson.Get(data, "choices").ForEach(func(_, ch gjson.Result) bool {
			if ch.Get("delta.content").String() != "" {
				deltas++
			}
			if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
				finish = fr.Str
			}
			return true
		})
	}
	return deltas, finish, done
}
