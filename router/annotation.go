// Package router holds Molly's request annotation (what classification found),
// target selection under a policy decision, and the dispatch path: the only
// code that builds a request to an upstream. It imports no Caddy package.
package router

import (
	"context"
	"fmt"
	"strings"

	"github.com/molly-gateway/molly/redaction"
)

// Endpoint names the OpenAI operation a request is for.
type Endpoint string

// The OpenAI endpoints Molly serves (paths under the client's base URL).
const (
	EndpointChat        Endpoint = "chat.completions" // POST /v1/chat/completions
	EndpointCompletions Endpoint = "completions"      // POST /v1/completions
	EndpointEmbeddings  Endpoint = "embeddings"       // POST /v1/embeddings
	EndpointModels      Endpoint = "models"           // GET  /v1/models
)

// Path is the endpoint's path relative to an OpenAI base URL ending in /v1.
func (e Endpoint) Path() string {
	switch e {
	case EndpointChat:
		return "/chat/completions"
	case EndpointCompletions:
		return "/completions"
	case EndpointEmbeddings:
		return "/embeddings"
	case EndpointModels:
		return "/models"
	}
	return ""
}

// Sensitivity is the sovereignty class of a request, ordered
// public < internal < confidential < restricted.
type Sensitivity int

// Sensitivity classes, lowest first.
const (
	Public Sensitivity = iota
	Internal
	Confidential
	Restricted
)

var sensitivityNames = [...]string{"public", "internal", "confidential", "restricted"}

func (s Sensitivity) String() string {
	if s < Public || s > Restricted {
		return fmt.Sprintf("Sensitivity(%d)", int(s))
	}
	return sensitivityNames[s]
}

// ParseSensitivity reads a class name (case-insensitive).
func ParseSensitivity(name string) (Sensitivity, error) {
	for i, n := range sensitivityNames {
		if strings.EqualFold(strings.TrimSpace(name), n) {
			return Sensitivity(i), nil
		}
	}
	return 0, fmt.Errorf("unknown sensitivity class %q (want one of public, internal, confidential, restricted)", name)
}

// MarshalText writes the class name.
func (s Sensitivity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a class name.
func (s *Sensitivity) UnmarshalText(b []byte) error {
	v, err := ParseSensitivity(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Capability is what the request needs from a model.
type Capability struct {
	Endpoint     Endpoint
	Model        string   // the client's "model" field
	Stream       bool     // "stream": true
	IncludeUsage bool     // "stream_options.include_usage": true
	Modalities   []string // input modalities: "text", "image", "audio", "file"
	PromptTokens int      // estimated prompt tokens (see EstimateTokens)
	MaxTokens    int      // max_completion_tokens or max_tokens; 0 when unset
	Tools        bool     // tools declared or tool messages present
	Task         string   // task category: chat, coding, math, translation, summarisation, extraction, creative, classification, embedding, or an adapter domain (see Estimator)
	Difficulty   float64  // estimated difficulty in [0,1] (see Estimator); 0 for embeddings and the model list
	TaskEntropy  float64  // nats: Estimate.Entropy of the category scores; high when no category dominates (mixture.go); 0 when not estimated
}

// Sovereignty is what the request's content allows.
type Sovereignty struct {
	Sensitivity Sensitivity    // max(Detected, Declared)
	Detected    Sensitivity    // from the findings
	Declared    Sensitivity    // from X-Molly-Sensitivity; can raise, never lower
	Findings    map[string]int // count per entity type, e.g. {"EMAIL": 2}
	Opaque      bool           // content that cannot be scanned (token-id prompts)
	ScanFailed  bool           // a detector failed on some field: findings are incomplete, so Sensitivity is Restricted and no tier that requires redaction is used
	Residency   string         // requested residency region from X-Molly-Residency, e.g. "EU"
}

// TextField is one text-bearing string of the body, addressed by its gjson/sjson path.
type TextField struct {
	Path string // e.g. "messages.2.content.0.text"
	Text string // the decoded string value
}

// FieldFinding is a detector finding inside Fields[Field].Text.
type FieldFinding struct {
	Field int
	redaction.Finding
	// Split is true for one part of a value cut across consecutive fields
	// (chat messages, tool-call arguments, prompts); each part is redacted
	// in its own field.
	Split bool
}

// Annotation is the result of classification. It is made once per request
// and read-only afterwards; the policy and route steps share it by pointer.
type Annotation struct {
	Capability
	Sovereignty
	Body     []byte         // the request body as received
	Fields   []TextField    // every text-bearing field, in document order
	Findings []FieldFinding // sorted by field, then offset
	Scanned  []string       // entity types the scanner looked for (the redactable ones)

	vaultOpts  []redaction.VaultOption // per-type modes and the HMAC key, from the Classifier
	classifier *Classifier             // that made it; the tool loop (tools.go) classifies the grown conversation again
}

type annotationKey struct{}

// WithAnnotation returns ctx carrying a.
func WithAnnotation(ctx context.Context, a *Annotation) context.Context {
	return context.WithValue(ctx, annotationKey{}, a)
}

// AnnotationFrom returns the annotation set by the classify step, or nil.
func AnnotationFrom(ctx context.Context) *Annotation {
	a, _ := ctx.Value(annotationKey{}).(*Annotation)
	return a
}
