package relay

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/router/openai"
)

// Answer is what normalising an answer needs to know about its request.
type Answer struct {
	// Endpoint is the OpenAI operation answered (chat, completions, embeddings).
	Endpoint openai.Endpoint
	// Model is the client's model name, written as the answer's "model"
	// (the upstream's name for it stays Molly's business).
	Model string
	// IncludeUsage: a stream whose client set stream_options.include_usage.
	IncludeUsage bool
	// Created is the Unix time (seconds) written where the upstream gave no
	// "created".
	Created int64
	// EncodingFormat is an embeddings request's encoding_format ("base64",
	// or "" / "float" for the spec's default, floats): an upstream that
	// answers in the other one (servers that ignore the parameter) has its
	// embeddings converted, since openai-node asks for base64 by default
	// and decodes every embedding as a base64 string (an array of floats
	// became an empty embedding).
	EncodingFormat string
	// Usage is the usage Molly recorded for a whole answer (the meter's:
	// the upstream's report, or Molly's estimate when that report is not
	// one to believe), written in place of a usage whose token counts are
	// not integers from 0 to MaxTokenCount; nil leaves such a usage as it is.
	Usage *Counts
}

// Counts are an answer's prompt and completion tokens.
type Counts struct{ Prompt, Completion int }

// MaxTokenCount is the largest token count a usage may carry (2^31 − 1,
// the ledger's bound: meter.MaxReportedTokens).
const MaxTokenCount = 1<<31 - 1

// validCount reports a usage member that is a JSON integer from 0 to
// MaxTokenCount (absent and null members pass).
func validCount(v gjson.Result) bool {
	if !v.Exists() || v.Type == gjson.Null {
		return true
	}
	k, err := strconv.ParseInt(v.Raw, 10, 64)
	return v.Type == gjson.Number && err == nil && k >= 0 && k <= MaxTokenCount
}

// validCounts reports whether every token count in the usage object u —
// its members named *_tokens, and those of its details objects — is a
// validCount (other members, such as Groq's queue_time in seconds, are
// not counts).
func validCounts(u gjson.Result) bool {
	ok := true
	u.ForEach(func(k, v gjson.Result) bool {
		switch {
		case v.IsObject():
			ok = validCounts(v)
		case strings.HasSuffix(k.Str, "_tokens"):
			ok = validCount(v)
		}
		return ok
	})
	return ok
}

// finishAliases maps finish reasons of OpenAI-compatible servers that are
// not in OpenAI's enum to the enum's word.
var finishAliases = map[string]string{
	"eos": "stop", "end_turn": "stop", "stop_sequence": "stop", "eot": "stop",
	"max_tokens": "length", "max_output_tokens": "length", "model_length": "length",
	"tool_use": "tool_calls", "function_calls": "tool_calls",
	"safety": "content_filter", "recitation": "content_filter",
}

// chatFinish and textFinish are the finish reasons the spec admits.
var (
	chatFinish = map[string]bool{"stop": true, "length": true, "tool_calls": true, "content_filter": true, "function_call": true}
	textFinish = map[string]bool{"stop": true, "length": true, "content_filter": true}
)

// finishReason maps a finish reason to the spec's enum for ep: aliases to
// their word, in any case (Gemini's and Vertex's STOP, MAX_TOKENS,
// SAFETY), anything else unknown to "stop".
func finishReason(ep openai.Endpoint, r string) string {
	if !chatFinish[r] {
		r = strings.ToLower(r)
	}
	if a, ok := finishAliases[r]; ok {
		r = a
	}
	ok := chatFinish[r]
	if ep == openai.EndpointCompletions {
		ok = textFinish[r]
		if r == "tool_calls" || r == "function_call" {
			ok = false
		}
	}
	if !ok {
		return "stop"
	}
	return r
}

// NewID returns prefix followed by 24 random hex digits (an OpenAI-style id).
func NewID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// edit applies sjson edits to a JSON document, keeping the first error's
// document unchanged.
type edit struct {
	b      []byte
	edited bool // b is no longer the document edit began with
}

// replaceString sets the string value of the member v (a value read from
// the unedited document, at v.Index) to s: spliced in place of v's text,
// as sjson writes it, while no other edit has moved the document's bytes;
// by sjson's look-up of path otherwise.
func (e *edit) replaceString(v gjson.Result, path, s string) {
	if e.edited || v.Index <= 0 || v.Index+len(v.Raw) > len(e.b) || string(e.b[v.Index:v.Index+len(v.Raw)]) != v.Raw {
		e.set(path, s)
		return
	}
	out := make([]byte, 0, len(e.b)-len(v.Raw)+len(s)+2)
	out = append(out, e.b[:v.Index]...)
	out = appendStringify(out, s)
	e.b = append(out, e.b[v.Index+len(v.Raw):]...)
	e.edited = true
}

