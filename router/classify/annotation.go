// Package classify turns a request body into a sealed Annotation: its
// capability profile (endpoint, model, task, difficulty, modalities, size)
// and its sovereignty profile (entities found by the detectors in every
// string, object key and number of the body, what could not be scanned and
// why, the declared class and residency). An Annotation is immutable once
// made: its fields are unexported, the body is held as a string, and its
// Digest binds a policy decision to exactly these bytes (policies.Decided).
package classify

import (
	"context"
	"maps"
	"slices"
	"sync"

	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
)

// Field kinds: how a scanned piece of the body sits in the JSON, which
// decides how a redaction is written back.
type fieldKind uint8

const (
	kindText    fieldKind = iota // a string value
	kindContent                  // a chat message's text (content or a content part's text/refusal)
	kindName                     // a participant or function name: placeholders must fit ^[a-zA-Z0-9_-]+$
	kindArgs                     // tool-call arguments: JSON text inside a string
	kindPrompt                   // a completions prompt or embeddings input string
	kindNumber                   // a JSON number, scanned as its literal text
	kindKey                      // an object member name
	kindDataURL                  // the decoded text of a text-typed data: URL
)

// field is one scanned piece of the body, addressed by its node in the
// body's Doc (Annotation.fieldPath gives its sjson path).
type field struct {
	node int32
	text string
	kind fieldKind
	// mediaType is the data URL's media type (kindDataURL only), for
	// re-encoding a redacted text.
	mediaType string
}

// FieldFinding is a detector finding inside one scanned field.
type FieldFinding struct {
	Field int // index of the field, in document order
	redaction.Finding
	// Split is true for one part of a value cut across consecutive fields
	// (chat messages, tool-call arguments, prompts); each part is redacted
	// in its own field.
	Split bool
}

// Unscanned is a part of the body no detector could read: binary media,
// token ids, a scan budget exceeded. Its presence makes the request opaque.
type Unscanned struct {
	Path   string `json:"path"`   // sjson path, e.g. "messages.0.content.1.image_url.url"
	Reason string `json:"reason"` // e.g. "binary image/png data URL", "token ids"
}

// Annotation is the classification of one request body. It is made by
// Classifier.Classify, read-only afterwards (every accessor returns a copy
// or a value), and travels in the request context (WithAnnotation).
type Annotation struct {
	req        openai.Request
	path       string      // URL path (GET /v1/models/{model})
	body       string      // the body as received, immutable
	doc        *openai.Doc // the body's values, read once (nil for the model listing)
	fields     []field
	suffix     int            // index + 1 in fields of the completions suffix; 0 when none
	findings   []FieldFinding // sorted by field, then offset
	counts     map[string]int // per entity type; a split value counts once
	detected   Sensitivity    // from the findings alone
	declared   Sensitivity    // X-Molly-Sensitivity; raises, never lowers
	unscanned  []Unscanned
	failed     bool // a detector failed: findings are incomplete
	residency  string
	tokens     int // estimated prompt tokens
	bound      int // PromptBound
	media      int // image, audio and file parts
	mediaBytes int // the body's bytes of binary media left out of the bound (images, audio)
	audioBound int // audio data's allowance: its bytes / BoundAudioBytesPerToken
	task       string
	diff       float64
	entropy    float64
	modal      []string
	lastUser   string // the last user turn's text (or the prompts), what the estimator read
	api        string // the client's API when the body was translated ("" for OpenAI's own)
	stored     bool   // the body holds a conversation from Molly's store

	classifier *Classifier
	digest     policies.Digest

	policyOnce    sync.Once
	policyMembers [3]*ast.Term // PolicyMembers, built on first use
	valueOnce     sync.Once
	policyValue   ast.Value // PolicyValue, from policyMembers
}

// Endpoint is the OpenAI operation.
func (a *Annotation) Endpoint() openai.Endpoint { return a.req.Endpoint }

// Model is the client's model name ("" for the model listing).
func (a *Annotation) Model() string { return a.req.Model }

// Path is the request's URL path.
func (a *Annotation) Path() string { return a.path }

// Request returns a copy of the validated request view.
func (a *Annotation) Request() openai.Request {
	r := a.req
	r.Tools = slices.Clone(r.Tools)
	return r
}

// Stream reports "stream": true.
func (a *Annotation) Stream() bool { return a.req.Stream }

// IncludeUsage reports "stream_options.include_usage": true.
func (a *Annotation) IncludeUsage() bool { return a.req.IncludeUsage }

