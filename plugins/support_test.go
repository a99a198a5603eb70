package plugins_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/molly-gateway/molly/plugins"
)

// ticket mirrors the support tool's Ticket, without the times.
type ticket struct {
	ID             string `json:"id"`
	Requester      string `json:"requester"`
	Subject        string `json:"subject"`
	Body           string `json:"body"`
	Status         string `json:"status"`
	Assignee       string `json:"assignee"`
	ConversationID string `json:"conversation_id"`
	DecisionID     string `json:"decision_id"`
	Comments       int    `json:"comments"`
}

type comment struct {
	Ticket string `json:"ticket"`
	Author string `json:"author"`
	Body   string `json:"body"`
}

type supportResult struct {
	Ticket   *ticket   `json:"ticket"`
	Comment  *comment  `json:"comment"`
	Comments []comment `json:"comments"`
	Tickets  []ticket  `json:"tickets"`
}

func supportManager(t *testing.T) *plugins.Manager {
	return newManager(t, plugins.Config{Name: "support", Path: supportBin, SHA256: supportSum,
		Env: map[string]string{"MOLLY_SUPPORT_DB": t.TempDir() + "/support.db"}})
}

func support(t *testing.T, m *plugins.Manager, member, key string, args map[string]any) (supportResult, json.RawMessage, error) {
	t.Helper()
	raw, err := invokeAs(t, m, "support", member, key, args)
	var r supportResult
	if err == nil {
		if jerr := json.Unmarshal(raw, &r); jerr != nil {
			t.Fatalf("result %s: %v", raw, jerr)
		}
	}
	return r, raw, err
}

func TestATicketGoesThroughItsLifecycle(t *testing.T) {
	m := supportManager(t)
	create := map[string]any{"op": "create", "subject": "Invoice looks wrong", "body": "November is twice October.",
		"conversation_id": "conv-42", "decision_id": "dec-7"}
	r, first, err := support(t, m, "alice", "create-1", create)
	if err != nil {
		t.Fatal(err)
	}
	id := r.Ticket.ID
	want := ticket{ID: id, Requester: "alice", Subject: "Invoice looks wrong", Body: "November is twice October.", Status: "open",
		ConversationID: "conv-42", DecisionID: "dec-7"}
	if *r.Ticket != want {
		t.Fatalf("created %+v, want %+v", *r.Ticket, want)
	}
	if _, again, err := support(t, m, "alice", "create-1", create); err != nil || string(again) != string(first) {
		t.Fatalf("the retried create gave %s, %v; want the first result %s", again, err, first)
	}

	steps := []struct {
		name     string
		member   string
		key      string
		args     map[string]any
		code     string // a tool error, or "" for success
		status   string // the ticket's status after the step
		assignee string
		comments int
	}{
		{"assigning the ticket sets its assignee", "dana", "s1",
			map[string]any{"op": "assign", "ticket_id": id, "assignee": "dana"}, "", "open", "dana", 0},
		{"a comment is counted on the ticket", "dana", "s2",
			map[string]any{"op": "comment", "ticket_id": id, "body": "Looking into it."}, "", "open", "dana", 1},
		{"an open ticket can wait on the requester", "dana", "s3",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "pending"}, "", "pending", "dana", 1},
		{"a retried status change with the same key changes nothing more", "dana", "s3",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "pending"}, "", "pending", "dana", 1},
		{"a pending ticket can be solved", "dana", "s4",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "solved"}, "", "solved", "dana", 1},
		{"a solved ticket cannot go back to pending", "dana", "s5",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "pending"}, plugins.CodeFailedPrecondition, "solved", "dana", 1},
		{"a solved ticket can be reopened", "alice", "s6",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "open"}, "", "open", "dana", 1},
		{"a ticket cannot move to the status it has", "alice", "s7",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "open"}, plugins.CodeFailedPrecondition, "open", "dana", 1},
		{"an empty assignee unassigns the ticket", "dana", "s8",
			map[string]any{"op": "assign", "ticket_id": id, "assignee": ""}, "", "open", "", 1},
		{"an open ticket can be closed", "dana", "s9",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "closed"}, "", "closed", "", 1},
		{"a closed ticket cannot be reopened", "alice", "s10",
			map[string]any{"op": "update_status", "ticket_id": id, "status": "open"}, plugins.CodeFailedPrecondition, "closed", "", 1},
		{"a closed ticket takes no comment", "alice", "s11",
			map[string]any{"op": "comment", "ticket_id": id, "body": "Still wrong."}, plugins.CodeFailedPrecondition, "closed", "", 1},
		{"a closed ticket cannot be assigned", "dana", "s12",
			map[string]any{"op": "assign", "ticket_id": id, "assignee": "dana"}, plugins.CodeFailedPrecondition, "closed", "", 1},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			_, raw, err := support(t, m, s.member, s.key, s.args)
			if s.code != "" {
				if !isCode(err, s.code) {
					t.Fatalf("got %s, %v; want a %s tool error", raw, err, s.code)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			g, _, err := support(t, m, "alice", "", map[string]any{"op": "get", "ticket_id": id})
			if err != nil {
				t.Fatal(err)
			}
			if g.Ticket.Status != s.status || g.Ticket.Assignee != s.assignee || g.Ticket.Comments != s.comments {
				t.Errorf("ticket %s, assignee %q, %d comments; want %s, %q, %d", g.Ticket.Status, g.Ticket.Assignee, g.Ticket.Comments,
					s.status, s.assignee, s.comments)
			}
		})
	}
	g, _, err := support(t, m, "alice", "", map[string]any{"op": "get", "ticket_id": id})
	if err != nil {
		t.Fatal(err)
	}
	if want := []comment{{Ticket: id, Author: "dana", Body: "Looking into it."}}; !reflect.DeepEqual(g.Comments, want) {
		t.Errorf("comments %+v, want %+v", g.Comments, want)
	}
}

