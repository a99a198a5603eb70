// Package policies embeds Molly's default Rego policies and evaluates them
// with OPA (v1/rego prepared queries on one compiler per revision).
// Evaluation is fail-closed: an error, an undefined result, a malformed
// result or a timeout is a denial.
//
// A policy directory is loaded as `opa eval -d <dir>` loads it (OPA's own
// loader: Rego modules, JSON/YAML data documents at their directory's path,
// .tar.gz bundles, subfolders), compiled once into an immutable revision
// named by its content hash, and reloaded on file-system events; requests
// never touch the file system.
package policies

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Default holds the embedded default policies (*.rego and *_test.rego).
//
//go:embed *.rego
var Default embed.FS

// DefaultQuery is the route decision rule (docs/architecture.md, residency.rego).
const DefaultQuery = "data.molly.policy.decision"

// ToolQuery is the rule evaluated before a governed tool runs (tools.rego).
const ToolQuery = "data.molly.policy.tool_decision"

// ToolOfferQuery is the rule evaluated before a governed tool's definition
// is offered to a model on some tier (tools.rego).
const ToolOfferQuery = "data.molly.policy.tool_offer"

// EscalationQuery is the rule a cascade asks whether to try its next
// candidate (escalation.rego).
const EscalationQuery = "data.molly.policy.escalate"

// DefaultTimeout is the CPU time one evaluation may use; past it the
// decision is a denial (CodePolicyTimeout).
const DefaultTimeout = 250 * time.Millisecond

// DefaultDebounce is how long the policy directory must be quiet after a
// file-system event before it is read again.
const DefaultDebounce = 100 * time.Millisecond

// Options configure an Engine.
type Options struct {
	// Dir is a policy directory loaded instead of the embedded defaults, as
	// `opa eval -d Dir` loads it: every .rego file (tests excluded), every
	// .json/.yaml document (at its directory's path below data), every
	// .tar.gz bundle, in subfolders too; names starting with "." are
	// skipped (`--ignore '.*'`). Changes are picked up from file-system
	// events.
	Dir string
	// Query is the route decision rule; default DefaultQuery.
	Query string
	// Timeout is the CPU time one evaluation may use; default
	// DefaultTimeout. An evaluation is also stopped after
	// max(20×Timeout, 5s) of wall-clock time.
	Timeout time.Duration
	// Debounce is the quiet time after a file-system event before Dir is
	// read again; default DefaultDebounce.
	Debounce time.Duration
	// Logger receives one line per decision and the reload log; nil logs
	// nothing.
	Logger *zap.Logger
	// OnReload, if set, is called after every reload attempt that changed
	// the Status (a new revision, or a failure), from the watcher goroutine.
	OnReload func(Status)
	// MemoSize is how many route decisions a revision remembers by the
	// parts of the input its policy reads (memo.go); 0: DefaultMemoSize,
	// negative: none.
	MemoSize int
}

// Status describes the revision serving and the last reload, for the admin
// endpoint /molly/policy.
type Status struct {
	// Revision is the hex SHA-256 of the files loaded: for each file in
	// lexical order of its slash-separated path below the source, the
	// path, a NUL byte, the content length as 8 big-endian bytes, then the
	// content.
	Revision string `json:"revision"`
	// LoadedAt is when Revision was compiled.
	LoadedAt time.Time `json:"loaded_at"`
	// Source is the policy directory, or "embedded".
	Source string `json:"source"`
	// Files lists the files of Revision, relative to Source.
	Files []string `json:"files"`
	// LastError is why the newest content of Source was not loaded; ""
	// when Revision is the newest content.
	LastError string `json:"last_error,omitempty"`
	// LastErrorAt is when LastError happened.
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	// Healthy is true when the revision serving is the newest content of
	// Source (no reload failed since).
	Healthy bool `json:"healthy"`
}

// Engine evaluates the policy. Safe for concurrent use.
type Engine struct {
	opts Options
	log  *zap.Logger
	path string // the route decision's path, as decision logs name it

	rev atomic.Pointer[revision]

	// Caches of what callers convert once (Input's docs): the last
	// targets' array, and the log plans of identities and shared subject
	// members (logplan.go).
	targets   atomic.Pointer[targetsCache]
	idPlans   planCache[ast.Object]
	termPlans planCache[*ast.Term]

	mu        sync.Mutex // guards the fields below
	lastErr   string
	lastErrAt time.Time

	reloadMu   sync.Mutex // one reload at a time; guards the two below
	failedHash string     // content that failed to compile last
	failedErr  error
	w          *watcher
	closed     chan struct{}
	once       sync.Once
}

