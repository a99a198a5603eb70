package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"golang.org/x/sys/unix"

	"github.com/molly-gateway/molly/caddy-modules/app"
	"github.com/molly-gateway/molly/internal/adversarial"
	"github.com/molly-gateway/molly/redaction"
)

// BenchmarkGateway is `make bench`'s table (docs/benchmarks.md): Molly's
// full path (molly_classify → molly_policy → molly_route) against bare
// Caddy reverse_proxy to the same static upstream, both served by one
// in-process Caddy, measured in the same run; plus the detectors' throughput
// against a plain regular expression. It writes the table to
// bench/latest.txt and, when that file exists from an earlier run, prints
// each metric's ratio to it first (the regression guard).
//
// The process's collector is set as molly's main sets it (tuneGC: GOGC
// 400 unless GOGC is set), for both paths alike.
//
// The machine it runs on is small and shared, so every figure is a median
// over rounds whose requests alternate between the two paths (ABBA order):
// noise from other processes falls on both alike. The load generator is a Go
// client in this process; it takes CPU from both paths alike.
//
// One iteration runs the whole suite (about a minute); `make bench` runs it
// with -benchtime 1x. MOLLY_BENCH_ROUNDS overrides the number of rounds
// (default 9).
func BenchmarkGateway(b *testing.B) {
	rounds := 9
	if s := os.Getenv("MOLLY_BENCH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("MOLLY_BENCH_ROUNDS=%q: want a positive integer", s)
		}
		rounds = n
	}
	p := startBenchPair(b)
	var t benchTable
	for range b.N {
		t = p.suite(b, rounds)
	}
	t.blackbox(b, rounds)
	t.detectors(b)
	for _, r := range t.rows {
		if r.report != "" {
			b.ReportMetric(r.value, r.report)
		}
	}
	path := filepath.Join("..", "..", "bench", "latest.txt")
	prev, _ := os.ReadFile(path) // absent on the first run
	var out bytes.Buffer
	t.write(&out, rounds)
	fmt.Print("\n" + out.String())
	if len(prev) > 0 {
		fmt.Print("\n" + t.compare(prev))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGatewayLoad sends b.N 2 KB or 32 KB chat requests through
// Molly's path alone with benchClients concurrent clients, or one (-c1),
// and bare Caddy's (caddy-): the load to profile (go test -bench
// 'GatewayLoad/^2KB$' -cpuprofile cpu.out ./cmd/molly/; a sub-benchmark's
// pattern needs its own ^ and $).
// Its figures are not a comparison; BenchmarkGateway's are.
func BenchmarkGatewayLoad(b *testing.B) {
	p := startBenchPair(b)
	for _, kb := range []int{2, 32} {
		body := benchBody(kb<<10, false)
		b.Run(fmt.Sprintf("%dKB", kb), func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			rps := p.burst(b, p.molly, body, b.N)
			b.ReportMetric(rps, "req/s")
		})
		b.Run(fmt.Sprintf("%dKB-c1", kb), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.do(p.molly, body); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Bare Caddy's path under the same load: the profile to hold
		// Molly's against.
		b.Run(fmt.Sprintf("caddy-%dKB", kb), func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			rps := p.burst(b, p.proxy, body, b.N)
			b.ReportMetric(rps, "req/s")
		})
		b.Run(fmt.Sprintf("caddy-%dKB-c1", kb), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.do(p.proxy, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// benchClients is the number of concurrent clients of the throughput rows.
const benchClients = 16

// Requests per round and path, by body size (fewer for the large bodies,
// whose requests take longer); throughput bursts send benchBurst requests
// per path and round.
var benchSizes = []struct {
	kb, n int
}{{2, 300}, {32, 80}, {256, 16}}

const benchBurst = 400

// benchPair is one in-process Caddy with two servers in front of one upstream.
type benchPair struct {
	molly, proxy string // chat completions URLs
	client       *http.Client
	// idle, for a gateway in another process (blackbox), waits after
	// either path's requests until that process is idle; nil in process.
	idle func(b *testing.B)
}

// startBenchPair starts a static upstream and loads a Caddy config with a
// Molly server (one T1 target) and a reverse_proxy server in front of it.
// Caddy is stopped at the end of b.
func startBenchPair(b *testing.B) *benchPair {
	b.Helper()
	// Caddy may touch its storage and config folders; keep them per run.
	b.Setenv("HOME", b.TempDir())
	b.Setenv("XDG_DATA_HOME", b.TempDir())
	b.Setenv("XDG_CONFIG_HOME", b.TempDir())

	// The collector runs as in the molly binary (tuneGC), for both paths.
	b.Cleanup(tuneGC())
	upHost := startStaticUpstream(b)
	mport, pport := freePort(b), freePort(b)
	caddyfile := benchCaddyfile(filepath.Join(b.TempDir(), "molly.log"), upHost, fmt.Sprint(mport), pport)
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		b.Fatalf("adapting the bench Caddyfile: %v", err)
	}
	for _, w := range warn {
		b.Logf("caddyfile: %s", w)
	}
	// Load returns once the listeners are bound; the warm-up below is the
	// readiness check.
	if err := caddy.Load(cfg, true); err != nil {
		b.Fatalf("starting caddy: %v", err)
	}
	b.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			b.Errorf("stopping caddy: %v", err)
		}
	})
	tr := &http.Transport{MaxIdleConns: 4 * benchClients, MaxIdleConnsPerHost: 2 * benchClients, IdleConnTimeout: time.Minute}
	b.Cleanup(tr.CloseIdleConnections)
	p := &benchPair{
		molly:  fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", mport),
		proxy:  fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", pport),
		client: &http.Client{Transport: tr, Timeout: time.Minute},
	}
	p.warm(b)
	return p
}

