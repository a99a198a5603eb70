package router

import (
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/api"
	"github.com/molly-gateway/molly/redaction"
)

// DefaultEntityClasses maps each entity type to the sensitivity class its
// presence implies. Secrets and credentials pin a request on-device;
// financial identifiers keep it inside the LAN; contact data keeps it on
// self-hosted tiers. Unlisted types count as Confidential.
var DefaultEntityClasses = map[string]Sensitivity{
	"SECRET":          Restricted,
	"URL_CREDENTIALS": Restricted,
	"CREDIT_CARD":     Confidential,
	"IBAN":            Confidential,
	"US_SSN":          Confidential,
	"IT_FISCAL_CODE":  Confidential,
	"EMAIL":           Internal,
	"PHONE":           Internal,
	"IP_ADDRESS":      Internal,
}

// Classifier turns a request body into an Annotation. Safe for concurrent use.
type Classifier struct {
	scanner   *redaction.Scanner
	classes   map[string]Sensitivity
	vaultOpts []redaction.VaultOption

	// scan and scanAcross are scanner.Scan and scanner.ScanAcross; tests
	// replace them to inject detector failures (no config can).
	scan       func(string) []redaction.Finding
	scanAcross func([]string) []redaction.SegmentFinding

	estimator *Estimator // task and difficulty (capability.go); nil: no adapter domains
}

// ClassifierOption configures a Classifier; see NewClassifier.
type ClassifierOption func(*Classifier)

// WithRedactionModes sets, per entity type, how NewDispatch replaces the
// type's values for a tier whose decision lists it: redaction.ModePlaceholder
// (reversible "[EMAIL_1]", the default for unlisted types), ModeMask
// ("[EMAIL]") or ModeHash (keyed HMAC pseudonym, see WithHashKey). The map
// is copied.
func WithRedactionModes(modes map[string]redaction.Mode) ClassifierOption {
	return func(c *Classifier) {
		for t, m := range modes {
			c.vaultOpts = append(c.vaultOpts, redaction.WithMode(t, m))
		}
	}
}

// WithHashKey sets the HMAC-SHA256 key of ModeHash pseudonyms (≥ 32 random
// bytes recommended), so the same value gets the same pseudonym across
// requests and restarts. Without it a random key made once per process is
// used. The key is copied; it is never logged.
func WithHashKey(key []byte) ClassifierOption {
	return func(c *Classifier) { c.vaultOpts = append(c.vaultOpts, redaction.WithHMACKey(key)) }
}

// NewClassifier builds a classifier over scanner. overrides replaces entries
// of DefaultEntityClasses (e.g. {"EMAIL": Public}); types in neither (e.g.
// user-defined patterns) imply Confidential.
func NewClassifier(scanner *redaction.Scanner, overrides map[string]Sensitivity, opts ...ClassifierOption) *Classifier {
	classes := make(map[string]Sensitivity, len(DefaultEntityClasses)+len(overrides))
	for k, v := range DefaultEntityClasses {
		classes[k] = v
	}
	for k, v := range overrides {
		classes[k] = v
	}
	c := &Classifier{scanner: scanner, classes: classes, scan: scanner.Scan, scanAcross: scanner.ScanAcross}
	for _, o := range opts {
		o(c)
	}
	return c
}

// EndpointOf maps method and path to the endpoint. The path may carry any
// prefix (clients use base URLs ending in /v1 or not). Errors are OpenAI
// errors: 404 unknown URL, 405 wrong method.
func EndpointOf(method, path string) (Endpoint, *api.Error) {
	shown := path
	if len(shown) > 200 {
		shown = shown[:200] + "..."
	}
	path = strings.TrimSuffix(path, "/")
	var ep Endpoint
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		ep = EndpointChat
	case strings.HasSuffix(path, "/completions"):
		ep = EndpointCompletions
	case strings.HasSuffix(path, "/embeddings"):
		ep = EndpointEmbeddings
	case strings.HasSuffix(path, "/models"):
		ep = EndpointModels
	case modelPathID(path) != "":
		ep = EndpointModels // GET /v1/models/{model}
	default:
		return "", &api.Error{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "unknown_url",
			Message: "Unknown request URL: " + method + " " + shown + "."}
	}
	want := http.MethodPost
	if ep == EndpointModels {
		want = http.MethodGet
	}
	if method != want {
		return "", &api.Error{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_supported",
			Message: "Method " + method + " is not allowed on " + path + "; use " + want + "."}
	}
	return ep, nil
}