// appendStringify appends s as a JSON string, as sjson.SetBytes writes a
// string value: as it is, quoted, when it has only printable ASCII other
// than '"' and a backslash; as encoding/json marshals it otherwise.
func appendStringify(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > 0x7f || s[i] == '"' || s[i] == '\\' {
			q, _ := json.Marshal(s)
			return append(buf, q...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

func (e *edit) set(path string, v any) {
	if out, err := sjson.SetBytes(e.b, path, v); err == nil {
		e.b, e.edited = out, true
	}
}

func (e *edit) raw(path, v string) {
	if out, err := sjson.SetRawBytes(e.b, path, []byte(v)); err == nil {
		e.b, e.edited = out, true
	}
}

func (e *edit) del(path string) {
	if out, err := sjson.DeleteBytes(e.b, path); err == nil {
		e.b, e.edited = out, true
	}
}

// argsText is the arguments string of a tool call whose arguments are not
// a string: an object or array (as Ollama and some other servers send
// them) becomes its JSON text, compacted; anything else (absent, null) "{}".
func argsText(a gjson.Result) string {
	if a.IsObject() || a.IsArray() {
		var b bytes.Buffer
		if json.Compact(&b, []byte(a.Raw)) == nil {
			return b.String()
		}
	}
	return "{}"
}

// argsCut reports tool-call arguments that are not a complete JSON text
// (an empty string is a call without arguments, not a cut one).
func argsCut(args string) bool {
	return strings.TrimSpace(args) != "" && !gjson.Valid(args)
}

// nextCall reports whether a tool-call delta's arguments delta, coming
// after arguments so far, starts another call: so far is one whole JSON
// object, and delta starts another (nothing may follow a whole object
// but white space, so this never splits one call's arguments).
func nextCall(sofar, delta string) bool {
	t := strings.TrimSpace(sofar)
	return strings.HasPrefix(t, "{") && gjson.Valid(t) && strings.HasPrefix(strings.TrimSpace(delta), "{")
}

// NormaliseBody rewrites a whole 2xx answer (chat completion, text
// completion or embeddings list) into the shape of OpenAI's spec
// (CreateChatCompletionResponse, CreateCompletionResponse,
// CreateEmbeddingResponse) where the upstream left it short: "id",
// "object" and "created" when absent, the client's model name as "model",
// a "system_fingerprint" that is not a string dropped, every choice's
// "index", "logprobs" (null) and "finish_reason" (an alias mapped to the
// enum; "length" when a tool call's arguments were cut off), a chat
// message's "role", "content" and "refusal" (null), a tool call's "type",
// an "id" where it has none (or ""), and its "arguments" as a string (an object's JSON text, "{}" when absent),
// and the usage's "total_tokens". Members some OpenAI-compatible servers
// (LiteLLM's proxy, vLLM, Groq) write as null where the spec has no null
// are dropped: a message's "function_call" and "tool_calls", the usage's
// "prompt_tokens_details" and "completion_tokens_details"; so is a
// "service_tier" outside the spec's enum (Groq's "on_demand"). A logprobs
// entry gets the "bytes" (null) and "top_logprobs" ([]) the spec
// requires. A body that is not a JSON object, or an error object, is
// returned as it is.
func NormaliseBody(ans Answer, body []byte) []byte {
	// Read in place: body is never written to (every edit makes a new
	// document), and no Result read from it outlives this call.
	root := gjson.Parse(unsafe.String(unsafe.SliceData(body), len(body)))
	if !root.IsObject() {
		return body
	}
	// One pass over each object for the members looked at, instead of a
	// scan from the object's start per look-up: most answers need one edit
	// at most (the model name), so the look-ups are the cost.
	var top [len(topNames)]gjson.Result
	pick(root, topNames[:], top[:])
	if top[topError].Exists() {
		return body
	}
	e := &edit{b: body}
	switch ans.Endpoint {
	case openai.EndpointEmbeddings:
		normaliseEmbeddings(ans, root, e)
		return e.b
	case openai.EndpointChat, openai.EndpointCompletions:
	default:
		return body
	}
	chat := ans.Endpoint == openai.EndpointChat
	prefix, object := "cmpl-", "text_completion"
	if chat {
		prefix, object = "chatcmpl-", "chat.completion"
	}
	header(ans, &top, e, prefix, object)
	if !top[topChoices].IsArray() {
		normaliseUsage(top[topUsage], "usage", e, ans.Usage)
		return e.b
	}
	top[topChoices].ForEach(func(k, ch gjson.Result) bool {
		base := choicePath(k)
		var c [len(choiceNames)]gjson.Result
		if ch.IsObject() {
			pick(ch, choiceNames[:], c[:])
		}
		if !present(c[choiceIndex]) {
			e.set(base+".index", k.Int())
		}
		lp := c[choiceLogprobs]
		switch {
		case !lp.Exists():
			e.raw(base+".logprobs", "null")
		case chat && lp.IsObject():
			logprobFields(base+".logprobs", lp, e)
		}
		fr := c[choiceFinish].Str
		if !chat {
			if !present(c[choiceText]) {
				e.set(base+".text", "")
			}
			if want := finishReason(ans.Endpoint, fr); want != fr || c[choiceFinish].Type != gjson.String {
				e.set(base+".finish_reason", want)
			}
			return true
		}
		msg := c[choiceMessage]
		var m [len(messageNames)]gjson.Result
		if !msg.IsObject() {
			e.raw(base+".message", `{"role":"assistant","content":null,"refusal":null}`)
		} else {
			pick(msg, messageNames[:], m[:])
			if m[messageRole].Type != gjson.String {
				e.set(base+".message.role", "assistant")
			}
			if !m[messageContent].Exists() {
				e.raw(base+".message.content", "null")
			}
			if c := m[messageContent]; c.IsArray() {
				partsContent(c, base+".message", msg, e)
			}
			if !m[messageRefusal].Exists() {
				e.raw(base+".message.refusal", "null")
			}
			if fc := m[messageFunctionCall]; fc.Exists() && !fc.IsObject() {
				e.del(base + ".message.function_call")
			}
		}
		tcs := m[messageToolCalls]
		cut := false
		if !tcs.IsArray() {
			// null or not a list: dropped (gjson's ForEach calls back once
			// with a scalar, which would make a call of it).
			if tcs.Exists() {
				e.del(base + ".message.tool_calls")
			}
			tcs = gjson.Result{}
		}
		tcs.ForEach(func(j, tc gjson.Result) bool {
			p := base + ".message.tool_calls." + j.String()
			if !tc.Get("type").Exists() {
				e.set(p+".type", "function")
			}
			if id := tc.Get("id"); id.Type != gjson.String || id.Str == "" {
				e.set(p+".id", NewID("call_"))
			}
			if a := tc.Get("function.arguments"); a.Type != gjson.String {
				e.set(p+".function.arguments", argsText(a))
			} else if argsCut(a.Str) {
				cut = true
			}
			return true
		})
		want := finishReason(ans.Endpoint, fr)
		if c[choiceFinish].Type != gjson.String && tcs.Get("#").Int() > 0 {
			want = "tool_calls"
		}
		if cut {
			want = "length"
		}
		if want != fr || c[choiceFinish].Type != gjson.String {
			e.set(base+".finish_reason", want)
		}
		return true
	})
	normaliseUsage(top[topUsage], "usage", e, ans.Usage)
	return e.b
}

// NormaliseRead is NormaliseBody(ans, body) for a body that d holds
// (openai.ReadJSON of body itself, the same bytes; otherwise, or when d is
// empty, it is NormaliseBody): a chat or text completion in which
// NormaliseBody would change nothing but the model name — the answers of
// OpenAI and of most OpenAI-compatible servers — is written from what d
// holds (body itself, or body with its "model" string replaced), without
// reading body again; any other answer is NormaliseBody's.
func NormaliseRead(ans Answer, d *openai.Doc, body []byte) []byte {
	if d.Len() == 0 || len(d.Body()) != len(body) || unsafe.StringData(d.Body()) != unsafe.SliceData(body) {
		return NormaliseBody(ans, body)
	}
	model, ok := plainAnswer(ans, d)
	if !ok {
		return NormaliseBody(ans, body)
	}
	if ans.Model == "" || model < 0 {
		return body
	}
	// As edit.replaceString splices the first edit: a new document.
	start, end := d.Offset(model), d.Offset(model)+len(d.Raw(model))
	out := make([]byte, 0, len(body)-(end-start)+len(ans.Model)+2)
	out = append(out, body[:start]...)
	out = appendStringify(out, ans.Model)
	return append(out, body[end:]...)
}

// plainAnswer reports whether NormaliseBody(ans, body), for the body that
// d holds (no member name repeated in one object: openai.ReadJSON), would
// change nothing but a string "model" that is not ans.Model; model is
// that member's value (-1 when the model needs no change). Each condition
// is one of NormaliseBody's for leaving a member as it is; an answer that
// fails one (or that NormaliseBody looks at more closely: tool calls, a
// chat logprobs object) is not plain.
func plainAnswer(ans Answer, d *openai.Doc) (model int, ok bool) {
	chat := ans.Endpoint == openai.EndpointChat
	if !chat && ans.Endpoint != openai.EndpointCompletions || d.Kind(0) != openai.KindObject {
		return -1, false
	}
	object := "text_completion"
	if chat {
		object = "chat.completion"
	}
	var top [len(topNames)]int
	members(d, 0, topNames[:], top[:])
	switch {
	case top[topError] >= 0,
		!docString(d, top[topID]) || len(d.Raw(top[topID])) <= 2,
		!docString(d, top[topObject]) || d.Str(top[topObject]) != object,
		!canonicalInt(d, top[topCreated]),
		top[topFingerprint] >= 0 && !docString(d, top[topFingerprint]),
		top[topServiceTier] >= 0 && d.Kind(top[topServiceTier]) != openai.KindNull &&
			!(docString(d, top[topServiceTier]) && serviceTiers[d.Str(top[topServiceTier])]),
		top[topChoices] < 0 || d.Kind(top[topChoices]) != openai.KindArray,
		!plainUsage(d, top[topUsage], ans.Usage != nil):
		return -1, false
	}
	model = -1
	if m := top[topModel]; ans.Model != "" && (m < 0 || d.Str(m) != ans.Model) {
		if !docString(d, m) {
			return -1, false // set, not replaced
		}
		model = m
	}
	ch := top[topChoices]
	for c, end := ch+1, d.Next(ch); c < end; c = d.Next(c) {
		if !plainChoice(ans.Endpoint, d, c) {
			return -1, false
		}
	}
	return model, true
}

// plainChoice reports whether NormaliseBody leaves choice c as it is.
func plainChoice(ep openai.Endpoint, d *openai.Doc, c int) bool {
	if d.Kind(c) != openai.KindObject {
		return false
	}
	var f [len(choiceNames)]int
	members(d, c, choiceNames[:], f[:])
	lp, fr := f[choiceLogprobs], f[choiceFinish]
	if !docPresent(d, f[choiceIndex]) || lp < 0 || !docString(d, fr) || finishReason(ep, d.Str(fr)) != d.Str(fr) {
		return false
	}
	if ep != openai.EndpointChat {
		return docPresent(d, f[choiceText])
	}
	msg := f[choiceMessage]
	if d.Kind(lp) == openai.KindObject || msg < 0 || d.Kind(msg) != openai.KindObject {
		return false
	}
	var m [len(messageNames)]int
	members(d, msg, messageNames[:], m[:])
	fc := m[messageFunctionCall]
	return docString(d, m[messageRole]) && m[messageContent] >= 0 && d.Kind(m[messageContent]) != openai.KindArray &&
		m[messageRefusal] >= 0 && m[messageToolCalls] < 0 && (fc < 0 || d.Kind(fc) == openai.KindObject)
}

// plainUsage reports whether normaliseUsage leaves the usage u (-1: none)
// as it is; checked says it is given the usage Molly recorded, and so
// looks at every count.
func plainUsage(d *openai.Doc, u int, checked bool) bool {
	if u < 0 {
		return true
	}
	if d.Kind(u) != openai.KindObject || checked && !docCounts(d, u) {
		return false
	}
	var f [len(usageNames)]int
	members(d, u, usageNames[:], f[:])
	for _, i := range f[3:] {
		if i >= 0 && d.Kind(i) != openai.KindObject {
			return false
		}
	}
	return docPresent(d, f[0]) && docPresent(d, f[1]) && docPresent(d, f[2])
}

// docCounts is validCounts for the usage object u of d.
func docCounts(d *openai.Doc, u int) bool {
	for c, end := u+1, d.Next(u); c < end; c = d.Next(c) {
		k, _ := d.Key(c)
		switch {
		case d.Kind(c) == openai.KindObject:
			if !docCounts(d, c) {
				return false
			}
		case strings.HasSuffix(k, "_tokens") && d.Kind(c) != openai.KindNull:
			n, err := strconv.ParseInt(d.Raw(c), 10, 64)
			if d.Kind(c) != openai.KindNumber || err != nil || n < 0 || n > MaxTokenCount {
				return false
			}
		}
	}
	return true
}

// members sets out[i] to the value of object obj's member named names[i]
// (-1 when it has none), as pick does for a gjson.Result.
func members(d *openai.Doc, obj int, names []string, out []int) {
	for i := range out {
		out[i] = -1
	}
	for c, end := obj+1, d.Next(obj); c < end; c = d.Next(c) {
		k, _ := d.Key(c)
		for i, n := range names {
			if k == n {
				if out[i] < 0 {
					out[i] = c
				}
				break
			}
		}
	}
}

// docString reports a value i (-1: none) that is a string.
func docString(d *openai.Doc, i int) bool { return i >= 0 && d.Kind(i) == openai.KindString }

// docPresent is present for value i of d (-1: none).
func docPresent(d *openai.Doc, i int) bool { return i >= 0 && d.Kind(i) != openai.KindNull }

// canonicalInt reports a value i (-1: none) that header leaves as the
// answer's "created": a number whose text is the decimal of its integer
// value, of at most 15 digits (where gjson's Int reads it exactly).
func canonicalInt(d *openai.Doc, i int) bool {
	if i < 0 || d.Kind(i) != openai.KindNumber || len(d.Raw(i)) > 15 {
		return false
	}
	n, err := strconv.ParseInt(d.Raw(i), 10, 64)
	var digits [20]byte
	return err == nil && d.Raw(i) == string(strconv.AppendInt(digits[:0], n, 10))
}

// choicePaths are the sjson paths of the first choices.
var choicePaths = func() (p [16]string) {
	for i := range p {
		p[i] = "choices." + strconv.Itoa(i)
	}
	return p
}()

// choicePath is the sjson path of the choice whose array key is k, as
// "choices." + k.String() spells it, without making the string for the
// first choices.
func choicePath(k gjson.Result) string {
	if k.Raw == "" && k.Num >= 0 && k.Num < float64(len(choicePaths)) && k.Num == math.Trunc(k.Num) {
		return choicePaths[int(k.Num)]
	}
	return "choices." + k.String()
}

// The members NormaliseBody looks at, by object, and their indexes.
var (
	topNames     = [...]string{"error", "id", "object", "created", "model", "system_fingerprint", "choices", "usage", "service_tier"}
	choiceNames  = [...]string{"index", "logprobs", "finish_reason", "text", "message"}
	messageNames = [...]string{"role", "content", "refusal", "tool_calls", "function_call"}
	usageNames   = [...]string{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "completion_tokens_details"}
)

const (
	topError = iota
	topID
	topObject
	topCreated
	topModel
	topFingerprint
	topChoices
	topUsage
	topServiceTier
)

const (
	choiceIndex = iota
	choiceLogprobs
	choiceFinish
	choiceText
	choiceMessage
)

const (
	messageRole = iota
	messageContent
	messageRefusal
	messageToolCalls
	messageFunctionCall
)

// pick sets out[i] to the value of obj's first member named names[i] (as
// obj.Get(names[i]) finds it; absent: the zero Result), in one pass over
// obj, a JSON object.
func pick(obj gjson.Result, names []string, out []gjson.Result) {
	left := len(names)
	obj.ForEach(func(k, v gjson.Result) bool {
		for i, n := range names {
			if k.Str == n {
				if !out[i].Exists() {
					out[i] = v
					left--
				}
				break
			}
		}
		return left > 0
	})
}

// header sets id, object, created and model and drops a non-string
// system_fingerprint; top holds the answer's members (topNames).
func header(ans Answer, top *[len(topNames)]gjson.Result, e *edit, prefix, object string) {
	if id := top[topID]; id.Type != gjson.String || id.Str == "" {
		e.set("id", NewID(prefix))
	}
	if top[topObject].Str != object {
		e.set("object", object)
	}
	var digits [20]byte
	if c := top[topCreated]; c.Type != gjson.Number || c.Raw != string(strconv.AppendInt(digits[:0], c.Int(), 10)) {
		e.set("created", ans.Created)
	}
	if m := top[topModel]; ans.Model != "" && m.Str != ans.Model {
		if m.Type == gjson.String {
			e.replaceString(m, "model", ans.Model)
		} else {
			e.set("model", ans.Model)
		}
	}
	if fp := top[topFingerprint]; fp.Exists() && fp.Type != gjson.String {
		e.del("system_fingerprint")
	}
	if st := top[topServiceTier]; st.Exists() && st.Type != gjson.Null && !serviceTiers[st.Str] {
		e.del("service_tier")
	}
}

// serviceTiers is the spec's ServiceTier enum (or null): the service tier
// an answer may name.
var serviceTiers = map[string]bool{"auto": true, "default": true, "flex": true, "scale": true, "priority": true, "fast": true}

// logprobFields gives a chat logprobs object its two required members,
// and each of their entries (ChatCompletionTokenLogprob) its "bytes" (null
// when absent) and "top_logprobs" ([] when absent or null), each
// alternative its "bytes".
func logprobFields(path string, lp gjson.Result, e *edit) {
	for _, f := range []string{"content", "refusal"} {
		list := lp.Get(f)
		if !list.Exists() {
			e.raw(path+"."+f, "null")
		}
		if !list.IsArray() {
			continue
		}
		list.ForEach(func(i, ent gjson.Result) bool {
			if !ent.IsObject() {
				return true
			}
			p := path + "." + f + "." + i.String()
			if !ent.Get("bytes").Exists() {
				e.raw(p+".bytes", "null")
			}
			switch top := ent.Get("top_logprobs"); {
			case !top.IsArray():
				e.raw(p+".top_logprobs", "[]")
			default:
				top.ForEach(func(j, alt gjson.Result) bool {
					if alt.IsObject() && !alt.Get("bytes").Exists() {
						e.raw(p+".top_logprobs."+j.String()+".bytes", "null")
					}
					return true
				})
			}
			return true
		})
	}
}

// normaliseUsage makes u (at path) a CompletionUsage: a null or non-object
// usage is dropped, a missing total_tokens is the sum. A usage with a
// count that is not an integer from 0 to MaxTokenCount (negative,
// fractional, huge: the spec's counts are integers, and clients keep them
// in 32 or 64 bits) becomes recorded's counts (the ledger's estimate)
// with their sum, its details dropped.
func normaliseUsage(u gjson.Result, path string, e *edit, recorded *Counts) {
	switch {
	case !u.Exists():
	case !u.IsObject():
		e.del(path)
	case recorded != nil && !validCounts(u):
		e.raw(path, usageOf(int64(recorded.Prompt), int64(recorded.Completion)))
	default:
		var f [len(usageNames)]gjson.Result
		pick(u, usageNames[:], f[:])
		p, c := f[0].Int(), f[1].Int()
		if !present(f[0]) {
			e.set(path+".prompt_tokens", 0)
		}
		if !present(f[1]) {
			e.set(path+".completion_tokens", 0)
		}
		if !present(f[2]) {
			e.set(path+".total_tokens", p+c)
		}
		for i, d := range usageNames[3:] { // the details, objects that servers send as null
			if v := f[3+i]; v.Exists() && !v.IsObject() {
				e.del(path + "." + d)
			}
		}
	}
}

// partsContent rewrites the content c of the message or delta msg (at
// path) when it is an array of parts, as Mistral's reasoning models send
// it ([{"type": "thinking", "thinking": [{"type": "text", "text": ...}]},
// {"type": "text", "text": ...}]) where the spec has a string: the text
// parts, joined, become the content; the thinking parts' text, the
// reasoning_content, when msg has none.
func partsContent(c gjson.Result, path string, msg gjson.Result, e *edit) {
	var text, thinking strings.Builder
	c.ForEach(func(_, part gjson.Result) bool {
		switch part.Get("type").Str {
		case "text":
			text.WriteString(part.Get("text").String())
		case "thinking":
			th := part.Get("thinking")
			if th.Type == gjson.String {
				thinking.WriteString(th.Str)
			}
			if th.IsArray() {
				th.ForEach(func(_, t gjson.Result) bool {
					thinking.WriteString(t.Get("text").String())
					return true
				})
			}
		}
		return true
	})
	e.set(path+".content", text.String())
	if rc := msg.Get("reasoning_content"); thinking.Len() > 0 && (rc.Type != gjson.String || rc.Str == "") {
		e.set(path+".reasoning_content", thinking.String())
	}
}

// present reports a member that is there and not null: a required member
// some servers write as null (a choice's index, a completion's text, a
// usage's counts) is written as if it were absent.
func present(v gjson.Result) bool { return v.Exists() && v.Type != gjson.Null }

// usageOf is the JSON of a usage of p prompt and c completion tokens.
func usageOf(p, c int64) string {
	return `{"prompt_tokens":` + strconv.FormatInt(p, 10) + `,"completion_tokens":` + strconv.FormatInt(c, 10) +
		`,"total_tokens":` + strconv.FormatInt(p+c, 10) + `}`
}

// floatsBase64 is an embedding given as a JSON array of numbers in the
// spec's base64 form: the little-endian IEEE 754 float32 of each, base64
// (standard alphabet, padded), as OpenAI encodes it; ok is false when an
// element is not a number.
func floatsBase64(a gjson.Result) (string, bool) {
	var buf []byte
	ok := true
	a.ForEach(func(_, v gjson.Result) bool {
		if v.Type != gjson.Number {
			ok = false
			return false
		}
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(float32(v.Float())))
		return true
	})
	return base64.StdEncoding.EncodeToString(buf), ok
}

// base64Floats is the JSON array of the little-endian float32 values a
// base64 embedding holds, each written as the shortest decimal that reads
// back as the same float32; ok is false for a string that is not base64
// of a whole number of float32 values.
func base64Floats(s string) (string, bool) {
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw)%4 != 0 {
		return "", false
	}
	out := make([]byte, 0, 2+len(raw)*3)
	out = append(out, '[')
	for i := 0; i < len(raw); i += 4 {
		if i > 0 {
			out = append(out, ',')
		}
		f := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return "", false
		}
		out = strconv.AppendFloat(out, float64(f), 'g', -1, 32)
	}
	return string(append(out, ']')), true
}

