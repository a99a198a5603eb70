// Package route holds the target catalogue and the pure decision of where a
// request goes: candidates ranked by expected quality minus weighted cost and
// latency under a policy decision, learned priors, per-request overrides, and
// the Plan value (strategy, candidates in the order they are tried, reasons)
// the strategies execute.
//
// It imports no Caddy and holds no upstream client (package egress does).
package route
