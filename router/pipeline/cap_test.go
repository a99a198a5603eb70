package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
)

// runaway is an upstream that ignores max_tokens: a stream goes on with a
// chunk of one token ("word ") at a time — each with its running usage
// when usageEvery is set, as some providers report — until its client
// closes the connection or it has sent runawayChunks; a whole answer is
// runawayChunks words with usage saying so (or no usage when quiet). It
// keeps what it was sent and, for each stream, how many chunks it wrote
// before it stopped and whether its client closed it first.
type runaway struct {
	srv        *httptest.Server
	usageEvery bool
	quiet      bool
	honest     []string // when set, the stream sends these chunks and finishes with "length", as an upstream at its cap

	mu       sync.Mutex
	bodies   [][]byte
	streamed chan streamEnd
}

type streamEnd struct {
	chunks int
	closed bool // the client closed the stream before it ended
}

const runawayChunks = 20000

func startRunaway(t *testing.T) *runaway {
	u := &runaway{streamed: make(chan streamEnd, 8)}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *runaway) URL() string { return u.srv.URL + "/v1" }

func (u *runaway) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.bodies = append(u.bodies, body)
	u.mu.Unlock()
	if !gjson.GetBytes(body, "stream").Bool() {
		w.Header().Set("Content-Type", "application/json")
		usage := fmt.Sprintf(`,"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}`, runawayChunks, runawayChunks+3)
		if u.quiet {
			usage = ""
		}
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":%q}}]%s}`,
			strings.Repeat("word ", runawayChunks), usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	if u.honest != nil {
		for _, c := range u.honest {
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", c)
		}
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n")
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", len(u.honest), len(u.honest)+3)
		u.streamed <- streamEnd{chunks: len(u.honest)}
		return
	}
	for i := 1; i <= runawayChunks; i++ {
		if r.Context().Err() != nil {
			u.streamed <- streamEnd{chunks: i - 1, closed: true}
			return
		}
		usage := ""
		if u.usageEvery {
			usage = fmt.Sprintf(`,"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}`, i, i+3)
		}
		if _, err := fmt.Fprintf(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"word \"},\"finish_reason\":null}]%s}\n\n", usage); err != nil {
			u.streamed <- streamEnd{chunks: i - 1, closed: true}
			return
		}
		fl.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	u.streamed <- streamEnd{chunks: runawayChunks}
}

func (u *runaway) last() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[len(u.bodies)-1]
}

// streamed reads an SSE answer: its content chunks, the finish reasons of
// choice 0, the usage chunk's, and whether it ended with [DONE].
type streamed struct {
	contentChunks int
	finish        []string
	usage         gjson.Result
	done          bool
}

func readStream(t *testing.T, body string) streamed {
	t.Helper()
	var s streamed
	d := relay.NewDecoder(strings.NewReader(body))
	for {
		ev, err := d.Next()
		if err != nil {
			break
		}
		if ev.IsDone() {
			s.done = true
			continue
		}
		if s.done {
			t.Fatalf("an event after [DONE]: %s", ev.Data)
		}
		if e := gjson.GetBytes(ev.Data, "error"); e.Exists() {
			t.Fatalf("an error event: %s", ev.Data)
		}
		if u := gjson.GetBytes(ev.Data, "usage"); u.IsObject() {
			s.usage = u
		}
		gjson.GetBytes(ev.Data, "choices").ForEach(func(_, ch gjson.Result) bool {
			if ch.Get("delta.content").String() != "" {
				s.contentChunks++
			}
			if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
				s.finish = append(s.finish, fr.Str)
			}
			return true
		})
	}
	return s
}