// MaxTokens is max_completion_tokens or max_tokens; 0 when unset.
func (a *Annotation) MaxTokens() int { return a.req.MaxTokens }

// Choices is how many completions the request generates (n, best_of).
func (a *Annotation) Choices() int { return a.req.Choices() }

// Logprobs reports whether the client asked for logprobs.
func (a *Annotation) Logprobs() bool { return a.req.Logprobs }

// Tools reports tools declared or tool turns in the conversation.
func (a *Annotation) Tools() bool { return len(a.req.Tools) > 0 || a.req.ToolTurns }

// ToolChoice is the request's tool_choice as a word (openai.Request.ToolChoice).
func (a *Annotation) ToolChoice() string { return a.req.ToolChoice }

// ResponseFormat is response_format.type; "" when unset.
func (a *Annotation) ResponseFormat() string { return a.req.ResponseFormat }

// DeclaresTools reports whether the request declares tools or functions of its own.
func (a *Annotation) DeclaresTools() bool { return len(a.req.Tools) > 0 }

// PromptTokens is the estimated prompt size in tokens (capability.EstimateTokens
// over every scanned field, plus 3 per chat message and 3 for the reply).
func (a *Annotation) PromptTokens() int { return a.tokens }

// Allowances of PromptBound, in tokens.
const (
	// BoundPerRequest covers the tokens a template adds once: BOS/EOS, the
	// reply's primer, a default system prompt's markers.
	BoundPerRequest = 16
	// BoundPerMessage covers a chat template's role markers around a message.
	BoundPerMessage = 8
	// BoundPerFinding covers a redaction placeholder longer than the value
	// it replaces.
	BoundPerFinding = 16
	// BoundPerMedia is each image, audio or file part: what vision models
	// charge for the largest image (about 1,600 tokens for Anthropic's,
	// 1,445 for GPT-4o at high detail), rounded up.
	BoundPerMedia = 2048
	// BoundToolsPreamble covers the tool-use instructions a template adds
	// when the request declares tools.
	BoundToolsPreamble = 1024
	// BoundAudioBytesPerToken is the fewest base64 bytes of input audio
	// that make a token, added to BoundPerMedia for each audio part: audio
	// counts at most 32 tokens a second (Gemini's rate; OpenAI's is 10),
	// and the slowest input_audio format, mp3 at 8 kbit/s, is 1,333 base64
	// bytes a second, 41 a token; 16 leaves room.
	BoundAudioBytesPerToken = 16
)

// PromptBound is an upper bound on the prompt tokens any target can count
// for this request, what admission reserves (route.Plan.Reserve): the
// body's bytes (capability.BoundTokens: every text, name, argument, tool
// schema and token id the model sees is in them, with room to spare for
// the JSON around them) less the bytes of images and audio, plus
// BoundPerRequest, BoundPerMessage per chat message, BoundPerMedia per
// image, audio or file part, an audio part's bytes / BoundAudioBytesPerToken,
// BoundToolsPreamble when tools are declared and BoundPerFinding per
// redaction finding. A file's data (a PDF, read by providers as its pages'
// text and images) stays in the bytes. It is at least PromptTokens; for
// English prose about five times it. Not bounded: a file named by its id
// only (file_id: its size is unknown here), and a PDF of many near-empty
// pages (a page image costs more tokens than such a page's bytes).
func (a *Annotation) PromptBound() int { return max(a.bound, a.tokens) }

// Task is the task category (capability.Estimator), "embedding" for
// embeddings, "" for the model listing.
func (a *Annotation) Task() string { return a.task }

// Difficulty is the estimated difficulty in [0,1].
func (a *Annotation) Difficulty() float64 { return a.diff }

// TaskEntropy is the entropy (nats) of the category distribution.
func (a *Annotation) TaskEntropy() float64 { return a.entropy }

// Modalities lists the input modalities ("text", "image", "audio", "file").
func (a *Annotation) Modalities() []string { return slices.Clone(a.modal) }

// Sensitivity is max(Detected, Declared). Opaque content and failed scans
// are not folded in here: the policy decides what they imply.
func (a *Annotation) Sensitivity() Sensitivity { return max(a.detected, a.declared) }

// Detected is the class the findings imply.
func (a *Annotation) Detected() Sensitivity { return a.detected }

// Declared is the X-Molly-Sensitivity class (public when absent).
func (a *Annotation) Declared() Sensitivity { return a.declared }