func normaliseEmbeddings(ans Answer, root gjson.Result, e *edit) {
	if root.Get("object").Str != "list" {
		e.set("object", "list")
	}
	if ans.Model != "" && root.Get("model").Str != ans.Model {
		e.set("model", ans.Model)
	}
	data := root.Get("data")
	if !data.IsArray() {
		// null or absent: an empty list (gjson's ForEach would call back
		// once with the null and make two half embeddings of it).
		e.raw("data", "[]")
		data = gjson.Result{}
	}
	data.ForEach(func(k, d gjson.Result) bool {
		if d.Get("object").Str != "embedding" {
			e.set("data."+k.String()+".object", "embedding")
		}
		if !present(d.Get("index")) {
			e.set("data."+k.String()+".index", k.Int())
		}
		emb := d.Get("embedding")
		switch {
		case ans.EncodingFormat == "base64" && emb.IsArray():
			if b64, ok := floatsBase64(emb); ok {
				e.set("data."+k.String()+".embedding", b64)
			}
		case ans.EncodingFormat != "base64" && emb.Type == gjson.String:
			if floats, ok := base64Floats(emb.Str); ok {
				e.raw("data."+k.String()+".embedding", floats)
			}
		}
		return true
	})
	u := root.Get("usage")
	if !u.IsObject() {
		e.raw("usage", `{"prompt_tokens":0,"total_tokens":0}`)
		return
	}
	if ans.Usage != nil && !validCounts(u) {
		p := strconv.Itoa(ans.Usage.Prompt)
		e.raw("usage", `{"prompt_tokens":`+p+`,"total_tokens":`+p+`}`)
		return
	}
	if !present(u.Get("prompt_tokens")) {
		e.set("usage.prompt_tokens", 0)
	}
	if !present(u.Get("total_tokens")) {
		e.set("usage.total_tokens", u.Get("prompt_tokens").Int())
	}
}

