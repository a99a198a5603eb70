package route

import (
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/health"
	"github.com/molly-gateway/molly/router/openai"
)

// Target kinds.
const (
	KindOpenAI = "openai" // an OpenAI-compatible HTTP API
	KindEngine = "engine" // Molly's in-process T0 engine (no HTTP hop)
)

// Target is one backend, as declared in the Caddyfile or JSON config.
type Target struct {
	// Name identifies the target in headers, logs and policy input.
	Name string `json:"name"`
	// Tier is "T0" (on-device), "T1" (LAN), "T2" (self-hosted remote) or "T3" (external API).
	Tier string `json:"tier"`
	// Kind is "openai" (default) or "engine".
	Kind string `json:"kind,omitempty"`
	// Endpoint is the OpenAI base URL, e.g. "http://10.0.0.5:8000/v1" (kind openai).
	Endpoint string `json:"endpoint,omitempty"`
	// Models lists the model names clients may ask for: "name" forwards the
	// name as is; "name=upstream" forwards it as upstream (an alias, as in
	// LiteLLM's model_list). The same name on several targets makes them
	// alternatives for routing and fallback.
	Models []string `json:"models"`
	// APIKeyEnv names the environment variable holding the upstream API key,
	// sent as "Authorization: Bearer". The key itself is never in the config.
	// A target whose variable is unset or empty when it is provisioned is
	// kept in the catalogue but never routed to (MissingKey): sending its
	// requests without the key would only earn the upstream's 401.
	APIKeyEnv string `json:"api_key_env,omitempty"`
	// PriceIn and PriceOut are USD per 1M prompt and completion tokens.
	PriceIn  float64 `json:"price_in,omitempty"`
	PriceOut float64 `json:"price_out,omitempty"`
	// LatencyMS is the prior expected latency of a response, in milliseconds.
	LatencyMS float64 `json:"latency_ms,omitempty"`
	// Quality holds prior answer quality in [0,1] per task category; the key
	// "default" covers the others (0.5 when absent).
	Quality map[string]float64 `json:"quality,omitempty"`
	// Region is the residency region, e.g. "EU"; T0 and T1 default to "local".
	Region string `json:"region,omitempty"`
	// Modalities the target accepts; default ["text"].
	Modalities []string `json:"modalities,omitempty"`
	// MaxContext is the context window in tokens; 0 means unknown (not checked).
	MaxContext int `json:"max_context,omitempty"`
	// Endpoints the target serves ("chat.completions", "completions",
	// "embeddings"); empty means all, except for kind engine, which serves
	// chat.completions and completions.
	Endpoints []string `json:"endpoints,omitempty"`
	// TimeoutMS bounds connecting plus waiting for response headers; default 30000.
	TimeoutMS int `json:"timeout_ms,omitempty"`
	// Capabilities the target has beyond text in and text out (CapTools,
	// CapJSONSchema, CapVision, CapAudio, CapEmbeddings, CapLogprobs).
	// Empty for kind openai: every capability is assumed (the upstream
	// refuses what it cannot do itself, and its 400 reaches the client);
	// once declared, exactly these. A kind engine target has what the
	// engine implements (EngineCapabilities), narrowed to this list when
	// one is declared. vision and audio admit the image and audio
	// modalities; a target without embeddings does not serve that endpoint.
	Capabilities []string `json:"capabilities,omitempty"`
	// DraftWithEngine (kind openai, tier T1 or T2, a Molly engine behind
	// Endpoint) lets the molly app's in-process engine draft for the
	// target: an eligible chat request (temperature 0, n 1, no stop,
	// logprobs, tools, response_format, reasoning) is decoded by the
	// engine's base model proposing tokens and the target's engine
	// verifying them (POST <endpoint without /v1>/molly/engine/verify), so
	// the answer is the target's own greedy answer in fewer remote decodes
	// (serving/remotedraft.go). It needs the molly app's engine, sharing the
	// target's tokenizer and chat template (checked at run time by GET on
	// the verify endpoint; otherwise requests go as usual).
	DraftWithEngine bool `json:"draft_with_engine,omitempty"`
	// DraftTokens is how many tokens the engine proposes per verify call
	// with DraftWithEngine; default 4 (at most 64).
	DraftTokens int `json:"draft_tokens,omitempty"`
	// OutlierDetection ejects the target from plans while it fails (circuit
	// breaking, router/health); its zero fields come from the molly app's
	// outlier_detection, then health's defaults.
	OutlierDetection *health.Config `json:"outlier_detection,omitempty"`

	models     map[string]string // client name → upstream name
	engine     Engine            // kind engine: also every model the engine serves now
	caps       map[string]bool   // nil: every capability
	missingKey bool              // APIKeyEnv is set but the variable is not (MissingKey)
}