func TestTicketsAreListedByStatusAssigneeAndLinks(t *testing.T) {
	m := supportManager(t)
	ids := map[string]string{}
	for _, c := range []struct {
		member, key, subject, conv, dec string
	}{
		{"alice", "a", "first", "conv-1", "dec-1"},
		{"bob", "b", "second", "conv-1", "dec-2"},
		{"alice", "c", "third", "", ""},
	} {
		args := map[string]any{"op": "create", "subject": c.subject}
		if c.conv != "" {
			args["conversation_id"], args["decision_id"] = c.conv, c.dec
		}
		r, raw, err := support(t, m, c.member, c.key, args)
		if err != nil {
			t.Fatalf("creating %s: %s, %v", c.subject, raw, err)
		}
		ids[c.subject] = r.Ticket.ID
	}
	// The same key from another member is another ticket: keys are per member.
	if r, _, err := support(t, m, "bob", "a", map[string]any{"op": "create", "subject": "fourth"}); err != nil || r.Ticket.ID == ids["first"] {
		t.Fatalf("bob's create with alice's key gave %+v, %v; want a new ticket", r.Ticket, err)
	}
	if _, raw, err := support(t, m, "dana", "x", map[string]any{"op": "assign", "ticket_id": ids["second"], "assignee": "dana"}); err != nil {
		t.Fatalf("assign: %s, %v", raw, err)
	}
	if _, raw, err := support(t, m, "dana", "y", map[string]any{"op": "update_status", "ticket_id": ids["third"], "status": "solved"}); err != nil {
		t.Fatalf("solve: %s, %v", raw, err)
	}
	cases := []struct {
		name   string
		filter map[string]any
		want   []string // subjects, in creation order
	}{
		{"no filter lists every ticket oldest first", map[string]any{}, []string{"first", "second", "third", "fourth"}},
		{"a status filter lists only that status", map[string]any{"status": "open"}, []string{"first", "second", "fourth"}},
		{"a requester filter lists that member's tickets", map[string]any{"requester": "alice"}, []string{"first", "third"}},
		{"an assignee filter lists what that member is assigned", map[string]any{"assignee": "dana"}, []string{"second"}},
		{"a conversation filter lists the tickets about it", map[string]any{"conversation_id": "conv-1"}, []string{"first", "second"}},
		{"a decision filter lists the tickets about it", map[string]any{"decision_id": "dec-2"}, []string{"second"}},
		{"filters combine", map[string]any{"conversation_id": "conv-1", "requester": "bob"}, []string{"second"}},
		{"a limit keeps the oldest", map[string]any{"limit": 2}, []string{"first", "second"}},
		{"a filter matching nothing lists nothing", map[string]any{"status": "closed"}, []string{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := map[string]any{"op": "list"}
			for k, v := range c.filter {
				args[k] = v
			}
			r, raw, err := support(t, m, "alice", "", args)
			if err != nil {
				t.Fatal(err)
			}
			got := []string{}
			for _, tk := range r.Tickets {
				got = append(got, tk.Subject)
			}
			if !reflect.DeepEqual(got, c.want) || r.Tickets == nil {
				t.Errorf("listed %s, want subjects %q", raw, c.want)
			}
		})
	}
}