// Findings returns the count of findings per entity type.
func (a *Annotation) Findings() map[string]int { return maps.Clone(a.counts) }

// FindingCount returns how many values of type typ were found.
func (a *Annotation) FindingCount(typ string) int { return a.counts[typ] }

// Opaque reports content that could not be scanned (see Unscanned).
func (a *Annotation) Opaque() bool { return len(a.unscanned) > 0 }

// Unscanned lists what was not scanned and why.
func (a *Annotation) Unscanned() []Unscanned { return slices.Clone(a.unscanned) }

// ScanFailed reports a detector failure: the findings are incomplete.
func (a *Annotation) ScanFailed() bool { return a.failed }

// Residency is the X-Molly-Residency region ("" when absent).
func (a *Annotation) Residency() string { return a.residency }

// Body is the request body as received.
func (a *Annotation) Body() string { return a.body }

// LastUserText is the text the capability estimator read: the last user
// turn of a chat, or the prompts.
func (a *Annotation) LastUserText() string { return a.lastUser }

// Scanned lists the entity types the scanner looks for (the redactable ones).
func (a *Annotation) Scanned() []string { return a.classifier.scanner.Types() }

// Digest binds policy decisions to this annotation (policies.Subject):
// SHA-256 over the classifier's identity, the body, the headers that
// steered classification and the findings.
func (a *Annotation) Digest() policies.Digest { return a.digest }

// API is the client's API the body was translated from ("responses",
// "messages"), "" for a request in OpenAI's chat, completions or
// embeddings API.
func (a *Annotation) API() string { return a.api }

// StoredConversation reports a body whose history came from Molly's store.
func (a *Annotation) StoredConversation() bool { return a.stored }

// Derive classifies body — a request derived from this one (a tool round,
// a follow-up) — with the same classifier, endpoint and headers.
func (a *Annotation) Derive(body []byte) (*Annotation, error) {
	return a.classifier.Classify(Input{Endpoint: a.req.Endpoint, Path: a.path, Body: body,
		Declared: a.declared.String(), Residency: a.residency, API: a.api, StoredConversation: a.stored})
}

// Classifier returns the classifier that made the annotation.
func (a *Annotation) Classifier() *Classifier { return a.classifier }

type annotationKey struct{}

// WithAnnotation returns ctx carrying a.
func WithAnnotation(ctx context.Context, a *Annotation) context.Context {
	return context.WithValue(ctx, annotationKey{}, a)
}

// From returns the annotation set by the classify step, or nil.
func From(ctx context.Context) *Annotation {
	a, _ := ctx.Value(annotationKey{}).(*Annotation)
	return a
}

// PolicyInput is the annotation as the policy input document shows it
// (schema in policies/README.md): the "request", "capability" and
// "sovereignty" members. It carries no request text: counts of findings
// by type, never the values.
func (a *Annotation) PolicyInput() map[string]any {
	findings := make(map[string]any, len(a.counts))
	for t, n := range a.counts {
		findings[t] = n
	}
	mods := make([]any, len(a.modal))
	for i, m := range a.modal {
		mods[i] = m
	}
	tools := make([]any, len(a.req.Tools))
	for i, t := range a.req.Tools {
		tools[i] = t
	}
	unscanned := make([]any, len(a.unscanned))
	for i, u := range a.unscanned {
		unscanned[i] = map[string]any{"path": u.Path, "reason": u.Reason}
	}
	return map[string]any{
		"request": map[string]any{
			"endpoint": string(a.req.Endpoint),
			"model":    a.req.Model,
			"stream":   a.req.Stream,
			"tools":    tools,
			"choices":  a.req.Choices(),
			// The client's API ("responses", "messages"; "" for OpenAI's
			// chat API itself), and whether the history came from Molly's store.
			"api":                 a.api,
			"stored_conversation": a.stored,
		},
		"capability": map[string]any{
			"task":          a.task,
			"difficulty":    a.diff,
			"modalities":    mods,
			"prompt_tokens": a.tokens,
			"max_tokens":    a.req.MaxTokens,
			"tools":         a.Tools(),
		},
		"sovereignty": map[string]any{
			"sensitivity": a.Sensitivity().String(),
			"detected":    a.detected.String(),
			"declared":    a.declared.String(),
			"findings":    findings,
			"opaque":      a.Opaque(),
			"unscanned":   unscanned,
			"scan_failed": a.failed,
			"residency":   a.residency,
		},
	}
}

var _ policies.Subject = (*Annotation)(nil)
