package registry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestStoredResponsesBelongToTheirMember(t *testing.T) {
	ctx := context.Background()
	path := locate(t)
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := StoredResponse{ID: "resp_1", Member: "ana", Model: "chat", Messages: []byte(`[{"role":"user","content":"hi"}]`), Response: []byte(`{"id":"resp_1"}`)}
	if err := r.PutResponse(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := r.PutResponse(ctx, s); err == nil {
		t.Fatal("the same id stored twice")
	}
	if err := r.PutResponse(ctx, StoredResponse{ID: "resp_2", Member: "ana", Messages: []byte(`{}`)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("messages that are no array: %v", err)
	}
	if _, err := r.Response(ctx, "resp_1", "bo"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another member's response: %v", err)
	}
	if _, err := r.Response(ctx, "resp_9", "ana"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("an unknown response: %v", err)
	}
	// It survives a reopen: committed before PutResponse returned.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if r, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, err := r.Response(ctx, "resp_1", "ana")
	if err != nil || string(got.Messages) != string(s.Messages) || got.Model != "chat" || got.Created.IsZero() {
		t.Fatalf("got %+v, %v", got, err)
	}
}

func TestStoredResponsesExpire(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r, err := Open(locate(t), Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	msgs := []byte(`[]`)
	if err := r.PutResponse(ctx, StoredResponse{ID: "resp_old", Member: "ana", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(ResponseRetention + time.Second)
	if _, err := r.Response(ctx, "resp_old", "ana"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a response past the retention: %v", err)
	}
	if err := r.PutResponse(ctx, StoredResponse{ID: "resp_new", Member: "ana", Messages: msgs}); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := r.db.QueryRow(`SELECT COUNT(*) FROM responses`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d rows after storing past the retention (%v): the old one stays", n, err)
	}
}
