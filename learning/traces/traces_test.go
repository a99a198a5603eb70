package traces

import (
	"context"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/pipeline"
)

func openRegistry(t *testing.T) *registry.Registry {
	t.Helper()
	reg, err := registry.Open(filepath.Join(t.TempDir(), "molly.db"), registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

// outcome is a consented answered request of member.
func outcome(member string, i int) pipeline.Outcome {
	return pipeline.Outcome{DecisionID: fmt.Sprintf("d%d", i), Member: member, Model: "chat", Task: "math", Label: "routed",
		Attempts: []pipeline.Attempt{{Target: "lan", Tier: "T1", Model: "small-lan", Delivered: true, ScoreKind: "none"}}, Answered: 0,
		Start: time.Now(),
		Text:  &pipeline.TraceText{Request: []byte(`{"messages":[{"role":"user","content":"q` + fmt.Sprint(i) + `"}]}`), Answer: []byte("a" + fmt.Sprint(i))}}
}

// TestConsentPrecedence: the request header wins, then the key's standing
// consent, then the member's; default off.
func TestConsentPrecedence(t *testing.T) {
	reg := openRegistry(t)
	r, err := New(reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	for _, c := range []registry.TraceConsent{
		{Scope: registry.ConsentMember, Name: "alice", Trace: true},
		{Scope: registry.ConsentMember, Name: "bob", Trace: true},
		{Scope: registry.ConsentKey, Name: "mk_bobkey", Trace: false},
	} {
		if err := r.SetConsent(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		header string
		id     *identity.Identity
		want   bool
	}{
		{"member on", "", &identity.Identity{Member: "alice"}, true},
		{"member on, header off", "off", &identity.Identity{Member: "alice"}, false},
		{"key off over member on", "", &identity.Identity{Member: "bob", KeyPrefix: "mk_bobkey"}, false},
		{"header on over key off", "On", &identity.Identity{Member: "bob", KeyPrefix: "mk_bobkey"}, true},
		{"other key of bob: member on", "", &identity.Identity{Member: "bob", KeyPrefix: "mk_other"}, true},
		{"no consent: default off", "", &identity.Identity{Member: "carol"}, false},
		{"anonymous: default off", "", nil, false},
		{"anonymous, header on", "on", nil, true},
		{"a header that is not on/off counts as absent", "yes", &identity.Identity{Member: "carol"}, false},
	} {
		req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		if tc.header != "" {
			req.Header.Set(pipeline.HeaderTrace, tc.header)
		}
		if got := r.Consents(req, tc.id); got != tc.want {
			t.Errorf("%s: consents %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRecordStoresInBatchesAndCountsDrops: recorded traces are stored in
// transactions of at most Batch; while the writer is held, what overflows
// the queue is dropped and counted, and never blocks Record.
func TestRecordStoresInBatchesAndCountsDrops(t *testing.T) {
	reg := openRegistry(t)
	hold, held := make(chan struct{}), make(chan int, 100)
	r, err := New(reg, Options{Queue: 4, Batch: 3, OnStored: func(ids []string) {
		held <- len(ids)
		<-hold
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.Record(outcome("alice", 0))
	select {
	case n := <-held: // the writer is now inside its first batch's OnStored
		if n != 1 {
			t.Fatalf("first batch of %d", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first trace was never stored")
	}
	for i := 1; i <= 7; i++ { // 4 fit the queue, 3 are dropped
		r.Record(outcome("alice", i))
	}
	if s := r.Stats(); s.Dropped != 3 || s.Queued != 4 {
		t.Fatalf("stats %+v, want 3 dropped and 4 queued", s)
	}
	close(hold)
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(held)
	for n := range held {
		if n > 3 {
			t.Fatalf("a batch of %d, over Batch 3", n)
		}
	}
	ts, err := reg.Traces(context.Background(), registry.TraceQuery{})
	if err != nil || len(ts) != 5 {
		t.Fatalf("%d traces stored (%v), want 5", len(ts), err)
	}
	if ts[0].Request == "" || ts[0].Answer != "a0" || ts[0].Category != "math" || ts[0].Tier != "T1" || ts[0].Feedback != -1 {
		t.Fatalf("trace %+v", ts[0])
	}
	if s := r.Stats(); s.Stored != 5 {
		t.Fatalf("stats %+v", s)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestUnredactedFindingsAreWithheld: an outcome whose classifier findings
// were not all redacted for its answering tier is never stored; one whose
// findings were redacted is.
func TestUnredactedFindingsAreWithheld(t *testing.T) {
	reg := openRegistry(t)
	r, err := New(reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	raw := outcome("alice", 1)
	raw.Findings = map[string]int{"api_key": 1}
	redacted := outcome("alice", 2)
	redacted.Findings, redacted.RedactedTypes = map[string]int{"email": 2}, []string{"email"}
	r.Record(raw)
	r.Record(redacted)
	r.Record(pipeline.Outcome{DecisionID: "no-text", Answered: 0, Attempts: raw.Attempts}) // not consented: no text
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts, _ := reg.Traces(context.Background(), registry.TraceQuery{})
	if len(ts) != 1 || ts[0].DecisionID != "d2" {
		t.Fatalf("stored %v, want only the redacted one", ts)
	}
	if s := r.Stats(); s.Withheld != 1 || s.Stored != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// TestPruneAppliesRetention: traces older than the member's retention
// (else the default) are deleted.
func TestPruneAppliesRetention(t *testing.T) {
	reg := openRegistry(t)
	r, err := New(reg, Options{RetentionDays: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	if err := r.SetConsent(ctx, registry.TraceConsent{Scope: registry.ConsentMember, Name: "brief", Trace: true, RetentionDays: 1}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-3 * 24 * time.Hour)
	var ts []registry.Trace
	for i, m := range []string{"brief", "alice"} {
		tr := FromOutcome(outcome(m, i))
		tr.Created = old
		ts = append(ts, tr)
	}
	if _, err := reg.PutTraces(ctx, ts); err != nil {
		t.Fatal(err)
	}
	n, err := r.Prune(ctx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want brief's one", n, err)
	}
	left, _ := reg.Traces(ctx, registry.TraceQuery{})
	if len(left) != 1 || left[0].Member != "alice" {
		t.Fatalf("left %+v", left)
	}
	if n, _ := r.Prune(ctx, time.Now().Add(40*24*time.Hour)); n != 1 {
		t.Fatalf("after the default retention pruned %d, want alice's", n)
	}
}

// TestAKeysConsentGivenByTheWholeKeyStoresItsPrefix: `molly traces consent
// --key` given the key itself (as an operator holding it would) applies to
// that key, and the registry keeps only its prefix: keys are never stored
// in the clear.
func TestAKeysConsentGivenByTheWholeKeyStoresItsPrefix(t *testing.T) {
	reg := openRegistry(t)
	ctx := context.Background()
	if _, _, err := reg.PutMember(ctx, registry.Member{Name: "dana"}); err != nil {
		t.Fatal(err)
	}
	secret, k, err := reg.CreateKey(ctx, "dana", "laptop")
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(reg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := r.SetConsent(ctx, registry.TraceConsent{Scope: registry.ConsentKey, Name: secret, Trace: true}); err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	if !r.Consents(req, &identity.Identity{Member: "dana", KeyPrefix: k.Prefix}) {
		t.Errorf("the key %s… has not consented", k.Prefix)
	}
	cs, err := reg.TraceConsents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 || cs[0].Name != k.Prefix {
		t.Fatalf("stored consents %+v, want one named %s", cs, k.Prefix)
	}
}
