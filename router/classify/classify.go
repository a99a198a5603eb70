package classify

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/openai"
	"github.com/molly-gateway/molly/router/relay"
)

// Classifier turns a request body into an Annotation. Safe for concurrent use.
type Classifier struct {
	scanner   *redaction.Scanner
	classes   map[string]Sensitivity
	vaultOpts []redaction.VaultOption
	id        [16]byte // random: digests from differently configured classifiers never collide

	// scan and scanAcross are scanner.Scan and scanner.ScanAcross; tests
	// replace them to inject detector failures (no config can).
	scan       func(string) ([]redaction.Finding, error)
	scanAcross func([]string) ([]redaction.SegmentFinding, error)
	// budget bounds the detectors' time on one request (WithScanBudget);
	// past it the rest of the body is unscanned, so the request is opaque.
	budget time.Duration

	estimator *capability.Estimator
	// cache keeps the findings of long texts sent again (scancache.go).
	cache *scanCache
	// cleanNames holds the model names the detectors found nothing in
	// (checkModelName); nClean counts the names offered to it.
	cleanNames sync.Map // string → struct{}
	nClean     atomic.Int32
}

// Option configures a Classifier; see New.
type Option func(*Classifier)

// WithRedactionModes sets, per entity type, how Annotation.Redact replaces
// the type's values: redaction.ModePlaceholder (reversible "[EMAIL_1]", the
// default for unlisted types), ModeMask ("[EMAIL]") or ModeHash (keyed HMAC
// pseudonym, see WithHashKey). The map is copied.
func WithRedactionModes(modes map[string]redaction.Mode) Option {
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
func WithHashKey(key []byte) Option {
	return func(c *Classifier) { c.vaultOpts = append(c.vaultOpts, redaction.WithHMACKey(key)) }
}

// DefaultScanBudget is the detectors' time budget for one request body.
const DefaultScanBudget = time.Second

// WithScanBudget bounds the wall-clock time the detectors may spend on one
// request body (default DefaultScanBudget); a body whose scan would run
// past it is treated as opaque: what was not scanned is listed in
// Unscanned with the reason "scan budget exceeded", and the policy decides
// what that allows (fail closed). Each text is also bounded by the
// scanner's own work budget (redaction.Config ScanTimeout, MaxScanBytes).
func WithScanBudget(d time.Duration) Option {
	return func(c *Classifier) {
		if d > 0 {
			c.budget = d
		}
	}
}

// WithDomains makes the classifier treat the names domains returns (the T0
// engine's adapter names, read on every request) as task categories.
func WithDomains(domains func() []string) Option {
	return func(c *Classifier) { c.estimator = capability.NewEstimator(domains) }
}

// New builds a classifier over scanner. overrides replaces entries of
// DefaultEntityClasses (e.g. {"EMAIL": Public}); types in neither (e.g.
// user-defined patterns) imply Confidential.
func New(scanner *redaction.Scanner, overrides map[string]Sensitivity, opts ...Option) *Classifier {
	classes := make(map[string]Sensitivity, len(DefaultEntityClasses)+len(overrides))
	for k, v := range DefaultEntityClasses {
		classes[k] = v
	}
	for k, v := range overrides {
		classes[k] = v
	}
	c := &Classifier{scanner: scanner, classes: classes, scan: scanner.ScanBounded, scanAcross: scanner.ScanAcrossBounded, budget: DefaultScanBudget,
		estimator: capability.NewEstimator(nil), cache: newScanCache()}
	_, _ = rand.Read(c.id[:])
	for _, o := range opts {
		o(c)
	}
	return c
}

// Scanner returns the classifier's scanner.
func (c *Classifier) Scanner() *redaction.Scanner { return c.scanner }

// Input is one request to classify.
type Input struct {
	Endpoint  openai.Endpoint
	Path      string // the URL path: GET /v1/models/{model} names its model
	Body      []byte // nil for GET requests
	Declared  string // X-Molly-Sensitivity header values, comma-joined; "" when absent
	Residency string // X-Molly-Residency header value; "" when absent
	// API is the client's API when Body is a chat request translated from
	// another ("responses", "messages"; router/translate); "" otherwise.
	API string
	// StoredConversation reports a body whose history Molly added from its
	// own store (the Responses API's previous_response_id).
	StoredConversation bool
	// BodyHandedOver: the caller never changes Body's bytes again, so the
	// annotation keeps them as its body text without a copy (the caller
	// that read the body itself); otherwise Body is copied.
	BodyHandedOver bool
}

var residencyRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// Classify validates in.Body for in.Endpoint (openai.ParseRequest) and
// builds its annotation: every string, object key and number of the body
// is scanned, except the OpenAI schema's own enum values at their
// positions (enumPaths) and the model name (checked on its own); what cannot be
// scanned is listed in Unscanned. Errors are *openai.Error with status 400.
func (c *Classifier) Classify(in Input) (*Annotation, error) {
	a := &Annotation{classifier: c, path: in.Path, api: in.API, stored: in.StoredConversation}
	a.residency = strings.TrimSpace(in.Residency)
	if a.residency != "" && !residencyRe.MatchString(a.residency) {
		// Not echoed: the header may carry anything, and errors get logged.
		return nil, openai.InvalidRequest("X-Molly-Residency", "Invalid X-Molly-Residency header: want a region code of letters, digits, '-' or '_' (at most 32), such as EU.")
	}
	// A repeated header is a comma-separated list (RFC 9110 §5.3); the
	// highest class wins, so no copy of the header can lower another.
	for _, v := range strings.Split(in.Declared, ",") {
		if strings.TrimSpace(v) == "" {
			continue
		}
		s, err := ParseSensitivity(v)
		if err != nil {
			return nil, openai.InvalidRequest("X-Molly-Sensitivity", "Invalid X-Molly-Sensitivity header: %v.", err)
		}
		a.declared = max(a.declared, s)
	}
	if in.Endpoint == openai.EndpointModels {
		a.req = openai.Request{Endpoint: openai.EndpointModels, N: 1}
		if id := openai.ModelPathID(in.Path); id != "" {
			if err := c.checkModelName(id); err != nil {
				return nil, err
			}
			a.req.Model = id
		}
		a.modal = []string{"text"}
		a.seal()
		return a, nil
	}
	// The one read of the body: Parse validates it and records its values
	// (openai.Doc); the walk below visits them without parsing again.
	var text string
	if in.BodyHandedOver {
		text = unsafe.String(unsafe.SliceData(in.Body), len(in.Body))
	} else {
		text = string(in.Body)
	}
	req, doc, aerr := openai.Parse(in.Endpoint, text)
	if aerr != nil {
		return nil, aerr
	}
	if err := c.checkModelName(req.Model); err != nil {
		return nil, err
	}
	a.req = *req
	a.doc = doc
	a.body = doc.Body()
	a.modal = []string{"text"}
	w := walker{a: a, d: doc}
	w.walk(0)
	if req.TokenPrompts {
		field := "prompt"
		if in.Endpoint == openai.EndpointEmbeddings {
			field = "input"
		}
		a.unscanned = append(a.unscanned, Unscanned{Path: field, Reason: "token ids"})
	}
	for _, f := range a.fields {
		if f.kind != kindNumber && f.kind != kindKey { // parameters and structure are not prompt text
			a.tokens += capability.EstimateTokens(f.text)
		}
	}
	a.bound = capability.BoundTokens(a.body) - a.mediaBytes + BoundPerRequest + BoundPerMedia*a.media + a.audioBound
	if len(req.Tools) > 0 {
		a.bound += BoundToolsPreamble
	}
	if in.Endpoint == openai.EndpointChat {
		a.tokens += 3 + 3*req.Messages
		a.bound += BoundPerMessage * req.Messages
	}
	switch in.Endpoint {
	case openai.EndpointEmbeddings:
		a.task = capability.TaskEmbedding
		a.lastUser = w.prompts.String()
	case openai.EndpointCompletions:
		a.lastUser = w.prompts.String()
	default:
		a.lastUser = w.lastUserText()
	}
	c.classifyText(a, w.lastUser) // and seals a
	a.bound += BoundPerFinding * len(a.findings)
	return a, nil
}

// seal computes the digest; nothing changes the annotation afterwards.
func (a *Annotation) seal() { a.sealTail(a.sealHead()) }

// sealer is the digest being computed: the hash and a buffer the strings
// go through (hash.Hash takes bytes; a string would be copied whole).
type sealer struct {
	h     hash.Hash
	n     [8]byte
	chunk [1024]byte
}

// put hashes s, length first.
func (z *sealer) put(s string) {
	binary.LittleEndian.PutUint64(z.n[:], uint64(len(s)))
	z.h.Write(z.n[:])
	for len(s) > 0 {
		k := copy(z.chunk[:], s)
		z.h.Write(z.chunk[:k])
		s = s[k:]
	}
}

// sealHead hashes the part of the digest that classification does not
// change: the classifier, the request's endpoint, path, declared class,
// residency and API, and the body. sealTail adds the findings.
func (a *Annotation) sealHead() *sealer {
	z := sealers.Get().(*sealer)
	z.h.Reset()
	z.h.Write(a.classifier.id[:])
	z.put(string(a.req.Endpoint))
	z.put(a.path)
	z.put(a.declared.String())
	z.put(a.residency)
	z.put(a.api)
	if a.stored {
		z.put("stored_conversation")
	}
	z.put(a.body)
	return z
}

// sealTail adds to z (sealHead's) the findings' counts by type, the
// unscanned paths and a scan failure, and sets the digest.
func (a *Annotation) sealTail(z *sealer) {
	types := make([]string, 0, len(a.counts))
	for t := range a.counts {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		z.put(t)
		z.put(strconv.Itoa(a.counts[t]))
	}
	for _, u := range a.unscanned {
		z.put(u.Path)
	}
	if a.failed {
		z.put("scan_failed")
	}
	z.h.Sum(a.digest[:0])
	sealers.Put(z)
}

// sealers keeps sealers for reuse: a sealer's hash and buffer are the same
// for every digest.
var sealers = sync.Pool{New: func() any { return &sealer{h: sha256.New()} }}

// enumPaths are the positions whose strings are the OpenAI schema's own
// enums, with the values each may take; a string there that is one of them
// is not scanned (it carries nothing but the schema's word), any other
// value is scanned like text. Ids (tool call ids, file ids) are free-form
// and scanned. Segments are object keys; "#" matches any array index. The
// model name is checked on its own (checkModelName).
var enumPaths = []struct {
	path   []string
	values map[string]bool
}{
	{[]string{"model"}, nil}, // nil: any value (checked by checkModelName)
	{[]string{"messages", "#", "role"}, words("system developer user assistant tool function")},
	{[]string{"messages", "#", "content", "#", "type"}, words("text image_url input_audio refusal file")},
	{[]string{"messages", "#", "content", "#", "image_url", "detail"}, words("auto low high")},
	{[]string{"messages", "#", "content", "#", "input_audio", "format"}, words("wav mp3 flac opus pcm16 aac ogg webm m4a")},
	{[]string{"messages", "#", "tool_calls", "#", "type"}, words("function custom")},
	{[]string{"tools", "#", "type"}, words("function custom")},
	{[]string{"tool_choice"}, words("none auto required")},
	{[]string{"tool_choice", "type"}, words("function custom allowed_tools")},
	{[]string{"tool_choice", "mode"}, words("auto required")},
	{[]string{"response_format", "type"}, words("text json_object json_schema")},
	{[]string{"service_tier"}, words("auto default flex scale priority fast")},
	{[]string{"reasoning_effort"}, words("none minimal low medium high xhigh max")},
	{[]string{"modalities", "#"}, words("text audio")},
	{[]string{"audio", "voice"}, words("alloy ash ballad coral echo fable onyx nova sage shimmer verse marin cedar")},
	{[]string{"audio", "format"}, words("wav aac mp3 flac opus pcm16")},
	{[]string{"prediction", "type"}, words("content")},
	{[]string{"encoding_format"}, words("float base64")},
	{[]string{"verbosity"}, words("low medium high")},
	{[]string{"web_search_options", "search_context_size"}, words("low medium high")},
}

func words(s string) map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(s) {
		m[w] = true
	}
	return m
}

