package app

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/molly-gateway/molly/learning/eval"
	"github.com/molly-gateway/molly/learning/specialise"
)

func TestCaddyfileSpecialise(t *testing.T) {
	d := caddyfile.NewTestDispenser(`molly {
		specialise {
			every 6h
			min_traces 200
			budget 20m
			domains support billing
			rank 16
			steps 300
			batch_size 4
			learning_rate 0.005
			threads 3
			margin 0.15
			regression_budget 0.02
			held_out 0.25
			retention_days 30
			external_trainer /opt/peft/train.sh --data {train} --out {out}
			dir /var/lib/molly/specialise
		}
	}`)
	v, err := parseGlobal(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	var a App
	if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &a); err != nil {
		t.Fatal(err)
	}
	want := specialise.Config{Every: 6 * time.Hour, MinTraces: 200, Budget: 20 * time.Minute, Domains: []string{"support", "billing"},
		Rank: 16, Steps: 300, BatchSize: 4, LR: 0.005, Threads: 3, Gate: eval.Gate{Margin: 0.15, RegressionBudget: 0.02}, HeldOut: 0.25,
		RetentionDays: 30, ExternalTrainer: []string{"/opt/peft/train.sh", "--data", "{train}", "--out", "{out}"}, Dir: "/var/lib/molly/specialise"}
	if a.Specialise == nil || !reflect.DeepEqual(*a.Specialise, want) {
		t.Fatalf("specialise %+v\nwant %+v", a.Specialise, want)
	}
}

func TestCaddyfileSpecialiseErrors(t *testing.T) {
	for _, tc := range []struct{ block, want string }{
		{"every 1h\n at 03:30", "set every or at, not both"},
		{"at 25:99", "must be a time of day"},
		{"rank 0", "rank must be a positive integer"},
		{"held_out 1.5", "held_out 1.5 must be in [0,1)"},
		{"colour blue", `unrecognized subdirective "colour"`},
		{"domains", "wrong argument count"},
	} {
		d := caddyfile.NewTestDispenser("molly {\n specialise {\n " + tc.block + "\n }\n}")
		if _, err := parseGlobal(d, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.block, err, tc.want)
		}
	}
}
