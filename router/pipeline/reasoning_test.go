package pipeline

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
)

func TestEngineReasoningSwitchIsExplainedInTheRouteHeader(t *testing.T) {
	dir := t.TempDir()
	if err := serving.WriteDemo(dir, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	cfg := serving.DemoConfig(dir)
	cfg.NSeqMax, cfg.NCtx, cfg.Threads = 2, 2048, 1
	cfg.Reasoning.Adapter, cfg.Reasoning.Medium = "support", 8
	eng, err := serving.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	gw, _ := startGateway(t, setup{engine: eng, targets: []*route.Target{{Name: "engine", Tier: "T0", Kind: route.KindEngine, Models: []string{"m=molly-demo"}}}})
	// router/capability's difficulty of this prompt, from its features.
	score := 1 / (1 + math.Exp(-(-1.6 + 0.5*math.Log1p(15.0/40) + 0.8*2 + 0.3*1 + 0.6)))
	r := post(t, gw.URL+"/v1/chat/completions", `{"model":"m","max_tokens":20,"temperature":0,"messages":[{"role":"user","content":"Prove step by step that the sum must be even for all n > 1"}]}`)
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	want := fmt.Sprintf("; reasoning on adapter=support score=%.4f threshold=0.5000 by=difficulty", score)
	if h := r.header.Get(HeaderRoute); !strings.HasPrefix(h, "engine/molly-demo score=") || !strings.HasSuffix(h, want) {
		t.Errorf("X-Molly-Route %q, want the engine's decision %q at its end", h, want)
	}
	if n := gjson.Get(r.body, "usage.completion_tokens_details.reasoning_tokens").Int(); n != 9 || gjson.Get(r.body, "choices.0.message.reasoning_content").String() == "" {
		t.Errorf("reasoning tokens %d, want 8 + </think>: %s", n, r.body)
	}
}
