package serving

import (
	"math"

	"github.com/molly-gateway/molly/serving/llama"
)

// constrain applies the chat request's response_format and tools (tools.go)
// to r and msgs: the grammar, checked once by llama.cpp's parser here so a
// request it would refuse is a 400 before it is queued.
func (e *Engine) constrain(cr *completionRequest, r *Request, msgs *[]llama.ChatMessage, body []byte) error {
	p, sys, err := planFor(body)
	if err != nil {
		return err
	}
	cr.plan = p
	*msgs = withPlan(*msgs, cr.Messages, body, sys)
	if p.grammar == "" {
		return nil
	}
	if err := e.checkGrammar(p); err != nil {
		return err
	}
	r.Params.Grammar = p.grammar
	// Every grammar of a plan is a JSON value, an object or a string at its
	// root: the choice ends where that value does.
	r.Params.StopAfterValue = true
	return nil
}

// checkGrammar initialises p's grammar in llama.cpp once and frees it.
// Errors: a 400 invalid_request_error naming p.param when llama.cpp's
// parser refuses it. The grammar is made from the request's schemas, so a
// grammar llama.cpp cannot initialise is the request's doing (a schema
// beyond the parser's limits), never the engine's: it must not read as a
// server failure, which the gateway would count against the target.
func (e *Engine) checkGrammar(p *plan) error {
	g, err := llama.NewGrammar(e.model, p.grammar)
	if err != nil {
		return grammarRefused(p.param, err)
	}
	g.Close()
	return nil
}

// grammarRefused is the 400 for a grammar llama.cpp refused (err), made
// from param ("response_format" when empty).
func grammarRefused(param string, err error) *apiError {
	if param == "" {
		param = "response_format"
	}
	return badRequest(param, "the grammar made from %s cannot be used: %v (its JSON Schema is beyond what llama.cpp's grammar sampler accepts; simplify it, e.g. with smaller length or item bounds)", param, err)
}

// sampleNext samples s's next token from logits, through s's grammar when
// the request has one, and advances the grammar over it.
func (e *Engine) sampleNext(s *sequence, logits []float32) (int32, error) {
	if s.smp.p.Grammar == "" {
		return s.smp.sample(logits), nil
	}
	if s.gr == nil {
		g, err := llama.NewGrammar(e.model, s.smp.p.Grammar)
		if err != nil {
			return 0, grammarRefused("", err) // checked at parse time: not expected
		}
		s.gr = g
		s.masked = make([]float32, len(logits))
	}
	s.gr.Mask(logits, s.masked)
	tok := s.smp.sample(s.masked)
	if math.IsInf(float64(s.masked[tok]), -1) {
		// The grammar allows nothing, not even an end-of-generation token
		// (a vocabulary without one once the grammar is complete): the
		// output ends here.
		return -1, nil
	}
	if !e.model.IsEOG(tok) {
		s.gr.Accept(tok)
	}
	return tok, nil
}

// jsonEnd finds where the JSON value an output starts with ends, fed the
// output piece by piece. The output is one the grammar allows (a prefix
// of valid JSON), so only strings and nesting are tracked.
type jsonEnd struct {
	depth             int
	started, inString bool
	escaped, scalar   bool
}

// feed reads the next piece of output and returns the offset in piece
// just past the root value's last byte, ok once that value is whole. A
// root number, boolean or null has no end of its own: ok stays false.
func (j *jsonEnd) feed(piece []byte) (int, bool) {
	if j.scalar {
		return 0, false
	}
	for i, c := range piece {
		switch {
		case j.inString:
			switch {
			case j.escaped:
				j.escaped = false
			case c == '\\':
				j.escaped = true
			case c == '"':
				j.inString = false
				if j.depth == 0 {
					return i + 1, true
				}
			}
		case c == '"':
			j.inString, j.started = true, true
		case c == '{' || c == '[':
			j.depth++
			j.started = true
		case c == '}' || c == ']':
			if j.depth--; j.depth <= 0 {
				return i + 1, true
			}
		case !j.started && c != ' ' && c != '\t' && c != '\n' && c != '\r':
			j.scalar = true
			return 0, false
		}
	}
	return 0, false
}

func (s *sequence) closeGrammar() {
	if s.gr != nil {
		s.gr.Close()
		s.gr = nil
	}
}
