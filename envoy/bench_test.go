package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
)

// benchBody is a 2 KB chat request of public text.
func benchBody() []byte {
	words := strings.Fields("please summarise the following notes about the quarterly planning meeting and list the open questions for the team")
	var sb strings.Builder
	for i := 0; sb.Len() < 1900; i++ {
		sb.WriteString(words[i%len(words)])
		sb.WriteByte(' ')
	}
	b, _ := json.Marshal(map[string]any{"model": "chat", "max_tokens": 64, "messages": []any{
		map[string]any{"role": "system", "content": "You are a helpful assistant."}, map[string]any{"role": "user", "content": sb.String()}}})
	return b
}

// cannedAnswer is the upstream's answer the benchmark's Envoy passes back.
var cannedAnswer = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"Here is the summary."}}],"usage":{"prompt_tokens":420,"completion_tokens":6,"total_tokens":426}}`)

// decision is one ext_proc exchange as Envoy makes it in FULL_DUPLEX_STREAMED
// mode for a whole answer: request headers and body, Molly's decision
// (the headers and the rewritten body), then the answer's headers and body
// and Molly's restored answer.
func (f *fleet) decision(ctx context.Context, body []byte) error {
	st, err := f.client.Process(ctx)
	if err != nil {
		return err
	}
	mode := extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	hdr := headerMap(map[string]string{":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json"})
	msgs := []*extprocv3.ProcessingRequest{
		{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, ResponseBodyMode: mode},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			return err
		}
	}
	for { // the headers' answer, then the body until its end
		r, err := st.Recv()
		if err != nil {
			return err
		}
		if r.GetImmediateResponse() != nil {
			return fmt.Errorf("answered immediately: %s", r.GetImmediateResponse().GetBody())
		}
		if r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	rh := headerMap(map[string]string{":status": "200", "content-type": "application/json"})
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: rh}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: cannedAnswer, EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			return err
		}
	}
	for {
		r, err := st.Recv()
		if err != nil {
			return err
		}
		if r.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetEndOfStream() {
			break
		}
	}
	if err := st.CloseSend(); err != nil {
		return err
	}
	if _, err := st.Recv(); err != io.EOF {
		return fmt.Errorf("the stream did not end: %v", err)
	}
	return nil
}

// BenchmarkPolicyPoint measures the ext_proc policy point — decisions per
// second per core and their p99, for a 2 KB chat body, each decision being
// Envoy's whole exchange with Molly over loopback gRPC (classify, policy,
// plan, dispatch; then the answer restored and metered) — next to the
// in-Caddy pipeline in the same run: the same parts serving the same body
// as Molly's HTTP handler chain (molly_classify → molly_policy →
// molly_route) over loopback HTTP, with a loopback upstream. Both run with
// GOMAXPROCS concurrent clients, in alternating rounds.
func BenchmarkPolicyPoint(b *testing.B) {
	targets := []*route.Target{{Name: "external", Tier: "T3", Models: []string{"chat=gpt-4o-mini"}, PriceIn: 0.15, PriceOut: 0.6}}
	f := startFleet(b, fleetOptions{targets: targets, ups: []string{"external"}})
	cl := f.pp.Classifier
	anon := &identity.Identity{Member: "anonymous"}
	gateway := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, aerr := openai.EndpointOf(r.Method, r.URL.Path)
		if aerr != nil {
			aerr.Write(w)
			return
		}
		body, _ := io.ReadAll(r.Body)
		a, err := cl.Classify(classify.Input{Endpoint: ep, Path: r.URL.Path, Body: body})
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		r = r.WithContext(identity.With(r.Context(), anon))
		d := f.pipeline.Decide(r.Context(), a, anon)
		if !d.Decision().Allowed() {
			pipeline.PolicyError(d.Decision()).Write(w)
			return
		}
		if err := f.pipeline.Serve(w, r, a, d); err != nil {
			openai.WriteError(w, err)
		}
	}))
	b.Cleanup(gateway.Close)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	body := benchBody()
	caddy := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateway.URL+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != 200 {
			return fmt.Errorf("in-Caddy pipeline: %d %v", resp.StatusCode, err)
		}
		return nil
	}
	extproc := func(ctx context.Context) error { return f.decision(ctx, body) }
	for _, op := range []func(context.Context) error{extproc, caddy} { // warm both paths
		if err := op(context.Background()); err != nil {
			b.Fatal(err)
		}
	}

	clients := runtime.GOMAXPROCS(0)
	type result struct {
		d   time.Duration
		lat []time.Duration
	}
	burst := func(op func(context.Context) error, n int, into *result) {
		var next atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		start := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var lat []time.Duration
				for next.Add(1) <= int64(n) {
					t0 := time.Now()
					if err := op(context.Background()); err != nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
						return
					}
					lat = append(lat, time.Since(t0))
				}
				mu.Lock()
				into.lat = append(into.lat, lat...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		into.d += time.Since(start)
		if firstErr != nil {
			b.Fatal(firstErr)
		}
	}
	var ext, cad result
	round := 8 * clients
	b.ResetTimer()
	for done, i := 0, 0; done < b.N; i++ {
		n := min(round, b.N-done)
		if i%2 == 0 {
			burst(extproc, n, &ext)
			burst(caddy, n, &cad)
		} else {
			burst(caddy, n, &cad)
			burst(extproc, n, &ext)
		}
		done += n
	}
	b.StopTimer()
	p99 := func(lat []time.Duration) float64 {
		slices.Sort(lat)
		return float64(lat[(len(lat)*99)/100].Microseconds())
	}
	perCore := func(r result) float64 { return float64(b.N) / r.d.Seconds() / float64(clients) }
	b.ReportMetric(perCore(ext), "extproc_decisions/s/core")
	b.ReportMetric(p99(ext.lat), "extproc_p99_us")
	b.ReportMetric(perCore(cad), "caddy_req/s/core")
	b.ReportMetric(p99(cad.lat), "caddy_p99_us")
	b.ReportMetric(perCore(ext)/perCore(cad), "extproc/caddy")
	if b.N > 100 {
		fmt.Printf("ext_proc policy point: %.0f decisions/s/core, p99 %.0fµs; in-Caddy pipeline: %.0f req/s/core, p99 %.0fµs (2 KB chat body, %d cores)\n",
			perCore(ext), p99(ext.lat), perCore(cad), p99(cad.lat), clients)
	}
}