// schemaKeys are object member names of OpenAI's request schemas. Such a
// key carries nothing but the schema's own word, so it is not scanned;
// any other key (metadata keys, JSON Schema property names, unknown
// fields) is scanned like a value.
var schemaKeys = map[string]bool{}

func init() {
	for _, k := range strings.Fields(`model messages role content name type text image_url url detail input_audio data format
		file file_data file_id filename refusal tool_calls id function arguments tool_call_id function_call audio
		tools description parameters strict tool_choice parallel_tool_calls response_format json_schema schema
		stream stream_options include_usage include_obfuscation max_tokens max_completion_tokens n temperature top_p
		presence_penalty frequency_penalty logit_bias logprobs top_logprobs stop seed user metadata store
		service_tier reasoning_effort modalities voice prediction prompt suffix echo best_of input encoding_format
		dimensions functions verbosity web_search_options search_context_size user_location approximate
		prompt_cache_key safety_identifier properties required items additionalProperties enum anyOf allOf oneOf
		title default minimum maximum minLength maxLength pattern $defs $ref definitions const examples nullable
		country region city timezone`) {
		schemaKeys[k] = true
	}
}

// enumsByFirst indexes enumPaths by their first segment.
var enumsByFirst = map[string][]int{}

func init() {
	for i, p := range enumPaths {
		enumsByFirst[p.path[0]] = append(enumsByFirst[p.path[0]], i)
	}
}

