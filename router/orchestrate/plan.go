package orchestrate

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/molly-gateway/molly/policies"
)

// SchemaJSON is the published JSON Schema (2020-12) of a Plan, the
// document a controller is asked to answer against
// (router/orchestrate/plan.schema.json).
//
//go:embed plan.schema.json
var SchemaJSON []byte

// planSchema is SchemaJSON compiled once.
var planSchema = func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(SchemaJSON))
	if err != nil {
		panic("orchestrate: plan.schema.json: " + err.Error())
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("plan.schema.json", doc); err != nil {
		panic("orchestrate: plan.schema.json: " + err.Error())
	}
	return c.MustCompile("plan.schema.json")
}()

// Plan is a delegation plan: a typed graph of subtasks (the JSON of
// SchemaJSON). Planner, ID and the defaults are the gateway's (Normalize).
type Plan struct {
	Version        int       `json:"version,omitempty"`
	ID             string    `json:"id,omitempty"`
	Planner        string    `json:"planner,omitempty"`
	Goal           string    `json:"goal,omitempty"`
	Subtasks       []Subtask `json:"subtasks"`
	Compose        *Compose  `json:"compose,omitempty"`
	Budget         *Budget   `json:"budget,omitempty"`
	MaxRefinements *int      `json:"max_refinements,omitempty"`
}

// Subtask is one node of a Plan.
type Subtask struct {
	ID           string     `json:"id"`
	Title        string     `json:"title,omitempty"`
	Instruction  string     `json:"instruction"`
	Inputs       []string   `json:"inputs,omitempty"`
	Specialist   Specialist `json:"specialist"`
	TierCeiling  string     `json:"tier_ceiling,omitempty"`
	Budget       *Budget    `json:"budget,omitempty"`
	DependsOn    []string   `json:"depends_on,omitempty"`
	Alternatives int        `json:"alternatives,omitempty"`
}

