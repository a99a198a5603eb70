package main

import (
	"context"
	"testing"
)

func TestIntentStatusFollowsItsAmounts(t *testing.T) {
	cases := []struct {
		name                       string
		amount, captured, refunded int64
		want                       string
	}{
		{"an intent with nothing captured requires capture", 100, 0, 0, "requires_capture"},
		{"an intent captured in part is partially captured", 100, 40, 0, "partially_captured"},
		{"an intent captured in full is captured", 100, 100, 0, "captured"},
		{"an intent refunded in part is partially refunded", 100, 100, 1, "partially_refunded"},
		{"an intent whose capture is all refunded is refunded", 100, 40, 40, "refunded"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := Intent{Amount: c.amount, Captured: c.captured, Refunded: c.refunded, Currency: "KWD"}
			in.derive()
			if in.Status != c.want || in.Exponent != 3 {
				t.Errorf("status %s exponent %d, want %s and 3", in.Status, in.Exponent, c.want)
			}
		})
	}
}

func TestTheLocalProviderIsIdempotentByKey(t *testing.T) {
	ctx := context.Background()
	var p LocalProvider
	a, _ := p.Capture(ctx, "auth", 100, "USD", "k1")
	b, _ := p.Capture(ctx, "auth", 100, "USD", "k1")
	c, _ := p.Capture(ctx, "auth", 100, "USD", "k2")
	if a != b || a == c || len(a) != len("local_cap_")+16 {
		t.Errorf("refs %q %q %q: want the same ref for the same key, another for another key", a, b, c)
	}
}

func TestTheLedgerFileSurvivesReopening(t *testing.T) {
	ctx := context.Background()
	path := t.TempDir() + "/l.db"
	l, err := OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	in := &Intent{ID: "pi_000000000000000000000001", Member: "m", Customer: "c", Amount: 700, Currency: "GBP", Provider: "local", ProviderRef: "r"}
	if err := l.InsertIntent(ctx, tx, in); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Post(ctx, tx, in, "capture", 700, "r2"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l, err = OpenLedger(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	bs, err := l.Balances(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Balance{{"customer:c", "GBP", -700}, {"merchant", "GBP", 700}}
	if len(bs) != 2 || bs[0] != want[0] || bs[1] != want[1] {
		t.Errorf("balances %v, want %v", bs, want)
	}
}
