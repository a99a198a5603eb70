package app

import (
	"context"
	"errors"

	"github.com/molly-gateway/molly/registry"
	"github.com/molly-gateway/molly/router/translate"
)

// responseStore keeps Responses API responses in the registry.
type responseStore struct{ reg *registry.Registry }

func (s responseStore) PutResponse(ctx context.Context, r translate.StoredResponse) error {
	return s.reg.PutResponse(ctx, registry.StoredResponse{ID: r.ID, Member: r.Member, Model: r.Model, DecisionID: r.DecisionID,
		Messages: r.Messages, Response: r.Response, Created: r.Created})
}

func (s responseStore) Response(ctx context.Context, id, member string) (translate.StoredResponse, error) {
	r, err := s.reg.Response(ctx, id, member)
	if errors.Is(err, registry.ErrNotFound) {
		return translate.StoredResponse{}, translate.ErrNotFound
	}
	if err != nil {
		return translate.StoredResponse{}, err
	}
	return translate.StoredResponse{ID: r.ID, Member: r.Member, Model: r.Model, DecisionID: r.DecisionID,
		Messages: r.Messages, Response: r.Response, Created: r.Created}, nil
}

func (s responseStore) DeleteResponse(ctx context.Context, id, member string) error {
	err := s.reg.DeleteResponse(ctx, id, member)
	if errors.Is(err, registry.ErrNotFound) {
		return translate.ErrNotFound
	}
	return err
}

// Responses is where the Responses API keeps responses (the registry).
func (a *App) Responses() translate.Store { return responseStore{a.registry} }
