package policies

import (
	"context"

	"github.com/open-policy-agent/opa/v1/rego"
)

// OrchestrationQuery is the rule that admits an orchestration plan before
// its first subtask runs (orchestration.rego).
const OrchestrationQuery = "data.molly.policy.orchestration"

// CodePlanDenied is the denial code of an orchestration plan the policy
// refused (the 403 a client sees).
const CodePlanDenied = "plan_denied"

// DecideOrchestration evaluates OrchestrationQuery on input (the plan
// without its text, its metrics, the catalogue's specialists, the caller;
// see policies/README.md) and logs the decision. The verdict has the shape
// of a tool decision: Allow, Code ("" when allowed, CodePolicyDenied for a
// policy denial, the fail-closed cause otherwise) and Reasons. Like Decide
// it never fails: an error, an undefined or malformed result or a timeout
// denies.
func (e *Engine) DecideOrchestration(ctx context.Context, input map[string]any) ToolDecision {
	return e.decideTool(ctx, OrchestrationQuery, "orchestration", func(r *revision) *rego.PreparedEvalQuery { return &r.orchestration }, input)
}
