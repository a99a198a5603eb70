package router

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// forwarderGateway serves classify → default policy → f.Serve, with id (may
// be nil) in the request context as molly_auth puts it there; the request's
// X-Molly-Sensitivity header is honoured.
func forwarderGateway(t *testing.T, f *Forwarder, id *Identity) *httptest.Server {
	t.Helper()
	cls, eng := testClassifier(t), defaultEngine(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, _ := EndpointOf(r.Method, r.URL.Path)
		body, _ := io.ReadAll(r.Body)
		a, err := cls.Classify(ep, body, r.Header.Get("X-Molly-Sensitivity"), "")
		if err != nil {
			api.WriteError(w, err)
			return
		}
		ctx := r.Context()
		if id != nil {
			ctx = WithIdentity(ctx, id)
		}
		d := eng.DecideMap(ctx, PolicyInputFor(a, id, f.Catalogue))
		if err := f.Serve(w, r.WithContext(ctx), a, d); err != nil {
			api.WriteError(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// cascadeTiers starts T1 lan (free, quality 0.5), T2 remote (0.1 USD per
// 1M tokens, 0.6) and T3 cloud (1 USD, 0.9) serving "m", whose answers
// carry logprobs with the given means. Ranked by score: cloud, remote,
// lan; by cost: lan, remote, cloud.
func cascadeTiers(t *testing.T, logprobs [3]float64) ([3]*upstreamtest.Upstream, *Catalogue) {
	t.Helper()
	var ups [3]*upstreamtest.Upstream
	for i, name := range []string{"lan", "remote", "cloud"} {
		ups[i] = upstreamtest.Start(name)
		ups[i].Logprob = logprobs[i]
		t.Cleanup(ups[i].Close)
	}
	cat := newCatalogue(t,
		&Target{Name: "lan", Tier: "T1", Endpoint: ups[0].URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}},
		&Target{Name: "remote", Tier: "T2", Endpoint: ups[1].URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.6}, PriceIn: 0.1, PriceOut: 0.1},
		&Target{Name: "cloud", Tier: "T3", Endpoint: ups[2].URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}, PriceIn: 1, PriceOut: 1},
	)
	return ups, cat
}

func TestCascade(t *testing.T) {
	const prompt = "what is the capital of France?"
	cases := []struct {
		name        string
		cascade     Cascade
		sensitivity string
		logprobs    [3]float64 // lan, remote, cloud
		askLogprobs bool
		wantTarget  string
		wantCascade string
		wantCounts  [3]int  // requests lan, remote, cloud received
		wantLanN    int64   // observations in lan's quality prior
		wantLanQ    float64 // lan's quality prior afterwards
	}{
		{
			name:        "a low-confidence local answer escalates to the next cheapest candidate",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3},
			logprobs:    [3]float64{-3, -0.2, -0.1},
			wantTarget:  "remote",
			wantCascade: "lan/m logprob=-3.00<-1.50 -> remote/m logprob=-0.20",
			wantCounts:  [3]int{1, 1, 0},
			wantLanN:    1, wantLanQ: 0.45, // (1−0.1)·0.5 + 0.1·0
		},
		{
			name:        "a confident local answer does not escalate",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3},
			logprobs:    [3]float64{-0.5, -0.2, -0.1},
			wantTarget:  "lan",
			wantCascade: "lan/m logprob=-0.50",
			wantCounts:  [3]int{1, 0, 0},
			wantLanQ:    0.5,
		},
		{
			name:        "an answer exactly at the threshold is accepted",
			cascade:     Cascade{Threshold: -1.5},
			logprobs:    [3]float64{-1.5, -0.2, -0.1},
			wantTarget:  "lan",
			wantCascade: "lan/m logprob=-1.50",
			wantCounts:  [3]int{1, 0, 0},
			wantLanQ:    0.5,
		},
		{
			name:        "max_attempts bounds the escalations and the last answer is returned",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 2},
			logprobs:    [3]float64{-3, -2, -0.1},
			wantTarget:  "remote",
			wantCascade: "lan/m logprob=-3.00<-1.50 -> remote/m logprob=-2.00",
			wantCounts:  [3]int{1, 1, 0},
			wantLanN:    1, wantLanQ: 0.45,
		},
		{
			name:        "order score tries T3 first when the policy allows it",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, Order: OrderScore},
			logprobs:    [3]float64{-3, -3, -0.1},
			wantTarget:  "cloud",
			wantCascade: "cloud/m logprob=-0.10",
			wantCounts:  [3]int{0, 0, 1},
			wantLanQ:    0.5,
		},
		{
			name:        "a policy allowing T0–T2 never escalates to T3 even when T3 is next by score",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, Order: OrderScore},
			sensitivity: "internal",
			logprobs:    [3]float64{-3, -3, -0.1},
			wantTarget:  "lan",
			wantCascade: "remote/m logprob=-3.00<-1.50 -> lan/m logprob=-3.00",
			wantCounts:  [3]int{1, 1, 0},
			wantLanQ:    0.5, // lan answered last and was not escalated
		},
		{
			name:        "a client asking for logprobs keeps them in the answer",
			cascade:     Cascade{Threshold: -1.5},
			logprobs:    [3]float64{-0.5, -0.2, -0.1},
			askLogprobs: true,
			wantTarget:  "lan",
			wantCascade: "lan/m logprob=-0.50",
			wantCounts:  [3]int{1, 0, 0},
			wantLanQ:    0.5,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ups, cat := cascadeTiers(t, tc.logprobs)
			priors := NewPriors()
			cfg := tc.cascade
			f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Priors: priors, Cascade: &cfg}
			gw := forwarderGateway(t, f, nil)
			body := chatBody(prompt)
			if tc.askLogprobs {
				body = `{"model":"m","logprobs":true,"messages":[{"role":"user","content":"` + prompt + `"}]}`
			}
			var hdr []string
			if tc.sensitivity != "" {
				hdr = []string{"X-Molly-Sensitivity", tc.sensitivity}
			}
			r := post(t, gw.URL+"/v1/chat/completions", body, hdr...)
			if r.status != 200 || r.header.Get(HeaderTarget) != tc.wantTarget {
				t.Fatalf("status %d target %q, want 200 %q: %s", r.status, r.header.Get(HeaderTarget), tc.wantTarget, r.body)
			}
			if got := r.header.Get(HeaderCascade); got != tc.wantCascade {
				t.Errorf("%s = %q, want %q", HeaderCascade, got, tc.wantCascade)
			}
			if got, want := gjson.Get(r.body, "choices.0.message.content").String(), tc.wantTarget+" says: "+prompt; got != want {
				t.Errorf("answer %q, want %q", got, want)
			}
			lp := gjson.Get(r.body, "choices.0.logprobs")
			if tc.askLogprobs != lp.IsObject() {
				t.Errorf("answer logprobs = %s, client asked: %v", lp.Raw, tc.askLogprobs)
			}
			for i, u := range ups {
				if u.Count() != tc.wantCounts[i] {
					t.Errorf("%s received %d requests, want %d", u.Name, u.Count(), tc.wantCounts[i])
				}
				for _, b := range u.Received() {
					if !gjson.GetBytes(b, "logprobs").Bool() {
						t.Errorf("%s was not asked for logprobs: %s", u.Name, b)
					}
				}
			}
			q, n := priors.Quality(PriorKey{Target: "lan", Model: "m", Category: TaskChat}, 0.5)
			if n != tc.wantLanN || math.Abs(q-tc.wantLanQ) > 1e-9 {
				t.Errorf("lan prior = %.4f after %d observations, want %.4f after %d", q, n, tc.wantLanQ, tc.wantLanN)
			}
		})
	}
}

