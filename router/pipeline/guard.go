package pipeline

import (
	"errors"
	"net/http"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
)

// outputGuard is the guard of answers from o's tier, from the decision's
// output rule (policies/redaction.rego): entity types the model wrote are
// masked or make the answer refused; values Molly restored from the vault
// are not flagged. nil when the rule lets everything pass.
func (p *Pipeline) outputGuard(rq *request, o *outcome) *redaction.Guard {
	rule := rq.dec.Output(o.cand.Target.Tier)
	if len(rule.Mask) == 0 && len(rule.Block) == 0 {
		return nil
	}
	scanner := rq.a.Classifier().Scanner()
	pol := redaction.GuardPolicy{Actions: map[string]redaction.GuardAction{}}
	for _, t := range scanner.Types() {
		switch {
		case rule.Blocks(t):
			pol.Actions[t] = redaction.GuardBlock
		case rule.Masks(t):
			pol.Actions[t] = redaction.GuardMask
		default:
			pol.Actions[t] = redaction.GuardPass
		}
	}
	var restored []string
	if v := o.disp.Vault(); v != nil {
		restored = v.Values()
	}
	return scanner.NewGuard(pol, restored...)
}

// ErrOutputBlocked is the 403 of an answer holding a value the policy's
// output rule blocks; it names the type, never the value.
func outputBlocked(rq *request, err error) *openai.Error {
	typ := "a blocked entity type"
	var be *redaction.BlockedError
	if errors.As(err, &be) {
		typ = be.Type
	}
	return &openai.Error{Status: http.StatusForbidden, Type: "policy_denied", Code: "output_blocked",
		Message: "The answer was withheld: it holds " + typ + ", which the policy does not let this tier's answers carry.",
		Extra:   map[string]any{"decision_id": rq.dec.ID()}}
}

// guardBody applies g to the text of a whole answer: every string of
// each choice's message (content, refusal, reasoning_content and any
// other text an upstream adds, such as reasoning or audio.transcript),
// the completion text, and function-call arguments (tool_calls and the
// legacy function_call, kept only when they stay valid JSON; otherwise the
// answer is refused). Identifiers (role, id, type, name, tool_call_id) and
// audio data are not text and are left alone. A choice whose content or
// refusal was masked gets "logprobs": null: its tokens spell what the
// mask removed. It returns the body, or the refusal.
func guardBody(g *redaction.Guard, body []byte) ([]byte, error) {
	out := body
	var err error
	set := func(path string, v gjson.Result, json bool) bool {
		if err != nil || v.Type != gjson.String || v.Str == "" {
			return false
		}
		text, _, cerr := g.Check(v.Str)
		if cerr != nil {
			err = cerr
			return false
		}
		if text == v.Str {
			return false
		}
		if json && gjson.Valid(v.Str) && !gjson.Valid(text) {
			err = &redaction.BlockedError{Type: "a value inside tool-call arguments"}
			return false
		}
		out, _ = sjson.SetBytes(out, path, text)
		return true
	}
	// walk guards the strings below v, at path.
	var walk func(path, key string, v gjson.Result) bool
	walk = func(path, key string, v gjson.Result) bool {
		switch {
		case v.Type == gjson.String:
			if guardSkipKeys[key] {
				return false
			}
			return set(path, v, key == "arguments")
		case v.IsObject() || v.IsArray():
			changed := false
			v.ForEach(func(k, e gjson.Result) bool {
				name := k.String()
				if key == "audio" && name == "data" {
					return true
				}
				changed = walk(path+"."+relay.EscapeKey(name), name, e) || changed
				return err == nil
			})
			return changed
		}
		return false
	}
	gjson.GetBytes(body, "choices").ForEach(func(i, ch gjson.Result) bool {
		base := "choices." + i.String()
		masked := set(base+".text", ch.Get("text"), false)
		ch.Get("message").ForEach(func(k, e gjson.Result) bool {
			name := k.String()
			changed := walk(base+".message."+relay.EscapeKey(name), name, e)
			masked = masked || (changed && (name == "content" || name == "refusal"))
			return err == nil
		})
		if masked && ch.Get("logprobs").Type != gjson.Null && ch.Get("logprobs").Exists() {
			out, _ = sjson.SetRawBytes(out, base+".logprobs", []byte("null"))
		}
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// guardSkipKeys name the strings of an answer that are identifiers, not
// text the model wrote.
var guardSkipKeys = map[string]bool{"role": true, "id": true, "type": true, "name": true, "tool_call_id": true}
