package app

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/dustin/go-humanize"

	"github.com/molly-gateway/molly/learning/federation"
	"github.com/molly-gateway/molly/learning/specialise"
	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/router/orchestrate"
	"github.com/molly-gateway/molly/router/route"
	"github.com/molly-gateway/molly/serving"
	"github.com/molly-gateway/molly/serving/llama"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("molly", parseGlobal)
	// The request walk is auth → classify → policy → route; plugins may
	// only be ordered against standard directives. Authentication goes
	// right after forward_auth, so it runs before any handle/route block
	// can answer (molly_auth lives in caddy-modules/auth); the other three
	// go before reverse_proxy, in this order.
	httpcaddyfile.RegisterDirectiveOrder("molly_auth", httpcaddyfile.After, "forward_auth")
	httpcaddyfile.RegisterDirectiveOrder("molly_classify", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterDirectiveOrder("molly_policy", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterDirectiveOrder("molly_route", httpcaddyfile.Before, "reverse_proxy")
	// molly_feedback answers POST /v1/feedback on its own route (handle).
	httpcaddyfile.RegisterDirectiveOrder("molly_feedback", httpcaddyfile.Before, "reverse_proxy")
}

// parseGlobal parses the global option:
//
//	molly {
//		policy_dir <dir>
//		policy_timeout <duration>
//		cost_weight <per-USD>
//		latency_weight <per-second>
//		registry <sqlite path>
//		priors_db <sqlite path>   # deprecated: a legacy priors file imported into the registry once
//		cascade {
//			threshold <mean token logprob, nats>
//			max_attempts <n>
//			order cheap|score
//			self_check
//			hold_tokens <n>
//		}
//		mixture {
//			entropy <nats>
//			k <n>
//		}
//		engine {
//			model <gguf>
//			name <served name>
//			adapters <dir>
//			adapter <name> <gguf>
//			n_seq_max <n>
//			n_ctx <tokens>
//			n_batch <tokens>
//			prefill_chunk <tokens>
//			threads <n>
//			hot_bytes <size>
//			warm_bytes <size>
//			memory_bytes <size>
//			prefix_cache
//			kv_cache_type f16|q8_0|q4_0        # K and V cache type (quantized: flash attention)
//			draft_model <gguf>                 # speculative decoding draft (shares the tokenizer)
//			draft_tokens <k>                   # tokens drafted per verification (default 4)
//			reasoning_adapter <adapter name>   # the reasoning switcher's adapter
//			reasoning_threshold <0..1>         # difficulty at or above which it reasons
//			reasoning_probe <json>             # linear probe on the prompt's hidden state (molly switcher train)
//			reasoning_budget <low> <medium> <high> [<xhigh> [<max>]]   # tokens per reasoning_effort
//			reasoning_delimiters <start> <end> # default: from the chat template
//			n_chains <n> [<adapter>]           # default parallel chains voted on (base: no adapter)
//			answer_regex <RE2>                 # a chain's answer: last match (first group)
//			answer_field <gjson path>          # or a field of JSON content
//		}
//		specialise {                      # trace capture and the learning loop (learning/specialise)
//			every <duration> | at <HH:MM>  # schedule; neither: only `molly specialise run --once`
//			min_traces <n>                 # new traces a domain needs since its last cycle (50)
//			budget <duration>              # wall-clock bound of one domain's training (10m)
//			domains <category>...          # default: every category with traces
//			rank <r>                       # LoRA rank (8)
//			steps <n>                      # optimiser steps (100)
//			batch_size <n>                 # examples per step (8)
//			learning_rate <lr>             # Adam's (1e-2)
//			threads <n>                    # trainer threads (all)
//			margin <0..1>                  # least held-out NLL gain to promote (0.1)
//			regression_budget <0..1>       # most general-probe NLL regression (0.01)
//			held_out <0..1>                # share of prompts held out (0.2)
//			retention_days <n>             # default trace retention (90; -1 forever)
//			external_trainer <argv>...     # {train} {heldout} {base} {out} {rank} {steps}
//			dir <path>                     # versions and checkpoints (beside the registry)
//		}
//		federation {                      # federated adapter improvement (learning/federation)
//			role participant|aggregator|both
//			aggregator https://<host:port>  # participant: the aggregator's URL
//			listen <addr>                  # aggregator: the mutual-TLS listener
//			peers <cert name>...           # aggregator: the participants' certificate names
//			cert <pem>  key <pem>  ca <pem>
//			rounds <duration>              # a round's deadline after its first report (10m)
//			min_participants <n>           # (2)
//			rank <r>  max_delta_size <size>  dir <path>  state <file>
//			dp { clip <C>  noise_multiplier <σ>  delta <δ>  epsilon_budget <ε> }
//		}
//		orchestrator off | {
//			controller <model>
//			controller_tier T0|T1|T2|T3
//			controller_tokens <n>
//			model <specialist model>
//			auto
//			max_parallel <n>
//			subtask_tokens <n>
//			tier_ceiling T0|T1|T2|T3
//			max_refinements <n>
//			plans_kept <n>
//		}
//		target <name> {
//			tier T0|T1|T2|T3
//			kind openai|engine
//			endpoint <base-url>
//			models <name>[=<upstream>]...
//			api_key_env <VAR>                 # unset or empty: warned about, never routed to
//			price <in-usd-per-1M> <out-usd-per-1M>
//			latency <duration>
//			quality [<task>] <0..1>
//			region <region>
//			modalities <modality>...
//			capabilities tools|json_schema|vision|audio|embeddings|logprobs...
//			endpoints chat.completions|completions|embeddings...
//			max_context <tokens>
//			timeout <duration>
//			outlier_detection { ... } | off   # as below; unset fields from the global one
//			draft_with_engine                 # T1/T2 Molly engine: the engine block's model drafts, it verifies
//			draft_tokens <k>                  # tokens drafted per verify call (default 4)
//		}
//		outlier_detection {               # circuit breaking, for every target (router/health)
//			consecutive_5xx <n>
//			interval <duration>
//			base_ejection_time <duration>
//			max_ejection_time <duration>
//			max_ejection_percent <0..100>
//			failure_percentage_threshold <0..100>
//			failure_percentage_request_volume <n>
//			latency_threshold <duration>
//		}
//	}
func parseGlobal(d *caddyfile.Dispenser, existing any) (any, error) {
	a := new(App)
	if existing != nil {
		return nil, d.Err("molly: the global option may appear only once")
	}
	d.Next() // "molly"
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "policy_dir":
			if !d.AllArgs(&a.PolicyDir) {
				return nil, d.ArgErr()
			}
		case "policy_timeout":
			dur, err := durationArg(d)
			if err != nil {
				return nil, err
			}
			a.PolicyTimeout = caddy.Duration(dur)
		case "cost_weight", "latency_weight":
			name := d.Val()
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			if a.Weights == nil {
				w := route.DefaultWeights
				a.Weights = &w
			}
			if name == "cost_weight" {
				a.Weights.Cost = v
			} else {
				a.Weights.Latency = v
			}
		case "registry":
			if !d.AllArgs(&a.RegistryFile) {
				return nil, d.ArgErr()
			}
		case "priors_db":
			if !d.AllArgs(&a.PriorsDB) {
				return nil, d.ArgErr()
			}
		case "cascade":
			c, err := parseCascade(d)
			if err != nil {
				return nil, err
			}
			a.Cascade = c
		case "mixture":
			m, err := parseMixture(d)
			if err != nil {
				return nil, err
			}
			a.Mixture = m
		case "engine":
			e, err := parseEngine(d)
			if err != nil {
				return nil, err
			}
			a.EngineConfig = e
		case "target":
			t, err := parseTarget(d)
			if err != nil {
				return nil, err
			}
			a.Targets = append(a.Targets, t)
		case "tool":
			t, err := parseTool(d)
			if err != nil {
				return nil, err
			}
			a.Tools = append(a.Tools, t)
		case "tool_steps":
			var v string
			if !d.AllArgs(&v) {
				return nil, d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return nil, d.Errf("molly: tool_steps %q: want a positive integer", v)
			}
			a.ToolSteps = n
		case "usage_tool":
			if !d.AllArgs(&a.UsageTool) {
				return nil, d.ArgErr()
			}
		case "orchestrator":
			if err := parseOrchestrator(d, a); err != nil {
				return nil, err
			}
		case "outlier_detection":
			c, err := parseOutlierDetection(d)
			if err != nil {
				return nil, err
			}
			a.OutlierDetection = c
		case "specialise":
			c, err := parseSpecialise(d)
			if err != nil {
				return nil, err
			}
			a.Specialise = c
		case "federation":
			c, err := federation.ParseCaddyfile(d)
			if err != nil {
				return nil, err
			}
			a.Federation = &c
		default:
			return nil, d.Errf("molly: unrecognized subdirective %q", d.Val())
		}
	}
	if err := a.Validate(); err != nil {
		return nil, d.Err(err.Error())
	}
	return httpcaddyfile.App{Name: "molly", Value: caddyconfig.JSON(a, nil)}, nil
}

