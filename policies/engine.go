// Package policies embeds Molly's default Rego policies and evaluates them
// with OPA (v1/rego prepared queries). Evaluation is fail-closed: an error,
// an undefined result, a malformed result or a timeout is a denial.
package policies

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
	"go.uber.org/zap"
)

// Default holds the embedded default policies (*.rego and *_test.rego).
//
//go:embed *.rego
var Default embed.FS

// DefaultQuery is the rule Molly evaluates (DESIGN.md §4).
const DefaultQuery = "data.molly.policy.decision"

// ToolQuery is the rule Molly evaluates before a governed tool runs
// (policies/tools.rego).
const ToolQuery = "data.molly.policy.tool_decision"

// DefaultTimeout bounds one evaluation; past it the request is denied.
const DefaultTimeout = 250 * time.Millisecond

// Options configure an Engine.
type Options struct {
	// Dir is a directory of .rego files (tests excluded) loaded instead of
	// the embedded defaults. Edits take effect on the next evaluation.
	Dir string
	// Query is the rule to evaluate; default DefaultQuery.
	Query string
	// Timeout bounds one evaluation; default DefaultTimeout.
	Timeout time.Duration
	// Logger receives one line per decision; nil logs nothing.
	Logger *zap.Logger
}

// Engine evaluates the policy. Safe for concurrent use.
type Engine struct {
	opts Options
	log  *zap.Logger

	mu      sync.RWMutex
	print   string // fingerprint of the loaded files ("" for embedded)
	query   *rego.PreparedEvalQuery
	tool    *rego.PreparedEvalQuery            // ToolQuery, on the same modules
	loadErr error                              // why query is nil after a failed reload
	extra   map[string]*rego.PreparedEvalQuery // other rules by query and fingerprint (decided.go)
}

// New loads and compiles the policy. A policy that does not compile at start
// is an error; one that breaks later denies every request until fixed.
func New(ctx context.Context, opts Options) (*Engine, error) {
	if opts.Query == "" {
		opts.Query = DefaultQuery
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	e := &Engine{opts: opts, log: opts.Logger}
	if e.log == nil {
		e.log = zap.NewNop()
	}
	if opts.Dir == "" {
		mods, err := readModules(Default, ".")
		if err != nil {
			return nil, err
		}
		q, err := prepare(ctx, opts.Query, mods)
		if err != nil {
			return nil, err
		}
		tq, err := prepare(ctx, ToolQuery, mods)
		if err != nil {
			return nil, err
		}
		e.query, e.tool = q, tq
		return e, nil
	}
	print, err := fingerprint(opts.Dir)
	if err != nil {
		return nil, err
	}
	if err := e.reload(ctx, print); err != nil {
		return nil, err
	}
	return e, nil
}

// readModules returns the non-test .rego files of fsys/dir by name.
func readModules(fsys fs.FS, dir string) (map[string]string, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("reading policy directory %s: %w", dir, err)
	}
	mods := map[string]string{}
	for _, ent := range entries {
		n := ent.Name()
		if ent.IsDir() || !strings.HasSuffix(n, ".rego") || strings.HasSuffix(n, "_test.rego") {
			continue
		}
		b, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, n)))
		if err != nil {
			return nil, fmt.Errorf("reading policy %s: %w", n, err)
		}
		mods[n] = string(b)
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("policy directory %s holds no .rego file", dir)
	}
	return mods, nil
}

func prepare(ctx context.Context, query string, mods map[string]string) (*rego.PreparedEvalQuery, error) {
	opts := []func(*rego.Rego){rego.Query(query), rego.StrictBuiltinErrors(true)}
	names := make([]string, 0, len(mods))
	for n := range mods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		opts = append(opts, rego.Module(n, mods[n]))
	}
	pq, err := rego.New(opts...).PrepareForEval(ctx)
	if err != nil {
		return nil, fmt.Errorf("compiling policy: %w", err)
	}
	return &pq, nil
}