// Classify validates body for ep and builds its annotation. declared is the
// X-Molly-Sensitivity header value ("" when absent); residency the
// X-Molly-Residency value. Errors are *api.Error with status 400.
func (c *Classifier) Classify(ep Endpoint, body []byte, declared, residency string) (*Annotation, error) {
	return c.ClassifyPath(ep, "", body, declared, residency)
}

// ClassifyPath is Classify for a request whose URL path is known, so that
// GET /v1/models/{model} names its model.
func (c *Classifier) ClassifyPath(ep Endpoint, path string, body []byte, declared, residency string) (*Annotation, error) {
	a := &Annotation{Body: body, Scanned: c.scanner.Types(), vaultOpts: c.vaultOpts, classifier: c}
	a.Endpoint = ep
	a.Residency = strings.TrimSpace(residency)
	if a.Residency != "" && !residencyRe.MatchString(a.Residency) {
		// Not echoed: the header may carry anything, and errors get logged.
		return nil, api.InvalidRequest("X-Molly-Residency", "Invalid X-Molly-Residency header: want a region code of letters, digits, '-' or '_' (at most 32), such as EU.")
	}
	// A repeated header is a comma-separated list (RFC 9110 §5.3); the
	// highest class wins, so no copy of the header can lower another.
	for _, v := range strings.Split(declared, ",") {
		if strings.TrimSpace(v) == "" {
			continue
		}
		s, err := ParseSensitivity(v)
		if err != nil {
			return nil, api.InvalidRequest("X-Molly-Sensitivity", "Invalid X-Molly-Sensitivity header: %v.", err)
		}
		a.Declared = max(a.Declared, s)
	}
	if ep == EndpointModels {
		// GET /v1/models/{model} retrieves one model; GET /v1/models lists them.
		if id := modelPathID(path); id != "" {
			if err := c.checkModelName(id); err != nil {
				return nil, err
			}
			a.Model = id
		}
		a.Sensitivity = a.Declared
		a.Modalities = []string{"text"}
		return a, nil
	}
	if len(body) == 0 {
		return nil, api.InvalidRequest("", "The request body is empty; send a JSON object.")
	}
	if !gjson.ValidBytes(body) {
		return nil, api.InvalidRequest("", "We could not parse the JSON body of your request: it is not valid JSON.")
	}
	if !utf8.Valid(body) {
		// JSON text exchanged between systems must be UTF-8 (RFC 8259 §8.1);
		// invalid bytes inside a value could also split an entity for the detectors.
		return nil, api.InvalidRequest("", "We could not parse the JSON body of your request: it is not valid UTF-8.")
	}
	k, dup, deep := checkStructure(body)
	if deep {
		return nil, api.InvalidRequest("", "We could not parse the JSON body of your request: it nests deeper than %d levels.", MaxJSONDepth)
	}
	if dup {
		// gjson reads the first of two equal names, while the JSON parsers
		// upstream (Go's encoding/json, Python's json) keep the last: a body
		// could be classified and redacted on one value and answered on the
		// other. RFC 8259 §4 says names SHOULD be unique; we require it.
		return nil, api.InvalidRequest("", "We could not parse the JSON body of your request: the key %q appears twice in one object.", k)
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return nil, api.InvalidRequest("", "The JSON body of your request must be an object, got %s.", kind(root))
	}
	if err := c.capability(a, root); err != nil {
		return nil, err
	}
	c.sovereignty(a)
	return a, nil
}

// kind names a JSON value's type for error messages.
func kind(v gjson.Result) string {
	switch {
	case !v.Exists():
		return "nothing"
	case v.Type == gjson.Null:
		return "null"
	case v.Type == gjson.String:
		return "a string"
	case v.Type == gjson.Number:
		return "a number"
	case v.Type == gjson.True, v.Type == gjson.False:
		return "a boolean"
	case v.IsArray():
		return "an array"
	default:
		return "an object"
	}
}