// TestAnUpstreamIgnoringMaxTokensIsBilledAtMostTheReservation: Molly sends
// upstream the completion cap its reservation holds (the client's
// max_tokens, or route.DefaultCompletionTokens for a budgeted caller who set
// none) and holds the upstream to it. A stream that runs past it is ended
// by the gateway as OpenAI ends an answer at its max_tokens — finish_reason
// "length", the usage chunk when asked for, [DONE] — after no more text
// deltas than the cap (each is at least a token), and the upstream's
// connection is closed; the usage billed is at most the cap, unless the
// upstream reported more (then as reported, and counted). A whole answer
// whose upstream reports more is billed what it reports (its real cost),
// with a warning and molly_completion_over_cap_total naming the target;
// one without usage is billed at the cap. An honest upstream at its cap is
// relayed whole.
func TestAnUpstreamIgnoringMaxTokensIsBilledAtMostTheReservation(t *testing.T) {
	up := startRunaway(t)
	targets := []*route.Target{{Name: "runaway", Tier: "T2", Endpoint: up.URL(), Models: []string{"m"}, PriceIn: 1, PriceOut: 2}}
	ledger := &memLedger{}
	metrics, reg := meter.NewMetrics(), prometheus.NewRegistry()
	if err := metrics.Register(reg); err != nil {
		t.Fatal(err)
	}
	gw, _ := startGateway(t, setup{targets: targets, id: &identity.Identity{Member: "alice", Budgeted: true, RemainingUSD: 1, Ledger: ledger},
		edit: func(p *Pipeline) { p.Metrics = metrics }})
	url := gw.URL + "/v1/chat/completions"
	overCap := func(reason string) float64 {
		return metricValue(t, reg, "molly_completion_over_cap_total", map[string]string{"target": "runaway", "reason": reason})
	}
	billed := func(t *testing.T) meter.Usage {
		t.Helper()
		got := ledger.take()
		if len(got) != 1 {
			t.Fatalf("recorded %d usages, want 1: %+v", len(got), got)
		}
		return got[0]
	}

	streams := []struct {
		name       string
		body       string
		usageEvery bool
		cap        int    // the completion tokens reserved, and sent upstream
		sent       string // the limit the upstream got, as the gateway sent it
	}{
		{"a stream with max_tokens", `{"model":"m","stream":true,"max_tokens":7,"messages":[{"role":"user","content":"go on"}]}`, false, 7, "max_tokens"},
		{"a stream with max_completion_tokens and usage asked for", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":5,"messages":[{"role":"user","content":"go on"}]}`, false, 5, "max_completion_tokens"},
		{"a stream without a limit, of a budgeted caller", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"go on"}]}`, false, route.DefaultCompletionTokens, "max_tokens"},
		{"a stream reporting its running usage", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"messages":[{"role":"user","content":"go on"}]}`, true, 6, "max_tokens"},
	}
	for _, tt := range streams {
		t.Run(tt.name+" is ended at its cap", func(t *testing.T) {
			up.usageEvery = tt.usageEvery
			cutBefore, reportedBefore := overCap("cut"), overCap("reported")
			r := post(t, url, tt.body, "X-Molly-Sensitivity", "internal")
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if got := gjson.GetBytes(up.last(), tt.sent).Int(); got != int64(tt.cap) {
				t.Fatalf("the upstream was sent %s %d, want %d: %s", tt.sent, got, tt.cap, up.last())
			}
			end := <-up.streamed
			if !end.closed || end.chunks >= runawayChunks {
				t.Fatalf("the upstream wrote %d chunks (closed by the gateway: %v); the gateway should have closed it past %d", end.chunks, end.closed, tt.cap)
			}
			s := readStream(t, r.body)
			if !s.done || len(s.finish) != 1 || s.finish[0] != "length" {
				t.Fatalf("done %v, finish reasons %v; want one \"length\" and [DONE]:\n%.2000s", s.done, s.finish, r.body)
			}
			if s.contentChunks > tt.cap || s.contentChunks == 0 {
				t.Fatalf("the client got %d text deltas, want 1..%d (each is at least a token)", s.contentChunks, tt.cap)
			}
			u := billed(t)
			switch {
			case tt.usageEvery:
				// The upstream reported the chunk that crossed the cap (not
				// relayed): it generated it, and bills it.
				if u.CompletionTokens != tt.cap+1 || u.Estimated {
					t.Fatalf("billed %+v, want the %d completion tokens the upstream reported last", u, tt.cap+1)
				}
				if got := overCap("reported") - reportedBefore; got != 1 {
					t.Fatalf("molly_completion_over_cap_total{reason=reported} rose by %v, want 1", got)
				}
			case u.CompletionTokens > tt.cap || u.CompletionTokens < s.contentChunks:
				t.Fatalf("billed %d completion tokens for %d relayed, cap %d", u.CompletionTokens, s.contentChunks, tt.cap)
			}
			if want := (float64(u.PromptTokens)*1 + float64(u.CompletionTokens)*2) / 1e6; fmt.Sprintf("%.12f", u.CostUSD) != fmt.Sprintf("%.12f", want) {
				t.Fatalf("cost %v, want %v", u.CostUSD, want)
			}
			if strings.Contains(tt.body, "include_usage") {
				if int(s.usage.Get("completion_tokens").Int()) != u.CompletionTokens || !s.usage.Get("prompt_tokens").Exists() {
					t.Fatalf("the usage chunk %s, billed %+v", s.usage.Raw, u)
				}
			} else if s.usage.Exists() {
				t.Fatalf("a usage chunk the client did not ask for: %s", s.usage.Raw)
			}
			if got := overCap("cut") - cutBefore; got != 1 {
				t.Fatalf("molly_completion_over_cap_total{reason=cut} rose by %v, want 1", got)
			}
		})
	}
	up.usageEvery = false

	t.Run("a whole answer reporting more than its cap is billed as reported and counted", func(t *testing.T) {
		before := overCap("reported")
		r := post(t, url, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"go on"}]}`, "X-Molly-Sensitivity", "internal")
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if u := billed(t); u.CompletionTokens != runawayChunks || u.Estimated {
			t.Fatalf("billed %+v, want the %d completion tokens the upstream reports", u, runawayChunks)
		}
		if got := overCap("reported") - before; got != 1 {
			t.Fatalf("molly_completion_over_cap_total{reason=reported} rose by %v, want 1", got)
		}
	})
	t.Run("a whole answer without usage is billed at its cap", func(t *testing.T) {
		up.quiet = true
		defer func() { up.quiet = false }()
		before := overCap("estimated")
		r := post(t, url, `{"model":"m","max_tokens":9,"messages":[{"role":"user","content":"go on"}]}`, "X-Molly-Sensitivity", "internal")
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if u := billed(t); u.CompletionTokens != 9 || !u.Estimated {
			t.Fatalf("billed %+v, want the cap of 9 completion tokens, estimated", u)
		}
		if got := overCap("estimated") - before; got != 1 {
			t.Fatalf("molly_completion_over_cap_total{reason=estimated} rose by %v, want 1", got)
		}
	})
	t.Run("an honest upstream at its cap is relayed whole", func(t *testing.T) {
		// Ten tokens of 7 characters on average, twice the estimate's
		// 4: the estimate of the text (18) is well over the cap, the
		// text deltas are not.
		up.honest = strings.Split(" the| understanding| of| tokens| is| approximate| and| conservative| by| design", "|")
		defer func() { up.honest = nil }()
		before := overCap("cut")
		r := post(t, url, `{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"go on"}]}`, "X-Molly-Sensitivity", "internal")
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if end := <-up.streamed; end.closed {
			t.Fatalf("the gateway closed an honest stream after %d chunks", end.chunks)
		}
		s := readStream(t, r.body)
		if s.contentChunks != 10 || len(s.finish) != 1 || s.finish[0] != "length" {
			t.Fatalf("%d text deltas, finish %v; want all 10 and the upstream's \"length\"", s.contentChunks, s.finish)
		}
		if u := billed(t); u.CompletionTokens != 10 {
			t.Fatalf("billed %+v, want the 10 completion tokens reported", u)
		}
		if overCap("cut") != before {
			t.Fatal("an honest stream was counted as cut")
		}
	})
}

// bulkyTool is a governed read tool whose every result is result: a
// plugin's answer, outside the gateway.
type bulkyTool struct{ result []byte }

func (b bulkyTool) Tools() []ToolSpec {
	return []ToolSpec{{Name: "lookup", Description: "Looks a customer record up by id and returns all of it.", SideEffect: "read",
		Parameters: json.RawMessage(`{"type":"object","properties":{"id":{"type":"string","description":"the record id"}},"required":["id"]}`)}}
}

func (b bulkyTool) Invoke(context.Context, string, []byte, string, []string, string) ([]byte, error) {
	return b.result, nil
}

// TestToolRoundsHoldWhatTheirConversationMayCost: a model that calls
// three tools in parallel in one round gets three results of nearly the
// result bound each, and every round carries the offered tools'
// definitions — more than route's tool reservation assumes (one result a
// round, no definitions). Before each round the gateway holds what the
// rounds so far may cost past the plan's reservation, so that what it
// held covers the worst the upstream could bill for what it was sent: a
// token per byte of each request, plus its max_tokens.
func TestToolRoundsHoldWhatTheirConversationMayCost(t *testing.T) {
	lan := upstreamtest.Start("lan")
	t.Cleanup(lan.Close)
	lan.ToolCalls = func(body []byte) []upstreamtest.ToolCall {
		if strings.Contains(gjson.GetBytes(body, "messages.#.role").Raw, `"tool"`) {
			return nil
		}
		return []upstreamtest.ToolCall{{ID: "call_1", Name: "lookup", Arguments: `{"id":"1"}`},
			{ID: "call_2", Name: "lookup", Arguments: `{"id":"2"}`}, {ID: "call_3", Name: "lookup", Arguments: `{"id":"3"}`}}
	}
	result := []byte(`{"record":"` + strings.Repeat("x", route.DefaultToolResultTokens-64) + `"}`)
	ledger := &reservingLedger{released: make(chan int, 8)}
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, PriceIn: 1, PriceOut: 1}},
		id: &identity.Identity{Member: "alice", Ledger: ledger},
		edit: func(p *Pipeline) {
			p.Tools, p.Strategies.Tools, p.Strategies.ToolSteps = bulkyTool{result}, true, 1
		}})
	r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"look up customers 1, 2 and 3"}]}`)
	if r.status != 200 || r.header.Get(HeaderPlan) != "tools" {
		t.Fatalf("status %d strategy %q: %s", r.status, r.header.Get(HeaderPlan), r.body)
	}
	bodies := lan.Received()
	if len(bodies) != 2 || strings.Count(string(bodies[1]), `"tool_call_id"`) != 3 {
		t.Fatalf("the upstream got %d requests, want a round of three calls and the answer", len(bodies))
	}
	worst := 0
	for _, b := range bodies {
		worst += len(b) + int(gjson.GetBytes(b, "max_tokens").Int())
	}
	ledger.mu.Lock()
	held, usd := 0, 0.0
	for i := range ledger.tokens {
		held, usd = held+ledger.tokens[i], usd+ledger.usd[i]
	}
	ledger.mu.Unlock()
	if held < worst || usd < float64(worst)/1e6-1e-12 {
		t.Fatalf("held %d tokens (%.6f USD) for a conversation that may cost %d tokens (%.6f USD)", held, usd, worst, float64(worst)/1e6)
	}
}

