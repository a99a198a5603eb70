package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/tidwall/gjson"
)

// worstCase is an OpenAI-compatible model that always spends all it may:
// every choice is max_tokens long (the larger of max_tokens and
// max_completion_tokens, as an upstream reading either may; 1000 tokens when
// the request sets no limit, like a model that talks until its context
// ends), n and best_of choices for each prompt of a completions prompt array,
// usage reported honestly by the worst tokenizer there is — a
// prompt token per byte of message content (a token per id of a token
// prompt), four times Molly's estimate for English and twelve times for
// Chinese. It embeds too (/v1/embeddings, one vector per input). A
// chat request asking for logprobs gets -5 per token, so a cascade always
// escalates. It keeps its own ledger of what it answered, by member (the
// request's "user", else the prompt's "<member>:" prefix): the test's
// oracle, independent of Molly's.
type worstCase struct {
	srv      *httptest.Server
	priceIn  float64 // USD per 1M tokens, as configured for its target
	priceOut float64
	failOn   string // a prompt containing it gets 500

	mu      sync.Mutex
	answers []spent
}

type spent struct {
	member             string
	prompt, completion int
	at                 time.Time
}

func startWorstCase(t *testing.T, priceIn, priceOut float64, failOn string) *worstCase {
	m := &worstCase{priceIn: priceIn, priceOut: priceOut, failOn: failOn}
	m.srv = httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *worstCase) URL() string { return m.srv.URL + "/v1" }

// byteTokens is the most tokens a byte-level tokenizer gives s.
func byteTokens(s string) int { return len(s) }

func (m *worstCase) serve(w http.ResponseWriter, r *http.Request) {
	var body json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	b := []byte(body)
	text, prompt, prompts := "", 0, 1
	if r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/embeddings" {
		// A string, token ids, or an array of either: one completion (or
		// embedding) per string or token array, as OpenAI's API makes.
		field := gjson.GetBytes(b, "prompt")
		if r.URL.Path == "/v1/embeddings" {
			field = gjson.GetBytes(b, "input")
		}
		elems := field.Array()
		switch {
		case !field.IsArray():
			text = field.String()
			prompt = byteTokens(text)
		case len(elems) > 0 && (elems[0].Type == gjson.String || elems[0].IsArray()):
			prompts = len(elems)
			for _, e := range elems {
				if e.IsArray() {
					prompt += len(e.Array())
				} else {
					prompt += byteTokens(e.Str)
				}
			}
			text = elems[0].Str
		default:
			prompt = len(elems) // one prompt of token ids
		}
	} else {
		for _, msg := range gjson.GetBytes(b, "messages").Array() {
			prompt += byteTokens(msg.Get("content").String())
			if msg.Get("role").Str == "user" {
				text = msg.Get("content").String()
			}
		}
	}
	if m.failOn != "" && strings.Contains(text, m.failOn) {
		http.Error(w, `{"error":{"message":"boom","type":"server_error"}}`, 500)
		return
	}
	member, _, _ := strings.Cut(text, ":")
	if u := gjson.GetBytes(b, "user"); u.Str != "" {
		member = u.Str // prompts without text (token ids) name their member here
	}
	// Upstreams differ in which of the two limits they read (Ollama's
	// OpenAI API reads max_tokens alone): the worst reads the larger.
	per := max(int(gjson.GetBytes(b, "max_completion_tokens").Int()), int(gjson.GetBytes(b, "max_tokens").Int()))
	if per == 0 {
		per = 1000
	}
	choices := max(int(gjson.GetBytes(b, "n").Int()), int(gjson.GetBytes(b, "best_of").Int()), 1) * prompts
	completion := per * choices
	if r.URL.Path == "/v1/embeddings" {
		completion = 0
	}
	m.mu.Lock()
	m.answers = append(m.answers, spent{member: member, prompt: prompt, completion: completion, at: time.Now()})
	m.mu.Unlock()
	usage := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	if r.URL.Path == "/v1/embeddings" {
		var data []any
		for i := range prompts {
			data = append(data, map[string]any{"object": "embedding", "index": i, "embedding": []float64{0.6, 0.8}})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "model": "m", "usage": map[string]any{"prompt_tokens": prompt, "total_tokens": prompt}})
		return
	}
	n := max(int(gjson.GetBytes(b, "n").Int()), 1)
	chat := r.URL.Path == "/v1/chat/completions"
	if !chat {
		n *= prompts
	}
	if gjson.GetBytes(b, "stream").Bool() {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			var ch map[string]any
			if chat {
				ch = map[string]any{"index": i, "delta": map[string]any{"role": "assistant", "content": "word"}, "finish_reason": "length"}
			} else {
				ch = map[string]any{"index": i, "text": "word", "finish_reason": "length"}
			}
			chunk, _ := json.Marshal(map[string]any{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []any{ch}})
			fmt.Fprintf(w, "data: %s\n\n", chunk)
		}
		if gjson.GetBytes(b, "stream_options.include_usage").Bool() {
			chunk, _ := json.Marshal(map[string]any{"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": []any{}, "usage": usage})
			fmt.Fprintf(w, "data: %s\n\n", chunk)
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	var out []any
	for i := range n {
		if chat {
			var lp any
			if gjson.GetBytes(b, "logprobs").Bool() {
				lp = map[string]any{"content": []any{map[string]any{"token": "word", "logprob": -5.0, "bytes": []int{119, 111, 114, 100}, "top_logprobs": []any{}}}}
			}
			out = append(out, map[string]any{"index": i, "finish_reason": "length", "logprobs": lp, "message": map[string]any{"role": "assistant", "content": "word"}})
		} else {
			out = append(out, map[string]any{"index": i, "finish_reason": "length", "text": "word", "logprobs": nil})
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "x", "object": "chat.completion", "created": 1, "model": "m", "choices": out, "usage": usage})
}

