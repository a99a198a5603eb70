package openai

import "context"

type maxToolCallsKey struct{}

// WithMaxToolCalls returns ctx carrying a request's bound on the calls of
// the gateway's own (governed, built-in) tools its answer may process:
// the Responses API's max_tool_calls ("the maximum number of total calls
// to built-in tools that can be processed in a response … Any further
// attempts to call a tool by the model will be ignored"), n ≥ 0.
func WithMaxToolCalls(ctx context.Context, n int) context.Context {
	return context.WithValue(ctx, maxToolCallsKey{}, n)
}

// MaxToolCalls is the bound WithMaxToolCalls put in ctx; ok is false when
// there is none (no bound).
func MaxToolCalls(ctx context.Context) (n int, ok bool) {
	n, ok = ctx.Value(maxToolCallsKey{}).(int)
	return n, ok
}
