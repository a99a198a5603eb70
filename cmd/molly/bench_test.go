package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// DESIGN.md §8: benchmarks report Molly as a ratio against a baseline measured
// in the same run. The baseline is plain Caddy reverse_proxy to the same
// upstream, served by the same in-process Caddy, so both paths share the
// listener, the HTTP stack and the upstream; the difference is what
// molly_classify → molly_policy → molly_route add.
//
// Every op sends one request through each path, in alternating order, so
// machine noise (GC, other processes, CPU frequency) falls on both alike.
// The client and the upstream run in this process too: on a small machine
// they take CPU from both paths alike, which makes the throughput ratio an
// end-to-end figure rather than the gateway's alone.

// benchClients is the number of concurrent clients of the throughput variant.
const benchClients = 16

// benchPair is one in-process Caddy with two servers in front of one upstream.
type benchPair struct {
	molly, proxy string // chat completions URLs
	client       *http.Client
}

// startBenchPair loads a Caddy config with a Molly server (one T1 target) and
// a reverse_proxy server, both in front of one upstreamtest server. Caddy is
// stopped at the end of b.
func startBenchPair(b *testing.B) *benchPair {
	b.Helper()
	// Caddy may touch its storage and config folders; keep them per run.
	b.Setenv("HOME", b.TempDir())
	b.Setenv("XDG_DATA_HOME", b.TempDir())
	b.Setenv("XDG_CONFIG_HOME", b.TempDir())

	up := upstreamtest.Start("t1")
	b.Cleanup(up.Close)
	upHost := strings.TrimSuffix(strings.TrimPrefix(up.URL(), "http://"), "/v1")
	mport, pport := freePort(b), freePort(b)
	// The logs go to discard: Molly still builds its decision and routing
	// lines (their cost is part of the path), they are just not written out.
	caddyfile := fmt.Sprintf(`{
	admin off
	auto_https off
	persist_config off
	log {
		output discard
	}
	molly {
		target lan {
			tier T1
			endpoint %s
			models chat=small-lan
			price 0 0
			latency 300ms
			quality 0.6
		}
	}
}
http://127.0.0.1:%d {
	molly_classify
	molly_policy
	molly_route
}
http://127.0.0.1:%d {
	reverse_proxy %s
}
`, up.URL(), mport, pport, upHost)
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
		client: &http.Client{Transport: tr, Timeout: 30 * time.Second},
	}
	// Both paths must answer, and Molly must have routed the confidential
	// prompt to the T1 target, before anything is timed.
	for _, stream := range []bool{false, true} {
		body := benchBody(stream)
		for i := 0; i < 2*benchClients; i++ {
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
	return p
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

// benchBody is a chat completion of about 2 KB of prose with an email address
// in it, so the detectors do real work and the policy sees a confidential
// request (T0–T1 by default).
func benchBody(stream bool) []byte {
	var sb strings.Builder
	sb.WriteString("Please draft a reply to the customer below. Keep it polite and short, and summarise what we will do next.\n\n")
	para := "Hello team, we have been using the gateway for our internal support assistant for three weeks now. " +
		"Most answers are good, but some replies about invoices arrive late and a few mention the wrong contract dates. " +
		"Could you check the configuration of the routing rules and tell us whether the latency targets are realistic? "
	for sb.Len() < 1700 {
		sb.WriteString(para)
	}
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

// BenchmarkPipelineOverhead measures Molly's full path against plain
// reverse_proxy to the same upstream, and prints the ratios.
func BenchmarkPipelineOverhead(b *testing.B) {
	p := startBenchPair(b)
	var lat, str latencyResult
	var thr throughputResult
	b.Run("chat", func(b *testing.B) { lat = p.benchLatency(b, benchBody(false)) })
	b.Run("stream", func(b *testing.B) { str = p.benchLatency(b, benchBody(true)) })
	b.Run("parallel", func(b *testing.B) { thr = p.benchThroughput(b, benchBody(false)) })
	if b.Failed() || lat.mollyNs == 0 || str.mollyNs == 0 || thr.mollyRPS == 0 {
		return
	}
	fmt.Printf("molly/reverse_proxy: latency ratio %.2f (%+.0fµs/request), stream latency ratio %.2f (%+.0fµs/request), throughput ratio %.2f (%.0f vs %.0f req/s, %d clients)\n",
		lat.ratio(), lat.addedUs(), str.ratio(), str.addedUs(), thr.ratio(), thr.mollyRPS, thr.proxyRPS, benchClients)
}

// latencyResult holds mean latencies in ns per request.
type latencyResult struct{ mollyNs, proxyNs float64 }

func (r latencyResult) ratio() float64   { return r.mollyNs / r.proxyNs }
func (r latencyResult) addedUs() float64 { return (r.mollyNs - r.proxyNs) / 1e3 }

// benchLatency sends body through both paths, one after the other, b.N times.
func (p *benchPair) benchLatency(b *testing.B, body []byte) latencyResult {
	var tm, tp time.Duration
	timed := func(url string, d *time.Duration) {
		start := time.Now()
		if _, err := p.do(url, body); err != nil {
			b.Fatal(err)
		}
		*d += time.Since(start)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			timed(p.molly, &tm)
			timed(p.proxy, &tp)
		} else {
			timed(p.proxy, &tp)
			timed(p.molly, &tm)
		}
	}
	b.StopTimer()
	r := latencyResult{float64(tm) / float64(b.N), float64(tp) / float64(b.N)}
	b.ReportMetric(r.mollyNs, "molly_ns/op")
	b.ReportMetric(r.proxyNs, "proxy_ns/op")
	b.ReportMetric(r.addedUs(), "added_us/op")
	b.ReportMetric(r.ratio(), "latency_ratio")
	return r
}

// throughputResult holds requests per second with benchClients clients.
type throughputResult struct{ mollyRPS, proxyRPS float64 }

func (r throughputResult) ratio() float64 { return r.mollyRPS / r.proxyRPS }

// benchThroughput sends b.N requests through each path with benchClients
// concurrent clients, in alternating rounds (one path at a time, so neither
// competes with the other's load), and compares requests per second.
func (p *benchPair) benchThroughput(b *testing.B, body []byte) throughputResult {
	const round = 4 * benchClients
	burst := func(url string, n int) time.Duration {
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
		return time.Since(start)
	}
	var tm, tp time.Duration
	b.ResetTimer()
	for done, i := 0, 0; done < b.N; i++ {
		n := min(round, b.N-done)
		if i%2 == 0 {
			tm += burst(p.molly, n)
			tp += burst(p.proxy, n)
		} else {
			tp += burst(p.proxy, n)
			tm += burst(p.molly, n)
		}
		done += n
	}
	b.StopTimer()
	r := throughputResult{float64(b.N) / tm.Seconds(), float64(b.N) / tp.Seconds()}
	b.ReportMetric(r.mollyRPS, "molly_req/s")
	b.ReportMetric(r.proxyRPS, "proxy_req/s")
	b.ReportMetric(r.ratio(), "throughput_ratio")
	return r
}