func TestCascadeFallsBackOnFailuresAndRecordsEveryAttempt(t *testing.T) {
	ups, cat := cascadeTiers(t, [3]float64{-3, 0, -0.1})
	ups[1].Close() // remote is down: the escalation goes on to cloud
	ledger := &memLedger{}
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: -1.5, MaxAttempts: 3}}
	gw := forwarderGateway(t, f, &Identity{Member: "alice", Ledger: ledger})
	r := post(t, gw.URL+"/v1/chat/completions", chatBody("what is the capital of France?"))
	if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" {
		t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
	}
	if got, want := r.header.Get(HeaderCascade), "lan/m logprob=-3.00<-1.50 -> remote/m failed -> cloud/m logprob=-0.10"; got != want {
		t.Errorf("%s = %q, want %q", HeaderCascade, got, want)
	}
	got := ledger.take()
	if len(got) != 2 || got[0].Target != "lan" || got[1].Target != "cloud" {
		t.Fatalf("usage recorded %+v, want lan then cloud", got)
	}
	// The fake upstream reports 5 prompt and 5 completion tokens.
	if got[0].CostUSD != 0 || math.Abs(got[1].CostUSD-10.0/1e6) > 1e-12 {
		t.Errorf("costs %v and %v USD, want 0 and 0.00001", got[0].CostUSD, got[1].CostUSD)
	}
}

