package pipeline

import (
	"errors"
	"net/http"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
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

// guardBody applies g to the text of a whole answer: message content and
// refusal, completion text, and tool-call arguments (kept only when they
// stay valid JSON; otherwise the answer is refused). It returns the body,
// or the refusal.
func guardBody(g *redaction.Guard, body []byte) ([]byte, error) {
	out := body
	var err error
	set := func(path string, v gjson.Result, json bool) {
		if err != nil || v.Type != gjson.String || v.Str == "" {
			return
		}
		text, _, cerr := g.Check(v.Str)
		if cerr != nil {
			err = cerr
			return
		}
		if text == v.Str {
			return
		}
		if json && gjson.Valid(v.Str) && !gjson.Valid(text) {
			err = &redaction.BlockedError{Type: "a value inside tool-call arguments"}
			return
		}
		out, _ = sjson.SetBytes(out, path, text)
	}
	gjson.GetBytes(body, "choices").ForEach(func(i, ch gjson.Result) bool {
		base := "choices." + i.String()
		set(base+".message.content", ch.Get("message.content"), false)
		set(base+".message.refusal", ch.Get("message.refusal"), false)
		set(base+".text", ch.Get("text"), false)
		ch.Get("message.tool_calls").ForEach(func(k, tc gjson.Result) bool {
			set(base+".message.tool_calls."+k.String()+".function.arguments", tc.Get("function.arguments"), true)
			return true
		})
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
