package registry

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// locate returns where a test's registry lives: a new SQLite file, or,
// while TestPostgres runs the generic tests, a new PostgreSQL database.
var locate = func(t *testing.T) string { return filepath.Join(t.TempDir(), "molly.db") }

func open(t *testing.T, path string, c *clock) *Registry {
	t.Helper()
	r, err := Open(path, Options{Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func put(t *testing.T, r *Registry, m Member) Member {
	t.Helper()
	got, _, err := r.PutMember(context.Background(), m)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

var t0 = time.Date(2026, 3, 15, 10, 0, 0, 0, time.UTC)

func TestMembersValidateAndRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	tests := []struct {
		name    string
		m       Member
		wantErr string
	}{
		{"a member with every setting is stored as given", Member{Name: "alice", BudgetUSD: 2.5, Period: PeriodMonth, RPM: 60, TPM: 1000,
			Models: []string{"gpt-4o-mini", "molly-demo:*"}, Tiers: []string{"T0", "T1"}, Tools: []string{"search"}}, ""},
		{"a member without limits is stored", Member{Name: "bob"}, ""},
		{"an empty name is refused", Member{}, "name must be"},
		{"a name with a slash is refused", Member{Name: "a/b"}, "name must be"},
		{"a negative budget is refused", Member{Name: "c", BudgetUSD: -1}, "must not be negative"},
		{"an unknown period is refused", Member{Name: "c", Period: "week"}, `period "week"`},
		{"an unknown tier is refused", Member{Name: "c", Tiers: []string{"T9"}}, `tier "T9"`},
		{"a model name with a space is refused", Member{Name: "c", Models: []string{"a b"}}, "without spaces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stored, created, err := r.PutMember(ctx, tt.m)
			if tt.wantErr != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || !created {
				t.Fatalf("PutMember: created %v, err %v", created, err)
			}
			got, err := r.Member(ctx, tt.m.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, stored) {
				t.Fatalf("read back %+v, stored %+v", got, stored)
			}
			if !got.Created.Equal(t0) {
				t.Fatalf("created %v, want %v", got.Created, t0)
			}
		})
	}
	if m, _ := r.Member(ctx, "alice"); !m.PeriodStart.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("default month period start %v, want the first of the month", m.PeriodStart)
	}
	if _, err := r.Member(ctx, "nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown member: %v", err)
	}
	// Updating keeps the creation time and reports no creation.
	if _, created, err := r.PutMember(ctx, Member{Name: "bob", RPM: 5}); err != nil || created {
		t.Fatalf("update: created %v err %v", created, err)
	}
	if m, _ := r.Member(ctx, "bob"); m.RPM != 5 || !m.Created.Equal(t0) {
		t.Fatalf("updated bob = %+v", m)
	}
	all, err := r.Members(ctx)
	if err != nil || len(all) != 2 || all[0].Name != "alice" || all[1].Name != "bob" {
		t.Fatalf("Members = %+v, %v", all, err)
	}
}

