package app

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/molly-gateway/molly/router/meter"
	"github.com/molly-gateway/molly/router/pipeline"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// usageTimeout bounds one record_usage call.
const usageTimeout = 10 * time.Second

// UsageCaller is the member the gateway records usage as (the caller of
// record_usage; the usage itself is booked to the request's member).
const UsageCaller = "molly-gateway"

// UsageStats counts the usage records handed to the usage tool.
type UsageStats struct {
	Sent   atomic.Int64 `json:"-"` // recorded by the tool (a replay included)
	Failed atomic.Int64 `json:"-"` // the call failed or timed out; logged
}

// usageSender hands each usage record to the usage tool's record_usage
// op, in the background: the answer never waits for billing.
type usageSender struct {
	tool    string
	runner  pipeline.ToolRunner
	log     *zap.Logger
	timeout time.Duration
	stats   *UsageStats
	wg      sync.WaitGroup

	mu  sync.Mutex
	seq map[string]seqEntry // records sent per decision id, recent ones only
}

type seqEntry struct {
	n  int
	at time.Time
}

// recordID names the n-th usage record of a decision: the decision id for
// the first, "<id>:<n>" after it. One request can make several records (a
// cascade's attempts, a mixture's members, tool-loop rounds), and the usage
// tool keeps one record per id (its idempotency key), so each needs its own.
// Entries older than 10 minutes are dropped once 10000 are kept.
func (s *usageSender) recordID(decision string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if s.seq == nil {
		s.seq = map[string]seqEntry{}
	}
	if len(s.seq) >= 10000 {
		for k, e := range s.seq {
			if now.Sub(e.at) > 10*time.Minute {
				delete(s.seq, k)
			}
		}
	}
	e := s.seq[decision]
	e.n++
	e.at = now
	s.seq[decision] = e
	if e.n == 1 {
		return decision
	}
	return fmt.Sprintf("%s:%d", decision, e.n)
}

// recordUsageArgs are the record_usage arguments for u: cost in integer
// nano-USD (1 USD = 10^9), rounded; the time in RFC 3339 (UTC).
func recordUsageArgs(u meter.Usage) []byte {
	cost := int64(math.Round(u.CostUSD * 1e9))
	if cost < 0 {
		cost = 0
	}
	args := map[string]any{"op": "record_usage", "decision_id": u.DecisionID, "member": u.Member, "model": u.Model,
		"tier": u.Tier, "target": u.Target, "prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens,
		"cost_nano_usd": cost}
	if !u.Time.IsZero() {
		args["at"] = u.Time.UTC().Format(time.RFC3339Nano)
	}
	b, _ := json.Marshal(args)
	return b
}

// send is pipeline.Pipeline.UsageSink: it starts the call and returns.
func (s *usageSender) send(u meter.Usage) {
	u.DecisionID = s.recordID(u.DecisionID)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		if _, err := s.runner.Invoke(ctx, s.tool, recordUsageArgs(u), UsageCaller, nil, u.DecisionID); err != nil {
			n := s.stats.Failed.Add(1)
			// The error is the tool's code and message; the record carries no prompt text.
			s.log.Error("recording usage in the usage tool failed", zap.String("tool", s.tool), zap.String("decision_id", u.DecisionID),
				zap.String("member", u.Member), zap.Int64("failed_total", n), zap.Error(err))
			return
		}
		s.stats.Sent.Add(1)
	}()
}

// wait returns when no record is in flight (each bounded by the timeout).
func (s *usageSender) wait() {
	if s != nil {
		s.wg.Wait()
	}
}