// Stream normalises the chunks of one streamed chat or text completion
// into the spec's CreateChatCompletionStreamResponse (or
// CreateCompletionResponse) shape, chunk by chunk:
//
//   - every chunk gets the id and created of the first chunk with choices
//     (the spec: "each chunk has the same ID", "the same timestamp"; a
//     created that is not a positive integer is the answer's start), the client's model
//     name, the object name; a system_fingerprint that is not a string is
//     dropped;
//   - every choice gets its index, a delta, and finish_reason (null until
//     it finishes, "" taken as not yet; aliases mapped to the enum); the
//     first delta of each
//     chat choice gets role "assistant"; a logprobs object gets content and
//     refusal;
//   - tool-call deltas are re-indexed per choice so that distinct call ids
//     never share an index (some servers stream parallel calls all with
//     index 0), nor two entries of one delta (Gemini's, without ids),
//     nor whole calls in successive deltas at one index without ids
//     (Gemini's too: arguments starting a JSON object after a whole one
//     start another call, of the same function when they name none), and a first delta without a type gets "function", without
//     an id (or with "") a made-up one; a choice
//     that finishes with a tool call whose arguments are not complete JSON
//     finishes with "length" (the call was cut off);
//   - usage is taken out of every chunk (its "usage", else Groq's
//     "x_groq.usage") and merged (a provider may report
//     prompt tokens on its first chunk and completion tokens on its last:
//     each count keeps its largest report); Final returns the one usage
//     chunk the spec places last, with "choices": [], when the client asked
//     for it (stream_options.include_usage), and nothing otherwise. When
//     the client asked, every other chunk carries "usage": null, as the
//     spec's stream options describe ("all other chunks will also include
//     a usage field, but with a null value"); otherwise no chunk has the
//     field;
//   - members written as null where the spec has none are dropped: a
//     delta's "tool_calls" and "function_call", a tool-call delta's "id",
//     "type", "function.name" and "function.arguments" (LiteLLM's proxy
//     writes them on every continuation), the usage's details; so is a
//     "service_tier" outside the spec's enum; a logprobs entry gets its
//     "bytes" and "top_logprobs".
//
// A chunk left without choices (a usage-only chunk, a provider's empty
// preamble) is dropped. Not safe for concurrent use.
type Stream struct {
	ans         Answer
	chat        bool
	id          string
	created     int64
	fingerprint string // raw JSON of a string system_fingerprint, "" when none
	tier        string // the last service_tier of the spec's enum seen, "" when none
	started     bool
	choices     map[int64]*choiceState
	usage       usageSum
}

