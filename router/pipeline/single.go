package pipeline

import (
	"net/http"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/route"
)

// single is the plain strategy: the first candidate that answers, trying
// the next on any failure before anything reached the client (fallback),
// and on an answer refusing the prompt as longer than the target's
// context window (contextExceeded; a context window fallback, as LiteLLM's
// context_window_fallbacks): when no candidate holds it, the client gets
// the last such refusal.
func (p *Pipeline) single(rq *request, cands []route.Candidate) error {
	var tooLong *outcome // the last answer saying the prompt exceeds its target's context
	for i, c := range cands {
		o := p.send(rq, c, 0)
		if o.kind == failClientGone {
			return p.clientGone(rq, &o)
		}
		if !o.ok() {
			rq.note(o)
			if o.meter.Recorded() && i < len(cands)-1 {
				// The failed attempt was billed (a stream that reported
				// usage or streamed text, then broke): the plan's
				// reservation holds one attempt, so the next one is
				// admitted only with a reservation of its own.
				if err := p.reserveAgain(rq); err != nil {
					return err
				}
			}
			continue
		}
		if why := contextExceeded(&o); why != "" && i < len(cands)-1 {
			// A context window fallback: the next candidate may hold the
			// prompt. The answer stays in hand for when none does.
			kept := o
			tooLong = &kept
			o.kind, o.failure = failContext, "the prompt exceeds its context window: "+why
			rq.note(o)
			continue
		}
		return p.respond(rq, &o, "")
	}
	if tooLong != nil {
		return p.respond(rq, tooLong, "")
	}
	return noTarget("All allowed targets for model `"+rq.a.Model()+"` failed", rq.plan.Excluded, rq.tried)
}

// contextExceeded returns the message of an upstream's answer refusing a
// prompt longer than its context window — a 400 or 413 whose error says so
// the way OpenAI and Azure (code context_length_exceeded), vLLM ("maximum
// context length", its flat error form included), llama.cpp's server (type
// exceed_context_size_error) and Anthropic ("prompt is too long") write it
// — and "" for any other answer.
func contextExceeded(o *outcome) string {
	if o.status != http.StatusBadRequest && o.status != http.StatusRequestEntityTooLarge || o.body == nil {
		return ""
	}
	e := gjson.GetBytes(o.body, "error")
	if e.Type == gjson.String { // {"error": "message"}
		e = gjson.Parse(`{"message":` + e.Raw + `}`)
	} else if !e.IsObject() {
		e = gjson.ParseBytes(o.body) // vLLM's flat form
	}
	msg := e.Get("message").String()
	if e.Get("code").String() == "context_length_exceeded" || e.Get("type").String() == "exceed_context_size_error" {
		return truncate(msg, 200)
	}
	low := strings.ToLower(msg)
	for _, s := range []string{"maximum context length", "context length exceeded", "context_length_exceeded", "exceeds the available context size",
		"prompt is too long", "exceeds the context window", "exceeds the maximum context"} {
		if strings.Contains(low, s) {
			return truncate(msg, 200)
		}
	}
	return ""
}