// spend is what member's answers cost at this model's prices, in USD, and
// their tokens by answer time.
func (m *worstCase) spend(member string) (usd float64, tokens []spent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, a := range m.answers {
		if a.member == member {
			usd += (float64(a.prompt)*m.priceIn + float64(a.completion)*m.priceOut) / 1e6
			tokens = append(tokens, a)
		}
	}
	return usd, tokens
}

// maxMinute is the most tokens answered in any 60 s window.
func maxMinute(tokens []spent) int {
	slices.SortFunc(tokens, func(a, b spent) int { return a.at.Compare(b.at) })
	best, sum, lo := 0, 0, 0
	for _, a := range tokens {
		sum += a.prompt + a.completion
		for a.at.Sub(tokens[lo].at) >= time.Minute {
			sum -= tokens[lo].prompt + tokens[lo].completion
			lo++
		}
		best = max(best, sum)
	}
	return best
}

// TestNoRequestShapeOvershootsABudgetOrATPM is the admission property
// end to end: 50 concurrent clients (openai-go, no retries) send generated
// request shapes — chat and completions, streamed or not, n up to 8,
// best_of, max_tokens unset to 600, long and short prompts in English,
// Chinese and emoji (counted by the upstreams a token per byte), some failing
// on their first target — through the real gateway, whose non-streamed
// chat requests cascade over two targets. Upstreams that always spend the
// most they may count what they answered: alice's spend at the targets'
// prices never exceeds her budget and bob's tokens in any minute never
// exceed his TPM, while both got answers and 429s. Molly's ledger agrees
// with the upstreams' to the nano-USD.
func TestNoRequestShapeOvershootsABudgetOrATPM(t *testing.T) {
	const (
		budget  = 1.5  // USD, alice
		tpm     = 9000 // tokens, bob
		clients = 50
		each    = 8
		seed    = 13
	)
	lan := startWorstCase(t, 100, 100, "FAIL500")
	remote := startWorstCase(t, 150, 150, "")
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		cascade {
			threshold -1
			max_attempts 2
		}
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=m davinci=m
			price 100 100
			quality 0.9
			# Admission is under test, not health: the FAIL500 prompts
			# must not eject lan (nor a loaded machine's slow answers).
			outlier_detection off
		}
		target remote {
			tier T2
			endpoint `+remote.URL()+`
			models chat=m davinci=m
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
	for _, m := range []map[string]any{{"name": "alice", "budget_usd": budget}, {"name": "bob", "tpm": tpm}} {
		if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", m); code != http.StatusCreated {
			t.Fatalf("member %v: %d %s", m, code, body)
		}
	}
	keys := map[string]string{}
	for _, m := range []string{"alice", "bob"} {
		keys[m], _ = newKey(t, admin, m)
	}

	var mu sync.Mutex
	outcomes := map[string]map[string]int{"alice": {}, "bob": {}}
	var wg sync.WaitGroup
	for i := range clients {
		member := []string{"alice", "bob"}[i%2]
		c := keyClient(g, keys[member])
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				// English, Chinese and emoji: the estimate is several times short of
				// what the upstream counts for the last two.
				words := strings.Repeat([]string{"lorem ipsum ", "请联系客服 ", "😀👍🇫🇷 "}[rng.IntN(3)], 1+rng.IntN(60))
				if rng.IntN(10) == 0 {
					words += " FAIL500"
				}
				prompt := member + ": " + words
				n := []int64{1, 1, 1, 2, 3, 8}[rng.IntN(6)]
				maxTokens := []int64{0, 1, 8, 64, 256, 600}[rng.IntN(6)]
				stream := rng.IntN(10) < 3
				err := askShape(c, rng.IntN(5) == 0, prompt, n, maxTokens, stream, rng.IntN(2) == 0)
				outcome := "200"
				var apiErr *openai.Error
				switch {
				case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusServiceUnavailable && strings.Contains(words, "FAIL500") &&
					strings.Contains(apiErr.Message, "over the remaining budget"):
					// lan fails FAIL500 prompts, and the fallback was left out
					// of the plan because it no longer fit the budget: a
					// failed upstream, not an overshoot.
					outcome = "503 fallback over budget"
				case errors.As(err, &apiErr):
					outcome = fmt.Sprintf("%d %s", apiErr.StatusCode, apiErr.Code)
				case err != nil:
					outcome = "error: " + err.Error()
				}
				mu.Lock()
				outcomes[member][outcome]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("outcomes: %v", outcomes)
	for member, got := range outcomes {
		for o := range got {
			if o != "200" && o != "429 insufficient_quota" && o != "429 rate_limit_exceeded" && (o != "503 fallback over budget" || member != "alice") {
				t.Errorf("%s: %d requests got %s", member, got[o], o)
			}
		}
	}
	if outcomes["alice"]["200"] == 0 || outcomes["alice"]["429 insufficient_quota"] == 0 || outcomes["bob"]["200"] == 0 || outcomes["bob"]["429 rate_limit_exceeded"] == 0 {
		t.Fatalf("the shapes did not reach both limits: %v", outcomes)
	}
	lanUSD, lanTok := lan.spend("alice")
	remoteUSD, remoteTok := remote.spend("alice")
	aliceUSD := lanUSD + remoteUSD
	_, bobLan := lan.spend("bob")
	_, bobRemote := remote.spend("bob")
	bobMinute := maxMinute(append(bobLan, bobRemote...))
	t.Logf("alice spent %.6f of %.2f USD over %d answers; bob's busiest minute %d of %d tokens", aliceUSD, budget, len(lanTok)+len(remoteTok), bobMinute, tpm)
	if aliceUSD > budget+1e-9 {
		t.Errorf("alice's answers cost %.9f USD at the targets' prices, over her budget %.2f", aliceUSD, budget)
	}
	if bobMinute > tpm {
		t.Errorf("bob got %d tokens in one minute, over his TPM %d", bobMinute, tpm)
	}
	if aliceUSD < budget/2 || bobMinute < tpm/2 {
		t.Errorf("the load did not press on the limits: %.6f USD, %d tokens", aliceUSD, bobMinute)
	}
	// Molly's book of record says the same, once every record is in.
	var s usageSummary
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s = usageOf(t, admin, "alice")
		if math.Abs(s.SpentUSD-aliceUSD) < 1e-9*float64(len(lanTok)+len(remoteTok)+1) || time.Now().After(deadline) {
			break
		}
	}
	if math.Abs(s.SpentUSD-aliceUSD) >= 1e-9*float64(len(lanTok)+len(remoteTok)+1) {
		t.Errorf("Molly's ledger has alice at %.9f USD, the upstreams at %.9f", s.SpentUSD, aliceUSD)
	}
}

