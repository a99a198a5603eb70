package registry

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/internal/pgtest"
	"github.com/molly-gateway/molly/registry/postgres"
	"github.com/molly-gateway/molly/registry/sqlite"
)

// TestPostgres runs the registry's backend-independent tests on the
// PostgreSQL backend (a real server: internal/pgtest), each on a database
// of its own: members, keys, the ledger and its record ids, spend
// counters, reservations across two handles (two gateways) and random
// request shapes, rate windows, the outbox and its deliverers, stored
// responses.
func TestPostgres(t *testing.T) {
	pgtest.DSN(t) // skips, saying why, where PostgreSQL cannot run
	saved := locate
	locate = func(t *testing.T) string { return pgtest.DSN(t) }
	defer func() { locate = saved }()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"MembersValidateAndRoundTrip", TestMembersValidateAndRoundTrip},
		{"Keys", TestKeys},
		{"BudgetTripsAtTheRightRequestAndSurvivesRestart", TestBudgetTripsAtTheRightRequestAndSurvivesRestart},
		{"RateLimits", TestRateLimits},
		{"TokenWindowSurvivesRestart", TestTokenWindowSurvivesRestart},
		{"RecordIDsAreAssignedPerDecisionInTheTransaction", TestRecordIDsAreAssignedPerDecisionInTheTransaction},
		{"ConcurrentRecordsAreEachCommittedWithTheirCountersAndOutbox", TestConcurrentRecordsAreEachCommittedWithTheirCountersAndOutbox},
		{"TheSpendCounterEqualsTheLedgerPerPeriod", TestTheSpendCounterEqualsTheLedgerPerPeriod},
		{"TheRPMWindowSurvivesReopen", TestTheRPMWindowSurvivesReopen},
		{"TwoHandlesOnOneFileCannotOvershootTogether", TestTwoHandlesOnOneFileCannotOvershootTogether},
		{"NoRequestShapeOvershootsTheBudgetOrTheTPM", TestNoRequestShapeOvershootsTheBudgetOrTheTPM},
		{"ConcurrentAdmissionsWithABudgetFittingExactlyThreeAdmitThree", TestConcurrentAdmissionsWithABudgetFittingExactlyThreeAdmitThree},
		{"AReleasedReservationOfAFailedRequestFreesTheBudget", TestAReleasedReservationOfAFailedRequestFreesTheBudget},
		{"ARecordSettlesItsReservationAndReleaseFreesTheRest", TestARecordSettlesItsReservationAndReleaseFreesTheRest},
		{"TPMCountsTheRequestsOwnTokens", TestTPMCountsTheRequestsOwnTokens},
		{"TPMRetryAfterIsWhenRecordedTokensLeaveTheWindow", TestTPMRetryAfterIsWhenRecordedTokensLeaveTheWindow},
		{"TheReservationsOfADeadProcessExpireWithTheirLease", TestTheReservationsOfADeadProcessExpireWithTheirLease},
		{"ALiveProcessRenewsItsLeases", TestALiveProcessRenewsItsLeases},
		{"EveryRecordIsDeliveredOnceWithItsValues", TestEveryRecordIsDeliveredOnceWithItsValues},
		{"AFailingSinkIsRetriedWithGrowingBackoff", TestAFailingSinkIsRetriedWithGrowingBackoff},
		{"ARecordRefusedForGoodIsMarkedFailedAndCanBeRequeued", TestARecordRefusedForGoodIsMarkedFailedAndCanBeRequeued},
		{"PendingRecordsAreSentAfterARestart", TestPendingRecordsAreSentAfterARestart},
		{"StoredResponsesBelongToTheirMember", TestStoredResponsesBelongToTheirMember},
		{"StoredResponsesExpire", TestStoredResponsesExpire},
	} {
		t.Run(tc.name, tc.fn)
	}
}

// TestPostgresSchemaMirrorsSQLite checks the mirror (migrations_postgres.go)
// against the SQLite schema as each database reports it — its own catalogue
// (information_schema, pragma table_info) is the oracle: the same tables
// with the same columns, and the same schema_migrations versions.
func TestPostgresSchemaMirrorsSQLite(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	pg, err := postgres.Open(dsn, postgres.Options{}, pgMigrations()...)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	lite, err := sqlite.Open(filepath.Join(t.TempDir(), "molly.db"), sqlite.Options{}, migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	columns := func(db *sql.DB, query string, args ...any) []string {
		t.Helper()
		rows, err := db.QueryContext(ctx, query, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
		slices.Sort(out)
		return out
	}
	pgTables := columns(pg, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`)
	liteTables := columns(lite, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if !slices.Equal(pgTables, liteTables) {
		t.Fatalf("tables: PostgreSQL %v, SQLite %v", pgTables, liteTables)
	}
	for _, table := range pgTables {
		p := columns(pg, `SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = ?`, table)
		l := columns(lite, `SELECT name FROM pragma_table_info(?)`, table)
		if !slices.Equal(p, l) {
			t.Errorf("table %s: PostgreSQL columns %v, SQLite %v", table, p, l)
		}
	}
	pv, err := postgres.Applied(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	lv, err := sqlite.Applied(ctx, lite)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(pv, lv) || len(pv) != len(migrations()) {
		t.Fatalf("versions: PostgreSQL %v, SQLite %v", pv, lv)
	}
}

// TestPostgresMigratesOnceWhenGatewaysStartTogether: eight gateways open
// one empty database at once; each version is applied once, and all of
// them work on the result.
func TestPostgresMigratesOnceWhenGatewaysStartTogether(t *testing.T) {
	dsn := pgtest.DSN(t)
	var wg sync.WaitGroup
	regs := make([]*Registry, 8)
	errs := make([]error, 8)
	for i := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			regs[i], errs[i] = Open(dsn, Options{})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("gateway %d: %v", i, err)
		}
		defer regs[i].Close()
	}
	applied, err := postgres.Applied(context.Background(), regs[0].db)
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	for _, m := range migrations() {
		want = append(want, m.Version)
	}
	if !slices.Equal(applied, want) {
		t.Fatalf("schema_migrations %v, want %v once each", applied, want)
	}
	put(t, regs[3], Member{Name: "one"})
	if _, err := regs[5].Member(context.Background(), "one"); err != nil {
		t.Fatal(err)
	}
	// The password never shows: not in Path, not in errors.
	withPassword, err := Open(strings.Replace(dsn, "molly@", "molly:secret@", 1), Options{}) // trust authentication ignores it
	if err != nil {
		t.Fatal(err)
	}
	defer withPassword.Close()
	if p := withPassword.Path(); strings.Contains(p, "secret") || !strings.Contains(p, "xxxxx") {
		t.Fatalf("Path %q shows the password or does not say one is hidden", p)
	}
	if _, err := Open("postgres://molly:secret@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", Options{}); err == nil || strings.Contains(err.Error(), "secret") {
		t.Fatalf("an unreachable server: %v", err)
	}
}

func TestRebindLeavesQuotedTextAlone(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`SELECT ? , ?`, `SELECT $1 , $2`},
		{`SELECT '?' || ? FROM t WHERE "a?" = ? -- why?` + "\n" + `AND b = ?`, `SELECT '?' || $1 FROM t WHERE "a?" = $2 -- why?` + "\n" + `AND b = $3`},
		{`SELECT 1`, `SELECT 1`},
		{`VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, `VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`},
	} {
		if got := postgres.Rebind(tc.in); got != tc.want {
			t.Errorf("Rebind(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