func TestCascadeAsksAgainWithoutLogprobsWhenRefused(t *testing.T) {
	var bodies []string
	picky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		w.Header().Set("Content-Type", "application/json")
		if gjson.GetBytes(b, "logprobs").Exists() {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"message":"logprobs is not supported with this model","type":"invalid_request_error","param":"logprobs","code":null}}`)
			return
		}
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"picky answer"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)
	}))
	t.Cleanup(picky.Close)
	other := upstreamtest.Start("other")
	t.Cleanup(other.Close)
	cat := newCatalogue(t,
		&Target{Name: "picky", Tier: "T1", Endpoint: picky.URL + "/v1", Models: []string{"m"}},
		&Target{Name: "other", Tier: "T2", Endpoint: other.URL(), Models: []string{"m"}, PriceIn: 1, PriceOut: 1},
	)
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: -1}}
	r := post(t, forwarderGateway(t, f, nil).URL+"/v1/chat/completions", chatBody("hello"))
	if r.status != 200 || r.header.Get(HeaderTarget) != "picky" || gjson.Get(r.body, "choices.0.message.content").String() != "picky answer" {
		t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
	}
	if got, want := r.header.Get(HeaderCascade), "picky/m logprob=none"; got != want {
		t.Errorf("%s = %q, want %q", HeaderCascade, got, want)
	}
	if len(bodies) != 2 || gjson.Get(bodies[1], "logprobs").Exists() || other.Count() != 0 {
		t.Errorf("picky received %q, other %d requests; want a retry without logprobs and no escalation", bodies, other.Count())
	}
}

func TestCascadeSettingsAreValidated(t *testing.T) {
	cases := []struct {
		name    string
		cascade Cascade
		wantErr string
	}{
		{"a negative threshold with defaults is valid", Cascade{Threshold: -1.5}, ""},
		{"a positive threshold is refused", Cascade{Threshold: 0.5}, "threshold 0.5"},
		{"a NaN threshold is refused", Cascade{Threshold: math.NaN()}, "threshold NaN"},
		{"negative max_attempts are refused", Cascade{Threshold: -1, MaxAttempts: -1}, "max_attempts -1"},
		{"an unknown order is refused", Cascade{Threshold: -1, Order: "random"}, `order "random"`},
		{"negative hold_tokens are refused", Cascade{Threshold: -1, HoldTokens: -2}, "hold_tokens -2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cascade.Validate()
			if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestMeanLogprob(t *testing.T) {
	cases := []struct {
		name  string
		body  string
		mean  float64
		count int
	}{
		{"chat logprobs average over every token of every choice",
			`{"choices":[{"logprobs":{"content":[{"logprob":-1},{"logprob":-2}]}},{"logprobs":{"content":[{"logprob":-3}]}}]}`, -2, 3},
		{"completion token_logprobs skip the null of the first token",
			`{"choices":[{"logprobs":{"token_logprobs":[null,-0.5,-1.5]}}]}`, -1, 2},
		{"an answer without logprobs has none", `{"choices":[{"logprobs":null,"message":{"content":"x"}}]}`, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mean, n := MeanLogprob([]byte(tc.body))
			if mean != tc.mean || n != tc.count {
				t.Fatalf("MeanLogprob = %v over %d, want %v over %d", mean, n, tc.mean, tc.count)
			}
		})
	}
}

func TestStripLogprobsNullsEveryChoice(t *testing.T) {
	in := `{"choices":[{"index":0,"logprobs":{"content":[]}},{"index":1,"logprobs":{"content":[]}}]}`
	got := string(stripLogprobs([]byte(in)))
	if want := `{"choices":[{"index":0,"logprobs":null},{"index":1,"logprobs":null}]}`; got != want {
		t.Fatalf("stripLogprobs = %s, want %s", got, want)
	}
}

// streamBody is a streamed chat request for prompt, asking for logprobs
// when logprobs is set.
func streamBody(prompt string, logprobs bool) string {
	lp := ""
	if logprobs {
		lp = `"logprobs":true,`
	}
	return `{"model":"m","stream":true,` + lp + `"messages":[{"role":"user","content":"` + prompt + `"}]}`
}

func TestCascadeStream(t *testing.T) {
	const prompt = "what is the capital of France?"
	cases := []struct {
		name        string
		cascade     Cascade
		sensitivity string
		logprobs    [3]float64 // lan, remote, cloud
		askLogprobs bool
		wantTarget  string
		wantCascade string
		wantCounts  [3]int  // requests lan, remote, cloud received
		wantLanN    int64   // observations in lan's quality prior
		wantLanQ    float64 // lan's quality prior afterwards
	}{
		{
			name:        "a low-confidence held stream escalates to the next cheapest candidate",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, HoldTokens: 2},
			logprobs:    [3]float64{-3, -0.2, -0.1},
			wantTarget:  "remote",
			wantCascade: "lan/m logprob=-3.00<-1.50 -> remote/m logprob=-0.20",
			wantCounts:  [3]int{1, 1, 0},
			wantLanN:    1, wantLanQ: 0.45,
		},
		{
			name:        "a confident held stream is relayed without escalating",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, HoldTokens: 2},
			logprobs:    [3]float64{-0.5, -0.2, -0.1},
			wantTarget:  "lan",
			wantCascade: "lan/m logprob=-0.50",
			wantCounts:  [3]int{1, 0, 0},
			wantLanQ:    0.5,
		},
		{
			name:        "a hold longer than the stream scores and relays the whole stream",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, HoldTokens: 50},
			logprobs:    [3]float64{-0.5, -0.2, -0.1},
			wantTarget:  "lan",
			wantCascade: "lan/m logprob=-0.50",
			wantCounts:  [3]int{1, 0, 0},
			wantLanQ:    0.5,
		},
		{
			name:        "a policy allowing T0–T2 never escalates a stream to T3 even when T3 is next by score",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, Order: OrderScore, HoldTokens: 2},
			sensitivity: "internal",
			logprobs:    [3]float64{-3, -3, -0.1},
			wantTarget:  "lan",
			wantCascade: "remote/m logprob=-3.00<-1.50 -> lan/m logprob=-3.00",
			wantCounts:  [3]int{1, 1, 0},
			wantLanQ:    0.5,
		},
		{
			name:        "a client asking for logprobs keeps them in the stream",
			cascade:     Cascade{Threshold: -1.5, MaxAttempts: 3, HoldTokens: 2},
			logprobs:    [3]float64{-3, -0.2, -0.1},
			askLogprobs: true,
			wantTarget:  "remote",
			wantCascade: "lan/m logprob=-3.00<-1.50 -> remote/m logprob=-0.20",
			wantCounts:  [3]int{1, 1, 0},
			wantLanN:    1, wantLanQ: 0.45,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ups, cat := cascadeTiers(t, tc.logprobs)
			priors := NewPriors()
			cfg := tc.cascade
			f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Priors: priors, Cascade: &cfg}
			var hdr []string
			if tc.sensitivity != "" {
				hdr = []string{"X-Molly-Sensitivity", tc.sensitivity}
			}
			r := post(t, forwarderGateway(t, f, nil).URL+"/v1/chat/completions", streamBody(prompt, tc.askLogprobs), hdr...)
			if r.status != 200 || r.header.Get(HeaderTarget) != tc.wantTarget {
				t.Fatalf("status %d target %q, want 200 %q: %s", r.status, r.header.Get(HeaderTarget), tc.wantTarget, r.body)
			}
			if got := r.header.Get(HeaderCascade); got != tc.wantCascade {
				t.Errorf("%s = %q, want %q", HeaderCascade, got, tc.wantCascade)
			}
			// One coherent stream: the chosen attempt's 4 content chunks and
			// its finish chunk, one [DONE], no usage chunk (not asked for).
			if got, want := sseContent(t, r.body), tc.wantTarget+" says: "+prompt; got != want {
				t.Errorf("streamed answer %q, want %q", got, want)
			}
			var chunks, done, withLogprobs int
			for _, line := range strings.Split(r.body, "\n") {
				data, ok := strings.CutPrefix(line, "data: ")
				switch {
				case !ok:
				case data == "[DONE]":
					done++
				default:
					chunks++
					if len(gjson.Get(data, "choices.0.logprobs.content").Array()) == 1 {
						withLogprobs++
					}
				}
			}
			wantLogprobs := 0
			if tc.askLogprobs {
				wantLogprobs = 4
			}
			if chunks != 5 || done != 1 || withLogprobs != wantLogprobs {
				t.Errorf("stream has %d chunks, %d [DONE], %d with logprobs; want 5, 1, %d:\n%s", chunks, done, withLogprobs, wantLogprobs, r.body)
			}
			for i, u := range ups {
				if u.Count() != tc.wantCounts[i] {
					t.Errorf("%s received %d requests, want %d", u.Name, u.Count(), tc.wantCounts[i])
				}
				for _, b := range u.Received() {
					if !gjson.GetBytes(b, "logprobs").Bool() || !gjson.GetBytes(b, "stream").Bool() {
						t.Errorf("%s was not asked for a stream with logprobs: %s", u.Name, b)
					}
				}
			}
			q, n := priors.Quality(PriorKey{Target: "lan", Model: "m", Category: TaskChat}, 0.5)
			if n != tc.wantLanN || math.Abs(q-tc.wantLanQ) > 1e-9 {
				t.Errorf("lan prior = %.4f after %d observations, want %.4f after %d", q, n, tc.wantLanQ, tc.wantLanN)
			}
		})
	}
}

func TestCascadeStreamIsNotHeldWithoutHoldTokens(t *testing.T) {
	ups, cat := cascadeTiers(t, [3]float64{-3, -0.2, -0.1})
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: -1.5, MaxAttempts: 3}}
	r := post(t, forwarderGateway(t, f, nil).URL+"/v1/chat/completions", streamBody("hello", false))
	if r.status != 200 || r.header.Get(HeaderCascade) != "" || r.header.Get(HeaderTarget) != "cloud" {
		t.Fatalf("status %d target %q cascade %q, want 200 from cloud (best by score) and no cascade", r.status, r.header.Get(HeaderTarget), r.header.Get(HeaderCascade))
	}
	if ups[2].Contains(`"logprobs"`) {
		t.Error("an uncascaded stream was asked for logprobs")
	}
}

func TestCascadeStreamRecordsTheUsageOfAbandonedAttempts(t *testing.T) {
	const prompt = "what is the capital of France?"
	ups, cat := cascadeTiers(t, [3]float64{-3, -3, -0.1})
	ledger := &memLedger{}
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: -1.5, MaxAttempts: 3, HoldTokens: 2}}
	r := post(t, chatURLFor(t, f, ledger), streamBody(prompt, false))
	if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" || sseContent(t, r.body) != "cloud says: "+prompt {
		t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
	}
	if got, want := r.header.Get(HeaderCascade), "lan/m logprob=-3.00<-1.50 -> remote/m logprob=-3.00<-1.50 -> cloud/m logprob=-0.10"; got != want {
		t.Errorf("%s = %q, want %q", HeaderCascade, got, want)
	}
	got := ledger.take()
	if len(got) != 3 || got[0].Target != "lan" || got[1].Target != "remote" || got[2].Target != "cloud" {
		t.Fatalf("usage recorded %+v, want lan, remote, cloud", got)
	}
	// The abandoned streams sent 2 of their 4 chunks ("lan says: what is
	// th") and no usage chunk: their tokens are counted from that text.
	for i, u := range got[:2] {
		held := ups[i].Name + " says: what is th"
		if !u.Estimated || u.PromptTokens <= 0 || u.CompletionTokens != EstimateTokens(held) {
			t.Errorf("%s usage %+v, want estimated with %d completion tokens", u.Target, u, EstimateTokens(held))
		}
	}
	if want := float64(got[1].PromptTokens+got[1].CompletionTokens) * 0.1 / 1e6; got[0].CostUSD != 0 || math.Abs(got[1].CostUSD-want) > 1e-15 {
		t.Errorf("abandoned costs %v and %v USD, want 0 and %v", got[0].CostUSD, got[1].CostUSD, want)
	}
	// The relayed stream's usage chunk: 5 prompt tokens, 4 chunks.
	if u := got[2]; u.Estimated || u.PromptTokens != 5 || u.CompletionTokens != 4 || math.Abs(u.CostUSD-9.0/1e6) > 1e-15 {
		t.Errorf("cloud usage %+v, want 5+4 tokens reported, 0.000009 USD", u)
	}
}

func TestCascadeStreamFallsBackWhenAHeldStreamBreaksOff(t *testing.T) {
	const prompt = "TRUNCATE what is the capital of France?"
	ups, cat := cascadeTiers(t, [3]float64{-0.5, -0.2, -0.1})
	ups[1].Chunks = 1 // remote answers in one chunk, before the fake's truncation point
	ledger := &memLedger{}
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: -1.5, MaxAttempts: 3, HoldTokens: 3}}
	r := post(t, chatURLFor(t, f, ledger), streamBody(prompt, false))
	if r.status != 200 || r.header.Get(HeaderTarget) != "remote" || sseContent(t, r.body) != "remote says: "+prompt {
		t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
	}
	if got, want := r.header.Get(HeaderCascade), "lan/m failed -> remote/m logprob=-0.20"; got != want {
		t.Errorf("%s = %q, want %q", HeaderCascade, got, want)
	}
	if strings.Contains(r.body, "stream_truncated") || strings.Contains(r.body, "lan says") {
		t.Errorf("the broken held stream reached the client:\n%s", r.body)
	}
	if got := ledger.take(); len(got) != 2 || got[0].Target != "lan" || !got[0].Estimated || got[0].CompletionTokens <= 0 || got[1].Target != "remote" {
		t.Errorf("usage recorded %+v, want lan (counted) then remote", got)
	}
}

// chatURLFor is the chat completions URL of a gateway for f whose
// caller "alice" records usage in ledger.
func chatURLFor(t *testing.T, f *Forwarder, ledger *memLedger) string {
	return forwarderGateway(t, f, &Identity{Member: "alice", Ledger: ledger}).URL + "/v1/chat/completions"
}

// TestCascadeKeepsTheAnswerInHandWhenALaterCandidateRefuses checks that a
// 4xx from a candidate asked after an escalation neither reaches the client
// nor ends the cascade.
func TestCascadeKeepsTheAnswerInHandWhenALaterCandidateRefuses(t *testing.T) {
	refuser := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"logprobs not supported","type":"invalid_request_error","param":null,"code":null}}`)
	}))
	t.Cleanup(refuser.Close)
	for _, tc := range []struct {
		name      string
		lastAlive bool
		target    string
		header    string
	}{
		{"a later good candidate answers", true, "cloud", "lan/m logprob=-3.00<-1.50 -> refuser/m HTTP 400 -> cloud/m logprob=-0.10"},
		{"with nothing better the escalated answer is returned", false, "lan", "lan/m logprob=-3.00<-1.50 -> refuser/m HTTP 400 -> cloud/m failed -> lan/m returned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lan, cloud := upstreamtest.Start("lan"), upstreamtest.Start("cloud")
			lan.Logprob, cloud.Logprob = -3, -0.1
			t.Cleanup(lan.Close)
			t.Cleanup(cloud.Close)
			if !tc.lastAlive {
				cloud.Close()
			}
			cat := newCatalogue(t,
				&Target{Name: "lan", Tier: "T1", Endpoint: lan.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.9}},
				&Target{Name: "refuser", Tier: "T2", Endpoint: refuser.URL + "/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.8}},
				&Target{Name: "cloud", Tier: "T3", Endpoint: cloud.URL(), Models: []string{"m"}, Quality: map[string]float64{"default": 0.7}},
			)
			f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: -1.5, MaxAttempts: 3, Order: "score"}}
			r := post(t, forwarderGateway(t, f, nil).URL+"/v1/chat/completions", `{"model":"m","logprobs":true,"messages":[{"role":"user","content":"what is the capital of France?"}]}`)
			if r.status != 200 || r.header.Get(HeaderTarget) != tc.target {
				t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
			}
			if got := r.header.Get(HeaderCascade); got != tc.header {
				t.Errorf("%s = %q, want %q", HeaderCascade, got, tc.header)
			}
		})
	}
}