func wrongType(param, want string, got gjson.Result) *api.Error {
	return api.InvalidRequest(param, "Invalid type for '%s': expected %s, but got %s.", param, want, kind(got))
}

func (c *Classifier) capability(a *Annotation, root gjson.Result) *api.Error {
	model := root.Get("model")
	if !model.Exists() || model.Type == gjson.Null {
		return api.InvalidRequest("model", "You must provide a model parameter.")
	}
	if model.Type != gjson.String || model.Str == "" {
		return wrongType("model", "a non-empty string", model)
	}
	if err := c.checkModelName(model.Str); err != nil {
		return err
	}
	a.Model = model.Str
	if v := root.Get("stream"); v.Exists() && v.Type != gjson.Null {
		if v.Type != gjson.True && v.Type != gjson.False {
			return wrongType("stream", "a boolean", v)
		}
		a.Stream = v.Bool()
	}
	if v := root.Get("stream_options.include_usage"); v.Exists() && v.Type != gjson.Null {
		if v.Type != gjson.True && v.Type != gjson.False {
			return wrongType("stream_options.include_usage", "a boolean", v)
		}
		a.IncludeUsage = v.Bool()
	}
	for _, p := range []string{"max_completion_tokens", "max_tokens"} {
		v := root.Get(p)
		if !v.Exists() || v.Type == gjson.Null {
			continue
		}
		n, err := strconv.Atoi(v.Raw)
		if v.Type != gjson.Number || err != nil || n < 1 {
			return api.InvalidRequest(p, "Invalid '%s': expected a positive integer, but got %s.", p, v.Raw)
		}
		if a.MaxTokens == 0 {
			a.MaxTokens = n
		}
	}
	for _, p := range []string{"temperature", "top_p", "presence_penalty", "frequency_penalty"} {
		if v := root.Get(p); v.Exists() && v.Type != gjson.Null && v.Type != gjson.Number {
			return wrongType(p, "a number", v)
		}
	}
	if v := root.Get("n"); v.Exists() && v.Type != gjson.Null {
		if n, err := strconv.Atoi(v.Raw); v.Type != gjson.Number || err != nil || n < 1 {
			return api.InvalidRequest("n", "Invalid 'n': expected a positive integer, but got %s.", v.Raw)
		}
	}
	a.Modalities = []string{"text"}
	var err *api.Error
	switch a.Endpoint {
	case EndpointChat:
		err = c.chat(a, root)
	case EndpointCompletions:
		err = c.prompts(a, root, "prompt")
		if err == nil {
			if v := root.Get("suffix"); v.Type == gjson.String {
				a.Fields = append(a.Fields, TextField{Path: "suffix", Text: v.Str})
			}
		}
	case EndpointEmbeddings:
		err = c.prompts(a, root, "input")
		a.Task = "embedding"
	}
	if err != nil {
		return err
	}
	a.PromptTokens = estimatePromptTokens(a)
	// Every other string in the body (user, metadata, stop, tool
	// definitions, response_format schemas, image URLs, ...) is scanned
	// too: a field the extractors above do not know must not carry a value
	// to a tier unseen (fail closed).
	known := make(map[string]bool, len(a.Fields))
	for _, f := range a.Fields {
		known[f.Path] = true
	}
	a.Fields = appendLeaves(a.Fields, root, "", known)
	if a.Task == "" {
		a.Task, a.Difficulty, a.TaskEntropy = c.estimate(lastUserText(a, root), a.Tools)
	}
	return nil
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true, "function": true}

