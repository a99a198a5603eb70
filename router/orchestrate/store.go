package orchestrate

import (
	"encoding/json"
	"sync"
	"time"
)

// DefaultPlansKept is how many plan records a Store keeps.
const DefaultPlansKept = 256

// Plan statuses (Record.Status).
const (
	StatusPlanning     = "planning"
	StatusRunning      = "running"
	StatusAnswered     = "answered"
	StatusUncertain    = "uncertain" // answered with an uncertainty annotation
	StatusDenied       = "denied"    // the orchestration policy refused the plan
	StatusInvalid      = "invalid"   // the controller's plan stayed invalid after one repair
	StatusFailed       = "failed"
	StatusClientClosed = "client_closed"
)

// Subtask outcomes (SubtaskRecord.Outcome).
const (
	OutcomePending      = "pending"
	OutcomeOK           = "ok"
	OutcomeFailed       = "failed"
	OutcomeDenied       = "denied"  // its own policy decision refused it
	OutcomeSkipped      = "skipped" // a dependency has no output
	OutcomeClientClosed = "client_closed"
)

// Record is what GET /molly/plans/<id> shows: the plan, its admission,
// and each subtask's tier, target, cost, latency and outcome. It holds the
// plan's instructions (the admin API is the operator's), never in logs.
type Record struct {
	mu sync.Mutex

	ID         string    `json:"id"`
	Created    time.Time `json:"created"`
	Member     string    `json:"member"`
	DecisionID string    `json:"decision_id"` // the client request's decision
	Model      string    `json:"model"`
	Stream     bool      `json:"stream"`
	Triage     string    `json:"triage"` // why the request was orchestrated
	Planner    string    `json:"planner"`
	Status     string    `json:"status"`
	Error      string    `json:"error,omitempty"`
	Plan       *Plan     `json:"plan,omitempty"`
	// PlanErrors are the validation errors of the controller's plan (before
	// a repair, or why it was rejected).
	PlanErrors  []string           `json:"plan_errors,omitempty"`
	Admission   *Admission         `json:"admission,omitempty"`
	Subtasks    []*SubtaskRecord   `json:"subtasks"`
	Refinements []RefinementRecord `json:"refinements,omitempty"`
	Uncertainty *Uncertainty       `json:"uncertainty,omitempty"`
	// CostUSD, PromptTokens and CompletionTokens add up every subtask
	// answer (alternatives and refinements included) and the controller's.
	CostUSD          float64 `json:"cost_usd"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	// LatencyMS is the whole request; CriticalPathMS the subtasks' own
	// latency along the slowest dependency chain (what any executor must
	// wait for); OverheadMS the difference: planning, policy, fusion.
	LatencyMS      float64 `json:"latency_ms"`
	CriticalPathMS float64 `json:"critical_path_ms"`
	OverheadMS     float64 `json:"overhead_ms"`
}

// Admission is the orchestration policy's verdict and the reservation.
type Admission struct {
	Allow      bool     `json:"allow"`
	DecisionID string   `json:"decision_id"`
	Reasons    []string `json:"reasons"`
	Depth      int      `json:"depth"`
	FanOut     int      `json:"fan_out"`
	WorstCase  Cost     `json:"worst_case"`
	Budget     Cost     `json:"budget"`
	Reserved   bool     `json:"reserved"`
}

// Cost is tokens and USD.
type Cost struct {
	Tokens  int     `json:"tokens"`
	CostUSD float64 `json:"cost_usd"`
}

// SubtaskRecord is one subtask's run (its last one, after refinements).
type SubtaskRecord struct {
	ID          string `json:"id"`
	Kind        string `json:"kind"` // model or tool
	Specialist  string `json:"specialist"`
	TierCeiling string `json:"tier_ceiling"`
	// Tier, Target and Model answered (the fused answer's, with
	// alternatives); Tiers are what its own decision allowed.
	Tier        string   `json:"tier,omitempty"`
	Target      string   `json:"target,omitempty"`
	Model       string   `json:"model,omitempty"`
	DecisionID  string   `json:"decision_id,omitempty"`
	Sensitivity string   `json:"sensitivity,omitempty"`
	Tiers       []string `json:"tiers,omitempty"`
	Outcome     string   `json:"outcome"`
	Error       string   `json:"error,omitempty"`
	// CostUSD and the tokens add up every answer it obtained.
	CostUSD          float64             `json:"cost_usd"`
	PromptTokens     int                 `json:"prompt_tokens"`
	CompletionTokens int                 `json:"completion_tokens"`
	Started          time.Time           `json:"started,omitzero"`
	Finished         time.Time           `json:"finished,omitzero"`
	LatencyMS        float64             `json:"latency_ms"`
	Fallbacks        []string            `json:"fallbacks,omitempty"`
	Excluded         []string            `json:"excluded,omitempty"`
	Fusion           string              `json:"fusion,omitempty"`
	Alternatives     []AlternativeRecord `json:"alternatives,omitempty"`
	Refined          int                 `json:"refined,omitempty"`
	OutputTokens     int                 `json:"output_tokens,omitempty"` // estimated tokens of its output
}

// AlternativeRecord is one of a subtask's alternative answers.
type AlternativeRecord struct {
	Target     string  `json:"target"`
	Tier       string  `json:"tier"`
	Model      string  `json:"model"`
	Fused      float64 `json:"fused"`
	Confidence float64 `json:"confidence"`
	Error      string  `json:"error,omitempty"`
}

// RefinementRecord is one round of refinement.
type RefinementRecord struct {
	Round     int      `json:"round"`
	Subtasks  []string `json:"subtasks"`
	Issues    []Issue  `json:"issues"`
	WorstCase Cost     `json:"worst_case"`
}

// Uncertainty annotates an answer the meta-cognition check did not pass:
// why refinement stopped ("budget", "max_refinements", "not_refinable")
// and the issues left.
type Uncertainty struct {
	Stopped string  `json:"stopped"`
	Issues  []Issue `json:"issues"`
}

// Store keeps the last N plan records in memory (a ring), by id. Safe for
// concurrent use.
type Store struct {
	mu    sync.Mutex
	byID  map[string]*Record
	order []string // ring of ids
	next  int
}

// NewStore keeps up to n records (n ≤ 0: DefaultPlansKept).
func NewStore(n int) *Store {
	if n <= 0 {
		n = DefaultPlansKept
	}
	return &Store{byID: make(map[string]*Record, n), order: make([]string, n)}
}

// add keeps r, dropping the oldest record when full.
func (s *Store) add(r *Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.order[s.next]; old != "" {
		delete(s.byID, old)
	}
	s.order[s.next] = r.ID
	s.next = (s.next + 1) % len(s.order)
	s.byID[r.ID] = r
}

// JSON returns the record of plan id as JSON, and whether it is kept.
func (s *Store) JSON(id string) ([]byte, bool) {
	s.mu.Lock()
	r := s.byID[id]
	s.mu.Unlock()
	if r == nil {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := json.Marshal(r)
	return b, err == nil
}

// Summary is one line of the plan listing.
type Summary struct {
	ID      string    `json:"id"`
	Created time.Time `json:"created"`
	Member  string    `json:"member"`
	Status  string    `json:"status"`
	Planner string    `json:"planner"`
}

// List returns the records kept, newest first.
func (s *Store) List() []Summary {
	s.mu.Lock()
	var rs []*Record
	for i := range len(s.order) {
		id := s.order[(s.next-1-i+2*len(s.order))%len(s.order)]
		if r := s.byID[id]; id != "" && r != nil {
			rs = append(rs, r)
		}
	}
	s.mu.Unlock()
	out := make([]Summary, 0, len(rs))
	for _, r := range rs {
		r.mu.Lock()
		out = append(out, Summary{ID: r.ID, Created: r.Created, Member: r.Member, Status: r.Status, Planner: r.Planner})
		r.mu.Unlock()
	}
	return out
}
