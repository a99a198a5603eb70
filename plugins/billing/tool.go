package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/molly-gateway/molly/plugins"
)

// Tool is the billing tool: one tool, several operations chosen by "op".
type Tool struct {
	ledger *Ledger
}

// Args are the tool's arguments (see argsSchema). Token counts are
// integers >= 0; CostNanoUSD is integer nano-USD (1 USD = 10^9); At is an
// RFC 3339 time (default: now); Month is "YYYY-MM", a UTC calendar month.
type Args struct {
	Op               string `json:"op"` // record_usage | invoice | balance | usage
	DecisionID       string `json:"decision_id,omitempty"`
	Member           string `json:"member,omitempty"`
	Model            string `json:"model,omitempty"`
	Tier             string `json:"tier,omitempty"`
	Target           string `json:"target,omitempty"`
	PromptTokens     *int64 `json:"prompt_tokens,omitempty"`
	CompletionTokens *int64 `json:"completion_tokens,omitempty"`
	CostNanoUSD      *int64 `json:"cost_nano_usd,omitempty"`
	At               string `json:"at,omitempty"`
	Month            string `json:"month,omitempty"`
	Format           string `json:"format,omitempty"` // json (default) | csv
}

const argsSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["op"],
  "properties": {
    "op": {"enum": ["record_usage", "invoice", "balance", "usage"],
           "description": "record_usage needs decision_id, member, model, tier, prompt_tokens, completion_tokens, cost_nano_usd (target, at optional) and is idempotent by decision_id; invoice and usage need month (member defaults to the caller; invoice takes format); balance takes member"},
    "decision_id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$", "description": "the gateway decision that used the tokens; the idempotency key of record_usage"},
    "member": {"type": "string", "pattern": "^[A-Za-z0-9_.@-]{1,128}$"},
    "model": {"type": "string", "minLength": 1, "maxLength": 256},
    "tier": {"type": "string", "minLength": 1, "maxLength": 64},
    "target": {"type": "string", "maxLength": 256},
    "prompt_tokens": {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
    "completion_tokens": {"type": "integer", "minimum": 0, "maximum": 9007199254740991},
    "cost_nano_usd": {"type": "integer", "minimum": 0, "maximum": 9007199254740991, "description": "cost in nano-USD: 1 USD = 1000000000"},
    "at": {"type": "string", "format": "date-time", "description": "RFC 3339 time of the event; default now"},
    "month": {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$", "description": "UTC calendar month"},
    "format": {"enum": ["json", "csv"], "description": "invoice only; csv puts CSV text in the csv field"}
  }
}`

const resultSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$defs": {"line": {"type": "object", "required": ["events", "prompt_tokens", "completion_tokens", "cost_nano_usd", "cost_usd"], "properties": {
    "model": {"type": "string"}, "tier": {"type": "string"}, "target": {"type": "string"},
    "events": {"type": "integer"}, "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
    "cost_nano_usd": {"type": "integer"}, "cost_usd": {"type": "string", "description": "decimal USD, nine fractional digits"}}}},
  "type": "object",
  "properties": {
    "usage": {"type": "object", "description": "record_usage: the recorded event", "properties": {
      "decision_id": {"type": "string"}, "member": {"type": "string"}, "model": {"type": "string"}, "tier": {"type": "string"},
      "target": {"type": "string"}, "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
      "cost_nano_usd": {"type": "integer"}, "at": {"type": "integer", "description": "unix ms"}}},
    "invoice": {"type": "object", "properties": {
      "member": {"type": "string"}, "period": {"type": "string"},
      "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "description": "per model and tier"},
      "total": {"$ref": "#/$defs/line"}}},
    "csv": {"type": "string", "description": "invoice with format csv: header member,period,kind,model,tier,events,prompt_tokens,completion_tokens,cost_nano_usd,cost_usd; kind line or total"},
    "member": {"type": "string"},
    "period": {"type": "string"},
    "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "description": "usage: per model, tier and target"},
    "balance": {"$ref": "#/$defs/line", "description": "balance: everything charged to the member to date"}
  }
}`