// walker visits every value of the body's Doc once, in document order. It
// keeps the path as a stack of member names (array indices are marked, not
// written) and builds a path string only for what is listed as unscanned;
// fields name their node, whose path is built when a redaction needs it.
type walker struct {
	a    *Annotation
	d    *openai.Doc
	segs []string // member names; "" for an array index
	idx  []bool   // whether segs[i] is an array index
	role string   // the role of the chat message the walker is in ("" if not a string)
	// The content fields of the user message being walked, and of the
	// last user message walked: the text the estimator reads.
	user, lastUser []int
	prompts        strings.Builder
}

// lastUserText is the texts of the last user message, each followed by a
// line feed.
func (w *walker) lastUserText() string {
	n := 0
	for _, f := range w.lastUser {
		n += len(w.a.fields[f].text) + 1
	}
	var b strings.Builder
	b.Grow(n)
	for _, f := range w.lastUser {
		b.WriteString(w.a.fields[f].text)
		b.WriteByte('\n')
	}
	return b.String()
}

// at reports whether the current path matches pattern.
func (w *walker) at(pattern ...string) bool {
	if len(pattern) != len(w.segs) {
		return false
	}
	for i, p := range pattern {
		if p == "#" {
			if !w.idx[i] {
				return false
			}
		} else if w.idx[i] || p != w.segs[i] {
			return false
		}
	}
	return true
}