// fingerprint hashes names, sizes and modification times of dir's .rego files.
func fingerprint(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("reading policy directory %s: %w", dir, err)
	}
	h := sha256.New()
	for _, ent := range entries {
		if !strings.HasSuffix(ent.Name(), ".rego") {
			continue
		}
		info, err := ent.Info()
		if err != nil {
			return "", fmt.Errorf("reading policy %s: %w", ent.Name(), err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\n", ent.Name(), info.Size(), info.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func (e *Engine) reload(ctx context.Context, print string) error {
	mods, err := readModules(os.DirFS(e.opts.Dir), ".")
	var q, tq *rego.PreparedEvalQuery
	if err == nil {
		q, err = prepare(ctx, e.opts.Query, mods)
	}
	if err == nil {
		tq, err = prepare(ctx, ToolQuery, mods)
	}
	if err != nil {
		q, tq = nil, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.print = print
	e.query, e.tool = q, tq
	e.loadErr = err
	if err != nil {
		e.log.Error("policy reload failed; denying every request until it is fixed", zap.String("dir", e.opts.Dir), zap.Error(err))
		return err
	}
	e.log.Info("policy loaded", zap.String("dir", e.opts.Dir), zap.Int("modules", len(mods)))
	return nil
}

// current returns the prepared query, reloading first when the directory changed.
func (e *Engine) current(ctx context.Context) (*rego.PreparedEvalQuery, error) {
	q, _, err := e.queries(ctx)
	return q, err
}

// queries returns the decision and tool queries, reloading first when the
// directory changed.
func (e *Engine) queries(ctx context.Context) (*rego.PreparedEvalQuery, *rego.PreparedEvalQuery, error) {
	if e.opts.Dir != "" {
		print, err := fingerprint(e.opts.Dir)
		if err != nil {
			return nil, nil, err
		}
		e.mu.RLock()
		same := print == e.print
		e.mu.RUnlock()
		if !same {
			_ = e.reload(ctx, print) // the error is kept in loadErr
		}
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.query == nil || e.tool == nil {
		return nil, nil, fmt.Errorf("policy failed to load: %w", e.loadErr)
	}
	return e.query, e.tool, nil
}

// decideMap evaluates the policy on input (the document of policies/README.md,
// as JSON-compatible Go values) and logs the decision. It never fails:
// whatever goes wrong becomes a denial whose reasons say why.
func (e *Engine) decideMap(ctx context.Context, input map[string]any) *Decision {
	start := time.Now()
	d := e.decide(ctx, input)
	d.id = newID()
	e.log.Info("policy decision",
		zap.String("decision_id", d.id),
		zap.String("path", strings.ReplaceAll(strings.TrimPrefix(e.opts.Query, "data."), ".", "/")),
		zap.Any("input", input),
		zap.Object("result", d),
		zap.Duration("eval_duration", time.Since(start)),
	)
	return d
}

func (e *Engine) decide(ctx context.Context, input map[string]any) *Decision {
	q, err := e.current(ctx)
	if err != nil {
		return denyDetail("policy failed to load (details in the server log)", err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.Timeout)
	defer cancel()
	rs, err := q.Eval(ctx, rego.EvalInput(input))
	if err != nil {
		if ctx.Err() != nil {
			return deny(fmt.Sprintf("policy evaluation timed out after %s", e.opts.Timeout))
		}
		return denyDetail("policy evaluation failed (details in the server log)", err.Error())
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return deny("policy decision is undefined")
	}
	d, err := parseDecision(rs[0].Expressions[0].Value)
	if err != nil {
		return denyDetail("policy returned a malformed decision (details in the server log)", err.Error())
	}
	return d
}

// newID returns a random RFC 4122 version 4 UUID.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// ToolDecision is the policy's verdict on one governed-tool call
// (policies/tools.rego); the zero value denies.
type ToolDecision struct {
	Allow   bool
	Reasons []string
}

// DecideTool evaluates ToolQuery on input (tool, arguments' findings,
// identity, tier, amount; router/tools.go builds it). Like Decide it never
// fails: an error, an undefined or malformed result or a timeout denies.
func (e *Engine) DecideTool(ctx context.Context, input map[string]any) ToolDecision {
	_, q, err := e.queries(ctx)
	if err != nil {
		e.log.Error("tool policy unavailable", zap.Error(err))
		return ToolDecision{Reasons: []string{"policy failed to load"}}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.Timeout)
	defer cancel()
	rs, err := q.Eval(ctx, rego.EvalInput(input))
	if err != nil {
		e.log.Error("tool policy evaluation failed", zap.Error(err))
		return ToolDecision{Reasons: []string{"tool policy evaluation failed"}}
	}
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return ToolDecision{Reasons: []string{"tool policy decision is undefined"}}
	}
	m, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return ToolDecision{Reasons: []string{"tool policy returned a malformed decision"}}
	}
	allow, ok := m["allow"].(bool)
	if !ok {
		return ToolDecision{Reasons: []string{"tool policy returned a malformed decision"}}
	}
	var reasons []string
	if rl, ok := m["reasons"].([]any); ok {
		for _, r := range rl {
			if s, ok := r.(string); ok {
				reasons = append(reasons, s)
			}
		}
	}
	return ToolDecision{Allow: allow, Reasons: reasons}
}

func osDirFS(dir string) fs.FS { return os.DirFS(dir) }
