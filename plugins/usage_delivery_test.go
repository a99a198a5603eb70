package plugins_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/registry/sqlite"
)

func TestRecordUsageArgs(t *testing.T) {
	u := registry.Usage{RecordID: "d-1:2", Member: "alice", DecisionID: "d-1", Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 5, CompletionTokens: 4,
		CostUSD: 90e-6, Time: time.Date(2026, 11, 30, 10, 0, 0, 5_000_000, time.FixedZone("X", 3600))}
	want := `{"at":"2026-11-30T09:00:00.005Z","completion_tokens":4,"cost_nano_usd":90000,"decision_id":"d-1:2","member":"alice",` +
		`"model":"chat","op":"record_usage","prompt_tokens":5,"target":"lan","tier":"T1"}`
	if got := string(plugins.RecordUsageArgs(u)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestRecordUsageTellsRetriesFromRefusals runs the sink against the real
// billing plugin: a booking and its replay are acknowledged; a record id
// booked with other values, or arguments the tool refuses, are permanent.
func TestRecordUsageTellsRetriesFromRefusals(t *testing.T) {
	m := newManager(t, billingConfig(t))
	sink := plugins.RecordUsage(m, "billing", "molly-gateway")
	ctx := context.Background()
	u := registry.Usage{RecordID: "d-7", Member: "alice", DecisionID: "d-7", Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 5, CompletionTokens: 4,
		CostUSD: 90e-6, Time: time.UnixMilli(1_780_000_000_000)}
	if err := sink(ctx, u); err != nil {
		t.Fatalf("booking: %v", err)
	}
	if err := sink(ctx, u); err != nil {
		t.Fatalf("a redelivery of the same record: %v", err)
	}
	other := u
	other.CostUSD = 91e-6
	if err := sink(ctx, other); !registry.IsPermanent(err) || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("the same record id with another cost: %v, want a permanent conflict", err)
	}
	bad := u
	bad.RecordID, bad.Member = "d-8", "two words"
	if err := sink(ctx, bad); !registry.IsPermanent(err) || !strings.Contains(err.Error(), "invalid_argument") {
		t.Fatalf("a member the tool refuses: %v, want a permanent invalid_argument", err)
	}
	lines := billingUsage(t, m, "alice")
	if len(lines) != 1 || lines[0].Events != 1 || lines[0].CostNanoUSD != 90000 {
		t.Fatalf("billing lines %+v, want one event of 90000 nano-USD", lines)
	}
}

func billingUsage(t *testing.T, m *plugins.Manager, member string) []billingLine {
	t.Helper()
	r, _, err := bill(t, m, "", map[string]any{"op": "usage", "member": member, "month": time.UnixMilli(1_780_000_000_000).UTC().Format("2006-01")})
	if err != nil {
		t.Fatal(err)
	}
	return r.Lines
}

// Environment of the "usagehost" role (runUsageHost).
const (
	hostRegistryEnv = "MOLLY_USAGE_REGISTRY" // registry file
	hostBillingEnv  = "MOLLY_USAGE_BILLING"  // billing binary, then its SHA-256, then its ledger file, space-separated
	hostRecordsEnv  = "MOLLY_USAGE_RECORDS"  // how many requests to record
	hostPrefixEnv   = "MOLLY_USAGE_PREFIX"   // decision id prefix of the records
	hostDrainEnv    = "MOLLY_USAGE_DRAIN"    // "1": once written, wait until the outbox is empty, then exit
	gatewayCaller   = "molly-gateway"        // the caller record_usage is booked by, as the gateway does
	usageSinkName   = "billing"              // the sink and tool name
	hostPace        = 2 * time.Millisecond   // between two requests: a burst a test can kill into
)

// runUsageHost is the "usagehost" role: the usage side of a gateway in its
// own process — a registry, the billing plugin under a Manager and a
// Deliverer with plugins.RecordUsage — writing a burst of usage records.
// It prints "plugin <pid>" whenever the billing plugin (re)starts, "ack
// <record id>" once a record is committed (what a gateway acknowledges to
// its client), and "drained" when the outbox is empty (drain mode).
func runUsageHost() {
	fail := func(err error) { fmt.Println("error", err); os.Exit(1) }
	reg, err := registry.Open(os.Getenv(hostRegistryEnv), registry.Options{})
	if err != nil {
		fail(err)
	}
	b := strings.Fields(os.Getenv(hostBillingEnv))
	m, err := plugins.NewManager([]plugins.Config{{Name: usageSinkName, Path: b[0], SHA256: b[1], Env: map[string]string{"MOLLY_BILLING_DB": b[2]}}},
		plugins.Options{Logger: hclog.NewNullLogger(), HealthInterval: 100 * time.Millisecond, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		fail(err)
	}
	var out sync.Mutex
	say := func(format string, a ...any) { out.Lock(); fmt.Printf(format+"\n", a...); out.Unlock() }
	go func() { // report the plugin's pid, restarts included
		last := 0
		for {
			if pid := m.PIDs()[usageSinkName]; pid != 0 && pid != last {
				say("plugin %d", pid)
				last = pid
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	ctx := context.Background()
	d, err := reg.Deliver(ctx, usageSinkName, plugins.RecordUsage(m, usageSinkName, gatewayCaller), registry.DeliveryOptions{
		Timeout: 2 * time.Second, MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Poll: 50 * time.Millisecond, Claim: 3 * time.Second})
	if err != nil {
		fail(err)
	}
	n, _ := strconv.Atoi(os.Getenv(hostRecordsEnv))
	prefix := os.Getenv(hostPrefixEnv)
	for i := range n {
		// A request's records: a first one, and a second for every third (a cascade's escalation).
		for k := range 1 + btoi(i%3 == 0) {
			id, err := reg.Record(ctx, registry.Usage{Member: fmt.Sprintf("member-%d", i%4), DecisionID: fmt.Sprintf("%s%03d", prefix, i),
				Model: "chat", Target: "lan", Tier: "T1", PromptTokens: 10 + i, CompletionTokens: k + i%7, CostUSD: float64(10+i) * 1.5e-6})
			if err != nil {
				fail(err)
			}
			say("ack %s", id)
		}
		time.Sleep(hostPace)
	}
	if os.Getenv(hostDrainEnv) != "1" {
		select {} // until killed
	}
	for {
		s, err := reg.Outbox(ctx, usageSinkName)
		if err != nil {
			fail(err)
		}
		if s.Pending == 0 {
			if s.Failed != 0 {
				fail(fmt.Errorf("%d records failed", s.Failed))
			}
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	d.Close()
	m.Close()
	reg.Close()
	say("drained")
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// usageHost is a running usagehost process and what it printed.
type usageHost struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	acks   []string
	plugin int
	lines  chan string
	done   chan struct{}
}

func startUsageHost(t *testing.T, env ...string) *usageHost {
	t.Helper()
	cmd := exec.Command(selfBin)
	cmd.Env = append(os.Environ(), append([]string{roleEnv + "=usagehost"}, env...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &usageHost{cmd: cmd, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			h.mu.Lock()
			switch {
			case strings.HasPrefix(line, "ack "):
				h.acks = append(h.acks, strings.TrimPrefix(line, "ack "))
			case strings.HasPrefix(line, "plugin "):
				h.plugin, _ = strconv.Atoi(strings.TrimPrefix(line, "plugin "))
			}
			h.mu.Unlock()
			select {
			case h.lines <- line:
			default:
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return h
}

// waitAcks waits until the host acknowledged at least n records and runs a
// plugin other than not (a killed one), and returns that plugin's pid.
func (h *usageHost) waitAcks(t *testing.T, n, not int) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		h.mu.Lock()
		got, pid := len(h.acks), h.plugin
		h.mu.Unlock()
		if got >= n && pid != 0 && pid != not {
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("the host acknowledged %d records (plugin %d), waiting for %d", got, pid, n)
		}
		select {
		case <-h.lines:
		case <-h.done:
			t.Fatalf("the host exited after %d acknowledgements", got)
		case <-time.After(time.Second):
		}
	}
}

// TestTheBillingLedgerEqualsTheRegistryAfterKills is the kill
// test for the usage path: usage hosts (the gateway's usage side in its own
// process) write bursts of records while the billing plugin is killed with
// SIGKILL again and again, and the hosts themselves are killed with SIGKILL
// mid-burst and started again. In the end the billing ledger holds exactly
// the registry's usage table, record for record, and every record a host
// acknowledged is in both.
func TestTheBillingLedgerEqualsTheRegistryAfterKills(t *testing.T) {
	dir := t.TempDir()
	regPath, billingDB := filepath.Join(dir, "molly.db"), filepath.Join(dir, "billing.db")
	env := []string{hostRegistryEnv + "=" + regPath, hostBillingEnv + "=" + billingBin + " " + billingSum + " " + billingDB}
	rounds, perRound := 4, 60
	if testing.Short() {
		rounds, perRound = 2, 30
	}
	var acked []string
	pluginKills, hostKills := 0, 0
	for round := range rounds {
		h := startUsageHost(t, append(env, hostRecordsEnv+"="+strconv.Itoa(perRound), fmt.Sprintf("%s=r%d-", hostPrefixEnv, round))...)
		// Kill the billing plugin twice during the burst; the manager restarts it.
		killed := 0
		for _, at := range []int{perRound / 4, perRound / 2} {
			pid := h.waitAcks(t, at, killed)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("killing the billing plugin: %v", err)
			}
			killed = pid
			pluginKills++
		}
		// Then kill the host itself, mid-burst: no Close, no acknowledgement stored for what was in flight.
		pid := h.waitAcks(t, 3*perRound/4, killed)
		if err := h.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_ = h.cmd.Wait()
		<-h.done
		hostKills++
		waitGone(t, pid, 10*time.Second) // the plugin follows its host
		h.mu.Lock()
		acked = append(acked, h.acks...)
		h.mu.Unlock()
	}
	// A last host writes nothing and delivers what is pending, then exits.
	final := startUsageHost(t, append(env, hostRecordsEnv+"=0", hostDrainEnv+"=1")...)
	select {
	case <-final.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the last host did not drain the outbox within 60 s")
	}
	if err := final.cmd.Wait(); err != nil {
		t.Fatalf("the last host: %v", err)
	}
	t.Logf("%d rounds: %d plugin kills, %d host kills, %d records acknowledged", rounds, pluginKills, hostKills, len(acked))

	// The registry's usage table, as written.
	reg, err := registry.Open(regPath, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	type row struct {
		id, member, model, tier, target string
		prompt, completion, nusd, at    int64
	}
	want := map[string]row{}
	for after := int64(0); ; {
		page, last, err := reg.UsageRecords(context.Background(), after, 500)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, u := range page {
			want[u.RecordID] = row{u.RecordID, u.Member, u.Model, u.Tier, u.Target, int64(u.PromptTokens), int64(u.CompletionTokens),
				registry.NanoUSD(u.CostUSD), u.Time.UnixMilli()}
		}
		after = last
	}
	for _, id := range acked {
		if _, ok := want[id]; !ok {
			t.Fatalf("record %s was acknowledged but is not in the registry", id)
		}
	}
	if s, err := reg.Outbox(context.Background(), usageSinkName); err != nil || s.Pending != 0 || s.Failed != 0 || s.Delivered != len(want) {
		t.Fatalf("outbox %+v (%v), want all %d delivered", s, err, len(want))
	}
	// The kills made the deliverers send records again (a retry or, after a
	// host kill, a resend): the billing tool's idempotency kept them single.
	rdb, err := sqlite.Open(regPath, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	var resent int
	if err := rdb.QueryRow(`SELECT COUNT(*) FROM outbox WHERE attempts > 1`).Scan(&resent); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d records were sent more than once", resent, len(want))
	if resent == 0 {
		t.Fatal("no record was sent twice: the kills did not exercise redelivery")
	}
	// The billing plugin's ledger, read from its file (the plugin has exited).
	db, err := sqlite.Open(billingDB, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT decision_id, member, model, tier, target, prompt_tokens, completion_tokens, cost_nano_usd, at, recorded_by FROM usage`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]row{}
	for rows.Next() {
		var r row
		var by string
		if err := rows.Scan(&r.id, &r.member, &r.model, &r.tier, &r.target, &r.prompt, &r.completion, &r.nusd, &r.at, &by); err != nil {
			t.Fatal(err)
		}
		if _, dup := got[r.id]; dup {
			t.Fatalf("record %s is booked twice", r.id)
		}
		if by != gatewayCaller {
			t.Fatalf("record %s booked by %q", r.id, by)
		}
		got[r.id] = r
	}
	if err := rows.Err(); err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatal(err)
	}
	if len(want) < len(acked) || len(want) == 0 {
		t.Fatalf("registry holds %d records for %d acknowledged", len(want), len(acked))
	}
	if !reflect.DeepEqual(got, want) {
		for id, w := range want {
			if g, ok := got[id]; !ok || g != w {
				t.Errorf("record %s: billing %+v, registry %+v", id, g, w)
			}
		}
		for id := range got {
			if _, ok := want[id]; !ok {
				t.Errorf("billing holds %s, the registry does not", id)
			}
		}
		t.Fatalf("the billing ledger (%d records) differs from the registry (%d)", len(got), len(want))
	}
}
