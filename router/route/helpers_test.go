package route

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/serving"
)

var (
	scannerOnce sync.Once
	scannerVal  *redaction.Scanner
	scannerErr  error
)

func testClassifier(tb testing.TB, opts ...classify.Option) *classify.Classifier {
	tb.Helper()
	scannerOnce.Do(func() { scannerVal, scannerErr = redaction.NewScanner(redaction.Config{}) })
	if scannerErr != nil {
		tb.Fatalf("NewScanner: %v", scannerErr)
	}
	return classify.New(scannerVal, nil, opts...)
}

// request describes a request of exactly promptTokens estimated prompt
// tokens: a chat message (or embeddings input) of text padded with "a"
// (ceil(runes/4) tokens, plus 3 for the message and 3 for the reply).
type request struct {
	ep           openai.Endpoint
	model        string
	maxTokens    int    // 0: unset
	n            int    // 0: unset
	stream       bool   //
	text         string // the start of the prompt, which decides the task
	image        bool   // add an image part with the 15-rune URL https://x/y.png (4 tokens)
	promptTokens int    // 0: 1000
}

func (r request) body() string {
	tokens := r.promptTokens
	if tokens == 0 {
		tokens = 1000
	}
	model := r.model
	if model == "" {
		model = "m"
	}
	var b strings.Builder
	b.WriteString(`{"model":"` + model + `"`)
	if r.maxTokens > 0 {
		b.WriteString(`,"max_tokens":` + strconv.Itoa(r.maxTokens))
	}
	if r.n > 0 {
		b.WriteString(`,"n":` + strconv.Itoa(r.n))
	}
	if r.stream {
		b.WriteString(`,"stream":true`)
	}
	if r.ep == openai.EndpointEmbeddings {
		b.WriteString(`,"input":"` + pad(r.text, 4*tokens) + `"}`)
		return b.String()
	}
	content := tokens - 6
	if r.image {
		content -= 4
		b.WriteString(`,"messages":[{"role":"user","content":[{"type":"text","text":"` + pad(r.text, 4*content) +
			`"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`)
		return b.String()
	}
	b.WriteString(`,"messages":[{"role":"user","content":"` + pad(r.text, 4*content) + `"}]}`)
	return b.String()
}

func pad(text string, runes int) string {
	return text + strings.Repeat("a", runes-len([]rune(text)))
}

// annotate classifies r with cls (the default classifier when nil) and
// checks the prompt size it was built for.
func annotate(tb testing.TB, cls *classify.Classifier, r request) *classify.Annotation {
	tb.Helper()
	if cls == nil {
		cls = testClassifier(tb)
	}
	if r.ep == "" {
		r.ep = openai.EndpointChat
	}
	a, err := cls.Classify(classify.Input{Endpoint: r.ep, Body: []byte(r.body())})
	if err != nil {
		tb.Fatalf("Classify: %v", err)
	}
	want := r.promptTokens
	if want == 0 {
		want = 1000
	}
	if a.PromptTokens() != want {
		tb.Fatalf("the test request has %d prompt tokens, want %d", a.PromptTokens(), want)
	}
	return a
}

// decision is what a real policy engine whose route decision is the
// literal d decides about a.
func decision(tb testing.TB, a *classify.Annotation, d map[string]any) *policies.Decision {
	tb.Helper()
	return policytest.Literal(tb, d).Decide(context.Background(), policies.Input{Subject: a}).Decision()
}

var allTiers = []string{"T0", "T1", "T2", "T3"}

func allow(tiers []string, extra map[string]any) map[string]any {
	return policytest.Allow(tiers, nil, extra)
}

func newCatalogue(tb testing.TB, targets ...*Target) *Catalogue {
	tb.Helper()
	c, err := NewCatalogue(targets, nil)
	if err != nil {
		tb.Fatalf("NewCatalogue: %v", err)
	}
	return c
}

// demoEngine is the real T0 engine on the generated demo model: it serves
// "molly-demo" and one adapter per serving.DemoAdapters name.
func demoEngine(tb testing.TB) *serving.Engine {
	tb.Helper()
	dir := tb.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		tb.Fatal(err)
	}
	cfg := serving.DemoConfig(dir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 1, 2048, 1 // room for the 1500-token requests of the tests
	e, err := serving.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	return e
}