type choiceState struct {
	roleSent bool
	finished bool // a finish_reason was passed on
	// byIndex maps an upstream tool-call index to the index given to the
	// call it continues; byID a call id to its index.
	byIndex map[int64]int
	byID    map[string]int
	args    []*strings.Builder // arguments so far, by given index
	names   map[int]string     // function names, by given index
}

// usageSum merges the usage reports of a stream.
type usageSum struct {
	seen               bool
	invalid            bool // a report had a count that is not a validCount
	prompt, completion int64
	raw                string // the last usage object, for its other members
}

// NewStream returns the normaliser of one stream answering ans.
func NewStream(ans Answer) *Stream {
	return &Stream{ans: ans, chat: ans.Endpoint == openai.EndpointChat, choices: map[int64]*choiceState{}}
}

// Usage returns the merged usage reported so far (ok false when none).
func (s *Stream) Usage() (prompt, completion int, ok bool) {
	return int(s.usage.prompt), int(s.usage.completion), s.usage.seen
}

// Chunk normalises one chunk's JSON data and returns it, or nil when the
// chunk is to be dropped (nothing but usage left). An error object (an
// error event inside the stream) is returned as it is. The chunk is read
// in one pass over its members and one over each choice's; a chunk that
// needs no change is returned without a copy.
func (s *Stream) Chunk(data []byte) []byte {
	root := gjson.ParseBytes(data)
	if !root.IsObject() {
		return data
	}
	var id, object, created, model, fp, usage, choices, errObj, tier, xgroq gjson.Result
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			id = v
		case "object":
			object = v
		case "created":
			created = v
		case "model":
			model = v
		case "system_fingerprint":
			fp = v
		case "usage":
			usage = v
		case "choices":
			choices = v
		case "error":
			errObj = v
		case "service_tier":
			tier = v
		case "x_groq":
			xgroq = v
		}
		return true
	})
	if errObj.Exists() {
		return data
	}
	e := &edit{b: data}
	reported := usage
	if !reported.IsObject() {
		// Groq's stream reports its usage under x_groq, on the last chunk.
		reported = xgroq.Get("usage")
	}
	if reported.IsObject() {
		usage := reported
		s.usage.seen = true
		s.usage.invalid = s.usage.invalid || !validCounts(usage)
		s.usage.prompt = max(s.usage.prompt, usage.Get("prompt_tokens").Int())
		s.usage.completion = max(s.usage.completion, usage.Get("completion_tokens").Int())
		s.usage.raw = usage.Raw
	}
	if !choices.IsArray() || len(choices.Raw) <= 2 || choices.Get("#").Int() == 0 {
		return nil
	}
	// The stream's id, created and fingerprint are those of the first chunk
	// the client gets: one with choices. A chunk without (Azure's first,
	// with prompt_filter_results, "id": "" and "created": 0) is not sent,
	// and its placeholders are not the answer's.
	if !s.started {
		s.started = true
		s.id = id.Str
		if s.id == "" {
			s.id = NewID(map[bool]string{true: "chatcmpl-", false: "cmpl-"}[s.chat])
		}
		s.created = s.ans.Created
		if created.Type == gjson.Number && created.Raw == strconv.FormatInt(created.Int(), 10) && created.Int() > 0 {
			s.created = created.Int()
		}
		if fp.Type == gjson.String {
			s.fingerprint = fp.Raw
		}
	}
	switch {
	case s.ans.IncludeUsage && usage.Raw != "null":
		e.raw("usage", "null")
	case !s.ans.IncludeUsage && usage.Exists():
		e.del("usage")
	}
	if id.Str != s.id {
		e.set("id", s.id)
	}
	want := "text_completion"
	if s.chat {
		want = "chat.completion.chunk"
	}
	if object.Str != want {
		e.set("object", want)
	}
	if created.Raw != strconv.FormatInt(s.created, 10) {
		e.set("created", s.created)
	}
	if s.ans.Model != "" && model.Str != s.ans.Model {
		e.set("model", s.ans.Model)
	}
	if fp.Exists() && fp.Type != gjson.String {
		e.del("system_fingerprint")
	}
	switch {
	case tier.Type == gjson.String && serviceTiers[tier.Str]:
		s.tier = tier.Str
	case tier.Exists() && tier.Type != gjson.Null:
		e.del("service_tier")
	}
	pos := int64(0)
	choices.ForEach(func(_, ch gjson.Result) bool {
		s.choice(e, "choices."+strconv.FormatInt(pos, 10), pos, ch)
		pos++
		return true
	})
	return e.b
}

