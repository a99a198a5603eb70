package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/molly-gateway/molly/plugins"
)

// Tool is the support tool: one tool, several operations chosen by "op".
type Tool struct {
	store *Store
}

// Args are the tool's arguments (see argsSchema). Body is the ticket's
// description on create and the comment's text on comment.
type Args struct {
	Op             string `json:"op"` // create | get | list | comment | update_status | assign
	TicketID       string `json:"ticket_id,omitempty"`
	Subject        string `json:"subject,omitempty"`
	Body           string `json:"body,omitempty"`
	Status         string `json:"status,omitempty"`
	Assignee       string `json:"assignee,omitempty"`
	Requester      string `json:"requester,omitempty"`
	ConversationID string `json:"conversation_id,omitempty"`
	DecisionID     string `json:"decision_id,omitempty"`
	Limit          int    `json:"limit,omitempty"`
}

const argsSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "required": ["op"],
  "properties": {
    "op": {"enum": ["create", "get", "list", "comment", "update_status", "assign"],
           "description": "create needs subject (body, conversation_id, decision_id optional); get needs ticket_id; list filters by status, requester, assignee, conversation_id, decision_id (limit 1..500, default 100); comment needs ticket_id and body; update_status needs ticket_id and status; assign needs ticket_id and assignee (empty unassigns). create, comment, update_status and assign need an idempotency key"},
    "ticket_id": {"type": "string", "pattern": "^tk_[0-9a-f]{24}$"},
    "subject": {"type": "string", "minLength": 1, "maxLength": 200},
    "body": {"type": "string", "maxLength": 20000},
    "status": {"enum": ["open", "pending", "solved", "closed"],
               "description": "transitions: open→pending|solved|closed, pending→open|solved|closed, solved→open|closed; closed is final"},
    "assignee": {"type": "string", "pattern": "^([A-Za-z0-9_.@-]{1,128})?$"},
    "requester": {"type": "string", "pattern": "^[A-Za-z0-9_.@-]{1,128}$"},
    "conversation_id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
    "decision_id": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
    "limit": {"type": "integer", "minimum": 1, "maximum": 500}
  }
}`

const resultSchema = `{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "$defs": {"ticket": {"type": "object", "required": ["id", "requester", "subject", "status", "comments", "created", "updated"], "properties": {
      "id": {"type": "string"}, "requester": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"},
      "status": {"enum": ["open", "pending", "solved", "closed"]}, "assignee": {"type": "string"},
      "conversation_id": {"type": "string"}, "decision_id": {"type": "string"}, "comments": {"type": "integer"},
      "created": {"type": "integer", "description": "unix ms"}, "updated": {"type": "integer", "description": "unix ms"}}},
    "comment": {"type": "object", "properties": {"id": {"type": "integer"}, "ticket": {"type": "string"},
      "author": {"type": "string"}, "body": {"type": "string"}, "created": {"type": "integer", "description": "unix ms"}}}},
  "type": "object",
  "properties": {
    "ticket": {"$ref": "#/$defs/ticket"},
    "comment": {"$ref": "#/$defs/comment"},
    "comments": {"type": "array", "items": {"$ref": "#/$defs/comment"}},
    "tickets": {"type": "array", "items": {"$ref": "#/$defs/ticket"}}
  }
}`

// Result is the tool's result; which fields are set depends on the op.
type Result struct {
	Ticket   *Ticket   `json:"ticket,omitempty"`
	Comment  *Comment  `json:"comment,omitempty"`
	Comments []Comment `json:"comments,omitempty"`
	Tickets  *[]Ticket `json:"tickets,omitempty"` // list: present, possibly empty
}

// Describe implements plugins.Tool.
func (t *Tool) Describe(context.Context) (plugins.Description, error) {
	return plugins.Description{
		Name:         "support",
		Description:  "Customer-support tickets: create, get, list, comment, update status (open, pending, solved, closed) and assign; tickets may link a conversation and a decision id. Every change needs an idempotency key.",
		ArgsSchema:   json.RawMessage(argsSchema),
		ResultSchema: json.RawMessage(resultSchema),
		SideEffect:   plugins.Write,
	}, nil
}

var (
	memberRE = regexp.MustCompile(`^[A-Za-z0-9_.@-]{1,128}$`)
	linkRE   = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
	ticketRE = regexp.MustCompile(`^tk_[0-9a-f]{24}$`)
)

// transitions lists the statuses each status may move to. A solved ticket
// can be reopened; a closed one is final (reopening means a new ticket).
var transitions = map[string][]string{
	"open":    {"pending", "solved", "closed"},
	"pending": {"open", "solved", "closed"},
	"solved":  {"open", "closed"},
	"closed":  {},
}

// fields lists the arguments each op takes besides op.
var fields = map[string][]string{
	"create":        {"subject", "body", "conversation_id", "decision_id"},
	"get":           {"ticket_id"},
	"list":          {"status", "requester", "assignee", "conversation_id", "decision_id", "limit"},
	"comment":       {"ticket_id", "body"},
	"update_status": {"ticket_id", "status"},
	"assign":        {"ticket_id", "assignee"},
}

// Invoke implements plugins.Tool. Errors are *plugins.ToolError:
// invalid_argument (bad args, an argument the op does not take, a change
// without an idempotency key, no caller), not_found (unknown ticket),
// failed_precondition (a transition the lifecycle forbids, a change to a
// closed ticket), conflict (idempotency key reused with other arguments),
// internal (storage). Who may read or change which tickets is for
// tools.rego to decide (by args.op); the tool records the caller as
// requester, author or actor.
func (t *Tool) Invoke(ctx context.Context, inv plugins.Invocation) (json.RawMessage, error) {
	var a Args
	if err := plugins.DecodeArgs(inv, &a); err != nil {
		return nil, err
	}
	allowed, ok := fields[a.Op]
	if !ok {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "op %q must be create, get, list, comment, update_status or assign", a.Op)
	}
	var present map[string]json.RawMessage
	_ = json.Unmarshal(inv.Args, &present) // decoded above, so an object
	var extra []string
	for k := range present {
		if k != "op" && !slices.Contains(allowed, k) {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "%s does not take %s", a.Op, strings.Join(extra, ", "))
	}
	if err := validate(a); err != nil {
		return nil, err
	}
	switch a.Op {
	case "get":
		tk, err := t.store.GetTicket(ctx, t.store.db, a.TicketID)
		if err != nil {
			return nil, err
		}
		cs, err := t.store.Comments(ctx, t.store.db, a.TicketID)
		if err != nil {
			return nil, err
		}
		return json.Marshal(Result{Ticket: tk, Comments: cs})
	case "list":
		limit := a.Limit
		if limit == 0 {
			limit = 100
		}
		ts, err := t.store.List(ctx, Filter{Status: a.Status, Requester: a.Requester, Assignee: a.Assignee,
			ConversationID: a.ConversationID, DecisionID: a.DecisionID, Limit: limit})
		if err != nil {
			return nil, err
		}
		return json.Marshal(Result{Tickets: &ts})
	}
	if inv.IdempotencyKey == "" {
		return nil, plugins.Errorf(plugins.CodeInvalidArgument, "op %s changes tickets and needs an idempotency key", a.Op)
	}
	canon, _ := json.Marshal(a) // struct order: a canonical form of the arguments
	h := sha256.Sum256(canon)
	reqHash := hex.EncodeToString(h[:])
	member := inv.Caller.Member
	return t.store.Idempotent(ctx, member, inv.IdempotencyKey, reqHash, func(tx *sql.Tx) (any, error) {
		if a.Op == "create" {
			return t.create(ctx, tx, member, a)
		}
		tk, err := t.store.GetTicket(ctx, tx, a.TicketID)
		if err != nil {
			return nil, err
		}
		if tk.Status == "closed" {
			return nil, plugins.Errorf(plugins.CodeFailedPrecondition, "ticket %s is closed; open a new one", tk.ID)
		}
		switch a.Op {
		case "comment":
			c := &Comment{Ticket: tk.ID, Author: member, Body: a.Body}
			if err := t.store.InsertComment(ctx, tx, c); err != nil {
				return nil, err
			}
			tk.Comments++
			tk.Updated = c.Created
			return Result{Ticket: tk, Comment: c}, nil
		case "update_status":
			if !slices.Contains(transitions[tk.Status], a.Status) {
				return nil, plugins.Errorf(plugins.CodeFailedPrecondition, "ticket %s cannot go from %s to %s (allowed: %s)",
					tk.ID, tk.Status, a.Status, strings.Join(transitions[tk.Status], ", "))
			}
			tk.Status = a.Status
		case "assign":
			tk.Assignee = a.Assignee
		}
		if err := t.store.UpdateTicket(ctx, tx, tk); err != nil {
			return nil, err
		}
		return Result{Ticket: tk}, nil
	})
}

// validate checks the shapes of the arguments the op takes (fields has
// already refused the others).
func validate(a Args) error {
	bad := func(name, v string, re *regexp.Regexp) error {
		return plugins.Errorf(plugins.CodeInvalidArgument, "%s %q must match %s", name, v, re)
	}
	switch a.Op {
	case "get", "comment", "update_status", "assign":
		if !ticketRE.MatchString(a.TicketID) {
			return bad("ticket_id", a.TicketID, ticketRE)
		}
	}
	switch a.Op {
	case "create":
		if n := utf8.RuneCountInString(a.Subject); n < 1 || n > 200 || strings.TrimSpace(a.Subject) == "" {
			return plugins.Errorf(plugins.CodeInvalidArgument, "subject must be 1..200 characters, not blank")
		}
	case "comment":
		if strings.TrimSpace(a.Body) == "" {
			return plugins.Errorf(plugins.CodeInvalidArgument, "comment needs a body")
		}
	case "update_status":
		if _, ok := transitions[a.Status]; !ok {
			return plugins.Errorf(plugins.CodeInvalidArgument, "status %q must be open, pending, solved or closed", a.Status)
		}
	case "assign":
		if a.Assignee != "" && !memberRE.MatchString(a.Assignee) {
			return bad("assignee", a.Assignee, memberRE)
		}
	case "list":
		if a.Status != "" {
			if _, ok := transitions[a.Status]; !ok {
				return plugins.Errorf(plugins.CodeInvalidArgument, "status %q must be open, pending, solved or closed", a.Status)
			}
		}
		for _, f := range []struct{ name, v string }{{"requester", a.Requester}, {"assignee", a.Assignee}} {
			if f.v != "" && !memberRE.MatchString(f.v) {
				return bad(f.name, f.v, memberRE)
			}
		}
		if a.Limit < 0 || a.Limit > 500 {
			return plugins.Errorf(plugins.CodeInvalidArgument, "limit %d must be 1..500", a.Limit)
		}
	}
	if utf8.RuneCountInString(a.Body) > 20000 || !utf8.ValidString(a.Body) || !utf8.ValidString(a.Subject) {
		return plugins.Errorf(plugins.CodeInvalidArgument, "subject and body must be UTF-8, body at most 20000 characters")
	}
	for _, f := range []struct{ name, v string }{{"conversation_id", a.ConversationID}, {"decision_id", a.DecisionID}} {
		if f.v != "" && !linkRE.MatchString(f.v) {
			return bad(f.name, f.v, linkRE)
		}
	}
	return nil
}

func (t *Tool) create(ctx context.Context, tx *sql.Tx, member string, a Args) (any, error) {
	var id [12]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, internal(err)
	}
	tk := &Ticket{ID: "tk_" + hex.EncodeToString(id[:]), Requester: member, Subject: a.Subject, Body: a.Body, Status: "open",
		ConversationID: a.ConversationID, DecisionID: a.DecisionID}
	if err := t.store.InsertTicket(ctx, tx, tk); err != nil {
		return nil, err
	}
	return Result{Ticket: tk}, nil
}

var _ plugins.Tool = (*Tool)(nil)
