package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/molly-gateway/molly/registry"
)

// RecordUsageArgs are the arguments of a usage tool's record_usage op (the
// billing plugin's, README) for one registry usage record: its record id as
// decision_id — the tool books one event per id —, cost in integer
// nano-USD as the registry stores it, the time in RFC 3339 (UTC, to the
// millisecond, as stored). The same record always gives the same bytes, so
// a redelivery is a replay for the tool, never a conflict.
func RecordUsageArgs(u registry.Usage) json.RawMessage {
	args := map[string]any{"op": "record_usage", "decision_id": u.RecordID, "member": u.Member, "model": u.Model,
		"tier": u.Tier, "target": u.Target, "prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens,
		"cost_nano_usd": registry.NanoUSD(u.CostUSD), "at": u.Time.UTC().Format(time.RFC3339Nano)}
	b, _ := json.Marshal(args) // strings and numbers only: cannot fail
	return b
}

// finalCodes are the tool error codes a retry cannot change.
var finalCodes = map[string]bool{CodeInvalidArgument: true, CodeConflict: true, CodeNotFound: true, CodeFailedPrecondition: true}

// RecordUsage is a registry.Sink (for Registry.Deliver) that books each
// usage record with tool's record_usage op on m, as caller, with the record
// id as idempotency key. A tool error whose code a retry cannot change
// (invalid_argument, conflict, not_found, failed_precondition) is
// registry.Permanent; the others (unavailable: the plugin is down or
// restarting; internal; a timeout) are retried by the deliverer.
func RecordUsage(m *Manager, tool, caller string) registry.Sink {
	return func(ctx context.Context, u registry.Usage) error {
		_, err := m.Invoke(ctx, tool, Invocation{Args: RecordUsageArgs(u), Caller: Caller{Member: caller}, IdempotencyKey: u.RecordID})
		if err == nil {
			return nil
		}
		var te *ToolError
		if errors.As(err, &te) && finalCodes[te.Code] {
			return registry.Permanent(err)
		}
		return err
	}
}