// New loads and compiles the policy. A policy that does not load at start is
// an error; one that breaks later keeps the last good revision serving
// (Status says so). With Dir set, New watches it until Close is called or
// ctx ends (a Caddy context ends when its config is unloaded).
func New(ctx context.Context, opts Options) (*Engine, error) {
	if opts.Query == "" {
		opts.Query = DefaultQuery
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	e := &Engine{opts: opts, log: opts.Logger, closed: make(chan struct{}), path: rulePath(opts.Query)}
	if e.log == nil {
		e.log = zap.NewNop()
	}
	if opts.Dir == "" {
		s, err := readSnapshot(Default)
		if err != nil {
			return nil, fmt.Errorf("reading the embedded policies: %w", err)
		}
		r, err := compile(ctx, s, "embedded", opts.Query, opts.MemoSize)
		if err != nil {
			return nil, fmt.Errorf("compiling the embedded policies: %w", err)
		}
		e.rev.Store(r)
		return e, nil
	}
	// Watch first, so that nothing written between reading and watching is
	// missed.
	w, werr := newWatcher(e)
	s, err := readSnapshot(os.DirFS(opts.Dir))
	if err != nil {
		w.close()
		return nil, fmt.Errorf("loading policy directory %s: %w", opts.Dir, err)
	}
	r, err := compile(ctx, s, opts.Dir, opts.Query, opts.MemoSize)
	if err != nil {
		w.close()
		return nil, fmt.Errorf("compiling policy directory %s: %w", opts.Dir, err)
	}
	e.rev.Store(r)
	e.log.Info("policy loaded", zap.String("dir", opts.Dir), zap.String("revision", r.id), zap.Strings("files", r.files))
	e.w = w
	if werr != nil {
		w.fw = nil
		e.setError(fmt.Errorf("watching %s: %w; edits are not picked up until Reload is called", opts.Dir, werr))
		e.log.Error("policy directory not watched", zap.String("dir", opts.Dir), zap.Error(werr))
	} else {
		w.update(opts.Dir, s)
		go w.run(ctx)
	}
	return e, nil
}

// Close stops watching the policy directory. Decisions keep working on the
// revision loaded last.
func (e *Engine) Close() error {
	e.once.Do(func() { close(e.closed) })
	return nil
}

// Status reports the revision serving and the outcome of the last reload.
func (e *Engine) Status() Status {
	r := e.rev.Load()
	e.mu.Lock()
	defer e.mu.Unlock()
	return Status{
		Revision: r.id, LoadedAt: r.loadedAt, Source: r.source, Files: slices.Clone(r.files),
		LastError: e.lastErr, LastErrorAt: e.lastErrAt, Healthy: e.lastErr == "",
	}
}

// setError records the outcome of a reload; it reports whether the
// recorded error changed.
func (e *Engine) setError(err error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev := e.lastErr
	if err == nil {
		e.lastErr, e.lastErrAt = "", time.Time{}
	} else {
		e.lastErr, e.lastErrAt = err.Error(), time.Now()
	}
	return prev != e.lastErr
}

// errChanging means the directory changed while it was read.
var errChanging = errors.New("the policy directory changed while it was read")

// Reload reads the policy directory now and, when its content differs from
// the revision serving, compiles and installs it. A failure keeps the
// revision serving, is logged and shows in Status. Without Dir it does
// nothing. The watcher calls it after file-system events; callers may too
// (e.g. an admin action).
func (e *Engine) Reload(ctx context.Context) error {
	if e.opts.Dir == "" {
		return nil
	}
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	s, err := e.reload(ctx)
	if s != nil {
		e.w.update(e.opts.Dir, s)
	}
	return err
}

func (e *Engine) reload(ctx context.Context) (*snapshot, error) {
	fsys := os.DirFS(e.opts.Dir)
	s, err := readSnapshot(fsys)
	if err != nil {
		err = &readError{err}
	} else if !s.sameContent(fsys) {
		return s, errChanging // not a failure: read again after the next quiet period
	}
	old := e.rev.Load()
	if err == nil && s.hash == old.id {
		if e.setError(nil) {
			e.log.Info("policy directory back to the revision serving", zap.String("dir", e.opts.Dir), zap.String("revision", old.id))
			e.notify()
		}
		return s, nil
	}
	if err == nil && s.hash == e.failedHash {
		return s, e.failedErr // the same broken content: already logged
	}
	if err == nil {
		var r *revision
		if r, err = compile(ctx, s, e.opts.Dir, e.opts.Query, e.opts.MemoSize); err == nil {
			e.rev.Store(r)
			e.setError(nil)
			e.failedHash, e.failedErr = "", nil
			e.log.Info("policy revision loaded", zap.String("dir", e.opts.Dir), zap.String("revision", r.id),
				zap.String("previous", old.id), zap.Strings("files", r.files))
			e.notify()
			return s, nil
		}
		e.failedHash = s.hash
	}
	err = fmt.Errorf("loading policy directory %s: %w", e.opts.Dir, err)
	e.failedErr = err
	e.setError(err)
	e.log.Error("policy reload failed; the last good revision keeps serving",
		zap.String("dir", e.opts.Dir), zap.String("revision", old.id), zap.Error(err))
	e.notify()
	return s, err
}

func (e *Engine) notify() {
	if e.opts.OnReload != nil {
		e.opts.OnReload(e.Status())
	}
}

// rulePath turns a query such as data.molly.policy.decision into the path
// decision logs name it by (molly/policy/decision).
func rulePath(query string) string {
	return strings.ReplaceAll(strings.TrimPrefix(query, "data."), ".", "/")
}

// Decide evaluates the route decision on in and logs it (OPA decision-log
// shape). It never fails: whatever goes wrong becomes a denial whose Code
// and Reasons say why. The result is bound to in.Subject's Digest.
func (e *Engine) Decide(ctx context.Context, in Input) Decided {
	if in.Subject == nil {
		d := denyDetail(CodePolicyError, "policy input is incomplete (details in the server log)", "Input.Subject is nil")
		d.id = newID()
		e.log.Error("policy decision", zap.String("decision_id", d.id), zap.String("path", e.path), zap.String("error", d.detail))
		return Decided{decision: d}
	}
	digest := in.Subject.Digest()
	rec := &record{}
	if err := buildRouteDoc(&rec.doc, in, e); err != nil {
		d := denyDetail(CodePolicyError, "policy input is malformed (details in the server log)", err.Error())
		d.id = newID()
		e.log.Error("policy decision", zap.String("decision_id", d.id), zap.String("path", e.path), zap.String("error", d.detail))
		return Decided{decision: d, digest: digest}
	}
	return Decided{decision: e.decideDoc(ctx, rec), digest: digest}
}

// DecideMap evaluates the route decision on an input document given as
// JSON-compatible Go values (policies/README.md).
//
// Deprecated: use Decide with an Input, whose Decided binds the decision to
// its Subject. DecideMap remains while router/ moves to the sealed pipeline.
func (e *Engine) DecideMap(ctx context.Context, input map[string]any) *Decision {
	v, err := ValueOf(input)
	if err != nil {
		d := denyDetail(CodePolicyError, "policy input is malformed (details in the server log)", err.Error())
		d.id = newID()
		return d
	}
	obj, _ := v.(ast.Object)
	rec := &record{doc: routeDoc{obj: obj, whole: true}}
	return e.decideDoc(ctx, rec)
}

// record is one route decision and what its log line refers to, in one
// allocation: the decision returned, the input document and the
// evaluation's timers.
type record struct {
	d       Decision
	doc     routeDoc
	metrics evalMetrics
}

// decideDoc evaluates the route decision on rec.doc on one revision, logs
// it and returns &rec.d.
func (e *Engine) decideDoc(ctx context.Context, rec *record) *Decision {
	rev := e.rev.Load()
	var key []ast.Value
	var hash int
	var hk [nMembers]*ast.Term
	var slot *atomic.Pointer[hotEntry]
	var hot bool
	if m := rev.memo; m != nil {
		hk, slot, hot = m.hotKey(&rec.doc)
		var me *memoEntry
		if hot {
			if he := slot.Load(); he != nil && he.terms == hk {
				me = he.entry
			}
		}
		if me == nil {
			key, hash = m.key(&rec.doc)
			if me = m.get(key, hash); me != nil && hot {
				slot.Store(&hotEntry{terms: hk, entry: me})
			}
		}
		if me != nil {
			rec.d = *me.decision
			rec.d.id, rec.d.revision = newID(), rev.id
			e.logDecision(e.path, rec.d.id, rev.id, &rec.doc, result{value: me.value, defined: true}, me.result, "", &rec.metrics,
				zap.Object("molly", &rec.d), zap.Bool("memoized", true))
			return &rec.d
		}
	}
	r := eval(ctx, &rev.decision, rec.doc.object(), e.opts.Timeout)
	var d *Decision
	switch r.outcome {
	case evalTimeout:
		d = deny(CodePolicyTimeout, fmt.Sprintf("policy evaluation used more than %s of CPU time", e.opts.Timeout))
	case evalCanceled:
		d = denyDetail(CodeClientClosed, "the request ended before the policy decided", r.err.Error())
	case evalError:
		d = denyDetail(CodePolicyError, "policy evaluation failed (details in the server log)", r.err.Error())
	default:
		if !r.defined {
			d = deny(CodePolicyError, "policy decision is undefined")
			break
		}
		var err error
		if d, err = parseDecision(r.value); err != nil {
			d = denyDetail(CodePolicyError, "policy returned a malformed decision (details in the server log)", err.Error())
		} else if m := rev.memo; m != nil {
			me := m.put(key, hash, r.value, resultPlan(r.value), d) // the memo keeps d, without id
			if hot {
				slot.Store(&hotEntry{terms: hk, entry: me})
			}
		}
	}
	rec.d = *d
	rec.d.id, rec.d.revision = newID(), rev.id
	rec.metrics = evalMetrics{evalNS: r.evalNS, cpuNS: r.cpuNS}
	e.logDecision(e.path, rec.d.id, rev.id, &rec.doc, r, nil, rec.d.detail, &rec.metrics, zap.Object("molly", &rec.d))
	return &rec.d
}

// logDecision writes one decision in the shape of OPA's decision log
// (https://www.openpolicyagent.org/docs/management-decision-logs):
// decision_id, path, input, result (absent when undefined), revision,
// timestamp, metrics, error; extra fields say what Molly made of it. plan,
// when not nil, is r.value's (an object's) plan, written instead of it;
// metrics, when not nil, is r's timers, written instead of a copy.
func (e *Engine) logDecision(path, id, revision string, input zapcore.ObjectMarshaler, r result, plan *logPlan, detail string, metrics *evalMetrics, extra ...zap.Field) {
	ce := e.log.Check(zap.InfoLevel, "policy decision")
	if ce == nil {
		return
	}
	if metrics == nil {
		metrics = &evalMetrics{evalNS: r.evalNS, cpuNS: r.cpuNS}
	}
	fields := make([]zap.Field, 0, 9+len(extra))
	fields = append(fields,
		zap.String("decision_id", id),
		zap.String("path", path),
		zap.Object("input", input),
	)
	if r.defined {
		if plan != nil {
			fields = append(fields, zap.Object("result", plan))
		} else if m, ok := r.value.(map[string]any); ok {
			fields = append(fields, zap.Object("result", jsonObject(m)))
		} else {
			fields = append(fields, zap.Any("result", r.value))
		}
	}
	fields = append(fields,
		zap.String("revision", revision),
		zap.String("timestamp", time.Now().UTC().Format(time.RFC3339Nano)),
		zap.Object("metrics", metrics),
	)
	if detail != "" {
		fields = append(fields, zap.String("error", detail))
	}
	ce.Write(append(fields, extra...)...)
}

// newID returns an RFC 9562 version 7 UUID (§5.7): the first 48 bits are
// the Unix time in milliseconds, big-endian, the other 74 (beside version
// and variant) are random. Ids therefore sort by time, so the registry's
// indexes on them (usage.record_id, usage.decision_id) take each new id at
// their right edge instead of at a random leaf: a commit of n records
// writes a few index pages rather than up to 2n. 74 random bits keep ids
// unguessable.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[6:])
	ms := uint64(time.Now().UnixMilli())
	b[0], b[1], b[2], b[3], b[4], b[5] = byte(ms>>40), byte(ms>>32), byte(ms>>24), byte(ms>>16), byte(ms>>8), byte(ms)
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	var h [36]byte
	hex.Encode(h[0:8], b[0:4])
	h[8] = '-'
	hex.Encode(h[9:13], b[4:6])
	h[13] = '-'
	hex.Encode(h[14:18], b[6:8])
	h[18] = '-'
	hex.Encode(h[19:23], b[8:10])
	h[23] = '-'
	hex.Encode(h[24:], b[10:])
	return string(h[:])
}