// editedPolicy is the embedded default policies with rule (the exact text
// of one rule of file) taken out, as an operator may edit them.
func editedPolicy(t *testing.T, file, rule string) *policies.Engine {
	t.Helper()
	dir := t.TempDir()
	err := fs.WalkDir(policies.Default, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".rego") || strings.HasSuffix(path, "_test.rego") {
			return err
		}
		b, err := fs.ReadFile(policies.Default, path)
		if err != nil {
			return err
		}
		if filepath.Base(path) == file {
			if !strings.Contains(string(b), rule) {
				t.Fatalf("%s no longer has the rule %q", file, rule)
			}
			b = []byte(strings.Replace(string(b), rule, "", 1))
		}
		return os.WriteFile(filepath.Join(dir, filepath.Base(path)), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
	e, err := policies.New(t.Context(), policies.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestACascadeObtainsNoMoreAnswersThanItReserved: the plan of a cascade
// holds max_attempts answers. Under an escalation policy that no longer
// stops at max_attempts, three low-confidence answers in a row still get
// only two asked; and a held stream that fails once billed is followed by
// an attempt only with a reservation of its own.
func TestACascadeObtainsNoMoreAnswersThanItReserved(t *testing.T) {
	t.Run("max_attempts holds whatever the escalation policy says", func(t *testing.T) {
		ups, targets := cascadeTiers(t, [3]float64{-3, -3, -3})
		pol := editedPolicy(t, "escalation.rego", `escalation_blockers contains sprintf("%v answer(s) reached max_attempts %v", [object.get(input, ["attempt", "answers"], null), object.get(input, ["attempt", "max_attempts"], null)]) if {
	not attempts_left
}
`)
		ledger := &reservingLedger{released: make(chan int, 4)}
		gw, _ := startGateway(t, setup{targets: targets, policy: pol, id: &identity.Identity{Member: "alice", Ledger: ledger},
			edit: withCascade(route.Cascade{Threshold: -1.5, MaxAttempts: 2}, nil)})
		r := post(t, gw.URL+"/v1/chat/completions", chatBody("what is the capital of France?"))
		if r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		if got := [3]int{ups[0].Count(), ups[1].Count(), ups[2].Count()}; got != [3]int{1, 1, 0} {
			t.Fatalf("lan, remote, cloud got %v requests; a cascade of max_attempts 2 asks two", got)
		}
		if ledger.mu.Lock(); len(ledger.tokens) != 1 {
			t.Errorf("%d reservations, want the plan's one", len(ledger.tokens))
		}
		ledger.mu.Unlock()
	})
	t.Run("a billed failed stream is followed by a reservation of its own", func(t *testing.T) {
		// lan streams two chunks and drops the connection (held, billed,
		// failed); remote's one-chunk answer is unsure, cloud's sure: three
		// billed attempts where the plan holds two answers.
		ups, targets := cascadeTiers(t, [3]float64{-0.1, -3, -0.1})
		ups[1].Chunks, ups[2].Chunks = 1, 1 // too short to be cut off by TRUNCATE
		ledger := &reservingLedger{released: make(chan int, 8)}
		gw, _ := startGateway(t, setup{targets: targets, id: &identity.Identity{Member: "alice", Ledger: ledger},
			edit: withCascade(route.Cascade{Threshold: -1.5, MaxAttempts: 2, HoldTokens: 4}, nil)})
		r := post(t, gw.URL+"/v1/chat/completions", streamBody("TRUNCATE please", true))
		if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" {
			t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
		}
		if got := [3]int{ups[0].Count(), ups[1].Count(), ups[2].Count()}; got != [3]int{1, 1, 1} {
			t.Fatalf("lan, remote, cloud got %v requests", got)
		}
		if n := len(ledger.take()); n != 3 {
			t.Fatalf("%d usages recorded, want the failed stream, the escalated and the answer", n)
		}
		ledger.mu.Lock()
		defer ledger.mu.Unlock()
		if len(ledger.tokens) != 2 {
			t.Fatalf("%d reservations, want the plan's (two answers) and one more after the billed failure", len(ledger.tokens))
		}
	})
}