func (s *Stream) choice(e *edit, base string, pos int64, ch gjson.Result) {
	var index, delta, fr, lp, text gjson.Result
	ch.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "index":
			index = v
		case "delta":
			delta = v
		case "finish_reason":
			fr = v
		case "logprobs":
			lp = v
		case "text":
			text = v
		}
		return true
	})
	idx := pos
	if index.Type == gjson.Number {
		idx = index.Int()
	} else {
		e.set(base+".index", pos)
	}
	st := s.choices[idx]
	if st == nil {
		st = &choiceState{byIndex: map[int64]int{}, byID: map[string]int{}, names: map[int]string{}}
		s.choices[idx] = st
	}
	if !s.chat {
		if !present(text) {
			e.set(base+".text", "")
		}
		if !lp.Exists() {
			e.raw(base+".logprobs", "null")
		}
		switch {
		case !fr.Exists(), fr.Type == gjson.String && fr.Str == "":
			e.raw(base+".finish_reason", "null")
		case fr.Type == gjson.String:
			st.finished = true
			if want := finishReason(s.ans.Endpoint, fr.Str); want != fr.Str {
				e.set(base+".finish_reason", want)
			}
		}
		return
	}
	if !delta.IsObject() {
		e.raw(base+".delta", "{}")
	}
	var role, calls, fcall gjson.Result
	delta.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "content":
			if v.IsArray() {
				partsContent(v, base+".delta", delta, e)
			}
		case "role":
			role = v
		case "tool_calls":
			calls = v
		case "function_call":
			fcall = v
		}
		return true
	})
	if fcall.Exists() && !fcall.IsObject() {
		e.del(base + ".delta.function_call")
	}
	if calls.Exists() && !calls.IsArray() {
		// "tool_calls": null (LiteLLM's proxy on every delta): dropped,
		// never read (gjson's ForEach would call back once with the null).
		e.del(base + ".delta.tool_calls")
		calls = gjson.Result{}
	}
	switch {
	case !st.roleSent:
		st.roleSent = true
		if role.Type != gjson.String {
			e.set(base+".delta.role", "assistant")
		}
	case role.Exists() && role.Type != gjson.String:
		e.del(base + ".delta.role") // a later delta's "role": null
	}
	if lp.IsObject() {
		logprobFields(base+".logprobs", lp, e)
	}
	var inChunk []int // the indexes given in this delta
	calls.ForEach(func(j, tc gjson.Result) bool {
		p := base + ".delta.tool_calls." + j.String()
		given, fresh := s.toolIndex(st, j.Int(), tc)
		if slices.Contains(inChunk, given) && tc.Get("id").Str == "" {
			// Two entries of one delta are two calls, never two pieces
			// of one (Gemini's OpenAI-compatible API sends parallel calls
			// in one delta, all index 0, without ids).
			given, fresh = len(st.args), true
			st.args = append(st.args, &strings.Builder{})
			up := j.Int()
			if i := tc.Get("index"); i.Type == gjson.Number {
				up = i.Int()
			}
			st.byIndex[up] = given
		}
		if a := tc.Get("function.arguments"); !fresh && tc.Get("id").Str == "" && a.Type == gjson.String && nextCall(st.args[given].String(), a.Str) {
			// Arguments that start a JSON object after the call's were
			// already one whole object belong to another call (Gemini's
			// OpenAI-compatible API streams parallel calls one per chunk,
			// each index 0, without ids): joined, they would be one
			// call with arguments no client can parse. The new call is
			// taken to be of the same function when it names none.
			prev := given
			given, fresh = len(st.args), true
			st.args = append(st.args, &strings.Builder{})
			up := j.Int()
			if i := tc.Get("index"); i.Type == gjson.Number {
				up = i.Int()
			}
			st.byIndex[up] = given
			if n := tc.Get("function.name"); (n.Type != gjson.String || n.Str == "") && st.names[prev] != "" {
				e.set(p+".function.name", st.names[prev])
			}
		}
		if n := tc.Get("function.name"); n.Type == gjson.String && n.Str != "" {
			st.names[given] = n.Str
		}
		inChunk = append(inChunk, given)
		if tc.Get("index").Raw != strconv.Itoa(given) {
			e.set(p+".index", given)
		}
		id, typ, fn := tc.Get("id"), tc.Get("type"), tc.Get("function")
		switch {
		case fresh:
			// A call's first delta without an id (or ""): one made up, so
			// parallel calls stay apart for the client (the Messages API's
			// tool_use blocks and their tool_results are matched by id).
			e.set(p+".id", NewID("call_"))
			id = gjson.Result{Type: gjson.String, Str: "call_"}
		case id.Exists() && id.Type != gjson.String:
			e.del(p + ".id") // a continuation's "id": null
		}
		switch {
		case id.Type == gjson.String && typ.Type != gjson.String:
			e.set(p+".type", "function")
		case typ.Exists() && typ.Type != gjson.String:
			e.del(p + ".type")
		}
		if fn.Exists() && !fn.IsObject() {
			e.del(p + ".function")
		}
		if n := fn.Get("name"); n.Exists() && n.Type != gjson.String {
			e.del(p + ".function.name")
		}
		if a := fn.Get("arguments"); a.Type == gjson.Null {
			e.del(p + ".function.arguments")
		}
		if a := fn.Get("arguments"); a.Type == gjson.String {
			st.args[given].WriteString(a.Str)
		} else if a.IsObject() || a.IsArray() {
			e.set(p+".function.arguments", argsText(a))
			st.args[given].WriteString(argsText(a))
		}
		return true
	})
	switch {
	case !fr.Exists(), fr.Type == gjson.String && fr.Str == "":
		// Absent, or "" (some servers' word for "not yet"): not finished.
		e.raw(base+".finish_reason", "null")
	case fr.Type == gjson.String:
		st.finished = true
		want := finishReason(s.ans.Endpoint, fr.Str)
		for i := range st.args {
			if argsCut(st.args[i].String()) {
				want = "length"
			}
		}
		if want != fr.Str {
			e.set(base+".finish_reason", want)
		}
	}
}

