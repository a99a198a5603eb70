package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func pragma(t *testing.T, db *sql.DB, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRow(`PRAGMA ` + name).Scan(&v); err != nil {
		t.Fatalf("PRAGMA %s: %v", name, err)
	}
	return v
}

func TestOpenSetsThePragmasAndAPrivateFile(t *testing.T) {
	for _, tc := range []struct {
		name, sync, want string
	}{
		{"the default is synchronous NORMAL", "", "1"},
		{"FULL is accepted in any case", "full", "2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a", "b", "x.db")
			db, err := Open(path, Options{Synchronous: tc.sync})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if got := pragma(t, db, "journal_mode"); got != "wal" {
				t.Errorf("journal_mode %q, want wal", got)
			}
			if got := pragma(t, db, "synchronous"); got != tc.want {
				t.Errorf("synchronous %q, want %s", got, tc.want)
			}
			if got := pragma(t, db, "busy_timeout"); got != "5000" {
				t.Errorf("busy_timeout %q, want 5000", got)
			}
			if got := pragma(t, db, "foreign_keys"); got != "1" {
				t.Errorf("foreign_keys %q, want 1", got)
			}
			if got := pragma(t, db, "temp_store"); got != "2" { // 2: MEMORY
				t.Errorf("temp_store %q, want 2 (MEMORY)", got)
			}
			if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil { // makes the WAL file
				t.Fatal(err)
			}
			for _, p := range []string{path, path + "-wal"} {
				st, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode().Perm() != 0o600 {
					t.Errorf("%s has mode %v, want 0600", filepath.Base(p), st.Mode().Perm())
				}
			}
			st, err := os.Stat(filepath.Dir(path))
			if err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("folder mode %v (%v), want 0700", st.Mode().Perm(), err)
			}
		})
	}
}

// AutoCheckpoint sets wal_autocheckpoint on the handle's connections
// (SQLite's own default, 1000, when unset).
func TestAutoCheckpointSetsThePragma(t *testing.T) {
	for _, tc := range []struct {
		pages int
		want  string
	}{{0, "1000"}, {4096, "4096"}} {
		db, err := Open(filepath.Join(t.TempDir(), "x.db"), Options{AutoCheckpoint: tc.pages})
		if err != nil {
			t.Fatal(err)
		}
		if got := pragma(t, db, "wal_autocheckpoint"); got != tc.want {
			t.Errorf("AutoCheckpoint %d: wal_autocheckpoint %q, want %s", tc.pages, got, tc.want)
		}
		db.Close()
	}
}

func TestAnExistingWorldReadableFileIsMadePrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", st.Mode().Perm())
	}
}

func TestOpenRefusesBadOptions(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name       string
		path       string
		opts       Options
		migrations []Migration
		want       string
	}{
		{"an empty path", "", Options{}, nil, "empty path"},
		{"synchronous OFF", filepath.Join(dir, "a.db"), Options{Synchronous: "OFF"}, nil, `synchronous "OFF" must be NORMAL or FULL`},
		{"a negative auto-checkpoint", filepath.Join(dir, "c.db"), Options{AutoCheckpoint: -1}, nil, "auto-checkpoint -1 pages must not be negative"},
		{"a gap in the versions", filepath.Join(dir, "b.db"), Options{}, []Migration{{Version: 1, Name: "one"}, {Version: 3, Name: "three"}},
			"migration 3 (three) must have version 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Open(tc.path, tc.opts, tc.migrations...)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want ErrInvalid with %q", err, tc.want)
			}
		})
	}
}

func TestMigrationsApplyInOrderOnceAndOnlyTheNewOnes(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "m.db")
	var ups []int
	v1 := Migration{Version: 1, Name: "items", SQL: `CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL); -- a comment; with a semicolon
		INSERT INTO items (name) VALUES ('a;b')`}
	v2 := Migration{Version: 2, Name: "price", SQL: `ALTER TABLE items ADD COLUMN price BIGINT NOT NULL DEFAULT 0`,
		Up: func(ctx context.Context, tx *sql.Tx) error {
			ups = append(ups, 2)
			_, err := tx.ExecContext(ctx, `UPDATE items SET price = 7`)
			return err
		}}
	db, err := Open(path, Options{}, v1)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	db, err = Open(path, Options{}, v1, v2)
	if err != nil {
		t.Fatal(err)
	}
	applied, err := Applied(ctx, db)
	if err != nil || !reflect.DeepEqual(applied, []int{1, 2}) {
		t.Fatalf("applied %v, %v; want [1 2]", applied, err)
	}
	var name string
	var price int
	if err := db.QueryRow(`SELECT name, price FROM items`).Scan(&name, &price); err != nil || name != "a;b" || price != 7 {
		t.Fatalf("row %q %d %v; want a;b 7 (the quoted ; is no statement end)", name, price, err)
	}
	db.Close()

	// Reopening applies nothing again.
	db, err = Open(path, Options{}, v1, v2)
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	if !reflect.DeepEqual(ups, []int{2}) {
		t.Fatalf("Up ran %v, want once", ups)
	}

	// Code that knows only v1 refuses a file at v2.
	if _, err := Open(path, Options{}, v1); err == nil || !strings.Contains(err.Error(), "schema version 2 is newer than this Molly knows (1)") {
		t.Fatalf("older code on a newer file: %v", err)
	}
}

func TestAFailingMigrationKeepsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.db")
	bad := Migration{Version: 1, Name: "half", SQL: `CREATE TABLE a (x INTEGER); CREATE TABLE a (x INTEGER)`}
	if _, err := Open(path, Options{}, bad); err == nil || !strings.Contains(err.Error(), "migration 1 (half)") {
		t.Fatalf("err %v", err)
	}
	db, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE name = 'a'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("table a exists after a failed migration: %d %v", n, err)
	}
}

func TestReadOnlyOpensAnExistingFileOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.db")
	if _, err := Open(path, Options{ReadOnly: true}); err == nil {
		t.Fatal("a missing file opened read-only")
	}
	db, err := Open(path, Options{}, Migration{Version: 1, Name: "t", SQL: `CREATE TABLE t (x INTEGER)`})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	ro, err := Open(path, Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.Exec(`INSERT INTO t VALUES (1)`); err == nil {
		t.Fatal("a read-only handle wrote")
	}
}