func TestPeriodAt(t *testing.T) {
	jan31 := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name       string
		m          Member
		at         time.Time
		start, end time.Time
	}{
		{"a day period starts at the anchor's time of day", Member{Period: PeriodDay, PeriodStart: time.Date(2026, 3, 1, 6, 0, 0, 0, time.UTC)},
			time.Date(2026, 3, 15, 5, 0, 0, 0, time.UTC), time.Date(2026, 3, 14, 6, 0, 0, 0, time.UTC), time.Date(2026, 3, 15, 6, 0, 0, 0, time.UTC)},
		{"a day period before its anchor rounds down", Member{Period: PeriodDay, PeriodStart: time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC)},
			time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC), time.Date(2026, 3, 8, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)},
		{"a month period anchored on the 31st ends on February's last day", Member{Period: PeriodMonth, PeriodStart: jan31},
			time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC), jan31, time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)},
		{"a month period anchored on the 31st returns to the 31st in March", Member{Period: PeriodMonth, PeriodStart: jan31},
			time.Date(2026, 3, 31, 1, 0, 0, 0, time.UTC), time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)},
		{"a month period a year on", Member{Period: PeriodMonth, PeriodStart: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
			time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 2, 1, 0, 0, 0, 0, time.UTC)},
		{"no period covers all time", Member{}, t0, time.Time{}, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start, end := tt.m.PeriodAt(tt.at)
			if !start.Equal(tt.start) || !end.Equal(tt.end) {
				t.Fatalf("PeriodAt(%v) = [%v, %v), want [%v, %v)", tt.at, start, end, tt.start, tt.end)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	ctx := context.Background()
	r := open(t, locate(t), &clock{t: t0})
	put(t, r, Member{Name: "alice", Tiers: []string{"T0"}})
	secret, k, err := r.CreateKey(ctx, "alice", "laptop")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(secret, "sk-molly-") || len(secret) != len("sk-molly-")+43 || strings.Trim(secret[9:], base62) != "" {
		t.Fatalf("key %q is not sk-molly- and 43 base62 characters", secret)
	}
	if k.Prefix != secret[:17] || k.Member != "alice" || k.Name != "laptop" || !k.Created.Equal(t0) {
		t.Fatalf("key record %+v", k)
	}
	other, _, err := r.CreateKey(ctx, "alice", "")
	if err != nil || other == secret {
		t.Fatalf("second key %v (same as the first: %v)", err, other == secret)
	}

	// One character off: the last one replaced by another (a fixed "x"
	// would be no change for the keys that end in x).
	off := secret[:len(secret)-1] + "x"
	if secret[len(secret)-1] == 'x' {
		off = secret[:len(secret)-1] + "y"
	}
	tests := []struct {
		name    string
		key     string
		want    string // member
		wantErr error
	}{
		{"the issued key finds its member", secret, "alice", nil},
		{"a key one character off is unknown", off, "", ErrUnknownKey},
		{"a key of another shape is unknown", "sk-proj-123", "", ErrUnknownKey},
		{"an empty key is unknown", "", "", ErrUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, _, err := r.Lookup(ctx, tt.key)
			if !errors.Is(err, tt.wantErr) || m.Name != tt.want {
				t.Fatalf("Lookup = %q, %v; want %q, %v", m.Name, err, tt.want, tt.wantErr)
			}
			if tt.wantErr == nil && !reflect.DeepEqual(m.Tiers, []string{"T0"}) {
				t.Fatalf("scopes not carried: %+v", m)
			}
			if err != nil && tt.key != "" && strings.Contains(err.Error(), tt.key) {
				t.Fatal("the error echoes the key")
			}
		})
	}

	// Only the hash is stored: the file (on SQLite), and every row of the
	// keys table, never hold the key.
	if !r.pg {
		raw, err := os.ReadFile(r.Path())
		if err != nil {
			t.Fatal(err)
		}
		wal, _ := os.ReadFile(r.Path() + "-wal")
		if strings.Contains(string(raw)+string(wal), secret) || strings.Contains(string(raw)+string(wal), secret[17:]) {
			t.Fatal("the database file holds the key")
		}
	}
	rows, err := r.db.QueryContext(ctx, `SELECT hash, prefix, member, name FROM keys`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var hash []byte
		var prefix, member, name string
		if err := rows.Scan(&hash, &prefix, &member, &name); err != nil {
			t.Fatal(err)
		}
		if row := string(hash) + prefix + member + name; strings.Contains(row, secret[17:]) {
			t.Fatal("the keys table holds the key")
		}
	}
	rows.Close()

	if err := r.RevokeKey(ctx, k.Prefix); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Lookup(ctx, secret); !errors.Is(err, ErrRevokedKey) {
		t.Fatalf("revoked key: %v", err)
	}
	if _, _, err := r.Lookup(ctx, other); err != nil {
		t.Fatalf("the other key stops working after revoking one: %v", err)
	}
	if err := r.RevokeKey(ctx, "sk-molly-nothing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoking an unknown prefix: %v", err)
	}
	keys, err := r.Keys(ctx, "alice")
	if err != nil || len(keys) != 2 || keys[0].Revoked.IsZero() == keys[1].Revoked.IsZero() {
		t.Fatalf("Keys = %+v, %v; want two, one revoked", keys, err)
	}
	if _, _, err := r.CreateKey(ctx, "nobody", ""); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a key for an unknown member: %v", err)
	}
}

func TestBudgetTripsAtTheRightRequestAndSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	c := &clock{t: t0}
	r := open(t, path, c)
	m := put(t, r, Member{Name: "alice", BudgetUSD: 0.0003, Period: PeriodDay})
	// Each request costs 0.0001 USD; three fit, the fourth is refused. In
	// float64, 0.0001+0.0001+0.0001 != 0.0003: money is summed in nano-USD.
	var refusedAt int
	for i := 1; i <= 5; i++ {
		left, budgeted, err := r.Remaining(ctx, m)
		if err != nil || !budgeted {
			t.Fatal(err)
		}
		if left <= 0 {
			refusedAt = i
			break
		}
		if _, err := r.Record(ctx, Usage{Member: "alice", DecisionID: "d", Model: "chat", Target: "t", Tier: "T3",
			PromptTokens: 5, CompletionTokens: 5, CostUSD: 0.0001}); err != nil {
			t.Fatal(err)
		}
	}
	if refusedAt != 4 {
		t.Fatalf("budget tripped at request %d, want 4", refusedAt)
	}

	// A restart (a new Open on the same file, the old one never closed as
	// after kill -9) keeps the spend.
	r2, err := Open(path, Options{Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if left, _, _ := r2.Remaining(ctx, m); left != 0 {
		t.Fatalf("after restart remaining %v, want 0", left)
	}
	s, err := r2.Summarize(ctx, "alice", 2)
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 3 || s.SpentUSD != 0.0003 || s.PromptTokens != 15 || s.CompletionTokens != 15 || len(s.Recent) != 2 || *s.RemainingUSD != 0 {
		t.Fatalf("summary %+v", s)
	}
	if !s.PeriodStart.Equal(time.Date(2026, 3, 15, 0, 0, 0, 0, time.UTC)) || !s.PeriodEnd.Equal(time.Date(2026, 3, 16, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("period [%v, %v)", s.PeriodStart, s.PeriodEnd)
	}

	// The next day the budget is whole again.
	c.add(24 * time.Hour)
	if left, _, _ := r2.Remaining(ctx, m); left != 0.0003 {
		t.Fatalf("next day remaining %v, want 0.0003", left)
	}
	if _, err := r2.Record(ctx, Usage{Member: ""}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("usage without a member: %v", err)
	}
}

func TestRateLimits(t *testing.T) {
	tests := []struct {
		name      string
		m         Member
		tokens    []int // recorded after each admitted request
		requests  int
		refusedAt int // 0: none refused
		kind      string
		retry     time.Duration
	}{
		{"without limits every request is admitted", Member{Name: "a"}, nil, 10, 0, "", 0},
		{"an RPM of 3 refuses the fourth request in the minute", Member{Name: "a", RPM: 3}, nil, 5, 4, "requests", 57 * time.Second},
		{"a TPM of 25 refuses once 30 tokens are recorded", Member{Name: "a", TPM: 25}, []int{10, 10, 10, 10}, 5, 4, "tokens", 57 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{t: t0}
			r := open(t, locate(t), c)
			put(t, r, tt.m)
			refused := 0
			var lim *Limited
			for i := 1; i <= tt.requests; i++ {
				var err error
				if lim, err = r.Admit(context.Background(), tt.m); err != nil {
					t.Fatal(err)
				}
				if lim != nil {
					refused = i
					break
				}
				if i <= len(tt.tokens) {
					if _, err := r.Record(context.Background(), Usage{Member: "a", PromptTokens: tt.tokens[i-1]}); err != nil {
						t.Fatal(err)
					}
				}
				c.add(time.Second)
			}
			if refused != tt.refusedAt {
				t.Fatalf("refused at request %d, want %d", refused, tt.refusedAt)
			}
			if lim == nil {
				return
			}
			if lim.Kind != tt.kind || lim.RetryAfter != tt.retry {
				t.Fatalf("refusal %+v, want %s after %v", lim, tt.kind, tt.retry)
			}
			// Once the window has moved on, the request is admitted.
			c.add(lim.RetryAfter)
			if again, err := r.Admit(context.Background(), tt.m); again != nil || err != nil {
				t.Fatalf("after waiting Retry-After: %v, %v", again, err)
			}
		})
	}
}

func TestTokenWindowSurvivesRestart(t *testing.T) {
	path := locate(t)
	c := &clock{t: t0}
	r := open(t, path, c)
	m := put(t, r, Member{Name: "a", TPM: 100})
	if _, err := r.Record(context.Background(), Usage{Member: "a", PromptTokens: 60, CompletionTokens: 40}); err != nil {
		t.Fatal(err)
	}
	c.add(10 * time.Second)
	r2 := open(t, path, c)
	if lim, err := r2.Admit(context.Background(), m); err != nil || lim == nil || lim.Kind != "tokens" || lim.RetryAfter != 50*time.Second {
		t.Fatalf("after restart: %+v, %v; want a tokens refusal for 50s", lim, err)
	}
}

func TestOpenRefusesBadSettings(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{Synchronous: "OFF"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("synchronous OFF: %v", err)
	}
	if _, err := Open("", Options{}); err == nil {
		t.Fatal("an empty path opened")
	}
	r, err := Open(filepath.Join(t.TempDir(), "sub", "dir", "x.db"), Options{Synchronous: "full"})
	if err != nil {
		t.Fatalf("a missing folder is created: %v", err)
	}
	r.Close()
}
