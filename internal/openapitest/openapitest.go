// Package openapitest validates what Molly sends to clients against
// OpenAI's published API description (its OpenAPI 3.1 document): a body or
// one stream chunk against a schema of components.schemas, with every $ref
// of the document resolved, by a JSON Schema 2020-12 validator
// (github.com/santhosh-tekuri/jsonschema/v6).
//
// The document is read from $MOLLY_OPENAPI, else from the copy in this
// package's testdata/openai (OpenAI's openapi.yaml, MIT licence, with the
// commit it was taken from in SOURCE); a missing document fails the test.
//
// OpenAI's document is OpenAPI 3.1 (JSON Schema 2020-12) but still marks
// some schemas with the OpenAPI 3.0 keyword `nullable: true`, which 2020-12
// ignores; Load rewrites each such schema to also admit null (type gains
// "null", an enum gains null, a $ref or composition is wrapped in
// anyOf [schema, {type: null}]), which is what the keyword means
// (OpenAPI 3.0.3 §4.7.24.1).
package openapitest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// EnvPath names the environment variable that overrides the document's path.
const EnvPath = "MOLLY_OPENAPI"

// docURL is the document's name inside the compiler.
const docURL = "file:///openai/openapi.json"

// Spec is OpenAI's API description, ready to validate against. Safe for
// concurrent use.
type Spec struct {
	Path     string
	compiler *jsonschema.Compiler
	mu       sync.Mutex
	schemas  map[string]*jsonschema.Schema
}

var (
	once    sync.Once
	loaded  *Spec
	loadErr error
	missing string
)

// Path returns where the document is looked for, and whether it exists.
func Path() (string, bool) {
	if p := os.Getenv(EnvPath); p != "" {
		_, err := os.Stat(p)
		return p, err == nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "internal", "openapitest", "testdata", "openai", "openapi.yaml")
			_, err := os.Stat(p)
			return p, err == nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", false
		}
		dir = up
	}
}

// Load returns the spec, loading it once per process; tb fails when the
// document is not there or does not load.
func Load(tb testing.TB) *Spec {
	tb.Helper()
	once.Do(func() {
		p, ok := Path()
		if !ok {
			missing = fmt.Sprintf("OpenAI's OpenAPI document is not at %q; set $%s to its path", p, EnvPath)
			return
		}
		loaded, loadErr = Open(p)
	})
	if missing != "" {
		tb.Fatal(missing)
	}
	if loadErr != nil {
		tb.Fatalf("loading the OpenAPI document: %v", loadErr)
	}
	return loaded
}

// Open reads and prepares the document at path (YAML or JSON).
func Open(path string) (*Spec, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	doc = rewriteNullable(doc)
	rewriteRecursive(doc)
	if err := addCompletionChunk(doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	// Through JSON, so numbers are what the validator expects.
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(docURL, v); err != nil {
		return nil, err
	}
	return &Spec{Path: path, compiler: c, schemas: map[string]*jsonschema.Schema{}}, nil
}

// schema compiles components.schemas.<name> once.
func (s *Spec) schema(name string) (*jsonschema.Schema, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sch, ok := s.schemas[name]; ok {
		return sch, nil
	}
	sch, err := s.compiler.Compile(docURL + "#/components/schemas/" + name)
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", name, err)
	}
	s.schemas[name] = sch
	return sch, nil
}

// Check validates the JSON text body against components.schemas.<name>.
// The error lists every violation with its location.
func (s *Spec) Check(name string, body []byte) error {
	sch, err := s.schema(name)
	if err != nil {
		return err
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if err := sch.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return fmt.Errorf("%s: %s", name, ve.Error())
		}
		return err
	}
	return nil
}

// CompletionChunk names the schema stream chunks of text completions are
// checked against: CreateCompletionResponse, which the spec says streamed
// chunks share, with choices[].finish_reason admitting null. The spec
// gives that field no null, yet OpenAI's API sends null on every chunk but
// a choice's last (as it does for chat chunks, whose schema admits it), so
// no stream could validate otherwise. Its usage admits null too: with
// stream_options.include_usage every chunk but the usage chunk carries
// "usage": null (the stream options' own description).
const CompletionChunk = "MollyCompletionChunk"

