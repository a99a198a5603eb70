package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/jackc/pgx/v5"
	"github.com/openai/openai-go/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/molly-gateway/molly/internal/pgtest"
)

// fleetCaddyfile is a Molly serving a fleet: molly_envoy on grpcPort, the
// three tiers of startTiers (plus extraTargets), admin on the socket admin
// ("unix/<path>", adminSocket).
func fleetCaddyfile(tr *tiers, admin string, grpcPort int, extraTargets string) string {
	return `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		target lan {
			tier T1
			endpoint ` + tr.t1.URL() + `
			models chat=small-lan
			quality 0.6
		}
		target external {
			tier T3
			endpoint ` + tr.t3.URL() + `
			models chat=gpt-4o-mini
			price 0.15 0.6
			quality 0.95
		}
		` + extraTargets + `
	}
	molly_envoy {
		listen 127.0.0.1:` + fmt.Sprint(grpcPort) + `
		refresh 100ms
		classify {
			sensitivity EMAIL public
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`
}

// clusterNames returns the clusters of one CDS response.
func clusterNames(t *testing.T, resp *discoverygrpc.DiscoveryResponse) []string {
	t.Helper()
	var names []string
	for _, a := range resp.GetResources() {
		c := &clusterv3.Cluster{}
		if err := a.UnmarshalTo(c); err != nil {
			t.Fatal(err)
		}
		names = append(names, c.GetName())
	}
	slices.Sort(names) // xDS responses carry resources in no particular order
	return names
}

// TestFleetModeInAMollyProcess runs `molly run` with molly_envoy and talks
// to it as an Envoy does, with go-control-plane's generated clients: ADS
// gives the clusters of the targets, the policy point decides a request
// (the cluster, the body redacted for T3), and a config reload that adds a
// target reaches the open ADS stream as a new version.
func TestFleetModeInAMollyProcess(t *testing.T) {
	tr := startTiers(t)
	adminAddr, grpcPort := adminSocket(t), freePort(t)
	g := startMolly(t, fleetCaddyfile(tr, adminAddr, grpcPort, ""))
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	ads, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	node := &corev3.Node{Id: "envoy-1", UserAgentName: "envoy"}
	if err := ads.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first, err := ads.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(clusterNames(t, first), ","); got != "external,lan" {
		t.Fatalf("clusters %q, want lan,external", got)
	}

	// The policy point: a public prompt with an e-mail address goes to the
	// external cluster, redacted.
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fd := extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	hdr := &corev3.HeaderMap{}
	for k, v := range map[string]string{":method": "POST", ":path": "/v1/chat/completions", ":authority": "gw", "content-type": "application/json"} {
		hdr.Headers = append(hdr.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	body := []byte(`{"model":"chat","messages":[{"role":"user","content":"Write to anna@example.org"}]}`)
	for _, m := range []*extprocv3.ProcessingRequest{
		{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: fd, ResponseBodyMode: fd},
			Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[:20]}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body[20:], EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	cluster := ""
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == "x-molly-cluster" {
			cluster = string(h.GetHeader().GetRawValue())
		}
	}
	if cluster != "external" {
		t.Fatalf("told to route to %q, want external (%v)", cluster, r)
	}
	var sent []byte
	for {
		r, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		sent = append(sent, sr.GetBody()...)
		if sr.GetEndOfStream() {
			break
		}
	}
	if strings.Contains(string(sent), "anna@example.org") || !strings.Contains(string(sent), `"model":"gpt-4o-mini"`) {
		t.Fatalf("the body for T3: %s", sent)
	}
	_ = st.CloseSend()

	// A reload that adds a target is a new snapshot on the open stream.
	cfg := filepath.Join(t.TempDir(), "Caddyfile")
	next := fleetCaddyfile(tr, adminAddr, grpcPort, `target selfhosted {
			tier T2
			endpoint `+tr.t2.URL()+`
			models chat=mid-remote
		}`)
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(next, "{PORT}", strings.TrimSuffix(strings.TrimPrefix(g.URL, "http://127.0.0.1:"), "/v1"))), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mollyBin, "reload", "--config", cfg, "--adapter", "caddyfile", "--address", adminAddr).CombinedOutput(); err != nil {
		t.Fatalf("reload: %v\n%s", err, out)
	}
	if err := ads.Send(&discoverygrpc.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, VersionInfo: first.GetVersionInfo(), ResponseNonce: first.GetNonce()}); err != nil {
		t.Fatal(err)
	}
	second, err := ads.Recv()
	if err != nil {
		t.Fatalf("no update after the reload: %v\nlogs:\n%s", err, g.logs.String())
	}
	if second.GetVersionInfo() == first.GetVersionInfo() || strings.Join(clusterNames(t, second), ",") != "external,lan,selfhosted" {
		t.Fatalf("after the reload: version %s (was %s), clusters %v", second.GetVersionInfo(), first.GetVersionInfo(), clusterNames(t, second))
	}
}

// TestTwoMollysOnOnePostgresRegistrySpendAtMostTheBudget: two Molly
// processes share one registry on a real PostgreSQL server; 50 concurrent
// clients split between them spend one member's budget, and the ledger —
// read with SQL of the test's own, the oracle — never holds more than the
// budget, while the refusals are OpenAI's insufficient_quota.
func TestTwoMollysOnOnePostgresRegistrySpendAtMostTheBudget(t *testing.T) {
	dsn := pgtest.DSN(t)
	tr := startTiers(t)
	adminA, adminB := adminSocket(t), adminSocket(t)
	ga := startMolly(t, authCaddyfile(tr, adminA, dsn, ""))
	gb := startMolly(t, authCaddyfile(tr, adminB, dsn, ""))
	admin := adminA
	const budget = 0.002 // each answer costs 0.0001 USD (5 + 5 tokens at 10 USD per 1M)
	if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": "team", "budget_usd": budget}); code != http.StatusCreated {
		t.Fatalf("creating the member: %d %s", code, body)
	}
	key, _ := newKey(t, admin, "team") // created through A, used through both

	var mu sync.Mutex
	ok, quota := 0, 0
	var wg sync.WaitGroup
	for i := range 50 {
		g := ga
		if i%2 == 1 {
			g = gb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := keyClient(g, key)
			for range 3 {
				p := chat("hello there")
				p.MaxTokens = openai.Int(1)
				_, err := c.Chat.Completions.New(context.Background(), p)
				mu.Lock()
				var apiErr *openai.Error
				switch {
				case err == nil:
					ok++
				case errors.As(err, &apiErr) && apiErr.StatusCode == 429 && apiErr.Code == "insufficient_quota":
					quota++
				default:
					t.Errorf("client %d: %v", i, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// The oracle: the ledger's rows, summed by the database.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var spentNano, records int64
	if err := conn.QueryRow(ctx, `SELECT COALESCE(SUM(cost_nusd), 0)::bigint, COUNT(*) FROM usage WHERE member = 'team'`).Scan(&spentNano, &records); err != nil {
		t.Fatal(err)
	}
	if spentNano > int64(budget*1e9) {
		t.Fatalf("the two gateways spent %d nano-USD of a %d budget", spentNano, int64(budget*1e9))
	}
	if int(records) != ok || quota == 0 || ok == 0 || ok+quota != 150 {
		t.Fatalf("%d answered, %d refused for quota, %d usage records; want every answer recorded and the budget to stop the rest", ok, quota, records)
	}
	t.Logf("%d answered, %d refused: %d of %d nano-USD spent", ok, quota, spentNano, int64(budget*1e9))
}