// MissingKey is why the target cannot be sent requests for want of its
// API key — "api_key_env <VAR> is not set" when APIKeyEnv names a variable
// that was unset or empty when the target was provisioned — or "" when it
// can. The variable's value is never part of it.
func (t *Target) MissingKey() string {
	if !t.missingKey {
		return ""
	}
	return "api_key_env " + t.APIKeyEnv + " is not set"
}

// Capabilities a target may have (Target.Capabilities) and a request may
// need (Needs).
const (
	CapTools      = "tools"       // function tools, tool_choice, tool turns in the conversation
	CapJSONSchema = "json_schema" // response_format json_schema and json_object (structured output)
	CapVision     = "vision"      // image inputs
	CapAudio      = "audio"       // audio inputs
	CapEmbeddings = "embeddings"  // POST /v1/embeddings
	CapLogprobs   = "logprobs"    // token log-probabilities
)

// AllCapabilities lists every capability name.
var AllCapabilities = []string{CapTools, CapJSONSchema, CapVision, CapAudio, CapEmbeddings, CapLogprobs}

// DefaultEngineCapabilities is what the T0 engine is taken to implement
// when it does not say (CapabilityReporter): log-probabilities, and no
// tools, structured output or embeddings.
var DefaultEngineCapabilities = []string{CapLogprobs}

// CapabilityReporter is implemented by an Engine that says what it
// implements: capability names as in AllCapabilities.
type CapabilityReporter interface {
	Capabilities() []string
}

// EngineCapabilities is what engine implements: its own report, else
// DefaultEngineCapabilities.
func EngineCapabilities(engine Engine) []string {
	if r, ok := engine.(CapabilityReporter); ok {
		return r.Capabilities()
	}
	return DefaultEngineCapabilities
}

// Supports reports whether t has capability c.
func (t *Target) Supports(c string) bool { return t.caps == nil || t.caps[c] }

// Engine is the in-process T0 engine as routing sees it: the model names
// it serves now (base and "<base>:<adapter>"). Calling it is egress's job.
type Engine interface {
	Models() []string
}

// upstream maps a client model name to the name sent to the target.
func (t *Target) upstream(model string) (string, bool) {
	if up, ok := t.models[model]; ok {
		return up, true
	}
	if t.engine != nil && slices.Contains(t.engine.Models(), model) {
		return model, true
	}
	return "", false
}

