package orchestrate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/pipeline"
)

// specialistSystem opens every specialist's conversation.
const specialistSystem = "You are a specialist working on one part of a larger request. Do only the task you are given, using only the material shown, and reply with the result alone."

// execute runs the subtasks ids (a whole plan, or a refinement's closure)
// on their dependency graph: each starts once every dependency in ids has
// finished, at most Config.MaxParallel at once; dependencies outside ids
// keep their earlier output. A subtask whose dependency has no output is
// skipped. critiques holds a refinement's critique per subtask. When the
// client goes away every running subtask's context ends with it.
func (rn *run) execute(ids []string, critiques map[string]string) {
	sem := make(chan struct{}, rn.o.cfg.MaxParallel)
	done := make(map[string]chan struct{}, len(ids))
	for _, id := range ids {
		done[id] = make(chan struct{})
	}
	var wg sync.WaitGroup
	for _, id := range ids {
		s := rn.byID[id]
		wg.Go(func() {
			defer close(done[id])
			for _, d := range s.DependsOn {
				if ch, ok := done[d]; ok {
					select {
					case <-ch:
					case <-rn.ctx.Done():
						rn.closed(s)
						return
					}
				}
			}
			for _, d := range s.DependsOn {
				if r := rn.result(d); r == nil || !r.ok {
					rn.skip(s, d)
					return
				}
			}
			select {
			case sem <- struct{}{}:
			case <-rn.ctx.Done():
				rn.closed(s)
				return
			}
			defer func() { <-sem }()
			rn.runSubtask(s, critiques[id])
		})
	}
	wg.Wait()
}

func (rn *run) closed(s *Subtask) {
	rec := rn.subtaskRecord(s)
	rn.rec.mu.Lock()
	rec.Outcome, rec.Error = OutcomeClientClosed, "the client went away"
	rn.rec.mu.Unlock()
	rn.setResult(s.ID, &result{err: "the client went away"})
}

func (rn *run) skip(s *Subtask, dep string) {
	rec := rn.subtaskRecord(s)
	why := "dependency " + dep + " has no result"
	rn.rec.mu.Lock()
	rec.Outcome, rec.Error = OutcomeSkipped, why
	rn.rec.mu.Unlock()
	rn.setResult(s.ID, &result{err: why})
	rn.log.Info("subtask", zap.String("subtask", s.ID), zap.String("outcome", OutcomeSkipped), zap.String("error", why))
	rn.progress("molly subtask " + s.ID + " skipped: " + why)
}

// runSubtask runs one subtask — a direct tool call, or its alternatives
// as derived requests fused into one output — and records it.
func (rn *run) runSubtask(s *Subtask, critique string) {
	rec := rn.subtaskRecord(s)
	start := time.Now()
	rn.rec.mu.Lock()
	rec.Started, rec.Outcome, rec.Error = start.UTC(), OutcomePending, ""
	if critique != "" || rn.result(s.ID) != nil {
		rec.Refined++
	}
	rn.rec.mu.Unlock()
	rn.progress("molly subtask " + s.ID + " started")
	res := &result{}
	if s.Specialist.Tool != "" {
		out, te := rn.o.p.RunTool(rn.ctx, rn.parent, rn.plannerTier, rn.plannerTarget, rn.rec.ID+":"+s.ID, s.Specialist.Tool, s.Specialist.Arguments)
		rn.rec.mu.Lock()
		rec.Tier = rn.plannerTier
		if te != nil {
			rec.Outcome, rec.Error = OutcomeFailed, "tool error "+te.Code+": "+te.Message
			res.err, res.denied = rec.Error, te.Code == "permission_denied" || te.Code == "not_found"
		} else {
			rec.Outcome, res.ok, res.out = OutcomeOK, true, string(out)
		}
		rn.rec.mu.Unlock()
	} else {
		rn.runModel(s, rec, res, critique)
	}
	if rn.ctx.Err() != nil {
		res = &result{err: "the client went away"}
		rn.rec.mu.Lock()
		rec.Outcome, rec.Error = OutcomeClientClosed, res.err
		rn.rec.mu.Unlock()
	}
	rn.setResult(s.ID, res)
	rn.rec.mu.Lock()
	rec.Finished = time.Now().UTC()
	rec.LatencyMS += ms(time.Since(start))
	rec.OutputTokens = capability.EstimateTokens(res.out)
	line := []zap.Field{zap.String("subtask", s.ID), zap.String("kind", rec.Kind), zap.String("specialist", rec.Specialist),
		zap.String("tier", rec.Tier), zap.String("target", rec.Target), zap.String("subtask_decision_id", rec.DecisionID),
		zap.String("outcome", rec.Outcome), zap.Float64("cost_usd", rec.CostUSD), zap.Duration("duration", time.Since(start)),
		zap.Strings("fallbacks", rec.Fallbacks), zap.String("fusion", rec.Fusion), zap.Int("refined", rec.Refined)}
	if rec.Error != "" {
		line = append(line, zap.String("error", rec.Error))
	}
	note := fmt.Sprintf("molly subtask %s %s tier=%s target=%s %dms", s.ID, rec.Outcome, orDash(rec.Tier), orDash(rec.Target), time.Since(start).Milliseconds())
	rn.rec.mu.Unlock()
	rn.log.Info("subtask", line...)
	rn.progress(note)
}