// parseOrchestrator reads `orchestrator off` or an orchestrator block
// (orchestrate.Config).
func parseOrchestrator(d *caddyfile.Dispenser, a *App) error {
	if d.NextArg() {
		if d.Val() != "off" || d.NextArg() {
			return d.Errf("molly: orchestrator takes a block or off, not %q", d.Val())
		}
		a.NoOrchestrator = true
		return nil
	}
	c := &orchestrate.Config{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		switch sub {
		case "controller", "controller_tier", "model", "tier_ceiling":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			switch sub {
			case "controller":
				c.Controller = v
			case "controller_tier":
				c.ControllerTier = v
			case "model":
				c.Model = v
			default:
				c.TierCeiling = v
			}
		case "auto":
			if d.NextArg() {
				return d.ArgErr()
			}
			c.Auto = true
		case "controller_tokens", "max_parallel", "subtask_tokens", "max_refinements", "plans_kept":
			var v string
			if !d.AllArgs(&v) {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || (n == 0 && sub != "max_refinements") {
				return d.Errf("molly: orchestrator: %s %q: want a positive integer", sub, v)
			}
			switch sub {
			case "controller_tokens":
				c.ControllerTokens = n
			case "max_parallel":
				c.MaxParallel = n
			case "subtask_tokens":
				c.SubtaskTokens = n
			case "max_refinements":
				c.MaxRefinements = &n
			default:
				c.PlansKept = n
			}
		default:
			return d.Errf("molly: orchestrator: unrecognized subdirective %q", sub)
		}
		if err := c.Validate(); err != nil { // here, so the error names this line
			return d.Errf("molly: %v", err)
		}
	}
	a.Orchestrator = c
	return nil
}

// parseTool reads `tool <name> { path <binary>; sha256 <hex>; env <NAME> <value> }`.
func parseTool(d *caddyfile.Dispenser) (plugins.Config, error) {
	var c plugins.Config
	if !d.NextArg() {
		return c, d.Err("molly: tool needs a name: tool <name> { path ...; sha256 ... }")
	}
	c.Name = d.Val()
	if d.NextArg() {
		return c, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch d.Val() {
		case "path":
			if !d.AllArgs(&c.Path) {
				return c, d.ArgErr()
			}
		case "sha256":
			if !d.AllArgs(&c.SHA256) {
				return c, d.ArgErr()
			}
		case "env":
			var k, v string
			if !d.AllArgs(&k, &v) {
				return c, d.Err("molly: tool env needs a name and a value: env <NAME> <value>")
			}
			if c.Env == nil {
				c.Env = map[string]string{}
			}
			c.Env[k] = v
		default:
			return c, d.Errf("molly: tool %s: unrecognized subdirective %q", c.Name, d.Val())
		}
	}
	return c, nil
}

func parseTarget(d *caddyfile.Dispenser) (*route.Target, error) {
	t := &route.Target{}
	if !d.NextArg() {
		return nil, d.Err("molly: target needs a name: target <name> { ... }")
	}
	t.Name = d.Val()
	file, line := d.File(), d.Line()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		var err error
		switch sub {
		case "tier":
			if !d.AllArgs(&t.Tier) {
				return nil, d.ArgErr()
			}
			if !slices.Contains(policies.Tiers, t.Tier) {
				return nil, d.Errf("molly: target %s: tier %q must be one of T0, T1, T2, T3", t.Name, t.Tier)
			}
		case "kind":
			if !d.AllArgs(&t.Kind) {
				return nil, d.ArgErr()
			}
		case "endpoint":
			if !d.AllArgs(&t.Endpoint) {
				return nil, d.ArgErr()
			}
		case "api_key_env":
			if !d.AllArgs(&t.APIKeyEnv) {
				return nil, d.ArgErr()
			}
		case "region":
			if !d.AllArgs(&t.Region) {
				return nil, d.ArgErr()
			}
		case "models":
			t.Models = append(t.Models, d.RemainingArgs()...)
			if len(t.Models) == 0 {
				return nil, d.ArgErr()
			}
		case "modalities":
			t.Modalities = append(t.Modalities, d.RemainingArgs()...)
		case "capabilities":
			t.Capabilities = append(t.Capabilities, d.RemainingArgs()...)
			if len(t.Capabilities) == 0 {
				return nil, d.ArgErr()
			}
		case "endpoints":
			t.Endpoints = append(t.Endpoints, d.RemainingArgs()...)
			if len(t.Endpoints) == 0 {
				return nil, d.ArgErr()
			}
		case "price":
			args := d.RemainingArgs()
			if len(args) != 2 {
				return nil, d.Err("molly: price takes two numbers: USD per 1M prompt tokens and per 1M completion tokens")
			}
			if t.PriceIn, err = strconv.ParseFloat(args[0], 64); err == nil {
				t.PriceOut, err = strconv.ParseFloat(args[1], 64)
			}
		case "latency", "timeout":
			var dur time.Duration
			if dur, err = durationArg(d); err == nil {
				if sub == "latency" {
					t.LatencyMS = float64(dur) / float64(time.Millisecond)
				} else {
					t.TimeoutMS = int(dur / time.Millisecond)
				}
			}
		case "max_context":
			var v float64
			if v, err = floatArg(d); err == nil {
				t.MaxContext = int(v)
			}
		case "draft_with_engine":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			t.DraftWithEngine = true
		case "draft_tokens":
			var v float64
			if v, err = floatArg(d); err == nil {
				if v != float64(int(v)) {
					err = fmt.Errorf("%v is not a whole number of tokens", v)
				}
				t.DraftTokens = int(v)
			}
		case "outlier_detection":
			t.OutlierDetection, err = parseOutlierDetection(d)
			if err != nil {
				return nil, err
			}
		case "quality":
			args := d.RemainingArgs()
			task := "default"
			switch len(args) {
			case 1:
			case 2:
				task, args = args[0], args[1:]
			default:
				return nil, d.Err("molly: quality takes [<task>] <value in 0..1>")
			}
			var q float64
			if q, err = strconv.ParseFloat(args[0], 64); err == nil {
				if t.Quality == nil {
					t.Quality = map[string]float64{}
				}
				t.Quality[task] = q
			}
		default:
			return nil, d.Errf("molly: target %s: unrecognized subdirective %q", t.Name, sub)
		}
		if err != nil {
			return nil, d.Errf("molly: target %s: %s: %v", t.Name, sub, err)
		}
	}
	if err := t.Validate(); err != nil {
		// Point at the target's own line, not the block's closing brace.
		return nil, fmt.Errorf("molly: %v, at %s:%d", err, file, line)
	}
	return t, nil
}

