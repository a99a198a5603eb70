package serving

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/molly-gateway/molly/serving/gguf"
)

// Activated LoRA (aLoRA: Greenewald et al., "Activated LoRA: Fine-tuned LLMs
// for Intrinsics", 2025; llama.cpp's adapter.alora.invocation_tokens): an
// adapter that applies only from its invocation sequence on. The tokens
// before the last occurrence of the invocation tokens in the prompt are
// decoded by the base model, the invocation and everything after it (the
// rest of the prompt and every generated token) with the adapter — Molly's
// per-token adapters make that one batch. A prompt without the invocation
// sequence runs on the base model alone, as llama.cpp's server does.
//
// KV reuse: the prefix cache records up to where a cached prompt's cells
// were computed by the base model (its split), so an aLoRA request reuses a
// base request's prompt KV for its tokens before the invocation without
// re-encoding them (and a base request reuses an aLoRA request's base
// part). Plain LoRA adapters keep their behaviour: nothing before their
// first token is base-computed, so they reuse only their own version's
// cache.

// maxInvocationTokens bounds the arrays read from an adapter header: an
// invocation sequence is a few tokens.
const maxInvocationTokens = 256

// invocationTokens reads an adapter's aLoRA invocation tokens (nil: plain
// LoRA). Errors: the key holds something else than token ids, or more than
// maxInvocationTokens of them.
func invocationTokens(kv ggml.KV) ([]int32, error) {
	v, ok := kv[gguf.KeyALoRAInvocation]
	if !ok {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", gguf.KeyALoRAInvocation, err)
	}
	var toks []int32
	if err := json.Unmarshal(b, &toks); err != nil || len(toks) == 0 {
		return nil, fmt.Errorf("%s must be 1 to %d token ids", gguf.KeyALoRAInvocation, maxInvocationTokens)
	}
	return toks, nil
}

// baseSplit is how many leading prompt tokens of a request on entry the base
// model computes: all of them (math.MaxInt) on the base model or for an
// aLoRA whose invocation is not in the prompt (the adapter is then off);
// the start of the invocation's last occurrence for an aLoRA; 0 for a plain
// LoRA. off reports an aLoRA that stays off.
func baseSplit(entry *adapterEntry, prompt []int32) (split int, off bool) {
	if entry == nil {
		return math.MaxInt, false
	}
	inv := entry.invocation
	if inv == nil {
		return 0, false
	}
	for i := len(prompt) - len(inv); i >= 0; i-- {
		match := true
		for k, t := range inv {
			if prompt[i+k] != t {
				match = false
				break
			}
		}
		if match {
			return i, false
		}
	}
	return math.MaxInt, true
}

// reusableLen is how many leading tokens of prompt (a request on key whose
// base model computes the first split tokens) could take their KV from the
// cached prefix cp: positions both computed the same way — by the base
// model before both splits, by the same adapter version from the same split
// on.
func reusableLen(cp *cachedPrefix, prompt []int32, key *adapterEntry, split int) int {
	l := 0
	for l < len(cp.tokens) && l < len(prompt) && cp.tokens[l] == prompt[l] {
		l++
	}
	lo := min(cp.split, split)
	if l <= lo || cp.split == split && cp.key == key {
		return l
	}
	return lo
}
