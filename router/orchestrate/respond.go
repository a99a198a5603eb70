package orchestrate

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/molly-gateway/molly/router/pipeline"
	"github.com/molly-gateway/molly/router/relay"
)

// BodyMember is the member Molly adds to an orchestrated chat completion
// (and to the last chunk of a stream): {"plan_id", "subtasks",
// "refinements", "uncertain", "uncertainty": {"stopped", "issues":
// [{"kind", "subtask", "detail"}]}}. OpenAI clients ignore members they do
// not know.
const BodyMember = "molly"

// streamPiece is the most bytes of answer text one stream chunk carries.
const streamPiece = 64

// info is the BodyMember of an answer.
func (rn *run) info(unc *Uncertainty) map[string]any {
	m := map[string]any{"plan_id": rn.rec.ID, "subtasks": len(rn.plan.Subtasks), "refinements": len(rn.rec.Refinements), "uncertain": unc != nil}
	if unc != nil {
		m["uncertainty"] = unc
	}
	return m
}

// respond writes the answer: one chat.completion, or — the stream having
// started at admission — the answer as chat.completion.chunk events, the
// usage chunk when the client asked for it (the other chunks then carry
// "usage": null), and [DONE]. Headers: the
// plan id (set at the start), the strategy, each subtask's tier and
// target, the most exposed tier any subtask reached, and the
// uncertainty when the check did not pass.
func (rn *run) respond(answer string, unc *Uncertainty) error {
	created := time.Now().Unix()
	id := "chatcmpl-" + rn.rec.ID
	rn.rec.mu.Lock()
	var summary []string
	tier := ""
	for _, s := range rn.rec.Subtasks {
		summary = append(summary, s.ID+"="+orDash(s.Tier)+"/"+orDash(s.Target)+" "+s.Outcome)
		if s.Outcome == OutcomeOK && tierIndex(s.Tier) > tierIndex(tier) {
			tier = s.Tier
		}
	}
	prompt, completion := rn.rec.PromptTokens, rn.rec.CompletionTokens
	rn.rec.mu.Unlock()
	finish := rn.finishReason(completion)
	usage := map[string]any{"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
	if rn.stream == nil {
		h := rn.w.Header()
		h.Set(HeaderOrchestration, strings.Join(summary, ", "))
		if tier != "" {
			h.Set(pipeline.HeaderTier, tier)
		}
		h.Set(pipeline.HeaderTarget, PlannerTarget)
		if unc != nil {
			h.Set(HeaderUncertainty, uncertaintyHeader(unc))
		}
		body, err := json.Marshal(map[string]any{"id": id, "object": "chat.completion", "created": created, "model": rn.a.Model(),
			"choices": []any{map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil,
				"message": map[string]any{"role": "assistant", "content": answer, "refusal": nil}}},
			"usage": usage, BodyMember: rn.info(unc)})
		if err != nil {
			return err
		}
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(body)))
		rn.w.WriteHeader(http.StatusOK)
		rn.wrote = true
		_, _ = rn.w.Write(body)
		return nil
	}
	chunk := func(delta map[string]any, finish any, extra bool) []byte {
		m := map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": rn.a.Model(),
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}}
		if rn.a.IncludeUsage() {
			m["usage"] = nil // on every chunk but the usage chunk, as OpenAI sends them
		}
		if extra {
			m[BodyMember] = rn.info(unc)
		}
		b, _ := json.Marshal(m)
		return b
	}
	if unc != nil {
		rn.progress("molly uncertainty: " + uncertaintyHeader(unc))
	}
	rn.progress("molly orchestration: " + strings.Join(summary, ", "))
	rn.stream.data(chunk(map[string]any{"role": "assistant", "content": ""}, nil, false))
	for rest := answer; rest != ""; {
		n := min(len(rest), streamPiece)
		for n < len(rest) && !utf8.RuneStart(rest[n]) {
			n++
		}
		rn.stream.data(chunk(map[string]any{"content": rest[:n]}, nil, false))
		rest = rest[n:]
	}
	rn.stream.data(chunk(map[string]any{}, finish, true))
	if rn.a.IncludeUsage() {
		b, _ := json.Marshal(map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": rn.a.Model(),
			"choices": []any{}, "usage": usage})
		rn.stream.data(b)
	}
	rn.stream.data([]byte("[DONE]"))
	return nil
}

// finishReason is the answer's finish_reason: "length" when a subtask's
// latest answer was cut off at its token budget (finish_reason "length"),
// or the completion tokens billed pass the client's max_tokens (an
// upstream that reported more than it was sent); "stop" otherwise.
func (rn *run) finishReason(completion int) string {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	for _, r := range rn.results {
		if r != nil && r.ok && r.finish == "length" {
			return "length"
		}
	}
	if m := rn.a.MaxTokens(); m > 0 && completion > m {
		return "length"
	}
	return "stop"
}

// uncertaintyHeader is the HeaderUncertainty value of u.
func uncertaintyHeader(u *Uncertainty) string {
	parts := []string{"stopped=" + u.Stopped}
	for _, i := range u.Issues {
		s := i.Kind
		if i.Subtask != "" {
			s += " " + i.Subtask
		}
		parts = append(parts, s+": "+i.Detail)
	}
	return strings.Join(parts, "; ")
}

// progress writes a progress note as an SSE comment line when the
// answer is streamed (relay.AppendComment); clients ignore comments.
func (rn *run) progress(text string) {
	rn.mu.Lock()
	s := rn.stream
	rn.mu.Unlock()
	if s != nil {
		s.comment(text)
	}
}

// sse writes one stream from several goroutines.
type sse struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

// startSSE sends the stream's headers.
func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Del("Content-Length")
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	s := &sse{w: w, rc: http.NewResponseController(w)}
	_ = s.rc.Flush()
	return s
}

func (s *sse) comment(text string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = relay.AppendComment(s.buf[:0], strings.ReplaceAll(text, "\n", " "))
	s.flush()
}

func (s *sse) data(b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = relay.AppendData(s.buf[:0], b)
	s.flush()
}

// event writes an event of type typ (an error after the stream started).
func (s *sse) event(typ string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf = relay.AppendEvent(s.buf[:0], relay.Event{Type: typ, Data: b}, false)
	s.flush()
}

func (s *sse) flush() {
	if _, err := s.w.Write(s.buf); err == nil {
		_ = s.rc.Flush()
	}
}
