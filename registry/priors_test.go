package registry

import (
	"context"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/molly-gateway/molly/registry/sqlite"
)

func TestPriorsLiveInTheRegistryAcrossReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "sub", "molly.db")
	c := &clock{t: t0}
	r, err := Open(path, Options{Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1_700_000_000_123).UTC()
	first := []Prior{
		{Kind: "quality", Target: "device", Model: "molly-demo:billing", Category: "billing", Value: 0.82, N: 3, Updated: at},
		{Kind: "ttfb_s", Target: "lan", Value: 0.125, N: 7, Updated: at},
	}
	if err := r.SavePriors(ctx, first); err != nil {
		t.Fatal(err)
	}
	// An upsert replaces the row with the same key.
	if err := r.SavePriors(ctx, []Prior{{Kind: "ttfb_s", Target: "lan", Value: 0.25, N: 8, Updated: at}}); err != nil {
		t.Fatal(err)
	}
	r.Close()
	r = open(t, path, c)
	got, err := r.LoadPriors(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Prior{first[0], {Kind: "ttfb_s", Target: "lan", Value: 0.25, N: 8, Updated: at}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("LoadPriors = %+v\nwant         %+v", got, want)
	}
}

// legacyPriors writes a priors.db as Molly wrote it before priors joined
// the registry (its own file, table priors).
func legacyPriors(t *testing.T, path string, priors []Prior) {
	t.Helper()
	db, err := sqlite.Open(path, sqlite.Options{}, sqlite.Migration{Version: 1, Name: "legacy priors", SQL: `CREATE TABLE IF NOT EXISTS priors (
		kind TEXT NOT NULL, target TEXT NOT NULL, model TEXT NOT NULL DEFAULT '', category TEXT NOT NULL DEFAULT '',
		value REAL NOT NULL, n INTEGER NOT NULL, updated INTEGER NOT NULL, PRIMARY KEY (kind, target, model, category))`})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, p := range priors {
		if _, err := db.Exec(`INSERT INTO priors VALUES (?, ?, ?, ?, ?, ?, ?)`, p.Kind, p.Target, p.Model, p.Category, p.Value, p.N, p.Updated.UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestALegacyPriorsFileIsImportedOnce(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	legacy := filepath.Join(dir, "priors.db")
	r := open(t, filepath.Join(dir, "molly.db"), &clock{t: t0})
	if n, err := r.ImportPriors(ctx, legacy); n != 0 || err != nil {
		t.Fatalf("a missing legacy file: %d, %v", n, err)
	}
	at := time.UnixMilli(1_700_000_000_000).UTC()
	legacyPriors(t, legacy, []Prior{
		{Kind: "quality", Target: "lan", Model: "m", Category: "chat", Value: 0.7, N: 4, Updated: at},
		{Kind: "ttfb_s", Target: "lan", Value: 0.3, N: 2, Updated: at},
	})
	// The registry already learned a newer lan latency: it is kept.
	newer := Prior{Kind: "ttfb_s", Target: "lan", Value: 0.1, N: 9, Updated: at.Add(time.Hour)}
	if err := r.SavePriors(ctx, []Prior{newer}); err != nil {
		t.Fatal(err)
	}
	if n, err := r.ImportPriors(ctx, legacy); n != 2 || err != nil {
		t.Fatalf("import: %d, %v", n, err)
	}
	got, _ := r.LoadPriors(ctx)
	want := []Prior{{Kind: "quality", Target: "lan", Model: "m", Category: "chat", Value: 0.7, N: 4, Updated: at}, newer}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("after the import %+v\nwant %+v", got, want)
	}
	// A second import (e.g. the next start) changes nothing, even after the registry moved on.
	if err := r.SavePriors(ctx, []Prior{{Kind: "quality", Target: "lan", Model: "m", Category: "chat", Value: 0.2, N: 5, Updated: at}}); err != nil {
		t.Fatal(err)
	}
	if n, err := r.ImportPriors(ctx, legacy); n != 0 || err != nil {
		t.Fatalf("second import: %d, %v", n, err)
	}
	if got, _ := r.LoadPriors(ctx); got[0].Value != 0.2 {
		t.Fatalf("the second import overwrote a learned prior: %+v", got[0])
	}
}
