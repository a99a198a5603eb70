package app

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/molly-gateway/molly/serving"
)

func TestCaddyfileEngineReasoning(t *testing.T) {
	d := caddyfile.NewTestDispenser(`molly {
		engine {
			model /models/base.gguf
			kv_cache_type q8_0
			draft_model /models/draft.gguf
			draft_tokens 6
			reasoning_adapter reasoner
			reasoning_threshold 0.7
			reasoning_budget 64 512 2048 4096
			reasoning_delimiters [plan] [/plan]
			n_chains 4 reasoner
			n_chains 2
			answer_regex "answer: (\d+)"
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
	want := serving.ReasoningConfig{Adapter: "reasoner", Threshold: 0.7, Low: 64, Medium: 512, High: 2048, XHigh: 4096, Start: "[plan]", End: "[/plan]",
		Chains: map[string]int{"reasoner": 4, "": 2}, AnswerRegex: `answer: (\d+)`}
	if a.EngineConfig == nil || !reflect.DeepEqual(a.EngineConfig.Reasoning, want) || a.EngineConfig.KVCacheType != "q8_0" ||
		a.EngineConfig.DraftModel != "/models/draft.gguf" || a.EngineConfig.DraftTokens != 6 {
		t.Fatalf("engine %+v, want reasoning %+v", a.EngineConfig, want)
	}
	for _, bad := range []string{"reasoning_threshold 1.5", "reasoning_budget 1 2", "reasoning_budget 1 two 3", "reasoning_budget 1 2 3 4 5 6", "reasoning_delimiters <think>", "reasoning_adapter", "n_chains 0", "n_chains", "kv_cache_type q3", "draft_model", "draft_tokens 0", "draft_tokens 2.5"} {
		_, err := parseGlobal(caddyfile.NewTestDispenser("molly {\nengine {\nmodel m.gguf\n"+bad+"\n}\n}"), nil)
		if err == nil || !strings.Contains(err.Error(), strings.Fields(bad)[0]) && !strings.Contains(err.Error(), "argument") {
			t.Errorf("%q: error %v", bad, err)
		}
	}
}
