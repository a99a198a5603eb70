package federation

import "context"

type peerKey struct{}

func contextWithPeer(ctx context.Context, peer string) context.Context {
	return context.WithValue(ctx, peerKey{}, peer)
}