// Keys of the input document, shared by every input built.
var (
	keyRequest     = ast.StringTerm("request")
	keyCapability  = ast.StringTerm("capability")
	keySovereignty = ast.StringTerm("sovereignty")
	keyIdentity    = ast.StringTerm("identity")
	keyTargets     = ast.StringTerm("targets")
	keyDerived     = ast.StringTerm("derived")
)

// The members of a route decision's input document, in the order an
// ast.Object iterates (and the decision log writes) them: its keys sorted
// by ast.Compare, which orders strings as Go does.
const (
	memberCapability = iota
	memberDerived
	memberIdentity
	memberRequest
	memberSovereignty
	memberTargets
	nMembers
)

var (
	memberKeys  = [nMembers]*ast.Term{keyCapability, keyDerived, keyIdentity, keyRequest, keySovereignty, keyTargets}
	memberNames = [nMembers]string{"capability", "derived", "identity", "request", "sovereignty", "targets"}
)

// routeDoc is a route decision's input document held as its members, so
// that a remembered decision is found (memo.hot, memo.key) and logged
// without building the ast.Object the evaluation needs; object builds it
// on first use. Immutable once built, but for that lazy object.
type routeDoc struct {
	terms [nMembers]*ast.Term // by member; nil where absent
	plans [nMembers]*logOp    // log plans of members callers convert once; nil: walked
	obj   ast.Object          // the document; built by object, or given (whole)
	whole bool                // obj was given and may hold other members (DecideMap): log and key it as it is
}