func (c *Classifier) chat(a *Annotation, root gjson.Result) *api.Error {
	msgs := root.Get("messages")
	if !msgs.Exists() {
		return api.InvalidRequest("messages", "Missing required parameter: 'messages'.")
	}
	if !msgs.IsArray() {
		return wrongType("messages", "an array", msgs)
	}
	arr := msgs.Array()
	if len(arr) == 0 {
		return api.InvalidRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.")
	}
	if t := root.Get("tools"); t.Exists() && t.Type != gjson.Null {
		if !t.IsArray() {
			return wrongType("tools", "an array", t)
		}
		a.Tools = len(t.Array()) > 0
	}
	for i, m := range arr {
		p := "messages." + strconv.Itoa(i)
		param := "messages[" + strconv.Itoa(i) + "]"
		if !m.IsObject() {
			return wrongType(param, "an object", m)
		}
		role := m.Get("role")
		if role.Type != gjson.String {
			return wrongType(param+".role", "a string", role)
		}
		if !chatRoles[role.Str] {
			return api.InvalidRequest(param+".role", "Invalid value for '%s.role': '%s'. Supported values are: 'system', 'developer', 'user', 'assistant', 'tool' and 'function'.", param, role.Str)
		}
		if role.Str == "tool" || role.Str == "function" {
			a.Tools = true
		}
		if n := m.Get("name"); n.Exists() && n.Type != gjson.Null {
			if n.Type != gjson.String {
				return wrongType(param+".name", "a string", n)
			}
			a.Fields = append(a.Fields, TextField{Path: p + ".name", Text: n.Str})
		}
		content := m.Get("content")
		switch {
		case !content.Exists() || content.Type == gjson.Null:
			if role.Str != "assistant" {
				return api.InvalidRequest(param+".content", "Invalid value for '%s.content': expected a string or an array of content parts, got null.", param)
			}
		case content.Type == gjson.String:
			a.Fields = append(a.Fields, TextField{Path: p + ".content", Text: content.Str})
		case content.IsArray():
			for j, part := range content.Array() {
				pp := p + ".content." + strconv.Itoa(j)
				pparam := param + ".content[" + strconv.Itoa(j) + "]"
				if !part.IsObject() {
					return wrongType(pparam, "an object", part)
				}
				switch t := part.Get("type").String(); t {
				case "text":
					txt := part.Get("text")
					if txt.Type != gjson.String {
						return wrongType(pparam+".text", "a string", txt)
					}
					a.Fields = append(a.Fields, TextField{Path: pp + ".text", Text: txt.Str})
				case "refusal":
					if r := part.Get("refusal"); r.Type == gjson.String {
						a.Fields = append(a.Fields, TextField{Path: pp + ".refusal", Text: r.Str})
					}
				case "image_url":
					a.addModality("image")
				case "input_audio":
					a.addModality("audio")
				case "file":
					a.addModality("file")
				default:
					return api.InvalidRequest(pparam+".type", "Invalid value for '%s.type': '%s'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal' and 'file'.", pparam, t)
				}
			}
		default:
			return wrongType(param+".content", "a string or an array of content parts", content)
		}
		if tcs := m.Get("tool_calls"); tcs.Exists() && tcs.Type != gjson.Null {
			if !tcs.IsArray() {
				return wrongType(param+".tool_calls", "an array", tcs)
			}
			a.Tools = true
			for k, tc := range tcs.Array() {
				args := tc.Get("function.arguments")
				if args.Type == gjson.String {
					a.Fields = append(a.Fields, TextField{Path: p + ".tool_calls." + strconv.Itoa(k) + ".function.arguments", Text: args.Str})
				}
			}
		}
		if args := m.Get("function_call.arguments"); args.Type == gjson.String {
			a.Fields = append(a.Fields, TextField{Path: p + ".function_call.arguments", Text: args.Str})
		}
	}
	return nil
}

// prompts reads the "prompt" (completions) or "input" (embeddings) field:
// a string, an array of strings, or token ids (which cannot be scanned).
func (c *Classifier) prompts(a *Annotation, root gjson.Result, field string) *api.Error {
	v := root.Get(field)
	if !v.Exists() || v.Type == gjson.Null {
		return api.InvalidRequest(field, "Missing required parameter: '%s'.", field)
	}
	switch {
	case v.Type == gjson.String:
		a.Fields = append(a.Fields, TextField{Path: field, Text: v.Str})
	case v.IsArray():
		for i, e := range v.Array() {
			switch {
			case e.Type == gjson.String:
				a.Fields = append(a.Fields, TextField{Path: field + "." + strconv.Itoa(i), Text: e.Str})
			case e.Type == gjson.Number, e.IsArray():
				a.Opaque = true // token ids: no detector can read them
			default:
				return wrongType(field+"["+strconv.Itoa(i)+"]", "a string or token ids", e)
			}
		}
	default:
		return wrongType(field, "a string or an array", v)
	}
	return nil
}