// toolIndex is the index given to tool-call delta tc (the pos-th of its
// chunk): a new call id gets the next free index; a delta without an id
// continues the call last given for its upstream index, or, when there is
// none, starts a call that has no id (fresh).
func (s *Stream) toolIndex(st *choiceState, pos int64, tc gjson.Result) (given int, fresh bool) {
	up := pos
	if i := tc.Get("index"); i.Type == gjson.Number {
		up = i.Int()
	}
	id := tc.Get("id").Str
	if id != "" {
		if given, ok := st.byID[id]; ok {
			st.byIndex[up] = given
			return given, false
		}
		given := len(st.args)
		st.args = append(st.args, &strings.Builder{})
		st.byID[id] = given
		st.byIndex[up] = given
		return given, false
	}
	if given, ok := st.byIndex[up]; ok {
		return given, false
	}
	given = len(st.args) // a call that never said its id
	st.args = append(st.args, &strings.Builder{})
	st.byIndex[up] = given
	return given, true
}

// Cut returns the chunk that ends a stream Molly stops before the upstream
// finished it (the answer ran past the completion tokens reserved for it):
// every choice seen that has not finished, or choice 0 when none was seen,
// finishing with "length" — the spec's reason for "the maximum number of
// tokens specified in the request was reached" — with an empty delta (chat)
// or text (completions), in the stream's id, created and model; nil when
// every choice seen has finished. Final follows it as usual.
func (s *Stream) Cut() []byte {
	open := s.open()
	if len(s.choices) == 0 {
		open = []int64{0}
	}
	return s.finishing(open, func(int64) string { return "length" })
}

// Close returns the chunk that ends a stream the upstream ended ([DONE],
// or its end after a finished choice) with choices it never finished (a
// server that finishes only choice 0 of n): each such choice seen
// finishes with "tool_calls" when it streamed tool calls ("length" when
// their arguments are not whole JSON: cut off), else "stop" — the stream
// is over, and the SDKs' stream helpers refuse a choice without a
// finish_reason. It is nil when every choice seen finished, or none was
// seen. Final follows it as usual.
func (s *Stream) Close() []byte {
	return s.finishing(s.open(), func(i int64) string {
		st := s.choices[i]
		if len(st.args) == 0 || !s.chat {
			return "stop"
		}
		for _, a := range st.args {
			if argsCut(a.String()) {
				return "length"
			}
		}
		return "tool_calls"
	})
}