// enum reports whether s at the current path is one of the schema's enum
// values for it (and so is not content).
func (w *walker) enum(s string) bool {
	if len(w.segs) == 0 || w.idx[0] {
		return false
	}
	for _, i := range enumsByFirst[w.segs[0]] {
		if p := enumPaths[i]; w.at(p.path...) {
			return p.values == nil || p.values[s]
		}
	}
	return false
}

func (w *walker) push(seg string, index bool) {
	w.segs = append(w.segs, seg)
	w.idx = append(w.idx, index)
}

func (w *walker) pop() {
	w.segs = w.segs[:len(w.segs)-1]
	w.idx = w.idx[:len(w.idx)-1]
}

// add records text, at node, as a field to scan.
func (w *walker) add(node int, text string, kind fieldKind) {
	w.a.fields = append(w.a.fields, field{node: int32(node), text: text, kind: kind})
}

// unscanned lists node as not scanned.
func (w *walker) unscanned(node int, reason string) {
	w.a.unscanned = append(w.a.unscanned, Unscanned{Path: w.a.nodePath(node), Reason: reason})
}

// walk visits value i and its subtree.
func (w *walker) walk(i int) {
	d := w.d
	switch d.Kind(i) {
	case openai.KindObject:
		msg := w.at("messages", "#")
		if msg {
			w.role = ""
			if r := d.Member(i, "role"); r >= 0 {
				w.role = d.Str(r)
			}
		}
		for c, end := i+1, d.Next(i); c < end; c = d.Next(c) {
			k, _ := d.Key(c)
			w.push(k, false)
			if !schemaKeys[k] {
				w.add(c, k, kindKey)
			}
			w.walk(c)
			w.pop()
		}
		if msg && w.role == "user" {
			w.lastUser, w.user = w.user, w.lastUser[:0]
		}
	case openai.KindArray:
		for c, end := i+1, d.Next(i); c < end; c = d.Next(c) {
			w.push("", true)
			w.walk(c)
			w.pop()
		}
	case openai.KindString:
		w.str(i, d.Str(i))
	case openai.KindNumber:
		w.add(i, numberText(d.Raw(i)), kindNumber)
	}
}

// maxNumberShift bounds the exponent numberText expands: a longer run of
// zeros carries no more digits of the literal.
const maxNumberShift = 64