// benchCaddyfile is the bench's config: Molly's full path on mport (a
// number, or {PORT} for startMolly) and bare reverse_proxy on pport, both
// in front of the upstream at upHost.
// Molly's log lines (a policy decision and a route decision per
// request) are encoded and written to a file, as in production: their
// cost is part of the path. ("output discard" would make Caddy's core a
// no-op that encodes nothing.) Bare Caddy logs nothing per request.
func benchCaddyfile(logPath, upHost, mport string, pport int) string {
	return fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output file %s
		format json
	}
	molly {
		target lan {
			tier T1
			endpoint http://%s/v1
			models chat=small-lan
			price 0 0
			latency 300ms
			quality 0.6
		}
	}
}
http://127.0.0.1:%s {
	molly_classify
	molly_policy
	molly_route
}
http://127.0.0.1:%d {
	reverse_proxy %s
}
`, logPath, upHost, mport, pport, upHost)
}

// warm sends each body size through both paths, and checks that Molly
// routed the prompt (an e-mail address in it makes it internal) to the T1
// target, before anything is timed: connections and caches are warm.
func (p *benchPair) warm(b *testing.B) {
	b.Helper()
	for _, stream := range []bool{false, true} {
		for i, s := range benchSizes {
			body := benchBody(s.kb<<10, stream)
			n := 2 * benchClients // connections and caches warm for the 2 KB rows
			if i > 0 {
				n = 2
			}
			for range n {
				h, err := p.do(p.molly, body)
				if err != nil {
					b.Fatalf("molly: %v", err)
				}
				if got := h.Get("X-Molly-Tier"); got != "T1" {
					b.Fatalf("molly routed to tier %q, want T1", got)
				}
				if _, err := p.do(p.proxy, body); err != nil {
					b.Fatalf("reverse_proxy: %v", err)
				}
			}
		}
	}
}

// The static upstream's answers: one chat completion, and the same as a
// stream of three chunks. Both carry usage, which Molly records.
const (
	staticAnswer = `{"id":"chatcmpl-bench","object":"chat.completion","created":1767225600,"model":"small-lan",` +
		`"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant",` +
		`"content":"Thank you for the details. We will check the routing rules and the latency targets and reply by Friday.","refusal":null}}],` +
		`"usage":{"prompt_tokens":512,"completion_tokens":24,"total_tokens":536}}`
	staticChunk  = `{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1767225600,"model":"small-lan","choices":[{"index":0,"delta":%s,"finish_reason":%s,"logprobs":null}]}`
	staticUsage  = `{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1767225600,"model":"small-lan","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":24,"total_tokens":536}}`
	streamMarker = `"stream":true`
)

var staticStream = "data: " + fmt.Sprintf(staticChunk, `{"role":"assistant","content":"Thank you for the details. "}`, "null") + "\n\n" +
	"data: " + fmt.Sprintf(staticChunk, `{"content":"We will check the routing rules and reply by Friday."}`, "null") + "\n\n" +
	"data: " + fmt.Sprintf(staticChunk, `{}`, `"stop"`) + "\n\n" +
	"data: " + staticUsage + "\n\n" +
	"data: [DONE]\n\n"

// startStaticUpstream serves the static answers on loopback (the upstream
// the gateway cannot reach in a test: a small local server) and returns its
// host:port. It reads every request body whole, as a real upstream does,
// and keeps nothing.
func startStaticUpstream(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: staticHandler()}
	go func() { _ = srv.Serve(l) }()
	b.Cleanup(func() { _ = srv.Close() })
	return l.Addr().String()
}

// staticHandler answers every request with the static answer (or stream
// when the body asks for one), after reading the body whole.
func staticHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if bytes.Contains(body, []byte(streamMarker)) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, staticStream)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, staticAnswer)
	})
}

// do sends one chat completion and reads the whole answer.
func (p *benchPair) do(url string, body []byte) (http.Header, error) {
	resp, err := p.client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || n == 0 {
		return nil, fmt.Errorf("%s: status %d, %d bytes", url, resp.StatusCode, n)
	}
	return resp.Header, nil
}

// benchBody is a chat completion of size bytes (±100) of prose with an
// e-mail address at the end, so the detectors do real work and the policy
// sees an internal request (T0–T2 by default).
func benchBody(size int, stream bool) []byte {
	var sb strings.Builder
	sb.WriteString("Please draft a reply to the customer below. Keep it polite and short, and summarise what we will do next.\n\n")
	para := "Hello team, we have been using the gateway for our internal support assistant for three weeks now. " +
		"Most answers are good, but some replies about invoices arrive late and a few mention the wrong contract dates. " +
		"Could you check the configuration of the routing rules and tell us whether the latency targets are realistic? "
	const overhead = 330 // the JSON around the user's text, the system message and the signature
	for sb.Len() < size-overhead-len(para) {
		sb.WriteString(para)
	}
	sb.WriteString(para[:max(0, min(len(para), size-overhead-sb.Len()))])
	sb.WriteString("\nYou can reach me at giulia.bianchi@example.com or through the usual ticket queue.\nBest regards, Giulia")
	b, _ := json.Marshal(map[string]any{
		"model":      "chat",
		"stream":     stream,
		"max_tokens": 256,
		"messages": []any{
			map[string]any{"role": "system", "content": "You are a helpful support assistant for a software company."},
			map[string]any{"role": "user", "content": sb.String()},
		},
	})
	return b
}

// latencies sends body n times through each path at concurrency 1, in
// ABBA order, and returns the latencies of each path.
func (p *benchPair) latencies(b *testing.B, body []byte, n int) (molly, proxy []time.Duration) {
	return p.latenciesOf(b, func(int) []byte { return body }, n)
}

// latenciesOf is latencies with bodyOf(i) as the body of the i-th request
// of each path.
func (p *benchPair) latenciesOf(b *testing.B, bodyOf func(i int) []byte, n int) (molly, proxy []time.Duration) {
	timed := func(url string, body []byte, into *[]time.Duration) {
		start := time.Now()
		if _, err := p.do(url, body); err != nil {
			b.Fatal(err)
		}
		*into = append(*into, time.Since(start))
	}
	molly, proxy = make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n {
		body := bodyOf(i)
		if i%2 == 0 {
			timed(p.molly, body, &molly)
			timed(p.proxy, body, &proxy)
		} else {
			timed(p.proxy, body, &proxy)
			timed(p.molly, body, &molly)
		}
	}
	return molly, proxy
}

// turnBody is the next turn of a conversation: four earlier messages of
// 8 KB each (two questions, two answers: 32 KB the client sends again on
// every turn), then a new question of about 2 KB, different for each
// request (turn numbers it), as a chat client or an agent sends them.
func turnBody(turn int) []byte {
	para := "Hello team, we have been using the gateway for our internal support assistant for three weeks now. " +
		"Most answers are good, but some replies about invoices arrive late and a few mention the wrong contract dates. "
	earlier := func(k int) string {
		return fmt.Sprintf("Message %d. ", k) + strings.Repeat(para, (8<<10)/len(para))
	}
	msgs := []any{map[string]any{"role": "system", "content": "You are a helpful support assistant for a software company."}}
	for k := range 4 {
		role := "user"
		if k%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": earlier(k)})
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("Question %d: ", turn) +
		strings.Repeat(para, (2<<10)/len(para)) + "\nYou can reach me at giulia.bianchi@example.com.\nBest regards, Giulia"})
	b, _ := json.Marshal(map[string]any{"model": "chat", "max_tokens": 256, "messages": msgs})
	return b
}

// burst sends n requests through url with benchClients concurrent clients
// and returns requests per second.
func (p *benchPair) burst(b *testing.B, url string, body []byte, n int) float64 {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	start := time.Now()
	for range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if _, err := p.do(url, body); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if p.idle != nil {
		// Out of process, the burst ends with its last answer; the wait
		// for the gateway's idleness is not timed.
		rps := float64(n) / time.Since(start).Seconds()
		p.idle(b)
		return rps
	}
	p.settle(b, url)
	return float64(n) / time.Since(start).Seconds()
}

// settle, after Molly's requests, waits until their usage records are
// committed in the ledger (the journal commits them up to 20 ms later,
// off the request path): that work is Molly's, so it is timed and counted
// with Molly's requests, not with whatever runs next.
func (p *benchPair) settle(b *testing.B, url string) {
	if p.idle != nil { // a gateway in another process
		p.idle(b)
		return
	}
	if url != p.molly {
		return
	}
	a := app.Current()
	if a == nil || a.Registry() == nil {
		b.Fatal("no molly app with a registry is running")
	}
	if err := a.Registry().CommitJournal(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// allocs counts the heap allocations per request of n requests through url
// at concurrency 1 (the whole process: client, Caddy, upstream).
func (p *benchPair) allocs(b *testing.B, url string, body []byte, n int) (allocs, bytes float64) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range n {
		if _, err := p.do(url, body); err != nil {
			b.Fatal(err)
		}
	}
	p.settle(b, url)
	runtime.ReadMemStats(&m1)
	return float64(m1.Mallocs-m0.Mallocs) / float64(n), float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
}

// row is one metric of the table.
type row struct {
	name   string
	value  float64
	unit   string
	base   string // what it is measured against, e.g. "caddy_p50=158.1us"; "-" when nothing
	goal   string // e.g. "<=150"; "-" when none
	met    string // "yes", "no" or "-"
	higher bool   // a higher value is better (throughput); else lower is
	report string // unit for b.ReportMetric; "" to leave it out
}

type benchTable struct{ rows []row }

func (t *benchTable) add(r row) {
	if r.base == "" {
		r.base = "-"
	}
	if r.goal == "" {
		r.goal, r.met = "-", "-"
	}
	t.rows = append(t.rows, r)
}

// goal fills in r's goal "<=limit" or ">=limit" and whether it is met.
func goal(r row, limit float64) row {
	op, ok := "<=", r.value <= limit
	if r.higher {
		op, ok = ">=", r.value >= limit
	}
	r.goal = op + strconv.FormatFloat(limit, 'g', -1, 64)
	r.met = map[bool]string{true: "yes", false: "no"}[ok]
	return r
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// quantile is the nearest-rank q-quantile of ds in microseconds.
func quantile(ds []time.Duration, q float64) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return float64(s[max(0, min(i, len(s)-1))]) / 1e3
}

// suite runs the gateway rows: rounds of latency at concurrency 1 for each
// body size (and a 2 KB stream), a throughput burst per path with
// benchClients clients, then allocation counts.
func (p *benchPair) suite(b *testing.B, rounds int) benchTable {
	type perSize struct {
		mollyP50, proxyP50, addP50, addP99, proxyP99, ratio []float64
	}
	sizes := make([]perSize, len(benchSizes))
	bodies := make([][]byte, len(benchSizes))
	for i, s := range benchSizes {
		bodies[i] = benchBody(s.kb<<10, false)
	}
	stream := benchBody(2<<10, true)
	var streamAdd, thrRatio, thrMolly, thrProxy, turnAdd, turnProxy []float64
	turns := 0
	for range rounds {
		for i, s := range benchSizes {
			m, px := p.latencies(b, bodies[i], s.n)
			mp50, pp50 := quantile(m, 0.5), quantile(px, 0.5)
			sz := &sizes[i]
			sz.mollyP50, sz.proxyP50 = append(sz.mollyP50, mp50), append(sz.proxyP50, pp50)
			sz.addP50 = append(sz.addP50, mp50-pp50)
			sz.addP99 = append(sz.addP99, quantile(m, 0.99)-quantile(px, 0.99))
			sz.proxyP99 = append(sz.proxyP99, quantile(px, 0.99))
			sz.ratio = append(sz.ratio, mp50/pp50)
		}
		m, px := p.latencies(b, stream, benchSizes[0].n/2)
		streamAdd = append(streamAdd, quantile(m, 0.5)-quantile(px, 0.5))
		m, px = p.latenciesOf(b, func(i int) []byte { turns++; return turnBody(turns) }, benchSizes[1].n)
		turnAdd, turnProxy = append(turnAdd, quantile(m, 0.5)-quantile(px, 0.5)), append(turnProxy, quantile(px, 0.5))
		// Alternate which path goes first, so neither always follows the
		// other's garbage.
		var mr, pr float64
		if len(thrRatio)%2 == 0 {
			mr = p.burst(b, p.molly, bodies[0], benchBurst)
			pr = p.burst(b, p.proxy, bodies[0], benchBurst)
		} else {
			pr = p.burst(b, p.proxy, bodies[0], benchBurst)
			mr = p.burst(b, p.molly, bodies[0], benchBurst)
		}
		thrRatio, thrMolly, thrProxy = append(thrRatio, mr/pr), append(thrMolly, mr), append(thrProxy, pr)
	}
	var t benchTable
	us := func(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) + "us" }
	s2, s32 := sizes[0], sizes[1]
	t.add(goal(row{name: "chat_2KB_c1.p50_added", value: median(s2.addP50), unit: "us", base: "caddy_p50=" + us(median(s2.proxyP50)), report: "added_p50_us"}, 150))
	t.add(goal(row{name: "chat_2KB_c1.p99_added", value: median(s2.addP99), unit: "us", base: "caddy_p99=" + us(median(s2.proxyP99)), report: "added_p99_us"}, 300))
	t.add(goal(row{name: "chat_2KB_c1.latency_ratio", value: median(s2.ratio), unit: "x", base: "caddy_p50", report: "latency_ratio"}, 1.5))
	t.add(row{name: "chat_2KB_c1.molly_p50", value: median(s2.mollyP50), unit: "us"})
	t.add(goal(row{name: "chat_32KB_c1.p50_added", value: median(s32.addP50), unit: "us", base: "caddy_p50=" + us(median(s32.proxyP50)), report: "added_32KB_p50_us"}, 1000))
	t.add(row{name: "stream_2KB_c1.p50_added", value: median(streamAdd), unit: "us"})
	t.add(row{name: "turn_34KB_c1.p50_added", value: median(turnAdd), unit: "us", base: "caddy_p50=" + us(median(turnProxy))})
	perKB := make([]float64, len(benchSizes))
	for i, s := range benchSizes {
		perKB[i] = median(sizes[i].addP50) / float64(s.kb)
		t.add(row{name: fmt.Sprintf("cost_per_KB.%dKB", s.kb), value: perKB[i], unit: "us/KB", base: "caddy_p50=" + us(median(sizes[i].proxyP50))})
	}
	// Linear growth: a KB of a 256 KB prompt costs no more than a KB of a
	// 32 KB one, give or take a quarter (fixed costs make small prompts
	// dearer per KB, never cheaper).
	lin := row{name: "cost_per_KB.256KB_over_32KB", value: perKB[2] / perKB[1], unit: "x"}
	t.add(goal(lin, 1.25))
	t.add(goal(row{name: "throughput_16c.ratio", value: median(thrRatio), unit: "x", base: fmt.Sprintf("caddy=%.0freq/s", median(thrProxy)), higher: true, report: "throughput_ratio"}, 0.6))
	t.add(row{name: "throughput_16c.molly", value: median(thrMolly), unit: "req/s", higher: true})
	ma, mb := p.allocs(b, p.molly, bodies[0], 200)
	pa, pb := p.allocs(b, p.proxy, bodies[0], 200)
	t.add(row{name: "allocs_2KB.added", value: ma - pa, unit: "allocs/req", base: fmt.Sprintf("caddy=%.0f", pa), report: "added_allocs/req"})
	t.add(row{name: "alloc_bytes_2KB.added", value: (mb - pb) / 1024, unit: "KB/req", base: fmt.Sprintf("caddy=%.1fKB", pb/1024)})
	return t
}

// Detector inputs: a mixed prompt (prose, code and paragraphs dense with
// personal data, about one in four); the adversarial shapes, built to make
// detectors work hard, are internal/adversarial's, the list of redaction's
// BenchmarkScan.
const (
	densePara = `Hi, I'm writing about my order ORD-2024-118734 placed on 2024-03-15 (version 1.4.2 of the app).