// open is the choices seen that have not finished, in index order.
func (s *Stream) open() []int64 {
	var open []int64
	for i, st := range s.choices {
		if !st.finished {
			open = append(open, i)
		}
	}
	slices.Sort(open)
	return open
}

// chunkHead starts a chunk of the stream's own making: its id (one made
// up when the upstream gave none), object, created, model and
// system_fingerprint.
func (s *Stream) chunkHead() *edit {
	object := "text_completion"
	if s.chat {
		object = "chat.completion.chunk"
	}
	if s.id == "" {
		s.id = NewID(map[bool]string{true: "chatcmpl-", false: "cmpl-"}[s.chat])
		s.created = s.ans.Created
	}
	e := &edit{b: []byte(`{}`)}
	e.set("id", s.id)
	e.set("object", object)
	e.set("created", s.created)
	e.set("model", s.ans.Model)
	if s.fingerprint != "" {
		e.raw("system_fingerprint", s.fingerprint)
	}
	return e
}

// finishing is the chunk finishing choices open, each with reason(i), with
// an empty delta (chat) or text (completions), in the stream's id, created
// and model; nil for none.
func (s *Stream) finishing(open []int64, reason func(int64) string) []byte {
	if len(open) == 0 {
		return nil
	}
	e := s.chunkHead()
	e.raw("choices", "[]")
	for _, i := range open {
		ch := map[string]any{"index": i, "finish_reason": reason(i)}
		if s.chat {
			ch["delta"] = map[string]any{}
			ch["logprobs"] = nil
		} else {
			ch["text"], ch["logprobs"] = "", nil
		}
		e.set("choices.-1", ch)
		if st := s.choices[i]; st != nil {
			st.finished = true
		}
	}
	if s.ans.IncludeUsage {
		e.raw("usage", "null")
	}
	return e.b
}

// Settle makes prompt and completion the counts of the usage chunk Final
// writes, in place of those the upstream reported (its other members
// kept unless one is invalid): what the ledger recorded for the answer,
// which the client is billed, as NormaliseBody's Answer.Usage does for a
// whole answer.
func (s *Stream) Settle(prompt, completion int) {
	s.usage.seen = true
	s.usage.prompt, s.usage.completion = int64(prompt), int64(completion)
	if !gjson.Valid(s.usage.raw) || !gjson.Parse(s.usage.raw).IsObject() {
		s.usage.raw = `{}`
	}
}

// Final returns the stream's last chunk: the usage chunk ("choices": [],
// the merged usage, or the fallback counts — the meter's — when the
// upstream reported none, or a count that is not an integer from 0 to
// MaxTokenCount; the stream's id, created, system_fingerprint and service_tier)
// when the client asked for usage, else nil.
func (s *Stream) Final(fallbackPrompt, fallbackCompletion int) []byte {
	if !s.ans.IncludeUsage {
		return nil
	}
	e := s.chunkHead()
	if s.tier != "" {
		// As OpenAI's usage chunk, which carries it too: the SDKs'
		// accumulators keep the last chunk's.
		e.set("service_tier", s.tier)
	}
	e.raw("choices", "[]")
	p, c := int64(fallbackPrompt), int64(fallbackCompletion)
	u := `{}`
	if s.usage.seen && !s.usage.invalid {
		p, c, u = s.usage.prompt, s.usage.completion, s.usage.raw
	}
	ue := &edit{b: []byte(u)}
	ue.set("prompt_tokens", p)
	ue.set("completion_tokens", c)
	ue.set("total_tokens", p+c)
	for _, d := range usageNames[3:] {
		if v := gjson.GetBytes(ue.b, d); v.Exists() && !v.IsObject() {
			ue.del(d)
		}
	}
	e.raw("usage", string(ue.b))
	return e.b
}

// NormaliseError rewrites the body of an upstream's error answer (status
// ≥ 400) into OpenAI's ErrorResponse, {"error": {"message", "type",
// "param", "code"}}: missing members are added (param and code null, type
// from the status), a string "error" becomes the message, the flat
// {"message", "type", "param", "code"} of vLLM and FastChat moves under
// "error", and a body that is not such JSON becomes the message (its first
// 512 bytes). A numeric code becomes a string, as the spec's code is.
func NormaliseError(status int, body []byte) []byte {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "upstream_error"
	}
	root := gjson.ParseBytes(body)
	eo := root.Get("error")
	switch {
	case root.IsObject() && eo.IsObject():
		e := &edit{b: body}
		if eo.Get("message").Type != gjson.String {
			msg := eo.Get("message").String()
			if msg == "" {
				msg = "The upstream answered HTTP " + strconv.Itoa(status) + "."
			}
			e.set("error.message", msg)
		}
		if eo.Get("type").Type != gjson.String {
			e.set("error.type", typ)
		}
		for _, f := range []string{"param", "code"} {
			switch v := eo.Get(f); {
			case !v.Exists():
				e.raw("error."+f, "null")
			case v.Type == gjson.Number:
				e.set("error."+f, v.Raw) // some servers give the status as a number
			}
		}
		return e.b
	case root.IsObject() && eo.Type == gjson.String:
		return (&openai.Error{Status: status, Type: typ, Message: eo.Str}).Body()
	case root.IsObject() && !eo.Exists() && root.Get("message").Type == gjson.String:
		// The flat form of vLLM and FastChat, {"object": "error",
		// "message", "type", "param", "code": 400}: the same members one
		// level up.
		e := &openai.Error{Status: status, Type: typ, Message: root.Get("message").Str}
		if t := root.Get("type"); t.Type == gjson.String && t.Str != "" {
			e.Type = t.Str
		}
		if p := root.Get("param"); p.Type == gjson.String {
			e.Param = p.Str
		}
		if c := root.Get("code"); c.Type == gjson.String || c.Type == gjson.Number {
			e.Code = c.String()
		}
		return e.Body()
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 512 {
		msg = msg[:512] + "..."
	}
	if msg == "" || !utf8Valid(msg) {
		msg = "The upstream answered HTTP " + strconv.Itoa(status) + "."
	}
	return (&openai.Error{Status: status, Type: typ, Message: msg}).Body()
}

func utf8Valid(s string) bool { return utf8.ValidString(s) }

func validJSON(b []byte) bool { return gjson.ValidBytes(b) }