// object returns the input document as an ast.Object.
func (d *routeDoc) object() ast.Object {
	if d.obj != nil {
		return d.obj
	}
	n := 0
	for _, t := range d.terms {
		if t != nil {
			n++
		}
	}
	obj := ast.NewObjectWithCapacity(n)
	for i, t := range d.terms {
		if t != nil {
			obj.Insert(memberKeys[i], t)
		}
	}
	d.obj = obj
	return obj
}

// MarshalLogObject writes the input document to the decision log as
// astObject writes its ast.Object (members in key order), members with a
// plan from their plans.
func (d *routeDoc) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	if d.whole {
		return marshalObject(enc, d.obj)
	}
	var err error
	for i, t := range d.terms {
		if t == nil {
			continue
		}
		var e error
		switch op := d.plans[i]; {
		case op == nil:
			e = addValue(enc, memberNames[i], t)
		case op.kind == opObject:
			e = enc.AddObject(memberNames[i], op.sub)
		default:
			e = enc.AddArray(memberNames[i], op.sub)
		}
		if e != nil && err == nil {
			err = e
		}
	}
	return err
}

// routeInput builds the route decision's input document as an ast.Object:
// the Subject's request, capability and sovereignty members (from
// PolicyMembers or PolicyValue when the Subject has them), identity ({} when nil), targets
// ([] when nil) and derived (absent when nil).
func routeInput(in Input) (ast.Object, error) {
	var d routeDoc
	if err := buildRouteDoc(&d, in, nil); err != nil {
		return nil, err
	}
	return d.object(), nil
}

