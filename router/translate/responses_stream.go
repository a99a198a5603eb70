package translate

import (
	"context"
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/relay"
)

// responsesStream turns a chat completion stream into the Responses API's
// stream: response.created and response.in_progress first; for reasoning
// (delta.reasoning_content), response.output_item.added (a reasoning
// item), response.content_part.added (a reasoning_text part),
// response.reasoning_text.delta…, then .done events; for the text,
// response.output_item.added (a message), response.content_part.added,
// response.output_text.delta…, then .done events; for each tool call,
// response.output_item.added (a function_call, sent once its name is
// known), response.function_call_arguments.delta…, .done, response.output_item.done;
// one call at a time, as OpenAI streams them: the first call named is
// streamed as it comes, and a call named while it is open is held whole
// and sent after it at the end (added, its arguments in one delta, done)
// — an OpenAI-style upstream's parallel calls may interleave their
// fragments (index 0, 1, 0, 1), and an item once done cannot grow;
// last response.completed (or response.incomplete) with the whole
// Response, usage included; a chat stream that ends in an error event
// ends in an error event and response.failed (fail). Every event has the
// next sequence_number.
type responsesStream struct {
	t       *Translation
	ctx     context.Context
	decided string // the decision id, stored with the response
	seq     int
	created int64
	started bool
	ended   bool
	next    int // the next output_index

	text    strings.Builder
	msg     *outItem // the message item, once text or a refusal came
	part    string   // "output_text" or "refusal": the open content part
	refusal strings.Builder
	lps     []any // the output_text's token logprobs, when included

	reason *outItem // the reasoning item being written, if any

	calls   map[int64]*outItem // function_call items by chat tool-call index
	order   []*outItem         // every item, in output_index order
	live    *outItem           // the call streamed as it comes (announced first)
	held    []*outItem         // calls named while live was open, held whole
	finish  string
	usage   gjson.Result
	tier    gjson.Result // the service_tier the chunks name
	saveErr error        // storing the response failed (the answer is still sent)
}

type outItem struct {
	index  int
	id     string
	callID string
	name   string
	args   strings.Builder // a function call's arguments, a reasoning item's text
	done   bool
	isCall bool
	held   bool           // a call sent whole at the end (responsesStream.held)
	item   map[string]any // the finished item
}

func newResponsesStream(t *Translation, ctx context.Context, decisionID string) *responsesStream {
	return &responsesStream{t: t, ctx: ctx, decided: decisionID, calls: map[int64]*outItem{}}
}

func (s *responsesStream) emit(out []byte, typ string, ev map[string]any) []byte {
	ev["type"] = typ
	ev["sequence_number"] = s.seq
	s.seq++
	return relay.AppendEvent(out, relay.Event{Type: typ, Data: marshal(ev)}, false)
}

func (s *responsesStream) start(out []byte, created int64) []byte {
	s.started = true
	s.created = created
	r := s.t.baseResponse(created, "in_progress")
	out = s.emit(out, "response.created", map[string]any{"response": r})
	return s.emit(out, "response.in_progress", map[string]any{"response": r})
}

// event translates one event of the chat stream.
func (s *responsesStream) event(out []byte, ev relay.Event) []byte {
	if s.ended {
		return out
	}
	if ev.IsDone() {
		return s.end(out)
	}
	root := gjson.ParseBytes(ev.Data)
	if e := root.Get("error"); e.Exists() {
		return s.fail(out, e)
	}
	if !s.started {
		created := root.Get("created").Int()
		if created == 0 {
			created = time.Now().Unix()
		}
		out = s.start(out, created)
	}
	if u := root.Get("usage"); u.IsObject() {
		s.usage = u
	}
	if st := root.Get("service_tier"); st.Type == gjson.String {
		s.tier = st
	}
	ch := root.Get("choices.0")
	if !ch.Exists() {
		return out
	}
	d := ch.Get("delta")
	if rc := reasoningOf(d); rc != "" {
		out = s.reasoningDelta(out, rc)
	}
	if c := d.Get("content"); c.Type == gjson.String && c.Str != "" {
		out = s.textDelta(out, "output_text", c.Str, s.t.chatLogprobs(ch))
	}
	if r := d.Get("refusal"); r.Type == gjson.String && r.Str != "" {
		out = s.textDelta(out, "refusal", r.Str, nil)
	}
	d.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		idx := tc.Get("index").Int()
		it := s.calls[idx]
		if it == nil {
			out = s.closeReasoning(out, "completed")
			out = s.closeMessage(out, "completed")
			it = &outItem{index: -1, id: relay.NewID("fc_"), callID: tc.Get("id").Str, isCall: true}
			s.calls[idx] = it
		}
		if it.name == "" {
			it.name = tc.Get("function.name").Str
		}
		a := tc.Get("function.arguments").Str
		it.args.WriteString(a)
		switch {
		case it.index < 0 && it.name != "" && !it.held:
			if s.live == nil {
				s.live = it
				out = s.announce(out, it)
			} else {
				// Another call is streaming: this one is sent whole
				// after it (see responsesStream).
				it.held = true
				s.held = append(s.held, it)
			}
		case it.index >= 0 && a != "":
			out = s.emit(out, "response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": it.index, "delta": a})
		}
		return true
	})
	if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
		s.finish = fr.Str
	}
	return out
}