// parseCascade parses a cascade block; a missing threshold is
// route.DefaultCascadeThreshold.
func parseCascade(d *caddyfile.Dispenser) (*route.Cascade, error) {
	c := &route.Cascade{Threshold: route.DefaultCascadeThreshold}
	if d.NextArg() {
		return nil, d.Errf("molly: cascade takes a block, not %q", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch sub := d.Val(); sub {
		case "threshold", "max_attempts", "hold_tokens":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			switch sub {
			case "threshold":
				c.Threshold = v
			case "max_attempts":
				if c.MaxAttempts = int(v); v < 1 || v != float64(c.MaxAttempts) {
					return nil, d.Errf("molly: cascade: max_attempts must be a positive integer")
				}
			default:
				if c.HoldTokens = int(v); v < 0 || v != float64(c.HoldTokens) {
					return nil, d.Errf("molly: cascade: hold_tokens must be a whole number of tokens, 0 or more")
				}
			}
		case "order":
			if !d.AllArgs(&c.Order) {
				return nil, d.ArgErr()
			}
		case "self_check":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			c.SelfCheck = true
		default:
			return nil, d.Errf("molly: cascade: unrecognized subdirective %q", sub)
		}
		if err := c.Validate(); err != nil { // here, so the error names this line
			return nil, d.Errf("molly: %v", err)
		}
	}
	return c, nil
}

// parseMixture parses a mixture block; a missing entropy is
// route.DefaultMixtureEntropy.
func parseMixture(d *caddyfile.Dispenser) (*route.Mixture, error) {
	m := &route.Mixture{Entropy: route.DefaultMixtureEntropy}
	if d.NextArg() {
		return nil, d.Errf("molly: mixture takes a block, not %q", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		switch sub := d.Val(); sub {
		case "entropy":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			m.Entropy = v
		case "k":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			if m.K = int(v); v < 2 || v != float64(m.K) {
				return nil, d.Errf("molly: mixture: k must be an integer of at least 2")
			}
		default:
			return nil, d.Errf("molly: mixture: unrecognized subdirective %q", sub)
		}
		if err := m.Validate(); err != nil { // here, so the error names this line
			return nil, d.Errf("molly: %v", err)
		}
	}
	return m, nil
}

func durationArg(d *caddyfile.Dispenser) (time.Duration, error) {
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, d.Errf("invalid duration %q: %v", s, err)
	}
	return dur, nil
}

func floatArg(d *caddyfile.Dispenser) (float64, error) {
	var s string
	if !d.AllArgs(&s) {
		return 0, d.ArgErr()
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, d.Errf("invalid number %q", s)
	}
	return v, nil
}

func parseEngine(d *caddyfile.Dispenser) (*serving.Config, error) {
	c := &serving.Config{}
	if d.NextArg() {
		return nil, d.Errf("molly: engine takes a block, not %q", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		switch sub {
		case "model":
			if !d.AllArgs(&c.ModelPath) {
				return nil, d.ArgErr()
			}
		case "name":
			if !d.AllArgs(&c.ModelName) {
				return nil, d.ArgErr()
			}
		case "adapters":
			if !d.AllArgs(&c.AdapterDir) {
				return nil, d.ArgErr()
			}
		case "prefix_cache":
			if d.NextArg() {
				return nil, d.ArgErr()
			}
			c.PrefixCache = true
		case "kv_cache_type":
			if !d.AllArgs(&c.KVCacheType) {
				return nil, d.ArgErr()
			}
			if _, _, err := llama.KVTypeBytes(c.KVCacheType); err != nil {
				return nil, d.Errf("molly: engine: kv_cache_type: %v", err)
			}
		case "draft_model":
			if !d.AllArgs(&c.DraftModel) {
				return nil, d.ArgErr()
			}
		case "reasoning_adapter":
			if !d.AllArgs(&c.Reasoning.Adapter) {
				return nil, d.ArgErr()
			}
		case "reasoning_delimiters":
			if !d.AllArgs(&c.Reasoning.Start, &c.Reasoning.End) {
				return nil, d.Err("molly: engine: reasoning_delimiters takes <start> <end>")
			}
		case "n_chains":
			args := d.RemainingArgs()
			if len(args) < 1 || len(args) > 2 {
				return nil, d.Err("molly: engine: n_chains takes <n> [<adapter>]")
			}
			n, err := strconv.Atoi(args[0])
			if err != nil || n < 1 {
				return nil, d.Errf("molly: engine: n_chains %q is not a positive integer", args[0])
			}
			name := ""
			if len(args) == 2 {
				name = args[1]
			}
			if c.Reasoning.Chains == nil {
				c.Reasoning.Chains = map[string]int{}
			}
			c.Reasoning.Chains[name] = n
		case "reasoning_probe":
			if !d.AllArgs(&c.Reasoning.Probe) {
				return nil, d.ArgErr()
			}
		case "answer_regex":
			if !d.AllArgs(&c.Reasoning.AnswerRegex) {
				return nil, d.ArgErr()
			}
		case "answer_field":
			if !d.AllArgs(&c.Reasoning.AnswerField) {
				return nil, d.ArgErr()
			}
		case "reasoning_threshold":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			if v <= 0 || v > 1 {
				return nil, d.Errf("molly: engine: reasoning_threshold must be in (0, 1]")
			}
			c.Reasoning.Threshold = v
		case "reasoning_budget":
			s := d.RemainingArgs()
			if len(s) < 3 || len(s) > 5 {
				return nil, d.Err("molly: engine: reasoning_budget takes <low> <medium> <high> [<xhigh> [<max>]] token counts")
			}
			n := make([]int, 5)
			for i, x := range s {
				v, err := strconv.Atoi(x)
				if err != nil || v < 1 {
					return nil, d.Errf("molly: engine: reasoning_budget %q is not a positive token count", x)
				}
				n[i] = v
			}
			c.Reasoning.Low, c.Reasoning.Medium, c.Reasoning.High, c.Reasoning.XHigh, c.Reasoning.Max = n[0], n[1], n[2], n[3], n[4]
		case "adapter":
			var name, path string
			if !d.AllArgs(&name, &path) {
				return nil, d.Err("molly: engine: adapter takes <name> <gguf path>")
			}
			if c.Adapters == nil {
				c.Adapters = map[string]string{}
			}
			c.Adapters[name] = path
		case "n_seq_max", "n_ctx", "n_batch", "prefill_chunk", "threads", "draft_tokens":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			if v < 1 || v != float64(int(v)) {
				return nil, d.Errf("molly: engine: %s must be a positive integer", sub)
			}
			n := int(v)
			switch sub {
			case "n_seq_max":
				c.NSeqMax = n
			case "n_ctx":
				c.NCtx = n
			case "n_batch":
				c.NBatch = n
			case "prefill_chunk":
				c.PrefillChunk = n
			case "draft_tokens":
				c.DraftTokens = n
			case "threads":
				c.Threads = n
			}
		case "hot_bytes", "warm_bytes", "memory_bytes":
			var s string
			if !d.AllArgs(&s) {
				return nil, d.ArgErr()
			}
			n, err := humanize.ParseBytes(s)
			if err != nil || n == 0 {
				return nil, d.Errf("molly: engine: %s %q is not a size such as 256MiB", sub, s)
			}
			switch sub {
			case "hot_bytes":
				c.HotBytes = int64(n)
			case "warm_bytes":
				c.WarmBytes = int64(n)
			default:
				c.MemoryBytes = int64(n)
			}
		default:
			return nil, d.Errf("molly: engine: unrecognized subdirective %q", sub)
		}
	}
	if c.ModelPath == "" {
		return nil, d.Err("molly: engine: model <gguf path> is required")
	}
	return c, nil
}

// NoArgs parses a handler directive that takes neither arguments nor a
// block; hint says where its settings live instead.
func NoArgs(d *caddyfile.Dispenser, directive, hint string) error {
	d.Next()
	if d.NextArg() || d.NextBlock(0) {
		return d.Errf("%s: takes no arguments; %s", directive, hint)
	}
	return nil
}

func parseSpecialise(d *caddyfile.Dispenser) (*specialise.Config, error) {
	c := &specialise.Config{}
	if d.NextArg() {
		return nil, d.Errf("molly: specialise takes a block, not %q", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		switch sub {
		case "every", "budget":
			v, err := durationArg(d)
			if err != nil {
				return nil, err
			}
			if sub == "every" {
				c.Every = v
			} else {
				c.Budget = v
			}
		case "at":
			if !d.AllArgs(&c.At) {
				return nil, d.ArgErr()
			}
		case "dir":
			if !d.AllArgs(&c.Dir) {
				return nil, d.ArgErr()
			}
		case "domains":
			c.Domains = d.RemainingArgs()
			if len(c.Domains) == 0 {
				return nil, d.ArgErr()
			}
		case "external_trainer":
			c.ExternalTrainer = d.RemainingArgs()
			if len(c.ExternalTrainer) == 0 {
				return nil, d.ArgErr()
			}
		case "min_traces", "rank", "steps", "batch_size", "threads", "retention_days":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			if v != float64(int(v)) || (v < 1 && sub != "retention_days") {
				return nil, d.Errf("molly: specialise: %s must be a positive integer", sub)
			}
			n := int(v)
			switch sub {
			case "min_traces":
				c.MinTraces = n
			case "rank":
				c.Rank = n
			case "steps":
				c.Steps = n
			case "batch_size":
				c.BatchSize = n
			case "threads":
				c.Threads = n
			default:
				c.RetentionDays = n
			}
		case "learning_rate", "margin", "regression_budget", "held_out":
			v, err := floatArg(d)
			if err != nil {
				return nil, err
			}
			switch sub {
			case "learning_rate":
				c.LR = v
			case "margin":
				c.Gate.Margin = v
			case "regression_budget":
				c.Gate.RegressionBudget = v
			default:
				c.HeldOut = v
			}
		default:
			return nil, d.Errf("molly: specialise: unrecognized subdirective %q", sub)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, d.Err(err.Error())
	}
	return c, nil
}