// ValidateCompletionChunk fails tb when chunk is not a text completion
// stream chunk (CompletionChunk).
func (s *Spec) ValidateCompletionChunk(tb testing.TB, chunk []byte) {
	tb.Helper()
	s.Validate(tb, CompletionChunk, chunk)
}

// addCompletionChunk adds the CompletionChunk schema to doc.
func addCompletionChunk(doc any) error {
	schemas, _ := doc.(map[string]any)["components"].(map[string]any)["schemas"].(map[string]any)
	src, ok := schemas["CreateCompletionResponse"]
	if !ok {
		return errors.New("no components.schemas.CreateCompletionResponse")
	}
	b, err := json.Marshal(src)
	if err != nil {
		return err
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	choices, _ := c["properties"].(map[string]any)["choices"].(map[string]any)
	items, _ := choices["items"].(map[string]any)
	fr, ok := items["properties"].(map[string]any)["finish_reason"].(map[string]any)
	if !ok {
		return errors.New("CreateCompletionResponse has no choices[].finish_reason")
	}
	admitNull(fr)
	// With stream_options.include_usage every chunk but the last carries
	// "usage": null (ChatCompletionStreamOptions.include_usage, which
	// CreateCompletionRequest's stream_options refers to).
	props := c["properties"].(map[string]any)
	if u, ok := props["usage"].(map[string]any); ok {
		props["usage"] = admitNull(u)
	}
	schemas[CompletionChunk] = c
	return nil
}

// Validate fails tb when body does not validate against name.
func (s *Spec) Validate(tb testing.TB, name string, body []byte) {
	tb.Helper()
	if err := s.Check(name, body); err != nil {
		tb.Errorf("%v\nbody: %s", err, body)
	}
}

// rewriteRecursive replaces the draft 2019-09 keywords $recursiveAnchor
// and $recursiveRef, which 2020-12 no longer has, in the component schemas
// that use them for self-reference: `$recursiveRef: "#"` becomes a $ref to
// the component itself.
func rewriteRecursive(doc any) {
	comps, _ := doc.(map[string]any)["components"].(map[string]any)
	schemas, _ := comps["schemas"].(map[string]any)
	for name, s := range schemas {
		m, ok := s.(map[string]any)
		if !ok {
			continue
		}
		if _, ok := m["$recursiveAnchor"]; !ok {
			continue
		}
		delete(m, "$recursiveAnchor")
		self := "#/components/schemas/" + name
		var walk func(v any)
		walk = func(v any) {
			switch x := v.(type) {
			case map[string]any:
				if r, ok := x["$recursiveRef"]; ok {
					delete(x, "$recursiveRef")
					if r == "#" {
						x["$ref"] = self
					}
				}
				for _, e := range x {
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			}
		}
		walk(m)
	}
}

// rewriteNullable turns `nullable: true` into JSON Schema 2020-12 (see the
// package comment), everywhere in v.
func rewriteNullable(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = rewriteNullable(e)
		}
		if n, ok := x["nullable"].(bool); ok {
			delete(x, "nullable")
			if n {
				return admitNull(x)
			}
		}
		return x
	case []any:
		for i, e := range x {
			x[i] = rewriteNullable(e)
		}
	}
	return v
}

func admitNull(x map[string]any) map[string]any {
	switch t := x["type"].(type) {
	case string:
		x["type"] = []any{t, "null"}
		if enum, ok := x["enum"].([]any); ok {
			x["enum"] = append(enum, nil)
		}
		return x
	case []any:
		for _, e := range t {
			if e == "null" {
				return x
			}
		}
		x["type"] = append(t, "null")
		if enum, ok := x["enum"].([]any); ok {
			x["enum"] = append(enum, nil)
		}
		return x
	}
	return map[string]any{"anyOf": []any{x, map[string]any{"type": "null"}}}
}