// numberText is the text a JSON number literal is scanned as: the literal
// itself when it has no exponent, else its value in plain decimal
// (4.111111111111111e15 and 4111111111111111e0 are 4111111111111111, the
// digits an upstream's parser gives the model), without leading zeros or
// a fraction of zeros. An exponent beyond ±maxNumberShift keeps the
// literal. The literal's grammar is RFC 8259 §6 (openai.Parse checked it).
func numberText(raw string) string {
	e := strings.IndexAny(raw, "eE")
	if e < 0 {
		return raw
	}
	exp, err := strconv.Atoi(strings.TrimPrefix(raw[e+1:], "+"))
	if err != nil || exp > maxNumberShift || exp < -maxNumberShift {
		return raw
	}
	mant, sign := raw[:e], ""
	if strings.HasPrefix(mant, "-") {
		mant, sign = mant[1:], "-"
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := intPart + frac
	point := len(intPart) + exp // where the decimal point falls in digits
	var whole, rest string
	switch {
	case point <= 0:
		whole, rest = "0", strings.Repeat("0", -point)+digits
	case point >= len(digits):
		whole = digits + strings.Repeat("0", point-len(digits))
	default:
		whole, rest = digits[:point], digits[point:]
	}
	whole = strings.TrimLeft(whole, "0")
	if whole == "" {
		whole = "0"
	}
	if rest = strings.TrimRight(rest, "0"); rest != "" {
		return sign + whole + "." + rest
	}
	return sign + whole
}

func (w *walker) str(node int, s string) {
	if len(w.segs) == 0 {
		return
	}
	if w.at("messages", "#", "content", "#", "type") {
		// A part's type says what the target must accept, whatever the
		// part holds (a file part may name an uploaded file by id only).
		switch s {
		case "image_url":
			w.a.addModality("image")
			w.a.media++
		case "input_audio":
			w.a.addModality("audio")
			w.a.media++
		case "file":
			w.a.addModality("file")
			w.a.media++
		}
	}
	if w.enum(s) {
		return
	}
	rest, isData := strings.CutPrefix(s, "data:")
	if !isData && (w.at("messages", "#", "content", "#", "image_url", "url") || w.at("messages", "#", "content", "#", "file", "file_data")) {
		// Where a URL goes, as an upstream's URL parser reads it.
		rest, isData = cutDataScheme(s)
	}
	if isData {
		w.dataURL(node, s, rest)
		return
	}
	switch {
	case w.at("messages", "#", "content"), w.at("messages", "#", "content", "#", "text"), w.at("messages", "#", "content", "#", "refusal"):
		if w.role == "user" {
			w.user = append(w.user, len(w.a.fields))
		}
		w.add(node, s, kindContent)
	case w.at("messages", "#", "name"), w.at("tools", "#", "function", "name"), w.at("functions", "#", "name"),
		w.at("messages", "#", "tool_calls", "#", "function", "name"), w.at("messages", "#", "function_call", "name"),
		w.at("tool_choice", "function", "name"):
		w.add(node, s, kindName)
	case w.at("messages", "#", "tool_calls", "#", "function", "arguments"), w.at("messages", "#", "function_call", "arguments"):
		w.add(node, s, kindArgs)
	case w.at("messages", "#", "content", "#", "input_audio", "data"):
		w.a.addModality("audio")
		w.unscanned(node, "audio data")
		w.a.mediaBytes += len(s)
		w.a.audioBound += len(s) / BoundAudioBytesPerToken
	case w.at("messages", "#", "content", "#", "file", "file_data"):
		// A file's bytes stay in the bound (a PDF is read as its pages'
		// text and images: far more than BoundPerMedia for a long one).
		w.a.addModality("file")
		w.unscanned(node, "file data")
	case w.at("prompt"), w.at("prompt", "#"), w.at("input"), w.at("input", "#"):
		w.add(node, s, kindPrompt)
		w.prompts.WriteString(s)
		w.prompts.WriteByte('\n')
	default:
		if w.at("messages", "#", "content", "#", "image_url", "url") {
			w.a.addModality("image")
		}
		if w.at("suffix") {
			w.a.suffix = len(w.a.fields) + 1
		}
		w.add(node, s, kindText)
	}
}

// nodePath is the sjson path of the body's value n: member names escaped
// (escapePath), array indices in decimal, joined by '.'.
func (a *Annotation) nodePath(n int) string {
	d := a.doc
	var up [16]int
	chain := up[:0]
	size := 0
	for i := n; d.Parent(i) >= 0; i = d.Parent(i) {
		chain = append(chain, i)
		size += 8
	}
	var b strings.Builder
	b.Grow(size)
	for k := len(chain) - 1; k >= 0; k-- {
		i := chain[k]
		if k < len(chain)-1 {
			b.WriteByte('.')
		}
		if key, ok := d.Key(i); ok {
			b.WriteString(escapePath(key))
		} else {
			b.WriteString(strconv.Itoa(d.Index(i)))
		}
	}
	return b.String()
}

// fieldPath is the sjson path of field i.
func (a *Annotation) fieldPath(i int) string { return a.nodePath(int(a.fields[i].node)) }

// textMediaTypes are the data URL media types whose bytes are text the
// detectors can read; any other media type is binary and left unscanned.
func textMediaType(mt string) bool {
	mt = strings.ToLower(mt)
	return strings.HasPrefix(mt, "text/") || mt == "" || strings.HasSuffix(mt, "+xml") || strings.HasSuffix(mt, "+json") ||
		mt == "application/json" || mt == "application/xml" || mt == "application/javascript" || mt == "application/x-yaml" ||
		mt == "application/yaml" || mt == "application/x-www-form-urlencoded"
}

// cutDataScheme reports whether s is a data: URL as a URL parser reads it
// (WHATWG URL §4.4: leading and trailing C0 controls and spaces stripped,
// ASCII tabs and newlines removed anywhere; RFC 3986 §3.1: the scheme in
// any case, "DATA:" too), and returns what follows the scheme.
func cutDataScheme(s string) (string, bool) {
	t := strings.TrimFunc(s, func(r rune) bool { return r <= ' ' })
	if strings.ContainsAny(t, "\t\n\r") {
		t = strings.Map(func(r rune) rune {
			if r == '\t' || r == '\n' || r == '\r' {
				return -1
			}
			return r
		}, t)
	}
	if len(t) < len("data:") || !strings.EqualFold(t[:len("data:")], "data:") {
		return "", false
	}
	return t[len("data:"):], true
}

// dataURL handles an RFC 2397 data: URL (s, rest after its scheme): a text
// media type is decoded and scanned (its redaction is re-encoded as a
// base64 data URL of the same type); a binary one (an image, audio, a
// PDF) is listed in Unscanned. Parameter names are read in any case.
func (w *walker) dataURL(node int, s, rest string) {
	meta, payload, ok := strings.Cut(rest, ",")
	if w.at("messages", "#", "content", "#", "image_url", "url") {
		w.a.addModality("image")
	}
	params := strings.Split(meta, ";")
	mt := strings.TrimSpace(params[0])
	b64 := slices.ContainsFunc(params[1:], func(p string) bool { return strings.EqualFold(strings.TrimSpace(p), "base64") })
	if !ok {
		w.add(node, s, kindText)
		return
	}
	if !textMediaType(mt) {
		w.unscanned(node, "binary "+strings.ToLower(mt)+" data URL")
		if !w.at("messages", "#", "content", "#", "file", "file_data") { // a file's bytes stay in the bound
			w.a.mediaBytes += len(s)
		}
		return
	}
	var text string
	if b64 {
		dec, err := base64.StdEncoding.DecodeString(payload)
		if err != nil {
			dec, err = base64.RawStdEncoding.DecodeString(payload)
		}
		if err != nil {
			w.unscanned(node, "undecodable base64 data URL")
			return
		}
		text = string(dec)
	} else {
		dec, err := url.PathUnescape(payload)
		if err != nil {
			w.unscanned(node, "undecodable data URL")
			return
		}
		text = dec
	}
	if mt == "" {
		mt = "text/plain"
	}
	w.a.fields = append(w.a.fields, field{node: int32(node), text: text, kind: kindDataURL, mediaType: mt})
}

func (a *Annotation) addModality(m string) {
	if !slices.Contains(a.modal, m) {
		a.modal = append(a.modal, m)
	}
}

// escapePath escapes an object member name for a gjson/sjson path
// (relay.EscapeKey): the path names exactly that member.
func escapePath(key string) string { return relay.EscapeKey(key) }

// checkModelName refuses model names that carry what looks like a secret
// or personal data: model names are logged and echoed in errors, so such a
// name is refused without repeating it.
//
// A name the detectors found nothing in is remembered (up to
// maxCleanNames of them, the first seen): requests name a handful of
// models, and a scan of a short string costs a few microseconds when the
// detectors' tables are out of the cache, as they are between requests,
// where a look-up costs a fraction of one. The same scanner gives the same
// findings for the same string, so a remembered name is one it would pass.
func (c *Classifier) checkModelName(name string) *openai.Error {
	if len(name) > openai.MaxModelName {
		return openai.InvalidRequest("model", "Invalid 'model': longer than %d bytes.", openai.MaxModelName)
	}
	if _, ok := c.cleanNames.Load(name); ok {
		return nil
	}
	if len(c.scanner.Scan(name)) > 0 {
		return openai.InvalidRequest("model", "Invalid 'model': the name contains what looks like a secret or personal data; it was neither logged nor routed.")
	}
	if c.nClean.Load() < maxCleanNames && c.nClean.Add(1) <= maxCleanNames {
		c.cleanNames.Store(name, struct{}{})
	}
	return nil
}

// maxCleanNames bounds the model names checkModelName remembers; past it,
// new names are scanned every time.
const maxCleanNames = 256

// ReasonScanBudget is the Unscanned reason of text the scan budget did not reach.
const ReasonScanBudget = "scan budget exceeded"

// classifyText runs the passes over a's texts: the capability estimate
// (unless the task is known), the detectors over each field (scanFields)
// and over the values split across fields (scanSplit), then merges their
// findings, counts them and seals a. (Running the estimate, the split scan
// and the body's hash on a second goroutine beside the field scan was
// measured in make bench and BenchmarkClassify on the 2-core machine: no
// faster at 2 KB, slower at 32 KB; so they run in turn. Measured again with
// the work claimed by whichever goroutine reached it first (sync.Once) and
// no goroutine under load: at one client the second goroutine began a
// median 90 µs after it was started, once the request's goroutine blocked
// on the upstream, so the request's goroutine had done the work itself.)
func (c *Classifier) classifyText(a *Annotation, fresh []int) {
	if a.task == "" {
		e := c.estimator.Estimate(a.lastUser, a.Tools())
		a.task, a.diff, a.entropy = e.Task, e.Difficulty, e.Entropy()
	}
	c.scanFields(a, fresh)
	seqs := c.splitSeqs(a)
	c.countFindings(a, c.mergeSplit(a, seqs, c.scanSplit(seqs)))
	a.seal()
}

// scanFields runs the detectors over each field of a (within the scan
// budget), appending to a.findings and a.unscanned; a detector failure
// sets a.failed. The findings of a long field sent before come from the
// scan cache, unless the field is one of fresh (the last user message's:
// see scanCache).
func (c *Classifier) scanFields(a *Annotation, fresh []int) {
	deadline := time.Now().Add(c.budget)
	for i, f := range a.fields {
		if time.Now().After(deadline) {
			a.unscanned = append(a.unscanned, Unscanned{Path: a.fieldPath(i), Reason: ReasonScanBudget})
			continue
		}
		fs, err, ok := c.scanText(f.text, !slices.Contains(fresh, i))
		switch {
		case !ok:
			a.failed = true
			continue
		case errors.Is(err, redaction.ErrScanBudget):
			a.unscanned = append(a.unscanned, Unscanned{Path: a.fieldPath(i), Reason: ReasonScanBudget})
			continue
		case err != nil:
			a.failed = true
			continue
		}
		if f.kind == kindArgs && strings.ContainsAny(f.text, "eE") {
			more, err, ok := safeScan2(func(text string) ([]redaction.Finding, error) { return c.exponentFindings(text) }, f.text)
			switch {
			case !ok || err != nil && !errors.Is(err, redaction.ErrScanBudget):
				a.failed = true
				continue
			case err != nil:
				a.unscanned = append(a.unscanned, Unscanned{Path: a.fieldPath(i), Reason: ReasonScanBudget})
				continue
			}
			if len(more) > 0 {
				fs = append(fs, more...)
				sort.SliceStable(fs, func(x, y int) bool { return fs[x].Start < fs[y].Start })
			}
		}
		for _, fd := range fs {
			a.findings = append(a.findings, FieldFinding{Field: i, Finding: fd})
		}
	}
}

// scanText runs the detectors over text, turning a panic into ok=false
// (safeScan2); with cacheable, a text of scanCacheMin bytes or more is
// looked up in the scan cache first and kept there once scanned whole.
func (c *Classifier) scanText(text string, cacheable bool) ([]redaction.Finding, error, bool) {
	if !cacheable || c.cache == nil || len(text) < scanCacheMin {
		return safeScan2(c.scan, text)
	}
	k := c.cache.key(text)
	if fs, ok := c.cache.get(k); ok {
		return fs, nil, true
	}
	fs, err, ok := safeScan2(c.scan, text)
	if ok && err == nil {
		c.cache.put(k, fs)
	}
	return fs, err, ok
}

// countFindings counts a's findings by type, a value split across fields
// once (values holds their types).
func (c *Classifier) countFindings(a *Annotation, values []string) {
	for _, f := range a.findings {
		if f.Split {
			continue // counted once per value below
		}
		c.count(a, f.Type)
	}
	for _, typ := range values {
		c.count(a, typ)
	}
}

func (c *Classifier) count(a *Annotation, typ string) {
	if a.counts == nil {
		a.counts = map[string]int{}
	}
	a.counts[typ]++
	cls, ok := c.classes[typ]
	if !ok {
		cls = Confidential
	}
	a.detected = max(a.detected, cls)
}

// safeScan2 runs scan on text, turning a panic into ok=false so that a
// detector bug fails the request closed instead of crashing the handler or
// letting the text through unscanned.
func safeScan2[T any, R any](scan func(T) (R, error), text T) (out R, err error, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	out, err = scan(text)
	return out, err, true
}

// exponentFindings scans the numbers written with an exponent in
// tool-call arguments text (a JSON document) as their plain decimal value
// (numberText): the model reads 4111111111111111e0 as the card's digits,
// which the scan of the text alone does not find next to the 'e'. Each
// finding covers the whole number literal. Text that is not JSON has none.
func (c *Classifier) exponentFindings(text string) ([]redaction.Finding, error) {
	if !gjson.Valid(text) {
		return nil, nil
	}
	var out []redaction.Finding
	var err error
	var walk func(v gjson.Result)
	walk = func(v gjson.Result) {
		switch {
		case err != nil:
		case v.Type == gjson.Number:
			raw := v.Raw
			if v.Index <= 0 || v.Index+len(raw) > len(text) || text[v.Index:v.Index+len(raw)] != raw {
				return
			}
			nt := numberText(raw)
			if nt == raw {
				return
			}
			var fs []redaction.Finding
			if fs, err = c.scan(nt); err != nil {
				return
			}
			for _, fd := range fs {
				out = append(out, redaction.Finding{Type: fd.Type, Subtype: fd.Subtype, Start: v.Index, End: v.Index + len(raw)})
			}
		case v.IsObject() || v.IsArray():
			v.ForEach(func(_, e gjson.Result) bool {
				walk(e)
				return err == nil
			})
		}
	}
	walk(gjson.Parse(text))
	return out, err
}

// segment is a piece of a field's text that continues in the next segment
// of its sequence: text == fields[field].text[off:off+len(text)].
type segment struct {
	field, off int
	text       string
}

// Values cut across consecutive segments are looked for in these
// sequences of segments: the texts of
// the chat messages in order (every role's), the string values of tool-call
// arguments in order (within one call and across calls), both together in
// document order (a message's text, then its tool calls' arguments, then
// the next message: a value cut between a text and an argument), the
// prompts or inputs of completions and embeddings, and each completions
// prompt with the suffix, in both orders (see
// redaction.Scanner.ScanAcross). splitSeqs returns those of a's fields
// (see scanSplit and mergeSplit).
func (c *Classifier) splitSeqs(a *Annotation) [][]segment {
	var msgs, args, prompts, conv []segment
	for i, f := range a.fields {
		switch f.kind {
		case kindContent:
			msgs = append(msgs, segment{i, 0, f.text})
			conv = append(conv, segment{i, 0, f.text})
		case kindArgs:
			n := len(args)
			args = appendArgSegments(args, i, f.text)
			conv = append(conv, args[n:]...)
		case kindPrompt:
			prompts = append(prompts, segment{i, 0, f.text})
		}
	}
	if len(msgs) == 0 || len(args) == 0 {
		conv = nil // the same segments as msgs or args alone
	}
	seqs := [][]segment{msgs, args, prompts, conv}
	if a.suffix > 0 {
		// A completions suffix is the text after the insertion point: a
		// value cut between a prompt and the suffix is joined in either
		// order (the upstream holds both, whichever it reads first).
		sx := segment{a.suffix - 1, 0, a.fields[a.suffix-1].text}
		for _, p := range prompts {
			seqs = append(seqs, []segment{p, sx}, []segment{sx, p})
		}
	}
	return seqs
}

// splitScan is the scan of one sequence of segments for values split
// across them: its findings, its error, and ok=false when it panicked.
type splitScan struct {
	found []redaction.SegmentFinding
	err   error
	ok    bool
}

// scanSplit scans each sequence of two or more segments of seqs (see
// splitSeqs) for values split across them; it reads only the segments'
// texts.
func (c *Classifier) scanSplit(seqs [][]segment) []splitScan {
	out := make([]splitScan, len(seqs))
	for q, seq := range seqs {
		if len(seq) < 2 {
			continue
		}
		texts := make([]string, len(seq))
		for k, sg := range seq {
			texts[k] = sg.text
		}
		sc := &out[q]
		sc.found, sc.err, sc.ok = safeScan2(c.scanAcross, texts)
	}
	return out
}

// mergeSplit adds the split values of scans (scanSplit of seqs) to
// a.findings: their parts replace any finding they overlap (the joined
// value is longer). It returns the type of each split value, for
// counting. A scan failure sets a.failed; a scan past its budget makes
// its first field unscanned.
func (c *Classifier) mergeSplit(a *Annotation, seqs [][]segment, scans []splitScan) []string {
	var types []string
	var parts []FieldFinding
	for q, seq := range seqs {
		if len(seq) < 2 {
			continue
		}
		found, err, ok := scans[q].found, scans[q].err, scans[q].ok
		switch {
		case ok && errors.Is(err, redaction.ErrScanBudget):
			a.unscanned = append(a.unscanned, Unscanned{Path: a.fieldPath(seq[0].field), Reason: ReasonScanBudget + " (values split across fields)"})
			continue
		case !ok || err != nil:
			a.failed = true
			continue
		}
		last := -1
		var seen map[int]bool // q >= 3: values that overlap one found above
		if q >= 3 {
			// The conversation's content and arguments together: a value
			// within the messages or within the arguments alone was found
			// above (and one of its parts may have been joined to a
			// neighbour here); only a value that crosses from a message's
			// text into a tool call's arguments, or back, is new.
			seen = map[int]bool{}
			for _, sf := range found {
				sg := seq[sf.Segment]
				f := sf.Finding
				f.Start += sg.off
				f.End += sg.off
				if overlapsPart(parts, sg.field, f) {
					seen[sf.Value] = true
				}
			}
		}
		for _, sf := range found {
			sg := seq[sf.Segment]
			f := sf.Finding
			f.Start += sg.off
			f.End += sg.off
			if seen[sf.Value] {
				continue
			}
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
	kept := a.findings[:0:0]
	for _, f := range a.findings {
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
	a.findings = append(kept, parts...)
	sort.SliceStable(a.findings, func(i, j int) bool {
		if a.findings[i].Field != a.findings[j].Field {
			return a.findings[i].Field < a.findings[j].Field
		}
		return a.findings[i].Start < a.findings[j].Start
	})
	return types
}

// overlapsPart reports whether f, in field, overlaps one of parts.
func overlapsPart(parts []FieldFinding, field int, f redaction.Finding) bool {
	for _, p := range parts {
		if p.Field == field && p.Start < f.End && f.Start < p.End {
			return true
		}
	}
	return false
}

// appendArgSegments adds the string values of tool-call arguments text (a
// JSON document) as segments, in document order, or the whole text when it
// is not JSON. A segment is the value as written between its quotes,
// escapes and all (the scanner's normalised view decodes \uXXXX and the
// two-character escapes), so its offsets are the field's own.
func appendArgSegments(segs []segment, field int, text string) []segment {
	if !gjson.Valid(text) {
		return append(segs, segment{field, 0, text})
	}
	var walk func(v gjson.Result)
	walk = func(v gjson.Result) {
		switch {
		case v.Type == gjson.String:
			raw := v.Raw
			if v.Index > 0 && v.Index+len(raw) <= len(text) && text[v.Index:v.Index+len(raw)] == raw && len(raw) >= 2 {
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