func TestSupportRefusesBadCalls(t *testing.T) {
	m := supportManager(t)
	r, _, err := support(t, m, "alice", "c", map[string]any{"op": "create", "subject": "help"})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Ticket.ID
	cases := []struct {
		name string
		key  string
		args map[string]any
		code string
	}{
		{"a create without an idempotency key is refused", "", map[string]any{"op": "create", "subject": "x"}, plugins.CodeInvalidArgument},
		{"a comment without an idempotency key is refused", "", map[string]any{"op": "comment", "ticket_id": id, "body": "x"}, plugins.CodeInvalidArgument},
		{"a key reused with other arguments is a conflict", "c", map[string]any{"op": "create", "subject": "other"}, plugins.CodeConflict},
		{"a blank subject is refused", "k1", map[string]any{"op": "create", "subject": "  "}, plugins.CodeInvalidArgument},
		{"an unknown status is refused", "k2", map[string]any{"op": "update_status", "ticket_id": id, "status": "reopened"}, plugins.CodeInvalidArgument},
		{"an argument the op does not take is refused", "k3", map[string]any{"op": "comment", "ticket_id": id, "body": "x", "status": "open"}, plugins.CodeInvalidArgument},
		{"an unknown argument is refused", "k4", map[string]any{"op": "create", "subject": "x", "priority": "high"}, plugins.CodeInvalidArgument},
		{"a malformed ticket id is refused", "k5", map[string]any{"op": "get", "ticket_id": "42"}, plugins.CodeInvalidArgument},
		{"an unknown ticket is not found", "k6", map[string]any{"op": "comment", "ticket_id": "tk_000000000000000000000000", "body": "x"}, plugins.CodeNotFound},
		{"a malformed decision link is refused", "k7", map[string]any{"op": "create", "subject": "x", "decision_id": "a b"}, plugins.CodeInvalidArgument},
		{"an unknown op is refused", "k8", map[string]any{"op": "delete", "ticket_id": id}, plugins.CodeInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, raw, err := support(t, m, "alice", c.key, c.args); !isCode(err, c.code) {
				t.Errorf("got %s, %v; want a %s tool error", raw, err, c.code)
			}
		})
	}
	l, _, err := support(t, m, "alice", "", map[string]any{"op": "list"})
	if err != nil || len(l.Tickets) != 1 || l.Tickets[0].Comments != 0 {
		t.Errorf("after refused calls only: %+v, %v; want the one ticket, no comments", l.Tickets, err)
	}
}