// Invoice is a member's bill for one month: a line per (model, tier),
// sorted, and their total. Empty months have no lines and a zero total.
type Invoice struct {
	Member string `json:"member"`
	Period string `json:"period"` // YYYY-MM
	Lines  []Line `json:"lines"`
	Total  Line   `json:"total"`
}

// Result is the tool's result; which fields are set depends on the op.
type Result struct {
	Usage   *Usage   `json:"usage,omitempty"`
	Invoice *Invoice `json:"invoice,omitempty"`
	CSV     string   `json:"csv,omitempty"`
	Member  string   `json:"member,omitempty"`
	Period  string   `json:"period,omitempty"`
	Lines   []Line   `json:"lines,omitempty"`
	Balance *Line    `json:"balance,omitempty"`
}

// Describe implements plugins.Tool.
func (t *Tool) Describe(context.Context) (plugins.Description, error) {
	return plugins.Description{
		Name:         "billing",
		Description:  "Record the gateway's usage events (idempotent by decision id) and answer invoice, balance and usage questions per member; costs in integer nano-USD.",
		ArgsSchema:   json.RawMessage(argsSchema),
		ResultSchema: json.RawMessage(resultSchema),
		SideEffect:   plugins.Write,
	}, nil
}

var (
	memberRE   = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,128}$`)
	decisionRE = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
)

// maxCount is the largest token count or nano-USD cost accepted: 2^53-1,
// so every number survives a JSON number in any client.
const maxCount = 1<<53 - 1

// Invoke implements plugins.Tool. Errors are *plugins.ToolError:
// invalid_argument (bad args, no caller, an idempotency key other than the
// decision id), conflict (a decision id recorded with other arguments),
// internal (storage).
func (t *Tool) Invoke(ctx context.Context, inv plugins.Invocation) (json.RawMessage, error) {
	var a Args
	if err := plugins.DecodeArgs(inv, &a); err != nil {
		return nil, err
	}
	switch a.Op {
	case "record_usage":
		return t.record(ctx, inv, a)
	case "invoice", "balance", "usage":
	default:
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "op %q must be record_usage, invoice, balance or usage", a.Op)
	}
	if a.DecisionID != "" || a.Model != "" || a.Tier != "" || a.Target != "" || a.PromptTokens != nil || a.CompletionTokens != nil || a.CostNanoUSD != nil || a.At != "" {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "%s takes only member, month and format", a.Op)
	}
	// Who may read whose bill is for tools.rego to decide (by args.member).
	member := a.Member
	if member == "" {
		member = inv.Caller.Member
	}
	if !memberRE.MatchString(member) {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "member %q must match %s", member, memberRE)
	}
	if a.Format != "" && (a.Op != "invoice" || (a.Format != "json" && a.Format != "csv")) {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "format %q: only invoice takes a format, json or csv", a.Format)
	}
	if a.Op == "balance" {
		if a.Month != "" {
			return nil, plugins.Errorf(plugins.CodeInvalidArgument, "balance takes no month: it is the total to date")
		}
		lines, err := t.ledger.Aggregate(ctx, member, 0, 1<<62)
		if err != nil {
			return nil, err
		}
		return json.Marshal(Result{Member: member, Balance: &lines[0]})
	}
	m, err := time.Parse("2006-01", a.Month)
	if err != nil {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "month %q must be YYYY-MM", a.Month)
	}
	from, to := m.UnixMilli(), m.AddDate(0, 1, 0).UnixMilli()
	if a.Op == "usage" {
		lines, err := t.ledger.Aggregate(ctx, member, from, to, "model", "tier", "target")
		if err != nil {
			return nil, err
		}
		return json.Marshal(Result{Member: member, Period: a.Month, Lines: lines})
	}
	lines, err := t.ledger.Aggregate(ctx, member, from, to, "model", "tier")
	if err != nil {
		return nil, err
	}
	total, err := t.ledger.Aggregate(ctx, member, from, to)
	if err != nil {
		return nil, err
	}
	invc := &Invoice{Member: member, Period: a.Month, Lines: lines, Total: total[0]}
	if a.Format == "csv" {
		return json.Marshal(Result{CSV: invoiceCSV(invc)})
	}
	return json.Marshal(Result{Invoice: invc})
}

// record stores one usage event for a.Member, whoever the caller is: only
// the gateway's own identity should be allowed record_usage (tools.rego),
// and the op is never offered to a model. The decision id is the idempotency key:
// the gateway makes one decision per request, so a retried record of the
// same decision returns the first result and books nothing more.
func (t *Tool) record(ctx context.Context, inv plugins.Invocation, a Args) (json.RawMessage, error) {
	if !decisionRE.MatchString(a.DecisionID) {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "decision_id %q must match %s", a.DecisionID, decisionRE)
	}
	if inv.IdempotencyKey != "" && inv.IdempotencyKey != a.DecisionID {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "record_usage is idempotent by decision_id; idempotency key %q must be empty or %q", inv.IdempotencyKey, a.DecisionID)
	}
	if !memberRE.MatchString(a.Member) {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "member %q must match %s", a.Member, memberRE)
	}
	for _, f := range []struct {
		name     string
		v        string
		min, max int
	}{{"model", a.Model, 1, 256}, {"tier", a.Tier, 1, 64}, {"target", a.Target, 0, 256}} {
		if n := utf8.RuneCountInString(f.v); n < f.min || n > f.max || !utf8.ValidString(f.v) {
			return nil, plugins.Errorf(plugins.CodeInvalidArgument, "%s must be %d..%d characters of UTF-8", f.name, f.min, f.max)
		}
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"prompt_tokens", a.PromptTokens}, {"completion_tokens", a.CompletionTokens}, {"cost_nano_usd", a.CostNanoUSD}} {
		if f.v == nil || *f.v < 0 || *f.v > maxCount {
			return nil, plugins.Errorf(plugins.CodeInvalidArgument, "%s must be an integer 0..%d", f.name, int64(maxCount))
		}
	}
	if a.Month != "" || a.Format != "" {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "record_usage takes no month or format")
	}
	u := &Usage{DecisionID: a.DecisionID, Member: a.Member, Model: a.Model, Tier: a.Tier, Target: a.Target,
		PromptTokens: *a.PromptTokens, CompletionTokens: *a.CompletionTokens, CostNanoUSD: *a.CostNanoUSD}
	if a.At != "" {
		at, err := time.Parse(time.RFC3339Nano, a.At)
		if err != nil || at.Before(time.Unix(0, 0)) {
			return nil, plugins.Errorf(plugins.CodeInvalidArgument, "at %q must be an RFC 3339 time after 1970", a.At)
		}
		u.At = at.UnixMilli()
	}
	canon, _ := json.Marshal(a) // struct order: a canonical form of the arguments
	h := sha256.Sum256(canon)
	reqHash := hex.EncodeToString(h[:])
	return t.ledger.Idempotent(ctx, inv.Caller.Member, a.DecisionID, reqHash, func(tx *sql.Tx) (any, error) {
		if a.At == "" {
			u.At = t.ledger.now().UnixMilli()
		}
		if err := t.ledger.InsertUsage(ctx, tx, u, inv.Caller.Member); err != nil {
			return nil, err
		}
		return Result{Usage: u}, nil
	})
}

// invoiceCSV renders in as RFC 4180 CSV: a header, one "line" row per
// invoice line and a "total" row.
func invoiceCSV(in *Invoice) string {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	row := func(kind string, l Line) []string {
		return []string{in.Member, in.Period, kind, l.Model, l.Tier, strconv.FormatInt(l.Events, 10),
			strconv.FormatInt(l.PromptTokens, 10), strconv.FormatInt(l.CompletionTokens, 10),
			strconv.FormatInt(l.CostNanoUSD, 10), l.CostUSD}
	}
	_ = w.Write([]string{"member", "period", "kind", "model", "tier", "events", "prompt_tokens", "completion_tokens", "cost_nano_usd", "cost_usd"})
	for _, l := range in.Lines {
		_ = w.Write(row("line", l))
	}
	_ = w.Write(row("total", in.Total))
	w.Flush() // writes to a bytes.Buffer cannot fail
	return b.String()
}

var _ plugins.Tool = (*Tool)(nil)