func (a *Annotation) addModality(m string) {
	for _, x := range a.Modalities {
		if x == m {
			return
		}
	}
	a.Modalities = append(a.Modalities, m)
}

// EstimateTokens approximates the token count of text as ceil(runes/4),
// OpenAI's rule of thumb for English ("a token is about 4 characters",
// help.openai.com "What are tokens and how to count them").
func EstimateTokens(text string) int {
	return (utf8.RuneCountInString(text) + 3) / 4
}

// estimatePromptTokens adds 3 tokens per chat message and 3 for the reply
// priming, after OpenAI's cookbook "How to count tokens with tiktoken".
func estimatePromptTokens(a *Annotation) int {
	n := 0
	for _, f := range a.Fields {
		n += EstimateTokens(f.Text)
	}
	if a.Endpoint == EndpointChat {
		n += 3 + 3*int(gjson.GetBytes(a.Body, "messages.#").Int())
	}
	return n
}

func lastUserText(a *Annotation, root gjson.Result) string {
	if a.Endpoint != EndpointChat {
		var b strings.Builder
		for _, f := range a.Fields {
			b.WriteString(f.Text)
			b.WriteByte('\n')
		}
		return b.String()
	}
	msgs := root.Get("messages").Array()
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Get("role").Str != "user" {
			continue
		}
		c := msgs[i].Get("content")
		if c.Type == gjson.String {
			return c.Str
		}
		var b strings.Builder
		for _, part := range c.Array() {
			b.WriteString(part.Get("text").Str)
			b.WriteByte('\n')
		}
		return b.String()
	}
	return ""
}

func (c *Classifier) sovereignty(a *Annotation) {
	a.Findings = nil
	a.ScanFailed = false
	for i, f := range a.Fields {
		fs, ok := safeScan(c.scan, f.Text)
		if !ok {
			a.ScanFailed = true
			continue
		}
		for _, fd := range fs {
			a.Findings = append(a.Findings, FieldFinding{Field: i, Finding: fd})
		}
	}
	values := c.splitValues(a)
	if len(a.Findings) > 0 {
		a.Sovereignty.Findings = make(map[string]int)
	}
	for _, f := range a.Findings {
		if f.Split {
			continue // counted once per value below
		}
		c.count(a, f.Type)
	}
	for _, typ := range values {
		c.count(a, typ)
	}
	if a.Opaque && a.Detected < Confidential {
		// Fail closed: what cannot be scanned is treated as confidential.
		a.Detected = Confidential
	}
	if a.ScanFailed {
		// Fail closed: a failed detector may have missed anything.
		a.Detected = Restricted
	}
	a.Sensitivity = max(a.Detected, a.Declared)
}

func (c *Classifier) count(a *Annotation, typ string) {
	a.Sovereignty.Findings[typ]++
	cls, ok := c.classes[typ]
	if !ok {
		cls = Confidential
	}
	if cls > a.Detected {
		a.Detected = cls
	}
}

// safeScan runs scan on text, turning a panic into ok=false so that a
// detector bug fails the request closed instead of crashing the handler or
// letting the text through unscanned.
func safeScan[T any, R any](scan func(T) R, text T) (out R, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return scan(text), true
}

// segment is a piece of a field's text that continues in the next segment
// of its sequence: text == Fields[field].Text[off:off+len(text)].
type segment struct {
	field, off int
	text       string
}

