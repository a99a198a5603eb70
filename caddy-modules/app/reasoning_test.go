package app

import (
	"encoding/json"
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
			reasoning_adapter reasoner
			reasoning_threshold 0.7
			reasoning_budget 64 512 2048
			reasoning_delimiters [plan] [/plan]
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
	want := serving.ReasoningConfig{Adapter: "reasoner", Threshold: 0.7, Low: 64, Medium: 512, High: 2048, Start: "[plan]", End: "[/plan]"}
	if a.EngineConfig == nil || a.EngineConfig.Reasoning != want {
		t.Fatalf("engine %+v, want reasoning %+v", a.EngineConfig, want)
	}
	for _, bad := range []string{"reasoning_threshold 1.5", "reasoning_budget 1 2", "reasoning_budget 1 two 3", "reasoning_delimiters <think>", "reasoning_adapter"} {
		_, err := parseGlobal(caddyfile.NewTestDispenser("molly {\nengine {\nmodel m.gguf\n"+bad+"\n}\n}"), nil)
		if err == nil || !strings.Contains(err.Error(), "reasoning") && !strings.Contains(err.Error(), "argument") {
			t.Errorf("%q: error %v", bad, err)
		}
	}
}