// runModel asks s's specialist Alternatives times in parallel (the i-th
// alternative starting on the i-th ranked candidate), fuses the answers
// and fills rec and res.
func (rn *run) runModel(s *Subtask, rec *SubtaskRecord, res *result, critique string) {
	k := max(s.Alternatives, 1)
	body, err := rn.body(s, critique, k > 1)
	if err != nil {
		rn.rec.mu.Lock()
		rec.Outcome, rec.Error = OutcomeFailed, err.Error()
		rn.rec.mu.Unlock()
		res.err = rec.Error
		return
	}
	answers := make([]pipeline.Answer, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		wg.Go(func() {
			d := pipeline.Derived{Kind: "subtask", Body: body, MaxTier: s.TierCeiling, MaxCostUSD: s.Budget.MaxCostUSD, First: i,
				Tools: s.Specialist.Tools, Label: s.ID}
			answers[i], errs[i] = rn.o.p.RunDerived(rn.ctx, rn.parent, d)
			if errs[i] == nil && answers[i].Status == http.StatusBadRequest && k > 1 {
				// a backend that refuses logprobs: ask again without them
				rn.spend(answers[i].PromptTokens, answers[i].CompletionTokens, answers[i].CostUSD)
				plain, _ := rn.body(s, critique, false)
				d.Body = plain
				answers[i], errs[i] = rn.o.p.RunDerived(rn.ctx, rn.parent, d)
			}
			rn.spend(answers[i].PromptTokens, answers[i].CompletionTokens, answers[i].CostUSD)
		})
	}
	wg.Wait()
	best, fusion, disagree, scores := fuse(answers, errs)
	rn.rec.mu.Lock()
	defer rn.rec.mu.Unlock()
	rec.Alternatives, rec.Fallbacks = nil, nil
	for i, a := range answers {
		rec.CostUSD = round6(rec.CostUSD + a.CostUSD)
		rec.PromptTokens += a.PromptTokens
		rec.CompletionTokens += a.CompletionTokens
		rec.Fallbacks = append(rec.Fallbacks, a.Fallbacks...)
		if k > 1 {
			alt := AlternativeRecord{Target: a.Target, Tier: a.Tier, Model: a.Model, Fused: round6(scores[i].fused), Confidence: round6(scores[i].confidence)}
			if errs[i] != nil {
				alt.Error = errs[i].Error()
			}
			rec.Alternatives = append(rec.Alternatives, alt)
		}
	}
	if k > 1 {
		rec.Fusion = fusion
	}
	if best < 0 {
		a, err := answers[0], errs[0]
		rec.DecisionID, rec.Sensitivity, rec.Tiers, rec.Excluded = a.DecisionID, a.Sensitivity, a.Tiers, a.Excluded
		rec.Outcome = OutcomeFailed
		var ae *openai.Error
		switch {
		case errors.As(err, &ae) && ae.Status == http.StatusForbidden:
			rec.Outcome, rec.Error, res.denied = OutcomeDenied, ae.Message, true
		case err != nil:
			rec.Error = errorText(err)
		default:
			rec.Error = fmt.Sprintf("the specialist answered HTTP %d", a.Status)
		}
		res.err = rec.Error
		return
	}
	a := answers[best]
	rec.Tier, rec.Target, rec.Model = a.Tier, a.Target, a.Model
	rec.DecisionID, rec.Sensitivity, rec.Tiers, rec.Excluded = a.DecisionID, a.Sensitivity, a.Tiers, a.Excluded
	rec.Outcome = OutcomeOK
	res.ok, res.out, res.finish, res.disagree = true, a.Content, a.FinishReason, disagree
}