// splitValues finds values cut across consecutive segments (the issue's
// "values split across messages and across tool arguments"): the texts of
// the chat messages in order, the string values of tool-call arguments in
// order (within one call and across calls), and the prompts or inputs of
// completions and embeddings (see redaction.Scanner.ScanAcross). Their
// parts replace any finding they overlap in a.Findings (the joined value is
// longer); it returns the type of each split value, for counting. A scan
// failure sets a.ScanFailed.
func (c *Classifier) splitValues(a *Annotation) []string {
	var msgs, args, prompts []segment
	for i, f := range a.Fields {
		p := f.Path
		switch {
		case strings.HasPrefix(p, "messages.") && (strings.HasSuffix(p, ".content") || strings.HasSuffix(p, ".text")) && !strings.Contains(p, "tool_calls"):
			msgs = append(msgs, segment{i, 0, f.Text})
		case strings.HasSuffix(p, ".function.arguments") || strings.HasSuffix(p, "function_call.arguments"):
			args = appendArgSegments(args, i, f.Text)
		case p == "prompt" || p == "input" || strings.HasPrefix(p, "prompt.") || strings.HasPrefix(p, "input."):
			prompts = append(prompts, segment{i, 0, f.Text})
		}
	}
	var types []string
	var parts []FieldFinding
	for _, seq := range [][]segment{msgs, args, prompts} {
		if len(seq) < 2 {
			continue
		}
		texts := make([]string, len(seq))
		for k, sg := range seq {
			texts[k] = sg.text
		}
		found, ok := safeScan(c.scanAcross, texts)
		if !ok {
			a.ScanFailed = true
			continue
		}
		last := -1
		for _, sf := range found {
			sg := seq[sf.Segment]
			f := sf.Finding
			f.Start += sg.off
			f.End += sg.off
			parts = append(parts, FieldFinding{Field: sg.field, Finding: f, Split: true})
			if sf.Value > last {
				last = sf.Value
				types = append(types, f.Type)
			}
		}
	}
	if len(parts) == 0 {
		return nil
	}
	kept := a.Findings[:0:0]
	for _, f := range a.Findings {
		clash := false
		for _, p := range parts {
			if p.Field == f.Field && p.Start < f.End && f.Start < p.End {
				clash = true
				break
			}
		}
		if !clash {
			kept = append(kept, f)
		}
	}
	a.Findings = append(kept, parts...)
	sort.SliceStable(a.Findings, func(i, j int) bool {
		if a.Findings[i].Field != a.Findings[j].Field {
			return a.Findings[i].Field < a.Findings[j].Field
		}
		return a.Findings[i].Start < a.Findings[j].Start
	})
	return types
}

