package federation

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/molly-gateway/molly/learning/adapters"
	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/lora"
	"github.com/molly-gateway/molly/serving"
)

// slices of one synthetic domain, "orders": each participant sees one
// kind of question about orders.
var slicesOf = []struct{ q, a string }{
	{"Refund status for order #%04d?", "Order #%04d was refunded; allow 3 days."},
	{"Where is order #%04d now?", "Order #%04d ships from Leeds on Monday."},
	{"Can I return order #%04d?", "Order #%04d can be returned within 30 days."},
}

func slicePairs(s, from, n int) []eval.Pair {
	var out []eval.Pair
	for i := range n {
		id := 1000*(s+1) + 37*(from+i)
		out = append(out, eval.Pair{Messages: []eval.Message{{Role: "user", Content: fmt.Sprintf(slicesOf[s].q, id)}},
			Answer: fmt.Sprintf(slicesOf[s].a, id)})
	}
	return out
}

// fixture is the generated base, an evaluator and three participants'
// locally trained adapters.
type fixture struct {
	dir, model string
	m          *lora.Model
	ev         *eval.Evaluator
	base       Base
	train      [][]eval.Pair
	held       [][]lora.Example
	union      []lora.Example
	local      []*lora.Adapter
	localPath  []string
	samples    []int64
}

var (
	fixOnce sync.Once
	fix     *fixture
	fixErr  error
)

const (
	trainPerSlice = 24
	heldPerSlice  = 8
)

func getFixture(t *testing.T) *fixture {
	t.Helper()
	fixOnce.Do(func() { fix, fixErr = buildFixture() })
	if fixErr != nil {
		t.Fatal(fixErr)
	}
	return fix
}

func buildFixture() (*fixture, error) {
	dir, err := os.MkdirTemp("", "molly-federation-")
	if err != nil {
		return nil, err
	}
	if err := serving.WriteDemo(dir, 7, "tiny"); err != nil {
		return nil, err
	}
	f := &fixture{dir: dir, model: filepath.Join(dir, serving.DemoModelFile)}
	if f.m, err = lora.LoadModel(f.model); err != nil {
		return nil, err
	}
	if f.ev, err = eval.Open(f.model); err != nil {
		return nil, err
	}
	b, err := adapters.BaseOf(f.model)
	if err != nil {
		return nil, err
	}
	f.base = Base{Arch: f.m.Arch, Checksum: b.Checksum, Quant: b.Quant}
	for s := range slicesOf {
		tr := slicePairs(s, 0, trainPerSlice)
		he, err := f.ev.EncodeAll(slicePairs(s, trainPerSlice, heldPerSlice))
		if err != nil {
			return nil, err
		}
		exs, err := f.ev.EncodeAll(tr)
		if err != nil {
			return nil, err
		}
		res, err := lora.Train(context.Background(), f.m, exs, lora.Options{Rank: 4, Steps: 40, BatchSize: 8, LR: 1e-2, Seed: uint64(s + 1)})
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, fmt.Sprintf("local-%d.gguf", s))
		if err := res.Adapter.WriteGGUF(p, f.m, "orders"); err != nil {
			return nil, err
		}
		f.train = append(f.train, tr)
		f.held = append(f.held, he)
		f.union = append(f.union, he...)
		f.local = append(f.local, res.Adapter)
		f.localPath = append(f.localPath, p)
		f.samples = append(f.samples, int64(len(exs)))
	}
	return f, nil
}

// recorder keeps every byte of the requests it carries, as the
// participant wrote them (before TLS).
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	sent bytes.Buffer
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "%s %s\n", req.Method, req.URL)
	req.Header.Write(&buf)
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body.Close()
		buf.Write(b)
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	r.mu.Lock()
	r.sent.Write(buf.Bytes())
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

// federation is an aggregator behind a mutual-TLS test server and the
// CA its peers' certificates come from.
type federation struct {
	agg *Aggregator
	srv *httptest.Server
	pki *pki
}

func startFederation(t *testing.T, cfg AggregatorConfig) *federation {
	t.Helper()
	p := newPKI(t, "molly federation test CA")
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	agg, err := NewAggregator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ServerTLS(p.issue("aggregator"))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(agg.Handler())
	srv.TLS = tc
	srv.StartTLS()
	t.Cleanup(func() { srv.Close(); agg.Close() })
	return &federation{agg: agg, srv: srv, pki: p}
}

// participant is a Participant with its own certificate named name
// (issued by ca, default the federation's) and a recording transport.
func (f *federation) participant(t *testing.T, name string, ca *pki, dp *DP) (*Participant, *recorder) {
	t.Helper()
	if ca == nil {
		ca = f.pki
	}
	files := ca.issue(name)
	files.CA = f.pki.ca // trust the aggregator's CA
	tc, err := ClientTLS(files)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{next: &http.Transport{TLSClientConfig: tc}}
	p, err := NewParticipant(ParticipantConfig{Aggregator: f.srv.URL, Client: &http.Client{Transport: rec, Timeout: time.Minute},
		DP: dp, StatePath: filepath.Join(t.TempDir(), "federation.json"), Rand: SeededRand(uint64(len(name)))})
	if err != nil {
		t.Fatal(err)
	}
	return p, rec
}

// client is a plain HTTP client with a certificate named name of the
// federation's CA, for requests the Participant would not make.
func (f *federation) client(t *testing.T, name string) *http.Client {
	t.Helper()
	tc, err := ClientTLS(f.pki.issue(name))
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: time.Minute}
}