// askShape sends one generated request: chat or completions (with best_of when
// bestOf), streamed or not; the stream is read to its end.
func askShape(c *openai.Client, completions bool, prompt string, n, maxTokens int64, stream, bestOf bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if completions {
		p := openai.CompletionNewParams{Model: "davinci", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)}, N: openai.Int(n)}
		if maxTokens > 0 {
			p.MaxTokens = openai.Int(maxTokens)
		}
		if bestOf && !stream {
			p.BestOf = openai.Int(n + 1)
		}
		if stream {
			s := c.Completions.NewStreaming(ctx, p)
			for s.Next() {
			}
			return s.Err()
		}
		_, err := c.Completions.New(ctx, p)
		return err
	}
	p := openai.ChatCompletionNewParams{Model: "chat", N: openai.Int(n), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)}}
	if maxTokens > 0 {
		p.MaxTokens = openai.Int(maxTokens)
	}
	if stream {
		s := c.Chat.Completions.NewStreaming(ctx, p)
		for s.Next() {
		}
		return s.Err()
	}
	_, err := c.Chat.Completions.New(ctx, p)
	return err
}

// TestBatchShapesReserveEveryAnswer sends, member by member, one request
// shape again and again until the budget refuses it, to an upstream that
// spends all it may: a completions prompt array (one completion per
// prompt, as OpenAI's API and vLLM make), an array of token-id prompts, a
// chat request setting both max_completion_tokens and a larger max_tokens
// (an upstream may read either), embeddings of an input array, and a chat
// request with a PDF file part (whose base64 the upstream counts a token a
// byte, as the worst tokenizer reads the JSON it got). What the
// upstream answered, at the target's prices, never exceeds the member's
// budget, and each member got an answer before its 429 insufficient_quota.
func TestBatchShapesReserveEveryAnswer(t *testing.T) {
	up := startWorstCase(t, 100, 100, "")
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint `+up.URL()+`
			models chat=m davinci=m emb=m
			modalities text image file
			price 100 100
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
	var prompts, idPrompts, inputs []any
	for i := range 20 {
		prompts = append(prompts, "carol: lorem ipsum")
		ids := []int{}
		for j := range 10 {
			ids = append(ids, 100+i+j)
		}
		idPrompts = append(idPrompts, ids)
	}
	for range 30 {
		inputs = append(inputs, "frank: some text")
	}
	// a PDF's base64: providers read its pages' text and images, a token
	// or more per byte of it
	pdf := strings.Repeat("JVBERi0xLjcKJcfs", 375)
	shapes := []struct {
		member string
		budget float64
		path   string
		body   map[string]any
	}{
		{"carol", 0.2, "/completions", map[string]any{"model": "davinci", "prompt": prompts, "max_tokens": 50}},
		{"dave", 0.23, "/completions", map[string]any{"model": "davinci", "prompt": idPrompts, "max_tokens": 50, "user": "dave"}},
		{"erin", 0.06, "/chat/completions", map[string]any{"model": "chat", "max_completion_tokens": 1, "max_tokens": 400,
			"messages": []any{map[string]any{"role": "user", "content": "erin: hi"}}}},
		{"frank", 0.15, "/embeddings", map[string]any{"model": "emb", "input": inputs, "user": "frank"}},
		{"gina", 1.0, "/chat/completions", map[string]any{"model": "chat", "max_tokens": 10, "user": "gina",
			"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "gina: summarise"},
				map[string]any{"type": "file", "file": map[string]any{"filename": "report.pdf", "file_data": "data:application/pdf;base64," + pdf}}}}}}},
	}
	for _, s := range shapes {
		t.Run(s.member, func(t *testing.T) {
			if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": s.member, "budget_usd": s.budget}); code != http.StatusCreated {
				t.Fatalf("member: %d %s", code, body)
			}
			key, _ := newKey(t, admin, s.member)
			raw, _ := json.Marshal(s.body)
			answered := 0
			for i := 0; ; i++ {
				if i == 20 {
					t.Fatalf("20 requests and no 429: %d answered", answered)
				}
				req, _ := http.NewRequest(http.MethodPost, g.URL+s.path, strings.NewReader(string(raw)))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests && gjson.GetBytes(out, "error.code").Str == "insufficient_quota" {
					break
				}
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, out)
				}
				answered++
			}
			usd, _ := up.spend(s.member)
			t.Logf("%d answered, %.6f of %.2f USD", answered, usd, s.budget)
			if answered == 0 {
				t.Errorf("the first request was refused: the shape's reservation is over its budget %.2f on its own", s.budget)
			}
			if usd > s.budget+1e-9 {
				t.Errorf("the upstream answered %.6f USD for %s, over the budget %.2f", usd, s.member, s.budget)
			}
		})
	}
}