// TestCascadeSelfCheckScoresAnswersWithoutLogprobs checks the self-check:
// an answer without logprobs is rated by its own target in a follow-up,
// and a low rating escalates.
func TestCascadeSelfCheckScoresAnswersWithoutLogprobs(t *testing.T) {
	rater := func(name, rating string, got *[]string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			*got = append(*got, string(b))
			content := name + " answer"
			if gjson.GetBytes(b, "messages.#(role==\"user\")#.content|@reverse|0").String() == selfCheckQuestion {
				content = rating
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"`+content+`"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	var lanGot, cloudGot []string
	lan, cloud := rater("lan", "3", &lanGot), rater("cloud", "9", &cloudGot)
	cat := newCatalogue(t,
		&Target{Name: "lan", Tier: "T1", Endpoint: lan.URL + "/v1", Models: []string{"m"}},
		&Target{Name: "cloud", Tier: "T2", Endpoint: cloud.URL + "/v1", Models: []string{"m"}, PriceIn: 1, PriceOut: 1},
	)
	f := &Forwarder{Catalogue: cat, Weights: DefaultWeights, Cascade: &Cascade{Threshold: math.Log(0.6), SelfCheck: true}}
	r := post(t, forwarderGateway(t, f, nil).URL+"/v1/chat/completions", chatBody("what is the capital of France?"))
	if r.status != 200 || r.header.Get(HeaderTarget) != "cloud" || gjson.Get(r.body, "choices.0.message.content").String() != "cloud answer" {
		t.Fatalf("status %d target %q: %s", r.status, r.header.Get(HeaderTarget), r.body)
	}
	if got, want := r.header.Get(HeaderCascade), "lan/m selfcheck=-1.20<-0.51 -> cloud/m selfcheck=-0.11"; got != want {
		t.Errorf("%s = %q, want %q", HeaderCascade, got, want)
	}
	if len(lanGot) != 2 {
		t.Fatalf("lan got %d requests, want the question and the self-check", len(lanGot))
	}
	follow := lanGot[1]
	if gjson.Get(follow, "messages.#").Int() != 3 || gjson.Get(follow, "messages.1.content").String() != "lan answer" ||
		gjson.Get(follow, "messages.2.content").String() != selfCheckQuestion || gjson.Get(follow, "logprobs").Exists() || gjson.Get(follow, "stream").Bool() {
		t.Errorf("self-check request %s", follow)
	}
}