func errorText(err error) string {
	var ae *openai.Error
	if errors.As(err, &ae) {
		return ae.Message
	}
	return err.Error()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// body is the chat request of subtask s: the specialist system message,
// the conversation when s reads it, and one user message with what else
// it reads (parts with the preamble, messages, earlier outputs) and the
// task; a refinement adds the previous answer and the critique
// (Self-Refine: Madaan et al., "Self-Refine: Iterative Refinement with
// Self-Feedback", NeurIPS 2023). logprobs asks for them, to fuse
// alternatives by confidence.
func (rn *run) body(s *Subtask, critique string, logprobs bool) ([]byte, error) {
	msgs := []any{map[string]any{"role": "system", "content": specialistSystem}}
	var sections []string
	preamble := false
	for _, in := range s.Inputs {
		switch {
		case in == InputConversation:
			for _, m := range rn.msgs {
				msgs = append(msgs, json.RawMessage(m.Raw))
			}
		case in == InputLastUser:
			sections = append(sections, "Request:\n"+rn.a.LastUserText())
		case strings.HasPrefix(in, inputPart):
			i, _ := strconv.Atoi(strings.TrimPrefix(in, inputPart))
			text := rn.a.LastUserText()
			if i < len(rn.parts.Items) {
				text = rn.parts.Items[i]
			}
			sections = append(sections, fmt.Sprintf("Part %d of the request:\n%s", i+1, text))
			preamble = true
		case strings.HasPrefix(in, inputMessage):
			i, _ := strconv.Atoi(strings.TrimPrefix(in, inputMessage))
			if i < len(rn.msgs) {
				sections = append(sections, fmt.Sprintf("Message %d (%s):\n%s", i, rn.msgs[i].Get("role").String(), messageText(rn.msgs[i])))
			}
		case strings.HasPrefix(in, inputSubtask):
			dep := strings.TrimPrefix(in, inputSubtask)
			r := rn.result(dep)
			if r == nil || !r.ok {
				return nil, fmt.Errorf("input %s has no result", in)
			}
			title := dep
			if d := rn.byID[dep]; d != nil && d.Title != "" {
				title = dep + " (" + d.Title + ")"
			}
			sections = append(sections, "Result of "+title+":\n"+r.out)
		}
	}
	if preamble && rn.parts.Preamble != "" {
		sections = append([]string{"Context:\n" + rn.parts.Preamble}, sections...)
	}
	sections = append(sections, "Task: "+s.Instruction)
	msgs = append(msgs, map[string]any{"role": "user", "content": strings.Join(sections, "\n\n")})
	if critique != "" {
		if r := rn.result(s.ID); r != nil && r.ok {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": r.out})
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": critique})
	}
	req := map[string]any{"model": s.Specialist.Model, "messages": msgs, "max_completion_tokens": s.Budget.MaxTokens}
	if logprobs {
		req["logprobs"] = true
	}
	return json.Marshal(req)
}

// messageText is a message's text: its content string, or its text parts
// joined.
func messageText(m gjson.Result) string {
	c := m.Get("content")
	if !c.IsArray() {
		return c.String()
	}
	var b strings.Builder
	for _, p := range c.Array() {
		if t := p.Get("text"); t.Exists() {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(t.String())
		}
	}
	return b.String()
}