// Specialist is who does a subtask: a client model name the catalogue
// serves (with Tools, the governed tools the policy offers it), or a
// governed tool called directly with Arguments.
type Specialist struct {
	Model     string          `json:"model,omitempty"`
	Tools     bool            `json:"tools,omitempty"`
	Tool      string          `json:"tool,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
}

// Kind is "tool" for a direct tool call, "model" otherwise.
func (s Specialist) Kind() string {
	if s.Tool != "" {
		return "tool"
	}
	return "model"
}

// Name is the model or tool name.
func (s Specialist) Name() string {
	if s.Tool != "" {
		return s.Tool
	}
	return s.Model
}

// Budget bounds a plan (tokens of every answer, prompts included; USD) or a
// subtask (completion tokens of one answer; USD of one answer).
type Budget struct {
	MaxTokens  int     `json:"max_tokens,omitempty"`
	MaxCostUSD float64 `json:"max_cost_usd,omitempty"`
}

// Compose modes (Compose.Mode).
const (
	ComposeFinal    = "final"    // the answer is Compose.Subtask's output
	ComposeSections = "sections" // each output under its title
	ComposeConcat   = "concat"   // the outputs joined by blank lines
)

// Compose says how complementary outputs become the answer.
type Compose struct {
	Mode    string   `json:"mode"`
	Subtask string   `json:"subtask,omitempty"`
	Order   []string `json:"order,omitempty"`
}

// Input references (Subtask.Inputs).
const (
	InputConversation = "conversation" // every message of the client's conversation
	InputLastUser     = "last_user"    // the last user message
	inputMessage      = "message:"     // message:<index> (0-based, in the client's messages)
	inputPart         = "part:"        // part:<index> of the last user message (SplitParts)
	inputSubtask      = "subtask:"     // subtask:<id>: an earlier subtask's output
)

// Validation errors, matched with errors.Is; each error of Validate wraps
// one and names the subtask or field.
var (
	ErrSchema          = errors.New("the plan does not match plan.schema.json")
	ErrDuplicateID     = errors.New("duplicate subtask id")
	ErrUnknownDep      = errors.New("depends on an unknown subtask")
	ErrCycle           = errors.New("dependency cycle")
	ErrInputNotDep     = errors.New("reads a subtask it does not depend on")
	ErrInputRange      = errors.New("input out of range")
	ErrComposeUnknown  = errors.New("compose names an unknown subtask")
	ErrComposeNoTarget = errors.New("compose mode final names no subtask")
)

// ParsePlan decodes a plan from JSON text, checking it against the
// published schema first. A plan that does not match returns ErrSchema
// errors, one per violation ("at /subtasks/0/id: ...").
func ParsePlan(text []byte) (*Plan, []error) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(text))
	if err != nil {
		return nil, []error{fmt.Errorf("%w: not one JSON document: %v", ErrSchema, err)}
	}
	if err := planSchema.Validate(inst); err != nil {
		return nil, schemaErrors(err)
	}
	var p Plan
	dec := json.NewDecoder(bytes.NewReader(text))
	if err := dec.Decode(&p); err != nil {
		return nil, []error{fmt.Errorf("%w: %v", ErrSchema, err)}
	}
	return &p, nil
}

// schemaErrors lists the leaves of a schema validation error, the
// instance location first ("at /subtasks/0: missing property 'instruction'").
func schemaErrors(err error) []error {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []error{fmt.Errorf("%w: %v", ErrSchema, err)}
	}
	var out []error
	seen := map[string]bool{}
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c)
			}
			return
		}
		loc := "/" + strings.Join(e.InstanceLocation, "/")
		msg := fmt.Sprintf("at %s: %s", loc, e.ErrorKind.LocalizedString(printer))
		if !seen[msg] {
			seen[msg] = true
			out = append(out, fmt.Errorf("%w: %s", ErrSchema, msg))
		}
	}
	walk(ve)
	return out
}

var printer = message.NewPrinter(language.English)

// Bounds are what a plan's inputs may address: the client's messages and
// the parts of its last user message.
type Bounds struct {
	Messages, Parts int
}

// Validate checks what the schema cannot: unique ids, dependencies that
// exist and form no cycle, subtask inputs that are dependencies, message
// and part indices inside b, and a compose that names subtasks of the
// plan. Errors wrap the Err* sentinels.
func (p *Plan) Validate(b Bounds) []error {
	var errs []error
	ids := map[string]int{}
	for i, s := range p.Subtasks {
		if _, dup := ids[s.ID]; dup {
			errs = append(errs, fmt.Errorf("subtask %s: %w", s.ID, ErrDuplicateID))
			continue
		}
		ids[s.ID] = i
	}
	for _, s := range p.Subtasks {
		for _, d := range s.DependsOn {
			if _, ok := ids[d]; !ok || d == s.ID {
				errs = append(errs, fmt.Errorf("subtask %s: %w %q", s.ID, ErrUnknownDep, d))
			}
		}
		for _, in := range s.Inputs {
			switch {
			case strings.HasPrefix(in, inputSubtask):
				dep := strings.TrimPrefix(in, inputSubtask)
				if !slices.Contains(s.DependsOn, dep) {
					errs = append(errs, fmt.Errorf("subtask %s: %w: %s", s.ID, ErrInputNotDep, in))
				}
			case strings.HasPrefix(in, inputMessage):
				if n, _ := strconv.Atoi(strings.TrimPrefix(in, inputMessage)); n >= b.Messages {
					errs = append(errs, fmt.Errorf("subtask %s: %w: %s (the conversation has %d messages)", s.ID, ErrInputRange, in, b.Messages))
				}
			case strings.HasPrefix(in, inputPart):
				if n, _ := strconv.Atoi(strings.TrimPrefix(in, inputPart)); n >= b.Parts {
					errs = append(errs, fmt.Errorf("subtask %s: %w: %s (the last user message has %d parts)", s.ID, ErrInputRange, in, b.Parts))
				}
			}
		}
	}
	if len(errs) == 0 {
		if cyc := p.cycle(); cyc != nil {
			errs = append(errs, fmt.Errorf("%w: %s", ErrCycle, strings.Join(cyc, " -> ")))
		}
	}
	if c := p.Compose; c != nil {
		if c.Mode == ComposeFinal && c.Subtask == "" {
			errs = append(errs, ErrComposeNoTarget)
		}
		for _, id := range append(slices.Clone(c.Order), c.Subtask) {
			if _, ok := ids[id]; id != "" && !ok {
				errs = append(errs, fmt.Errorf("%w %q", ErrComposeUnknown, id))
			}
		}
	}
	return errs
}

// Repair fixes, once, what has one obvious fix: an input reading a
// subtask that is not a dependency gets the dependency (when that makes
// no cycle). It reports whether it changed anything.
func (p *Plan) Repair() bool {
	ids := map[string]bool{}
	for _, s := range p.Subtasks {
		ids[s.ID] = true
	}
	changed := false
	for i := range p.Subtasks {
		s := &p.Subtasks[i]
		for _, in := range s.Inputs {
			dep, ok := strings.CutPrefix(in, inputSubtask)
			if !ok || !ids[dep] || dep == s.ID || slices.Contains(s.DependsOn, dep) {
				continue
			}
			s.DependsOn = append(s.DependsOn, dep)
			if p.cycle() != nil {
				s.DependsOn = s.DependsOn[:len(s.DependsOn)-1]
				continue
			}
			changed = true
		}
	}
	return changed
}

// cycle returns one dependency cycle as ids, or nil (depth-first search
// with three colours; Cormen et al., Introduction to Algorithms, §22.3).
func (p *Plan) cycle() []string {
	deps := map[string][]string{}
	for _, s := range p.Subtasks {
		deps[s.ID] = s.DependsOn
	}
	const (
		white = iota
		grey
		black
	)
	colour := map[string]int{}
	var stack []string
	var found []string
	var visit func(id string) bool
	visit = func(id string) bool {
		colour[id] = grey
		stack = append(stack, id)
		for _, d := range deps[id] {
			switch colour[d] {
			case grey:
				i := slices.Index(stack, d)
				found = append(slices.Clone(stack[i:]), d)
				return true
			case white:
				if _, ok := deps[d]; ok && visit(d) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		colour[id] = black
		return false
	}
	for _, s := range p.Subtasks {
		if colour[s.ID] == white && visit(s.ID) {
			return found
		}
	}
	return nil
}

// Depth is the number of subtasks on the longest dependency chain; FanOut
// the most direct dependents of one node, the request itself being the
// parent of every subtask without dependencies. The plan must be valid.
func (p *Plan) Depth() (depth, fanOut int) {
	level := map[string]int{}
	var at func(id string) int
	byID := p.byID()
	at = func(id string) int {
		if l, ok := level[id]; ok {
			return l
		}
		l := 1
		for _, d := range byID[id].DependsOn {
			l = max(l, at(d)+1)
		}
		level[id] = l
		return l
	}
	children := map[string]int{}
	for _, s := range p.Subtasks {
		depth = max(depth, at(s.ID))
		if len(s.DependsOn) == 0 {
			children[""]++
		}
		for _, d := range s.DependsOn {
			children[d]++
		}
	}
	for _, n := range children {
		fanOut = max(fanOut, n)
	}
	return depth, fanOut
}

func (p *Plan) byID() map[string]*Subtask {
	m := make(map[string]*Subtask, len(p.Subtasks))
	for i := range p.Subtasks {
		m[p.Subtasks[i].ID] = &p.Subtasks[i]
	}
	return m
}

// sinks are the subtasks no other subtask depends on, in plan order.
func (p *Plan) sinks() []string {
	used := map[string]bool{}
	for _, s := range p.Subtasks {
		for _, d := range s.DependsOn {
			used[d] = true
		}
	}
	var out []string
	for _, s := range p.Subtasks {
		if !used[s.ID] {
			out = append(out, s.ID)
		}
	}
	return out
}

// dependents returns ids and every subtask that depends on one of them,
// directly or not, in plan order.
func (p *Plan) dependents(ids []string) []string {
	in := map[string]bool{}
	for _, id := range ids {
		in[id] = true
	}
	for changed := true; changed; {
		changed = false
		for _, s := range p.Subtasks {
			if in[s.ID] {
				continue
			}
			for _, d := range s.DependsOn {
				if in[d] {
					in[s.ID], changed = true, true
					break
				}
			}
		}
	}
	var out []string
	for _, s := range p.Subtasks {
		if in[s.ID] {
			out = append(out, s.ID)
		}
	}
	return out
}

// normalize fills the defaults: inputs last_user, ceiling def.Ceiling,
// completion budget def.Tokens, one alternative, the compose (final on
// the only sink, else sections over the sinks), max_refinements
// def.Refinements, version 1.
func (p *Plan) normalize(def Defaults) {
	p.Version = 1
	for i := range p.Subtasks {
		s := &p.Subtasks[i]
		if len(s.Inputs) == 0 {
			s.Inputs = []string{InputLastUser}
		}
		if s.TierCeiling == "" {
			s.TierCeiling = def.Ceiling
		}
		if s.Budget == nil {
			s.Budget = &Budget{}
		}
		if s.Budget.MaxTokens == 0 {
			s.Budget.MaxTokens = def.Tokens
		}
		if s.Alternatives == 0 {
			s.Alternatives = 1
		}
		if s.Specialist.Tool != "" && len(s.Specialist.Arguments) == 0 {
			s.Specialist.Arguments = json.RawMessage(`{}`)
		}
	}
	if p.Compose == nil {
		if sinks := p.sinks(); len(sinks) == 1 {
			p.Compose = &Compose{Mode: ComposeFinal, Subtask: sinks[0]}
		} else {
			p.Compose = &Compose{Mode: ComposeSections, Order: sinks}
		}
	}
	if p.Compose.Mode != ComposeFinal && len(p.Compose.Order) == 0 {
		p.Compose.Order = p.sinks()
	}
	if p.MaxRefinements == nil {
		n := def.Refinements
		p.MaxRefinements = &n
	}
}

// Defaults are what normalize fills in.
type Defaults struct {
	Ceiling     string // tier ceiling
	Tokens      int    // completion tokens of one subtask answer
	Refinements int
}

// tierIndex is the rank of a tier in policies.Tiers (-1 for none).
func tierIndex(t string) int { return slices.Index(policies.Tiers, t) }
