package route

import (
	"reflect"
	"testing"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/serving"
)

func chatAnnotation(t *testing.T, body string) *classify.Annotation {
	t.Helper()
	a, err := testClassifier(t).Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestNeeds(t *testing.T) {
	const tool = `"tools":[{"type":"function","function":{"name":"f"}}]`
	tests := []struct {
		name, body string
		want       []string
	}{
		{"plain text needs nothing", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"declared tools need tools", `{"model":"m",` + tool + `,"messages":[{"role":"user","content":"hi"}]}`, []string{CapTools}},
		{"tool_choice none needs no tools", `{"model":"m",` + tool + `,"tool_choice":"none","messages":[{"role":"user","content":"hi"}]}`, nil},
		{"a tool turn in the conversation needs tools", `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}`, []string{CapTools}},
		{"json_schema needs structured output", `{"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"x"}},"messages":[{"role":"user","content":"hi"}]}`, []string{CapJSONSchema}},
		{"json_object needs structured output", `{"model":"m","response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"}]}`, []string{CapJSONSchema}},
		{"text format needs nothing", `{"model":"m","response_format":{"type":"text"},"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"audio output needs audio", `{"model":"m","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"messages":[{"role":"user","content":"hi"}]}`, []string{CapAudio}},
		{"text output needs nothing", `{"model":"m","modalities":["text"],"messages":[{"role":"user","content":"hi"}]}`, nil},
		{"logprobs need logprobs, in order", `{"model":"m","logprobs":true,` + tool + `,"messages":[{"role":"user","content":"hi"}]}`, []string{CapTools, CapLogprobs}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Needs(chatAnnotation(t, tt.body)); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Needs = %v, want %v", got, tt.want)
			}
		})
	}
}

// reporting is the real engine, saying what it implements.
type reporting struct {
	*serving.Engine
	caps []string
}

func (r reporting) Capabilities() []string { return r.caps }

// silent is the real engine hiding its Capabilities (an engine that does
// not say).
type silent struct{ e *serving.Engine }

func (s silent) Models() []string { return s.e.Models() }

func TestTargetCapabilities(t *testing.T) {
	eng := demoEngine(t)
	tests := []struct {
		name      string
		target    Target
		engine    Engine
		caps      []string
		endpoints []string
		modal     []string
	}{
		{"an OpenAI target that declares none has every one", Target{Name: "a", Tier: "T3", Endpoint: "http://x/v1", Models: []string{"m"}},
			nil, []string{"audio", "embeddings", "json_schema", "logprobs", "tools", "vision"}, nil, []string{"text"}},
		{"a declared list is exactly what it has; vision admits images, no embeddings no endpoint",
			Target{Name: "a", Tier: "T3", Endpoint: "http://x/v1", Models: []string{"m"}, Capabilities: []string{"tools", "vision"}},
			nil, []string{"tools", "vision"}, []string{"chat.completions", "completions"}, []string{"text", "image"}},
		{"the engine that does not say has the default: logprobs only", Target{Name: "e", Tier: "T0", Kind: KindEngine},
			silent{eng}, []string{"logprobs"}, []string{"chat.completions", "completions"}, []string{"text"}},
		{"the serving engine reports tools, structured output, embeddings and logprobs", Target{Name: "e", Tier: "T0", Kind: KindEngine},
			eng, []string{"embeddings", "json_schema", "logprobs", "tools"}, []string{"chat.completions", "completions", "embeddings"}, []string{"text"}},
		{"the engine that says has what it says, embeddings serving the endpoint", Target{Name: "e", Tier: "T0", Kind: KindEngine},
			reporting{eng, []string{"tools", "json_schema", "embeddings", "logprobs"}}, []string{"embeddings", "json_schema", "logprobs", "tools"},
			[]string{"chat.completions", "completions", "embeddings"}, []string{"text"}},
		{"a list on an engine target narrows, never widens", Target{Name: "e", Tier: "T0", Kind: KindEngine, Capabilities: []string{"tools", "vision"}},
			reporting{eng, []string{"tools", "logprobs"}}, []string{"tools"}, []string{"chat.completions", "completions"}, []string{"text"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tg := tt.target
			if _, err := NewCatalogue([]*Target{&tg}, tt.engine); err != nil {
				t.Fatal(err)
			}
			if got := tg.CapabilityNames(); !reflect.DeepEqual(got, tt.caps) {
				t.Fatalf("capabilities %v, want %v", got, tt.caps)
			}
			if !reflect.DeepEqual(tg.Endpoints, tt.endpoints) || !reflect.DeepEqual(tg.Modalities, tt.modal) {
				t.Fatalf("endpoints %v modalities %v, want %v %v", tg.Endpoints, tg.Modalities, tt.endpoints, tt.modal)
			}
		})
	}
	bad := Target{Name: "a", Tier: "T3", Endpoint: "http://x/v1", Models: []string{"m"}, Capabilities: []string{"telepathy"}}
	if err := bad.Validate(); err == nil {
		t.Fatal("an unknown capability validated")
	}
}

func TestRankExcludesATargetLackingWhatTheRequestNeeds(t *testing.T) {
	cat := newCatalogue(t,
		&Target{Name: "plain", Tier: "T1", Endpoint: "http://x/v1", Models: []string{"m"}, Capabilities: []string{"logprobs"}, Quality: map[string]float64{"default": 0.9}},
		&Target{Name: "full", Tier: "T1", Endpoint: "http://y/v1", Models: []string{"m"}, Quality: map[string]float64{"default": 0.5}})
	a := chatAnnotation(t, `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`)
	cands, excluded, _ := cat.Rank(a, decision(t, a, allow(allTiers, nil)), DefaultWeights)
	want := []Exclusion{{Target: "plain", Reason: "does not support tools (the request uses tools)", Kind: ExcludedCapability, Need: CapTools}}
	if len(cands) != 1 || cands[0].Target.Name != "full" || !reflect.DeepEqual(excluded, want) {
		t.Fatalf("candidates %v excluded %+v", cands, excluded)
	}
	// Without tools the better target is first again.
	a = chatAnnotation(t, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	cands, excluded, _ = cat.Rank(a, decision(t, a, allow(allTiers, nil)), DefaultWeights)
	if len(cands) != 2 || cands[0].Target.Name != "plain" || len(excluded) != 0 {
		t.Fatalf("candidates %v excluded %+v", cands, excluded)
	}
	if got := ExcludedHeader(want); got != "none; excluded plain: does not support tools (the request uses tools)" {
		t.Fatalf("ExcludedHeader = %q", got)
	}
}