Please refund card 4111 1111 1111 1111 or send the money to IBAN IT60 X054 2811 1010 0000 0123 456.
You can reach me at mario.rossi@example.it or +39 333 123 4567; my colleague is on (415) 555-2671.
Il mio codice fiscale è RSSMRA85T10A562S e il server è 192.168.1.10. The API key is sk-proj-Zx8kQ2mP9vLr4TfW7yBn3HcJ5dGs1aE6 — please keep it safe.
`
	prosePara = `The scheduler groups active sequences by adapter set, then decodes each group's tokens in one
batch; in our tests on 2 cores the p99 latency stayed under 120 ms for 16 concurrent requests. Use
the access token from the settings page, not the key in the example config (see section 4.2, step 3).
func (s *Server) Handle(w http.ResponseWriter, r *http.Request) { if err := s.auth(r); err != nil { return } }
Il modello è stato quantizzato a 4 bit e occupa circa 3,8 GB; la versione 0.17.4 supporta gli adattatori.
`
)

func repeatTo(p string, size int) string {
	return strings.Repeat(p, size/len(p)+1)[:size]
}

// threadCPU is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID); the
// caller holds runtime.LockOSThread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// mbPerCoreSecond runs scan over text reps times on one locked thread and
// returns the median throughput in MB/s of that thread's CPU time.
func mbPerCoreSecond(text string, reps int, scan func(string)) float64 {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	scan(text) // warm
	rates := make([]float64, reps)
	for i := range rates {
		rates[i] = scanRate(text, scan)
	}
	return median(rates)
}

// scanRate is one scan of text in MB/s of the calling (locked) thread's CPU
// time.
func scanRate(text string, scan func(string)) float64 {
	// A collection finished now does not start during the scan, whose
	// thread would otherwise be charged its mark assists.
	runtime.GC()
	c0 := threadCPU()
	scan(text)
	return float64(len(text)) / 1e6 / max((threadCPU()-c0).Seconds(), 1e-9)
}

// slowdown scans prose and shape in reps interleaved pairs (alternating
// which goes first) on one locked thread and returns the median of the
// pairs' prose/shape time ratios and the shape's median MB/s: each ratio
// compares two scans made moments apart, so a change of clock or cache
// between pairs does not enter it.
func slowdown(prose, shape string, reps int, scan func(string)) (ratio, rate float64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	scan(prose) // warm
	scan(shape)
	ratios, rates := make([]float64, reps), make([]float64, reps)
	for i := range reps {
		var p, a float64
		if i%2 == 0 {
			p, a = scanRate(prose, scan), scanRate(shape, scan)
		} else {
			a, p = scanRate(shape, scan), scanRate(prose, scan)
		}
		ratios[i], rates[i] = p/a, a
	}
	return median(ratios), median(rates)
}

// detectors adds the detector rows: redaction's public Scanner with every
// built-in detector on a 1 MB mixed prompt, next to one plain regular
// expression (an e-mail pattern, RE2) over the same text; then each
// adversarial shape (256 KB) and its slowdown against 256 KB of prose.
func (t *benchTable) detectors(b *testing.B) {
	sc, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		b.Fatal(err)
	}
	scan := func(s string) { sc.Scan(s) }
	var mixed strings.Builder
	for mixed.Len() < 1<<20 {
		mixed.WriteString(prosePara)
		mixed.WriteString(prosePara)
		mixed.WriteString(densePara)
		mixed.WriteString(prosePara)
	}
	text := mixed.String()[:1<<20]
	re := regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`)
	reRate := mbPerCoreSecond(text, 5, func(s string) { re.FindAllStringIndex(s, -1) })
	t.add(goal(row{name: "detect.mixed_1MB", value: mbPerCoreSecond(text, 5, scan), unit: "MB/s", higher: true,
		base: fmt.Sprintf("regex=%.1fMB/s", reRate), report: "detect_MB/s"}, 100))
	t.add(row{name: "detect.regex_baseline_1MB", value: reRate, unit: "MB/s", higher: true})
	prose := repeatTo(prosePara, 256<<10)
	t.add(row{name: "detect.prose_256KB", value: mbPerCoreSecond(prose, 7, scan), unit: "MB/s", higher: true})
	for _, a := range adversarial.Shapes {
		ratio, rate := slowdown(prose, repeatTo(a.Unit, 256<<10), 9, scan)
		t.add(row{name: "detect.adversarial." + a.Name, value: rate, unit: "MB/s", higher: true,
			base: fmt.Sprintf("prose/this=%.2fx", ratio)})
		r := goal(row{value: ratio}, 3)
		t.rows[len(t.rows)-1].goal, t.rows[len(t.rows)-1].met = "prose/this"+r.goal, r.met
	}
}