// modelNames lists the client model names the target serves now.
func (t *Target) modelNames() []string {
	names := make([]string, 0, len(t.models))
	for name := range t.models {
		names = append(names, name)
	}
	if t.engine != nil {
		names = append(names, t.engine.Models()...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Validate checks the declaration; errors name the target and field.
func (t *Target) Validate() error {
	if t.Name == "" {
		return fmt.Errorf("target: name is required")
	}
	if !slices.Contains(policies.Tiers, t.Tier) {
		return fmt.Errorf("target %s: tier %q must be one of T0, T1, T2, T3", t.Name, t.Tier)
	}
	switch t.Kind {
	case "", KindOpenAI:
		u, err := url.Parse(t.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("target %s: endpoint %q must be an http(s) URL such as http://127.0.0.1:8000/v1", t.Name, t.Endpoint)
		}
	case KindEngine:
		if t.Tier != "T0" {
			return fmt.Errorf("target %s: kind engine runs on this machine, so its tier must be T0, not %s", t.Name, t.Tier)
		}
	default:
		return fmt.Errorf("target %s: kind %q must be openai or engine", t.Name, t.Kind)
	}
	if len(t.Models) == 0 && t.Kind != KindEngine {
		return fmt.Errorf("target %s: models must list at least one model name", t.Name)
	}
	for _, m := range t.Models {
		name, up, _ := strings.Cut(m, "=")
		if name == "" || strings.ContainsAny(m, " \t") || (strings.Contains(m, "=") && up == "") {
			return fmt.Errorf("target %s: model %q must be name or name=upstream", t.Name, m)
		}
	}
	for _, ep := range t.Endpoints {
		switch openai.Endpoint(ep) {
		case openai.EndpointChat, openai.EndpointCompletions, openai.EndpointEmbeddings:
		default:
			return fmt.Errorf("target %s: endpoint kind %q must be chat.completions, completions or embeddings", t.Name, ep)
		}
	}
	for _, c := range t.Capabilities {
		if !slices.Contains(AllCapabilities, c) {
			return fmt.Errorf("target %s: capability %q must be one of %s", t.Name, c, strings.Join(AllCapabilities, ", "))
		}
	}
	for cat, q := range t.Quality {
		if q < 0 || q > 1 {
			return fmt.Errorf("target %s: quality %s = %v must be in [0,1]", t.Name, cat, q)
		}
	}
	if t.PriceIn < 0 || t.PriceOut < 0 || t.LatencyMS < 0 || t.MaxContext < 0 || t.TimeoutMS < 0 {
		return fmt.Errorf("target %s: price_in, price_out, latency_ms, max_context and timeout_ms must not be negative", t.Name)
	}
	if t.DraftWithEngine && (kindOrDefault(t.Kind) != KindOpenAI || (t.Tier != "T1" && t.Tier != "T2")) {
		return fmt.Errorf("target %s: draft_with_engine is for a kind openai target of tier T1 or T2 (a Molly engine on another machine), not %s %s", t.Name, kindOrDefault(t.Kind), t.Tier)
	}
	if t.DraftTokens < 0 || t.DraftTokens > 64 || (t.DraftTokens > 0 && !t.DraftWithEngine) {
		return fmt.Errorf("target %s: draft_tokens %d must be 1..64, with draft_with_engine", t.Name, t.DraftTokens)
	}
	if t.OutlierDetection != nil {
		if err := t.OutlierDetection.Validate(); err != nil {
			return fmt.Errorf("target %s: %w", t.Name, err)
		}
	}
	return nil
}

// provision resolves models, key and the one HTTP client of the target.
// engine is the in-process engine for kind engine (nil otherwise).
func (t *Target) provision(engine Engine) error {
	if err := t.Validate(); err != nil {
		return err
	}
	t.models = make(map[string]string, len(t.Models))
	for _, m := range t.Models {
		name, up, ok := strings.Cut(m, "=")
		if !ok {
			up = name
		}
		t.models[name] = up
	}
	if t.Region == "" && (t.Tier == "T0" || t.Tier == "T1") {
		t.Region = "local"
	}
	if len(t.Modalities) == 0 {
		t.Modalities = []string{"text"}
	}
	if t.DraftWithEngine && engine == nil {
		return fmt.Errorf("target %s: draft_with_engine needs the molly app's engine, and none is configured", t.Name)
	}
	t.missingKey = t.APIKeyEnv != "" && os.Getenv(t.APIKeyEnv) == ""
	caps := t.Capabilities
	if t.Kind == KindEngine {
		if engine == nil {
			return fmt.Errorf("target %s: kind engine needs the molly app's engine, and none is configured", t.Name)
		}
		t.engine = engine // serves the engine's models (adapters come and go) besides any aliases
		if c, ok := engine.(interface{ ContextTokens() int }); ok && t.MaxContext == 0 {
			t.MaxContext = c.ContextTokens()
		}
		implemented := EngineCapabilities(engine)
		if len(caps) == 0 {
			caps = implemented
		} else {
			caps = slices.DeleteFunc(slices.Clone(caps), func(c string) bool { return !slices.Contains(implemented, c) })
		}
		if caps == nil {
			caps = []string{}
		}
	}
	if caps != nil {
		t.caps = make(map[string]bool, len(caps))
		for _, c := range caps {
			t.caps[c] = true
		}
		for c, m := range map[string]string{CapVision: "image", CapAudio: "audio"} {
			if t.caps[c] && !slices.Contains(t.Modalities, m) {
				t.Modalities = append(t.Modalities, m)
			}
		}
		if len(t.Endpoints) == 0 {
			t.Endpoints = []string{string(openai.EndpointChat), string(openai.EndpointCompletions)}
			if t.caps[CapEmbeddings] {
				t.Endpoints = append(t.Endpoints, string(openai.EndpointEmbeddings))
			}
		}
	}
	return nil
}

// CapabilityNames lists the target's capabilities (every one when it
// declared none), sorted.
func (t *Target) CapabilityNames() []string {
	var out []string
	for _, c := range AllCapabilities {
		if t.Supports(c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// Timeout is how long connecting plus waiting for response headers may
// take (TimeoutMS; default 30 s).
func (t *Target) Timeout() time.Duration {
	if t.TimeoutMS > 0 {
		return time.Duration(t.TimeoutMS) * time.Millisecond
	}
	return 30 * time.Second
}

// Cost returns the USD cost of the tokens at t's prices (USD per 1M tokens).
func (t *Target) Cost(prompt, completion int) float64 {
	return (float64(prompt)*t.PriceIn + float64(completion)*t.PriceOut) / 1e6
}

// quality is the prior for task (falling back to "default", then 0.5).
func (t *Target) quality(task string) float64 {
	if q, ok := t.Quality[task]; ok {
		return q
	}
	if q, ok := t.Quality["default"]; ok {
		return q
	}
	return 0.5
}

// Catalogue is the set of targets. Read-only after NewCatalogue.
type Catalogue struct {
	targets []*Target
	// policy is PolicyTargets' conversion (policyview.go).
	policy atomic.Pointer[policyTargets]
}

// NewCatalogue validates and provisions targets. engine serves kind engine
// targets in-process and may be nil when there are none.
func NewCatalogue(targets []*Target, engine Engine) (*Catalogue, error) {
	seen := map[string]bool{}
	for _, t := range targets {
		if seen[t.Name] {
			return nil, fmt.Errorf("target %s: declared twice", t.Name)
		}
		seen[t.Name] = true
		if err := t.provision(engine); err != nil {
			return nil, err
		}
	}
	return &Catalogue{targets: targets}, nil
}

// Targets returns the targets in declaration order.
func (c *Catalogue) Targets() []*Target { return c.targets }

// MissingKeys lists the targets that are never routed to for want of their
// API key (Target.MissingKey), in declaration order.
func (c *Catalogue) MissingKeys() []*Target {
	var out []*Target
	for _, t := range c.targets {
		if t.MissingKey() != "" {
			out = append(out, t)
		}
	}
	return out
}

// Models returns the client-facing model names served by targets that the
// decision allows, sorted and de-duplicated.
func (c *Catalogue) Models(d *policies.Decision) []string {
	var out []string
	for _, t := range c.targets {
		if !d.AllowsTier(t.Tier) || !RegionAllowed(d, t) {
			continue
		}
		out = append(out, t.modelNames()...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Serves reports whether some target serves the client-facing model name,
// whatever a policy would allow.
func (c *Catalogue) Serves(model string) bool {
	for _, t := range c.targets {
		if slices.Contains(t.modelNames(), model) {
			return true
		}
	}
	return false
}

// EngineModel reports the in-process engine's name for the client-facing
// model when every target serving it is a kind engine target (the first
// one's, in declaration order): then the engine's own token count is the
// count of whichever target serves it. ok is false when no target serves
// the model or another kind does.
func (c *Catalogue) EngineModel(model string) (upstream string, ok bool) {
	for _, t := range c.targets {
		up, serves := t.upstream(model)
		if !serves {
			continue
		}
		if t.Kind != KindEngine || t.engine == nil {
			return "", false
		}
		if !ok {
			upstream, ok = up, true
		}
	}
	return upstream, ok
}

// RegionAllowed reports whether the decision's regions admit t.
func RegionAllowed(d *policies.Decision, t *Target) bool {
	regions := d.Regions()
	return len(regions) == 0 || slices.Contains(regions, t.Region)
}

// PolicyView is the targets as the policy input document shows them
// (input.targets).
func (c *Catalogue) PolicyView() []any {
	out := make([]any, 0, len(c.targets))
	for _, t := range c.targets {
		out = append(out, t.PolicyView())
	}
	return out
}

// PolicyView is the target as the policy input document shows it.
func (t *Target) PolicyView() map[string]any { return t.policyViewOf(t.modelNames()) }

// policyViewOf is PolicyView with the model names given.
func (t *Target) policyViewOf(models []string) map[string]any {
	names := []any{}
	for _, m := range models {
		names = append(names, m)
	}
	return map[string]any{
		"name": t.Name, "tier": t.Tier, "kind": kindOrDefault(t.Kind), "region": t.Region,
		"models": names, "price_in": t.PriceIn, "price_out": t.PriceOut,
	}
}

func kindOrDefault(k string) string {
	if k == "" {
		return KindOpenAI
	}
	return k
}
