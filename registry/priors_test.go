package registry

import (
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestPriorStoreKeepsPriorsAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "priors.db")
	s, err := OpenPriorStore(path)
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMilli(1_700_000_000_123).UTC()
	first := []Prior{
		{Kind: "quality", Target: "device", Model: "molly-demo:billing", Category: "billing", Value: 0.82, N: 3, Updated: at},
		{Kind: "ttfb_s", Target: "lan", Value: 0.125, N: 7, Updated: at},
	}
	if err := s.Save(first); err != nil {
		t.Fatal(err)
	}
	// An upsert replaces the row with the same key.
	if err := s.Save([]Prior{{Kind: "ttfb_s", Target: "lan", Value: 0.25, N: 8, Updated: at}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = OpenPriorStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	want := []Prior{first[0], {Kind: "ttfb_s", Target: "lan", Value: 0.25, N: 8, Updated: at}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Load = %+v\nwant   %+v", got, want)
	}
	var mode string
	if err := s.db.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode = %q, %v; want wal", mode, err)
	}
}

func TestOpenPriorStoreRefusesAnEmptyPath(t *testing.T) {
	if _, err := OpenPriorStore(""); err == nil || err.Error() != "priors: empty path" {
		t.Fatalf("err = %v", err)
	}
}
