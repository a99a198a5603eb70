package orchestrate

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

var (
	scannerOnce sync.Once
	scannerVal  *redaction.Scanner
	scannerErr  error
)

func testClassifier(tb testing.TB) *classify.Classifier {
	tb.Helper()
	scannerOnce.Do(func() { scannerVal, scannerErr = redaction.NewScanner(redaction.Config{}) })
	if scannerErr != nil {
		tb.Fatal(scannerErr)
	}
	return classify.New(scannerVal, nil)
}

// gateway is the walk of the Caddy modules — classify, policy, route —
// in one handler, with an orchestrator on the pipeline.
type gateway struct {
	url  string
	p    *pipeline.Pipeline
	o    *Orchestrator
	logs *observer.ObservedLogs
}

type setup struct {
	targets []*route.Target
	engine  *serving.Engine
	cfg     Config
	id      *identity.Identity
	edit    func(*pipeline.Pipeline)
	policy  *policies.Engine // nil: the embedded default policies
}

func startGateway(tb testing.TB, s setup) *gateway {
	tb.Helper()
	var (
		models  route.Engine
		handler http.Handler
	)
	if s.engine != nil {
		models, handler = s.engine, s.engine
	}
	cat, err := route.NewCatalogue(s.targets, models)
	if err != nil {
		tb.Fatal(err)
	}
	eg, err := egress.New(cat, handler)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(eg.Close)
	core, logs := observer.New(zap.InfoLevel)
	pol := s.policy
	if pol == nil {
		pol = policytest.Default(tb)
	}
	p := &pipeline.Pipeline{Catalogue: cat, Egress: eg, Policy: pol, Weights: route.DefaultWeights, Logger: zap.New(core)}
	if s.edit != nil {
		s.edit(p)
	}
	o, err := New(p, pol, s.cfg, zap.New(core))
	if err != nil {
		tb.Fatal(err)
	}
	p.Orchestrator = o
	cls := testClassifier(tb)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, aerr := openai.EndpointOf(r.Method, r.URL.Path)
		if aerr != nil {
			aerr.Write(w)
			return
		}
		body, _ := io.ReadAll(r.Body)
		a, err := cls.Classify(classify.Input{Endpoint: ep, Path: r.URL.Path, Body: body, Declared: r.Header.Get("X-Molly-Sensitivity")})
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		ctx := r.Context()
		if s.id != nil {
			ctx = identity.With(ctx, s.id)
		}
		d := p.Decide(ctx, a, identity.From(ctx))
		if !d.Decision().Allowed() {
			pipeline.PolicyError(d.Decision()).Write(w)
			return
		}
		if err := p.Serve(w, r.WithContext(ctx), a, d); err != nil {
			openai.WriteError(w, err)
		}
	}))
	tb.Cleanup(srv.Close)
	return &gateway{url: srv.URL + "/v1/chat/completions", p: p, o: o, logs: logs}
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(tb testing.TB, ctx context.Context, url, body string, header ...string) reply {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

// chat is a chat request for model with one user message.
func chat(model, prompt string, extra ...string) string {
	b, _ := json.Marshal(map[string]any{"model": model, "messages": []any{map[string]any{"role": "user", "content": prompt}}})
	s := string(b)
	for i := 0; i+1 < len(extra); i += 2 {
		s = s[:len(s)-1] + `,"` + extra[i] + `":` + extra[i+1] + `}`
	}
	return s
}

// record is the plan record of the reply, from the store.
func (g *gateway) record(tb testing.TB, r reply) gjson.Result {
	tb.Helper()
	id := r.header.Get(HeaderPlanID)
	b, ok := g.o.Store().JSON(id)
	if !ok {
		tb.Fatalf("no plan record %q (status %d: %s)", id, r.status, r.body)
	}
	return gjson.ParseBytes(b)
}

// call is one request a scripted upstream received.
type call struct {
	body       []byte
	start, end time.Time
	cancelled  bool
}

// scripted is an upstream playing a controller or a specialist: answer
// gives the status, content and finish_reason of each chat request
// (default: 200, "<name>: <last user message>", "stop"); before answering
// it calls hold, which may block (a barrier, a wait for cancellation).
type scripted struct {
	name   string
	srv    *httptest.Server
	answer func(body []byte) (status int, content, finish string)
	hold   func(r *http.Request)

	mu    sync.Mutex
	calls []call
}

func startScripted(tb testing.TB, name string) *scripted {
	tb.Helper()
	s := &scripted{name: name}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	tb.Cleanup(func() { s.srv.CloseClientConnections(); s.srv.Close() })
	return s
}

func (s *scripted) url() string { return s.srv.URL + "/v1" }

func (s *scripted) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	c := call{body: body, start: time.Now()}
	if s.hold != nil {
		s.hold(r)
	}
	c.cancelled = r.Context().Err() != nil
	status, content, finish := http.StatusOK, s.name+": "+lastUser(body), "stop"
	if s.answer != nil {
		status, content, finish = s.answer(body)
	}
	c.end = time.Now()
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	if c.cancelled {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if status/100 != 2 {
		_, _ = io.WriteString(w, `{"error":{"message":"scripted failure","type":"server_error","param":null,"code":null}}`)
		return
	}
	b, _ := json.Marshal(map[string]any{"id": "chatcmpl-x", "object": "chat.completion", "created": time.Now().Unix(), "model": gjson.GetBytes(body, "model").String(),
		"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil,
			"message": map[string]any{"role": "assistant", "content": content, "refusal": nil}}},
		"usage": map[string]any{"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}})
	_, _ = w.Write(b)
}

func (s *scripted) received() []call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]call(nil), s.calls...)
}

// lastUser is the last user message's content of a chat body.
func lastUser(body []byte) string {
	msgs := gjson.GetBytes(body, "messages").Array()
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Get("role").String() == "user" {
			return msgs[i].Get("content").String()
		}
	}
	return ""
}

// target is an OpenAI target on u.
func target(name, tier, url string, quality float64, models ...string) *route.Target {
	return &route.Target{Name: name, Tier: tier, Endpoint: url, Models: models, Quality: map[string]float64{"default": quality}}
}

// controllerAnswering is a T0 controller serving model "planner" that
// answers each planning request with the next of plans (the last one
// again when they run out).
func controllerAnswering(tb testing.TB, plans ...string) (*scripted, *route.Target) {
	tb.Helper()
	c := startScripted(tb, "controller")
	var mu sync.Mutex
	n := 0
	c.answer = func([]byte) (int, string, string) {
		mu.Lock()
		defer mu.Unlock()
		p := plans[min(n, len(plans)-1)]
		n++
		return http.StatusOK, p, "stop"
	}
	return c, target("ctl", "T0", c.url(), 0.5, "planner")
}

// barrier returns a hold that blocks each request until n requests are
// held at once (or the deadline passes), and a channel closed when they
// were.
func barrier(n int, deadline time.Duration) (func(*http.Request), <-chan struct{}) {
	var mu sync.Mutex
	count := 0
	all := make(chan struct{})
	return func(r *http.Request) {
		mu.Lock()
		count++
		if count == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(deadline):
		case <-r.Context().Done():
		}
	}, all
}
