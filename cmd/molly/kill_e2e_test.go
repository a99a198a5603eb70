package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/registry/sqlite"
)

// childOf returns the pids of the processes whose parent is ppid and
// whose executable is exe, from /proc.
func childOf(ppid int, exe string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after its ')'.
		i := strings.LastIndexByte(string(stat), ')')
		f := strings.Fields(string(stat)[i+1:])
		if len(f) < 2 || f[1] != strconv.Itoa(ppid) {
			continue
		}
		if path, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && path == exe {
			out = append(out, pid)
		}
	}
	return out
}

// burst is clients sending chat requests (streamed and not) to one
// gateway until stopped, keeping the decision id of every answer they got
// in full: what the gateway acknowledged.
type burst struct {
	mu     sync.Mutex
	acks   []string
	failed int
	stop   chan struct{}
	wg     sync.WaitGroup
}

func startBurst(g *gateway, clients int, prefix string) *burst {
	b := &burst{stop: make(chan struct{})}
	for i := range clients {
		c := openai.NewClient(option.WithBaseURL(g.URL), option.WithAPIKey("unused"), option.WithMaxRetries(0), option.WithRequestTimeout(10*time.Second))
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			for n := 0; ; n++ {
				select {
				case <-b.stop:
					return
				default:
				}
				var resp *http.Response
				p := chat(fmt.Sprintf("%s client %d request %d", prefix, i, n))
				var err error
				if n%2 == 0 {
					_, err = c.Chat.Completions.New(context.Background(), p, option.WithResponseInto(&resp))
				} else {
					s := c.Chat.Completions.NewStreaming(context.Background(), p, option.WithResponseInto(&resp))
					for s.Next() {
					}
					err = s.Err()
				}
				b.mu.Lock()
				if err == nil && resp != nil && resp.Header.Get("X-Molly-Decision-Id") != "" {
					b.acks = append(b.acks, resp.Header.Get("X-Molly-Decision-Id"))
				} else {
					b.failed++
				}
				b.mu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond) // the gateway is down: do not spin
				}
			}
		}()
	}
	return b
}

func (b *burst) count() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.acks) }

// waitFor waits until the burst has n acknowledged answers.
func (b *burst) waitFor(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); b.count() < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the burst got %d answers, waiting for %d", b.count(), n)
		}
	}
}

func (b *burst) end() { close(b.stop); b.wg.Wait() }

// ledgerRow is one usage record as both ledgers hold it.
type ledgerRow struct {
	id, member, model, tier, target string
	prompt, completion, nusd, at    int64
}

