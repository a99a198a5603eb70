package serving

import (
	"fmt"
	"net/http"

	"github.com/molly-gateway/molly/serving/llama"
)

// constrain applies the chat request's response_format and tools (tools.go)
// to r and msgs: the grammar, checked once by llama.cpp's parser here so a
// request it would refuse is a 400/500 before it is queued.
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
	g, err := llama.NewGrammar(e.model, p.grammar)
	if err != nil {
		return &apiError{http.StatusInternalServerError, "server_error", "response_format", "", fmt.Sprintf("the grammar made from the schema was refused: %v", err)}
	}
	g.Close()
	r.Params.Grammar = p.grammar
	return nil
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
			return 0, err
		}
		s.gr = g
		s.masked = make([]float32, len(logits))
	}
	s.gr.Mask(logits, s.masked)
	tok := s.smp.sample(s.masked)
	if !e.model.IsEOG(tok) {
		s.gr.Accept(tok)
	}
	return tok, nil
}

func (s *sequence) closeGrammar() {
	if s.gr != nil {
		s.gr.Close()
		s.gr = nil
	}
}