// announce sends response.output_item.added for a function call, giving
// it the next output_index, and one response.function_call_arguments.delta
// with the arguments held so far. A call is announced once its name is
// known: some servers send a call's id in one delta and its name in a
// later one, and the added item's name is the one the Response carries
// (a client keeps the added item and appends the argument deltas).
func (s *responsesStream) announce(out []byte, it *outItem) []byte {
	it.index = s.next
	s.next++
	s.order = append(s.order, it)
	out = s.emit(out, "response.output_item.added", map[string]any{"output_index": it.index, "item": map[string]any{
		"type": "function_call", "id": it.id, "call_id": it.callID, "name": it.name, "arguments": "", "status": "in_progress"}})
	if a := it.args.String(); a != "" {
		out = s.emit(out, "response.function_call_arguments.delta", map[string]any{"item_id": it.id, "output_index": it.index, "delta": a})
	}
	return out
}

// reasoningDelta appends reasoning text to the open reasoning item,
// opening one (and its reasoning_text part) first, after closing the
// message item if one is open.
func (s *responsesStream) reasoningDelta(out []byte, text string) []byte {
	if s.reason == nil || s.reason.done {
		out = s.closeMessage(out, "completed")
		s.reason = &outItem{index: s.next, id: relay.NewID("rs_")}
		s.next++
		s.order = append(s.order, s.reason)
		out = s.emit(out, "response.output_item.added", map[string]any{"output_index": s.reason.index,
			"item": reasoningItem(s.reason.id, "", "in_progress")})
		out = s.emit(out, "response.content_part.added", map[string]any{"item_id": s.reason.id, "output_index": s.reason.index,
			"content_index": 0, "part": reasoningText("")})
	}
	s.reason.args.WriteString(text)
	return s.emit(out, "response.reasoning_text.delta", map[string]any{"item_id": s.reason.id, "output_index": s.reason.index,
		"content_index": 0, "delta": text})
}

// closeReasoning finishes the reasoning item, if one is open, with its
// status.
func (s *responsesStream) closeReasoning(out []byte, status string) []byte {
	it := s.reason
	if it == nil || it.done {
		return out
	}
	it.done = true
	text := it.args.String()
	out = s.emit(out, "response.reasoning_text.done", map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0, "text": text})
	out = s.emit(out, "response.content_part.done", map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0, "part": reasoningText(text)})
	it.item = reasoningItem(it.id, text, status)
	return s.emit(out, "response.output_item.done", map[string]any{"output_index": it.index, "item": it.item})
}