// TestBillingEqualsTheGatewayAfterKillsDuringBursts is the kill -9
// test through the real gateway: clients send bursts of chat requests
// (whole and streamed) while the billing plugin is killed with SIGKILL
// twice per round and then the gateway itself is killed with SIGKILL
// mid-burst and started again, for several rounds. At the end the
// billing plugin's ledger equals the gateway's registry record for record,
// and every answer a client got in full is in both.
func TestBillingEqualsTheGatewayAfterKillsDuringBursts(t *testing.T) {
	billing, billingSum := pluginBin(t, "billing")
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	dir := t.TempDir()
	regPath, billingDB := filepath.Join(dir, "registry", "molly.db"), filepath.Join(dir, "billing.db")
	admin := adminSocket(t)
	cfg := `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		registry ` + regPath + `
		tool billing {
			path ` + billing + `
			sha256 ` + billingSum + `
			env MOLLY_BILLING_DB ` + billingDB + `
		}
		usage_tool billing
		target lan {
			tier T1
			endpoint ` + lan.URL() + `
			models chat=small-lan
			price 10 10
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	var acked []string
	pluginKills, gatewayKills, failed := 0, 0, 0
	for round := range rounds {
		g := startMolly(t, cfg)
		gpid := g.cmd.Process.Pid
		b := startBurst(g, 6, fmt.Sprintf("round %d", round))
		killed := 0
		for k := range 2 {
			b.waitFor(t, 40*(k+1))
			var pids []int
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if pids = childOf(gpid, billing); len(pids) == 1 && pids[0] != killed {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: no billing plugin (other than %d) under the gateway: %v", round, killed, pids)
				}
			}
			if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			killed = pids[0]
			pluginKills++
		}
		b.waitFor(t, 120)
		if err := g.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = g.cmd.Wait()
		gatewayKills++
		b.end()
		acked = append(acked, b.acks...)
		failed += b.failed
		for deadline := time.Now().Add(10 * time.Second); len(childOf(1, billing))+len(childOf(gpid, billing)) > 0; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				break // an orphaned plugin only adds a writer to its SQLite file
			}
		}
	}

	// The last gateway delivers what is pending (claims of the killed ones
	// lapse first), then stops cleanly, and its plugin with it.
	g := startMolly(t, cfg)
	rdb, err := sqlite.Open(regPath, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var pending, failedRows int
		if err := rdb.QueryRow(`SELECT COUNT(CASE WHEN state = 'pending' THEN 1 END), COUNT(CASE WHEN state = 'failed' THEN 1 END) FROM outbox`).Scan(&pending, &failedRows); err != nil {
			t.Fatal(err)
		}
		if failedRows != 0 {
			t.Fatalf("%d records failed delivery", failedRows)
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records still pending after 120 s", pending)
		}
	}
	gpid := g.cmd.Process.Pid
	_ = g.cmd.Process.Signal(syscall.SIGINT)
	_ = g.cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); len(childOf(gpid, billing))+len(childOf(1, billing)) > 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the billing plugin outlived the gateway")
		}
	}
	var resent int
	if err := rdb.QueryRow(`SELECT COUNT(*) FROM outbox WHERE attempts > 1`).Scan(&resent); err != nil {
		t.Fatal(err)
	}

	reg, err := registry.Open(regPath, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	gateway := map[string]ledgerRow{}
	decisions := map[string]bool{}
	for after := int64(0); ; {
		page, last, err := reg.UsageRecords(context.Background(), after, 500)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, u := range page {
			gateway[u.RecordID] = ledgerRow{u.RecordID, u.Member, u.Model, u.Tier, u.Target, int64(u.PromptTokens), int64(u.CompletionTokens),
				registry.NanoUSD(u.CostUSD), u.Time.UnixMilli()}
			decisions[u.DecisionID] = true
		}
		after = last
	}
	db, err := sqlite.Open(billingDB, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT decision_id, member, model, tier, target, prompt_tokens, completion_tokens, cost_nano_usd, at FROM usage`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	billed := map[string]ledgerRow{}
	for rows.Next() {
		var r ledgerRow
		if err := rows.Scan(&r.id, &r.member, &r.model, &r.tier, &r.target, &r.prompt, &r.completion, &r.nusd, &r.at); err != nil {
			t.Fatal(err)
		}
		if _, dup := billed[r.id]; dup {
			t.Fatalf("record %s is billed twice", r.id)
		}
		billed[r.id] = r
	}
	missingGateway, missingBilling := 0, 0
	for _, id := range acked {
		if !decisions[id] {
			missingGateway++
		}
		if _, ok := billed[id]; !ok {
			missingBilling++
		}
	}
	t.Logf("%d rounds, %d billing plugin kills, %d gateway kills: %d answers acknowledged (%d requests failed while something was down); "+
		"found %d of them in the gateway's ledger and %d in the billing ledger; gateway %d records, billing %d records, %d sent more than once",
		rounds, pluginKills, gatewayKills, len(acked), failed, len(acked)-missingGateway, len(acked)-missingBilling, len(gateway), len(billed), resent)
	if missingGateway != 0 || missingBilling != 0 {
		t.Fatalf("acknowledged answers missing: %d from the gateway's ledger, %d from billing", missingGateway, missingBilling)
	}
	if len(gateway) < len(acked) || !reflect.DeepEqual(gateway, billed) {
		for id, w := range gateway {
			if got, ok := billed[id]; !ok || got != w {
				t.Errorf("record %s: billing %+v, gateway %+v", id, got, w)
			}
		}
		for id := range billed {
			if _, ok := gateway[id]; !ok {
				t.Errorf("billing holds %s, the gateway does not", id)
			}
		}
		t.Fatalf("the billing ledger (%d records) differs from the gateway's (%d)", len(billed), len(gateway))
	}
}
