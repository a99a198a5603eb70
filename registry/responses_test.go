package registry

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
)

func TestStoredResponsesBelongToTheirMember(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "molly.db")
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