// benchFormat is the first line of bench/latest.txt (docs/benchmarks.md).
const benchFormat = "# molly bench v1"

// write prints the table: a header line naming the format, the time, the
// machine and the rounds, a column header, then one metric per line with
// whitespace-separated fields: metric, value, unit, baseline, goal, met.
func (t *benchTable) write(w io.Writer, rounds int) {
	fmt.Fprintf(w, "%s %s %s/%s cpus=%d rounds=%d %s\n", benchFormat, time.Now().UTC().Format(time.RFC3339),
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), rounds, runtime.Version())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "# metric\tvalue\tunit\tbaseline\tgoal\tmet")
	for _, r := range t.rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.name, strconv.FormatFloat(r.value, 'f', 2, 64), r.unit, r.base, r.goal, r.met)
	}
	tw.Flush()
}

// compare prints, for every metric also in prev (an earlier bench/latest.txt),
// the new value over the old and whether that is worse by more than 10%.
func (t *benchTable) compare(prev []byte) string {
	old := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(prev))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			old[f[0]] = v
		}
	}
	var out bytes.Buffer
	fmt.Fprintln(&out, "# against the previous run (bench/latest.txt): new/old")
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "# metric\told\tnew\tnew/old\tverdict")
	for _, r := range t.rows {
		o, ok := old[r.name]
		if !ok || o == 0 {
			continue
		}
		ratio := r.value / o
		verdict := "same"
		worse := ratio > 1.1
		better := ratio < 1/1.1
		if r.higher {
			worse, better = better, worse
		}
		// Added latencies near zero swing by large ratios: judge them by
		// the absolute change too.
		if r.unit == "us" && abs(r.value-o) < 20 {
			worse, better = false, false
		}
		switch {
		case worse:
			verdict = "WORSE"
		case better:
			verdict = "better"
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%s\n", r.name, o, r.value, ratio, verdict)
	}
	tw.Flush()
	return out.String()
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