// routeDoc is routeInput's document with the Engine's caches: the
// targets' array is reused while a caller passes the same converted
// targets, a converted identity's term too, and the members callers
// convert once are logged from their plans.
func (e *Engine) routeDoc(in Input) (*routeDoc, error) {
	d := &routeDoc{}
	return d, buildRouteDoc(d, in, e)
}

// targetsCache is the input.targets array made of elems (ast.Objects a
// caller converted once), and its log plan.
type targetsCache struct {
	elems []ast.Object
	term  *ast.Term
	plan  *logOp
}

// cachedTargets returns the targets' array term and plan when every
// element is an ast.Object, from e's cache when they are the same objects
// as last time; nil otherwise.
func (e *Engine) cachedTargets(targets []any) *targetsCache {
	c := e.targets.Load()
	if c != nil && len(c.elems) == len(targets) {
		same := true
		for i, t := range targets {
			if o, ok := t.(ast.Object); !ok || o != c.elems[i] {
				same = false
				break
			}
		}
		if same {
			return c
		}
	}
	elems := make([]ast.Object, len(targets))
	terms := make([]*ast.Term, len(targets))
	for i, t := range targets {
		o, ok := t.(ast.Object)
		if !ok {
			return nil
		}
		elems[i], terms[i] = o, ast.NewTerm(o)
	}
	arr := ast.NewArray(terms...)
	op, _ := astValuePlan(arr)
	c = &targetsCache{elems: elems, term: ast.NewTerm(arr), plan: &op}
	e.targets.Store(c)
	return c
}