// textDelta appends text of kind ("output_text" or "refusal") to the
// message item, opening it and its content part first (after closing the
// reasoning item).
func (s *responsesStream) textDelta(out []byte, kind, text string, lps []any) []byte {
	out = s.closeReasoning(out, "completed")
	if s.msg == nil {
		s.msg = &outItem{index: s.next, id: relay.NewID("msg_")}
		s.next++
		s.order = append(s.order, s.msg)
		out = s.emit(out, "response.output_item.added", map[string]any{"output_index": s.msg.index, "item": map[string]any{
			"type": "message", "id": s.msg.id, "status": "in_progress", "role": "assistant", "content": []any{}}})
	}
	if s.part != kind {
		out = s.closePart(out)
		s.part = kind
		part := outputText("", nil)
		if kind == "refusal" {
			part = map[string]any{"type": "refusal", "refusal": ""}
		}
		out = s.emit(out, "response.content_part.added", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
			"content_index": s.contentIndex(), "part": part})
	}
	if kind == "refusal" {
		s.refusal.WriteString(text)
		return s.emit(out, "response.refusal.delta", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
			"content_index": s.contentIndex(), "delta": text})
	}
	s.text.WriteString(text)
	s.lps = append(s.lps, lps...)
	if lps == nil {
		lps = []any{}
	}
	return s.emit(out, "response.output_text.delta", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
		"content_index": s.contentIndex(), "delta": text, "logprobs": lps})
}

// contentIndex is the index of the open content part.
func (s *responsesStream) contentIndex() int {
	if s.part == "refusal" && s.text.Len() > 0 {
		return 1
	}
	return 0
}

// parts are the message's content parts so far.
func (s *responsesStream) parts() []any {
	var parts []any
	if s.text.Len() > 0 {
		parts = append(parts, outputText(s.text.String(), s.lps))
	}
	if s.refusal.Len() > 0 {
		parts = append(parts, map[string]any{"type": "refusal", "refusal": s.refusal.String()})
	}
	if parts == nil {
		parts = []any{}
	}
	return parts
}

func (s *responsesStream) closePart(out []byte) []byte {
	switch s.part {
	case "output_text":
		out = s.emit(out, "response.output_text.done", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
			"content_index": s.contentIndex(), "text": s.text.String(), "logprobs": outputText("", s.lps)["logprobs"]})
		out = s.emit(out, "response.content_part.done", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
			"content_index": s.contentIndex(), "part": outputText(s.text.String(), s.lps)})
	case "refusal":
		out = s.emit(out, "response.refusal.done", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
			"content_index": s.contentIndex(), "refusal": s.refusal.String()})
		out = s.emit(out, "response.content_part.done", map[string]any{"item_id": s.msg.id, "output_index": s.msg.index,
			"content_index": s.contentIndex(), "part": map[string]any{"type": "refusal", "refusal": s.refusal.String()}})
	}
	s.part = ""
	return out
}

// closeMessage finishes the message item, if one is open, with its status
// ("completed", or "incomplete" when the answer stopped in it).
func (s *responsesStream) closeMessage(out []byte, status string) []byte {
	if s.msg == nil || s.msg.done {
		return out
	}
	out = s.closePart(out)
	s.msg.done = true
	s.msg.item = map[string]any{"type": "message", "id": s.msg.id, "status": status, "role": "assistant", "content": s.parts()}
	return s.emit(out, "response.output_item.done", map[string]any{"output_index": s.msg.index, "item": s.msg.item})
}

// fail ends a stream the chat stream's error event e (OpenAI's error
// object: Molly's stream_truncated when the upstream broke off, or the
// upstream's own) cut short: an error event (ResponseErrorEvent: code,
// message, param), then the terminal response.failed, whose Response has
// status failed, the error as a ResponseError (code rate_limit_exceeded
// for a rate limit, else server_error: ResponseErrorCode's values) and
// the items so far, the open ones incomplete. A failed response is not
// stored (previous_response_id cannot continue it).
func (s *responsesStream) fail(out []byte, e gjson.Result) []byte {
	s.ended = true
	if !s.started {
		out = s.start(out, time.Now().Unix())
	}
	code := any(nil)
	if c := e.Get("code"); c.Exists() && c.Type != gjson.Null {
		code = c.String() // a string, as the event's code is (vLLM sends the status as a number)
	}
	param := any(nil)
	if p := e.Get("param"); p.Type == gjson.String {
		param = p.Str
	}
	msg := e.Get("message").String()
	if msg == "" {
		msg = "The answer failed."
	}
	out = s.emit(out, "error", map[string]any{"code": code, "message": msg, "param": param})
	output := []any{}
	for _, it := range s.order {
		switch {
		case it.done:
			output = append(output, it.item)
		case it == s.reason:
			output = append(output, reasoningItem(it.id, it.args.String(), "incomplete"))
		case it == s.msg:
			output = append(output, map[string]any{"type": "message", "id": it.id, "status": "incomplete", "role": "assistant", "content": s.parts()})
		default:
			output = append(output, map[string]any{"type": "function_call", "id": it.id, "call_id": it.callID, "name": it.name,
				"arguments": it.args.String(), "status": "incomplete"})
		}
	}
	rcode := "server_error"
	if eventType(e) == "rate_limit_error" {
		rcode = "rate_limit_exceeded"
	}
	r := s.t.baseResponse(s.created, "failed")
	r["error"] = map[string]any{"code": rcode, "message": msg}
	r["output"] = output
	r["service_tier"] = usedTier(s.tier)
	if s.usage.IsObject() {
		r["usage"] = responseUsage(s.usage)
	}
	return s.emit(out, "response.failed", map[string]any{"response": r})
}

