package serving

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"testing"
	"text/tabwriter"
	"time"
)

// BenchmarkRemoteDraft measures drafting for a remote engine
// (remotedraft.go): one greedy chat request of 128 tokens to a remote
// engine on the bench model (F16; MOLLY_BENCH_SIZE=small for a quick run)
// behind a loopback HTTP server, answered by the remote itself (plain
// greedy over HTTP) or by a local engine drafting k=4 tokens per verify
// call, in interleaved rounds (MOLLY_BENCH_ROUNDS, default 3), medians of
// tokens/s, with the acceptance rate and tokens committed per verify call.
// Drafts as in BenchmarkSpeculative: the target itself, a Q4_0 copy, the
// first quarter of layers. Both engines share this machine's cores
// (threads split between them), so the figures are what one machine
// shows, not a LAN; answers are checked equal to the remote's.
//
//	go test -run '^$' -bench RemoteDraft -benchtime 1x ./serving/
func BenchmarkRemoteDraft(b *testing.B) {
	size := os.Getenv("MOLLY_BENCH_SIZE")
	if size == "" || size == "tiny" {
		size = "bench"
	}
	target, q4, trunc := specModels(b, size)
	rounds := 3
	if v := os.Getenv("MOLLY_BENCH_ROUNDS"); v != "" {
		fmt.Sscan(v, &rounds)
	}
	const tokens, k = 128, 4
	threads := max(1, (runtime.NumCPU()-1)/2)
	mk := func(model, name string) *Engine {
		e, err := New(Config{ModelPath: model, ModelName: name, NSeqMax: 1, NCtx: 512, Threads: threads})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	remote := mk(target, "target")
	srv := httptest.NewServer(remote)
	b.Cleanup(srv.Close)
	cases := []struct{ name, draft string }{{"remote greedy over HTTP", ""}, {"draft = target", target}, {"draft = Q4_0 copy", q4}, {"draft = truncated layers", trunc}}
	locals := make([]*Engine, len(cases))
	drafts := make([]*RemoteDraft, len(cases))
	for i, c := range cases {
		if c.draft != "" {
			locals[i] = mk(c.draft, "draft")
			drafts[i] = &RemoteDraft{Verifier: &HTTPVerifier{URL: srv.URL + "/molly/engine/verify"}, Tokens: k}
		}
	}
	body, _ := json.Marshal(map[string]any{"model": "target", "temperature": 0, "max_tokens": tokens,
		"messages": []map[string]any{{"role": "user", "content": "Tell me a long story about a benchmark."}}})
	tps := make([][]float64, len(cases))
	want := ""
	for b.Loop() {
		for range rounds {
			for i := range cases {
				start := time.Now()
				var out []byte
				if locals[i] == nil {
					resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
					if err != nil {
						b.Fatal(err)
					}
					var buf bytes.Buffer
					_, _ = buf.ReadFrom(resp.Body)
					resp.Body.Close()
					out = buf.Bytes()
				} else {
					w := httptest.NewRecorder()
					if !locals[i].ServeRemoteDraft(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body)), body, drafts[i]) {
						b.Fatalf("%s: not drafted", cases[i].name)
					}
					out = w.Body.Bytes()
				}
				d := time.Since(start)
				var r chatResponse
				if err := json.Unmarshal(out, &r); err != nil || len(r.Choices) != 1 || r.Usage == nil {
					b.Fatalf("%s: %s", cases[i].name, out)
				}
				text := r.Choices[0].Message.Content
				if want == "" {
					want = text
				} else if text != want {
					b.Fatalf("%s: answer differs from the remote's greedy one", cases[i].name)
				}
				tps[i] = append(tps[i], float64(r.Usage.CompletionTokens)/d.Seconds())
			}
		}
	}
	base := median(tps[0])
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "remote drafting, %s model, k=%d, %d tokens, %d threads per engine, %d rounds (medians)\n", size, k, tokens, threads, rounds)
	fmt.Fprintln(w, "case\ttokens/s\tspeed-up\tacceptance\ttokens/verify")
	for i, c := range cases {
		acc, per := "-", "-"
		if locals[i] != nil {
			st := locals[i].RemoteDraftStats()
			acc = fmt.Sprintf("%.2f", float64(st.Accepted)/float64(st.Proposed))
			per = fmt.Sprintf("%.2f", float64(st.Accepted+st.Rounds)/float64(st.Rounds))
			b.ReportMetric(float64(st.Accepted)/float64(st.Proposed), "accept/"+fmt.Sprint(i))
		}
		fmt.Fprintf(w, "%s\t%.1f\t%.2fx\t%s\t%s\n", c.name, median(tps[i]), median(tps[i])/base, acc, per)
		b.ReportMetric(median(tps[i])/base, "speedup/"+fmt.Sprint(i))
	}
	w.Flush()
}