// buildRouteDoc fills d with in's members; e (nil: none) supplies the
// caches.
func buildRouteDoc(d *routeDoc, in Input, e *Engine) error {
	if ms, ok := in.Subject.(MemberSubject); ok {
		req, capability, sov := ms.PolicyMembers()
		if req == nil && capability == nil && sov == nil {
			return fmt.Errorf("Subject.PolicyValue is %T, want an ast.Object", ms.PolicyValue())
		}
		d.terms[memberRequest], d.terms[memberCapability], d.terms[memberSovereignty] = req, capability, sov
		if e != nil {
			if req != nil {
				d.plans[memberRequest] = e.termPlans.get(req, req.Value).op
			}
			if sov != nil {
				d.plans[memberSovereignty] = e.termPlans.get(sov, sov.Value).op
			}
		}
	} else if vs, ok := in.Subject.(ValueSubject); ok {
		so, ok := vs.PolicyValue().(ast.Object)
		if !ok {
			return fmt.Errorf("Subject.PolicyValue is %T, want an ast.Object", vs.PolicyValue())
		}
		d.terms[memberRequest] = so.Get(keyRequest)
		d.terms[memberCapability] = so.Get(keyCapability)
		d.terms[memberSovereignty] = so.Get(keySovereignty)
	} else {
		m := in.Subject.PolicyInput()
		for _, i := range [...]int{memberRequest, memberCapability, memberSovereignty} {
			x, ok := m[memberNames[i]]
			if !ok {
				continue
			}
			v, err := ValueOf(x)
			if err != nil {
				return fmt.Errorf("input.%s: %w", memberNames[i], err)
			}
			d.terms[i] = ast.NewTerm(v)
		}
	}
	if o, converted := in.Identity.(ast.Object); converted && e != nil {
		// The term is kept with the plan, so that a member's requests
		// share it (memo.hot compares members by term).
		c := e.idPlans.get(o, o)
		d.terms[memberIdentity], d.plans[memberIdentity] = c.term, c.op
	} else {
		var id ast.Value = ast.NewObject()
		var err error
		if in.Identity != nil {
			id, err = ValueOf(in.Identity) // a nil map is {} too
		}
		if err != nil {
			return fmt.Errorf("input.identity: %w", err)
		}
		d.terms[memberIdentity] = ast.NewTerm(id)
	}
	var tc *targetsCache
	if e != nil {
		tc = e.cachedTargets(in.Targets)
	}
	if tc != nil {
		d.terms[memberTargets], d.plans[memberTargets] = tc.term, tc.plan
	} else {
		targets := make([]*ast.Term, len(in.Targets))
		for i, t := range in.Targets {
			v, err := ValueOf(t)
			if err != nil {
				return fmt.Errorf("input.targets[%d]: %w", i, err)
			}
			targets[i] = ast.NewTerm(v)
		}
		d.terms[memberTargets] = ast.NewTerm(ast.NewArray(targets...))
	}
	if in.Derived != nil {
		v, err := ValueOf(in.Derived)
		if err != nil {
			return fmt.Errorf("input.derived: %w", err)
		}
		d.terms[memberDerived] = ast.NewTerm(v)
	}
	return nil
}

// resultPlan is the log plan of a rego result that is an object; nil
// otherwise.
func resultPlan(v any) *logPlan {
	if m, ok := v.(map[string]any); ok {
		return jsonObjectPlan(m)
	}
	return nil
}
