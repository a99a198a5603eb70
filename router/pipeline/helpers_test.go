package pipeline

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/policytest"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/egress"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

var (
	scannerOnce sync.Once
	scannerVal  *redaction.Scanner
	scannerErr  error
)

func testScanner(tb testing.TB) *redaction.Scanner {
	tb.Helper()
	scannerOnce.Do(func() { scannerVal, scannerErr = redaction.NewScanner(redaction.Config{}) })
	if scannerErr != nil {
		tb.Fatalf("NewScanner: %v", scannerErr)
	}
	return scannerVal
}

func testClassifier(tb testing.TB) *classify.Classifier {
	tb.Helper()
	return classify.New(testScanner(tb), nil)
}

// setup is one gateway under test; zero fields take the defaults.
type setup struct {
	targets []*route.Target
	engine  *serving.Engine      // serves kind engine targets
	policy  *policies.Engine     // nil: the embedded default policies
	cls     *classify.Classifier // nil: the default classifier
	id      *identity.Identity   // the caller molly_auth would put in the context; nil: none
	edit    func(*Pipeline)      // strategies, priors, metrics, logger, tools...
}

// startGateway serves the walk of the Caddy modules — molly_classify,
// molly_policy, molly_route — in one handler, without Caddy: enough to
// test the pipeline as clients see it.
func startGateway(t *testing.T, s setup) (*httptest.Server, *Pipeline) {
	t.Helper()
	var (
		models  route.Engine
		handler http.Handler
	)
	if s.engine != nil {
		models, handler = s.engine, s.engine
	}
	cat, err := route.NewCatalogue(s.targets, models)
	if err != nil {
		t.Fatalf("NewCatalogue: %v", err)
	}
	eg, err := egress.New(cat, handler)
	if err != nil {
		t.Fatalf("egress.New: %v", err)
	}
	t.Cleanup(eg.Close)
	if s.policy == nil {
		s.policy = policytest.Default(t)
	}
	if s.cls == nil {
		s.cls = testClassifier(t)
	}
	p := &Pipeline{Catalogue: cat, Egress: eg, Policy: s.policy, Weights: route.DefaultWeights}
	if s.edit != nil {
		s.edit(p)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ep, aerr := openai.EndpointOf(r.Method, r.URL.Path)
		if aerr != nil {
			aerr.Write(w)
			return
		}
		body, _ := io.ReadAll(r.Body)
		a, err := s.cls.Classify(classify.Input{Endpoint: ep, Path: r.URL.Path, Body: body,
			Declared: strings.Join(r.Header.Values("X-Molly-Sensitivity"), ","), Residency: strings.Join(r.Header.Values("X-Molly-Residency"), ",")})
		if err != nil {
			openai.WriteError(w, err)
			return
		}
		ctx := classify.WithAnnotation(r.Context(), a)
		if s.id != nil {
			ctx = identity.With(ctx, s.id)
		}
		d := p.Decide(ctx, classify.From(ctx), identity.From(ctx))
		w.Header().Set(HeaderDecisionID, d.Decision().ID())
		if !d.Decision().Allowed() {
			p.Denied(a, d, identity.From(ctx)).Write(w)
			return
		}
		ctx = WithDecided(ctx, d)
		got, ok := DecidedFrom(ctx)
		if !ok {
			t.Error("the decision is not in the context")
		}
		if err := p.Serve(w, r.WithContext(ctx), classify.From(ctx), got); err != nil {
			openai.WriteError(w, err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, p
}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, body string, header ...string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func get(t *testing.T, url string) reply {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func chatBody(prompt string) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + prompt + `"}]}`
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

// sseContent joins the content deltas of an SSE body that ends with
// [DONE], read with the relay's decoder.
func sseContent(t *testing.T, body string) string {
	t.Helper()
	var b strings.Builder
	done := false
	d := relay.NewDecoder(strings.NewReader(body))
	for {
		ev, err := d.Next()
		if err != nil {
			break
		}
		if ev.IsDone() {
			done = true
			continue
		}
		b.WriteString(gjson.GetBytes(ev.Data, "choices.0.delta.content").String())
	}
	if !done {
		t.Fatalf("stream without [DONE]: %s", body)
	}
	return b.String()
}

// failing is an upstream that answers every request with status.
func failing(t *testing.T, status int) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":{"message":"no","type":"server_error","param":null,"code":null}}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// memLedger keeps recorded usage in memory; recorded, when set, gets each
// record as it is made.
type memLedger struct {
	mu       sync.Mutex
	got      []meter.Usage
	recorded chan meter.Usage
}

func (l *memLedger) Record(_ context.Context, u meter.Usage) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, u)
	if l.recorded != nil {
		l.recorded <- u
	}
	return nil
}

func (l *memLedger) take() []meter.Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.got
	l.got = nil
	return out
}

// metricValue is the value of the counter name (or the sample count of
// the histogram name) with exactly labels, 0 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	return 0
}

// seriesOf counts the label sets of the metric name.
func seriesOf(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return len(f.GetMetric())
		}
	}
	return 0
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
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 2, 2048, 1
	e, err := serving.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	return e
}

func writeFile(dir, name, content string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600)
}
