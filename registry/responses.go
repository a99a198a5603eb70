package registry

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ResponseRetention is how long a stored response can be continued, as
// in OpenAI's API (30 days); older ones are deleted as new ones are stored.
const ResponseRetention = 30 * 24 * time.Hour

// StoredResponse is a response of the Responses API (POST /v1/responses)
// kept so that a later request may continue it (previous_response_id).
type StoredResponse struct {
	ID         string // "resp_…"
	Member     string // who made it; only they may continue it
	Model      string // the client's model name
	DecisionID string
	// Messages is the conversation as chat messages (a JSON array), the
	// answer last, without the request's instructions (they are not
	// carried over, as in OpenAI's API).
	Messages []byte
	// Response is the Response object sent to the client (JSON).
	Response []byte
	Created  time.Time
}

// PutResponse stores s, committed before it returns, and deletes the
// responses older than ResponseRetention in the same transaction. Errors:
// ErrInvalid for an empty id or member, or messages that are not a JSON
// array; a response id stored before.
func (r *Registry) PutResponse(ctx context.Context, s StoredResponse) error {
	if s.ID == "" || s.Member == "" || len(s.Messages) == 0 || s.Messages[0] != '[' {
		return fmt.Errorf("registry: stored response: id, member and a messages array are required: %w", ErrInvalid)
	}
	if s.Created.IsZero() {
		s.Created = r.now()
	}
	err := r.txq(ctx, func(q q) error {
		if _, err := q.exec(`DELETE FROM responses WHERE created < ?`, ms(r.now().Add(-ResponseRetention))); err != nil {
			return err
		}
		_, err := q.exec(`INSERT INTO responses (id, member, model, decision_id, messages, response, created) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			s.ID, s.Member, s.Model, s.DecisionID, string(s.Messages), string(s.Response), ms(s.Created))
		return err
	})
	if err != nil {
		return fmt.Errorf("registry: storing response %s: %w", s.ID, err)
	}
	return nil
}

// DeleteResponse deletes the stored response id of member. Errors:
// ErrNotFound when there is none, it is older than ResponseRetention, or
// it is another member's (not told apart, as Response does).
func (r *Registry) DeleteResponse(ctx context.Context, id, member string) error {
	res, err := r.exec(ctx, `DELETE FROM responses WHERE id = ? AND member = ? AND created >= ?`, id, member, ms(r.now().Add(-ResponseRetention)))
	if err != nil {
		return fmt.Errorf("registry: deleting response %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("registry: deleting response %s: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("response %s: %w", id, ErrNotFound)
	}
	return nil
}

// Response returns the stored response id of member. Errors: ErrNotFound
// when there is none, it is older than ResponseRetention, or it is another
// member's (which is not told apart, so ids cannot be probed).
func (r *Registry) Response(ctx context.Context, id, member string) (StoredResponse, error) {
	s := StoredResponse{ID: id}
	var messages, response string
	var created int64
	err := r.row(ctx, `SELECT member, model, decision_id, messages, response, created FROM responses WHERE id = ?`, id).
		Scan(&s.Member, &s.Model, &s.DecisionID, &messages, &response, &created)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return StoredResponse{}, fmt.Errorf("response %s: %w", id, ErrNotFound)
	case err != nil:
		return StoredResponse{}, fmt.Errorf("registry: response %s: %w", id, err)
	case s.Member != member || created < ms(r.now().Add(-ResponseRetention)):
		return StoredResponse{}, fmt.Errorf("response %s: %w", id, ErrNotFound)
	}
	s.Messages, s.Response, s.Created = []byte(messages), []byte(response), fromMS(created)
	return s, nil
}