// appendArgSegments adds the string values of tool-call arguments text (a
// JSON document) as segments, in document order, or the whole text when it
// is not JSON. Values holding escapes are skipped: their decoded bytes do
// not map one to one onto the field's text.
func appendArgSegments(segs []segment, field int, text string) []segment {
	if !gjson.Valid(text) {
		return append(segs, segment{field, 0, text})
	}
	var walk func(v gjson.Result)
	walk = func(v gjson.Result) {
		switch {
		case v.Type == gjson.String:
			raw := v.Raw
			if v.Index > 0 && v.Index+len(raw) <= len(text) && text[v.Index:v.Index+len(raw)] == raw &&
				len(raw) >= 2 && !strings.Contains(raw, `\`) {
				segs = append(segs, segment{field, v.Index + 1, raw[1 : len(raw)-1]})
			}
		case v.IsObject() || v.IsArray():
			v.ForEach(func(_, e gjson.Result) bool {
				walk(e)
				return true
			})
		}
	}
	walk(gjson.Parse(text))
	return segs
}

// MaxJSONDepth bounds the nesting of request bodies: OpenAI requests nest a
// handful of levels (tool schemas a few more); deeper bodies are refused
// before any walk over them.
const MaxJSONDepth = 64

var residencyRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// duplicateKey returns the first object member name (unescaped) that occurs
// twice in one object of the valid JSON text b.
func duplicateKey(b []byte) (string, bool) {
	k, dup, _ := checkStructure(b)
	return k, dup
}

// checkStructure walks the valid JSON text b once and stops at the first
// problem: an object member name (unescaped) that occurs twice in one
// object (dup), or nesting deeper than MaxJSONDepth (deep). No recursion,
// so deeply nested bodies cost no stack; a map is made only for objects
// with more than one member.
func checkStructure(b []byte) (key string, dup, deep bool) {
	type frame struct {
		object bool
		first  string              // the first member name
		keys   map[string]struct{} // the names, from the second member on
		n      int                 // members seen
	}
	var stack []frame
	expectKey := false
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '{', '[':
			if len(stack) == MaxJSONDepth {
				return "", false, true
			}
			stack = append(stack, frame{object: b[i] == '{'})
			expectKey = b[i] == '{'
		case '}', ']':
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			expectKey = false
		case ',':
			expectKey = len(stack) > 0 && stack[len(stack)-1].object
		case '"':
			j, esc := i+1, false
			for ; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
					esc = true
				}
			}
			if expectKey && len(stack) > 0 {
				var k string
				if esc {
					k = gjson.ParseBytes(b[i : j+1]).Str
				} else {
					k = string(b[i+1 : j])
				}
				f := &stack[len(stack)-1]
				switch f.n {
				case 0:
					f.first = k
				case 1:
					if k == f.first {
						return k, true, false
					}
					f.keys = map[string]struct{}{f.first: {}, k: {}}
				default:
					if _, seen := f.keys[k]; seen {
						return k, true, false
					}
					f.keys[k] = struct{}{}
				}
				f.n++
				expectKey = false
			}
			i = j
		}
	}
	return "", false, false
}

// skipLeaves are keys whose strings are not content: binary payloads
// carried as base64 (no text, possibly megabytes) and the API's own enums
// and ids (role, type, ...).
var skipLeaves = map[string]bool{
	"data": true, "file_data": true, "b64_json": true,
	"role": true, "type": true, "id": true, "tool_call_id": true, "detail": true, "object": true,
	"format": true, "service_tier": true, "reasoning_effort": true, "modalities": true, "voice": true,
}

// appendLeaves adds every string leaf of v not in known, addressed by its
// sjson path, skipping the model name and binary payloads.
func appendLeaves(fields []TextField, v gjson.Result, path string, known map[string]bool) []TextField {
	v.ForEach(func(k, e gjson.Result) bool {
		var p string
		if v.IsArray() {
			p = join(path, k.String())
		} else {
			p = join(path, escapePath(k.Str))
			if (path == "" && k.Str == "model") || skipLeaves[k.Str] ||
				(k.Str == "name" && (strings.HasSuffix(path, "function") || strings.HasSuffix(path, "function_call"))) {
				return true
			}
		}
		switch {
		case e.Type == gjson.String:
			if !known[p] && !strings.HasPrefix(e.Str, "data:") {
				fields = append(fields, TextField{Path: p, Text: e.Str})
			}
		case e.IsObject() || e.IsArray():
			fields = appendLeaves(fields, e, p, known)
		}
		return true
	})
	return fields
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// escapePath escapes the characters gjson/sjson paths give meaning to.
func escapePath(key string) string {
	if !strings.ContainsAny(key, `.*?\|#@!:=<>%"`) {
		return key
	}
	var b strings.Builder
	for _, r := range key {
		if strings.ContainsRune(`.*?\|#@!:=<>%"`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// modelPathID returns {model} of a path ending in /models/{model}, or "".
func modelPathID(path string) string {
	i := strings.LastIndex(path, "/models/")
	if i < 0 {
		return ""
	}
	id := path[i+len("/models/"):]
	if id == "" || strings.Contains(id, "/") {
		return ""
	}
	return id
}

// checkModelName refuses model names that are too long or carry what
// looks like a secret or personal data: model names are logged and echoed
// in errors, so such a name is refused without repeating it.
func (c *Classifier) checkModelName(name string) *api.Error {
	if len(name) > 256 {
		return api.InvalidRequest("model", "Invalid 'model': longer than 256 bytes.")
	}
	if len(c.scanner.Scan(name)) > 0 {
		return api.InvalidRequest("model", "Invalid 'model': the name contains what looks like a secret or personal data; it was neither logged nor routed.")
	}
	return nil
}