// end closes every item, stores the response and sends its last event.
func (s *responsesStream) end(out []byte) []byte {
	if s.ended {
		return out
	}
	s.ended = true
	if !s.started {
		out = s.start(out, time.Now().Unix())
	}
	status, incomplete := statusOf(s.finish)
	// A call whose name never came is sent now, after the held ones, in
	// the chat stream's tool-call order, with the name it has ("").
	idxs := make([]int64, 0, len(s.calls))
	for i := range s.calls {
		idxs = append(idxs, i)
	}
	sort.Slice(idxs, func(i, j int) bool { return idxs[i] < idxs[j] })
	for _, i := range idxs {
		if c := s.calls[i]; c.index < 0 && !c.held {
			c.held = true
			s.held = append(s.held, c)
		}
	}
	// The item the answer stopped in (the last) is incomplete when the
	// Response is: the ones before it were finished.
	var last *outItem
	switch {
	case len(s.held) > 0:
		last = s.held[len(s.held)-1]
	case len(s.order) > 0:
		last = s.order[len(s.order)-1]
	}
	itemStatus := func(it *outItem) string {
		if status == "incomplete" && it == last {
			return "incomplete"
		}
		return "completed"
	}
	out = s.closeReasoning(out, itemStatus(s.reason))
	out = s.closeMessage(out, itemStatus(s.msg))
	var toolCalls []any
	finishCall := func(c *outItem) {
		args := c.args.String()
		c.item = map[string]any{"type": "function_call", "id": c.id, "call_id": c.callID, "name": c.name, "arguments": args, "status": itemStatus(c)}
		out = s.emit(out, "response.function_call_arguments.done", map[string]any{"item_id": c.id, "output_index": c.index, "name": c.name, "arguments": args})
		out = s.emit(out, "response.output_item.done", map[string]any{"output_index": c.index, "item": c.item})
		toolCalls = append(toolCalls, map[string]any{"id": c.callID, "type": "function", "function": map[string]any{"name": c.name, "arguments": args}})
	}
	// The live call first, then each held call whole — added, its
	// arguments in one delta, done — so that no two calls' events
	// interleave, as in OpenAI's streams.
	if s.live != nil {
		finishCall(s.live)
	}
	for _, c := range s.held {
		out = s.announce(out, c)
		finishCall(c)
	}
	r := s.t.baseResponse(s.created, status)
	r["incomplete_details"] = incomplete
	r["service_tier"] = usedTier(s.tier)
	output := []any{}
	for _, it := range s.order {
		output = append(output, it.item)
	}
	r["output"] = output
	if status == "completed" {
		r["completed_at"] = time.Now().Unix()
	}
	if s.usage.IsObject() {
		r["usage"] = responseUsage(s.usage)
	}
	assistant := map[string]any{"role": "assistant", "content": nil}
	if s.text.Len() > 0 {
		assistant["content"] = s.text.String()
	}
	if s.refusal.Len() > 0 {
		assistant["refusal"] = s.refusal.String()
	}
	if toolCalls != nil {
		assistant["tool_calls"] = toolCalls
	}
	resp := marshal(r)
	s.saveErr = s.t.save(s.ctx, resp, assistant, s.decided)
	typ := "response.completed"
	if status == "incomplete" {
		typ = "response.incomplete"
	}
	return s.emit(out, typ, map[string]any{"response": json.RawMessage(resp)})
}
