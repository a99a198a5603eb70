// Package plugins holds Molly's governed-tool contract, the host-side manager
// that runs tools as separate processes, and (one folder each) the tool
// binaries themselves (docs/architecture.md).
//
// A tool is a hashicorp/go-plugin plugin speaking gRPC: the host starts the
// binary, the two sides shake hands (magic cookie, protocol version), agree on
// a mutual-TLS connection (AutoMTLS) and the host calls the Tool service:
//
//	Describe() → Description{name, description, args_schema, result_schema, side_effect}
//	Invoke(Invocation{args, caller{member, scopes}, idempotency_key}) → result JSON | ToolError
//
// A crash or a leak in a tool stays in its process; the manager restarts it.
// Policy (who may call what, amount limits) is the gateway's job
// (policies/tools.rego); a tool trusts the caller identity the host sends.
package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hashicorp/go-plugin"
)

// SideEffect classifies what invoking a tool can do to the world; policy
// decides per class (tools.rego).
type SideEffect string

// The side-effect classes, from least to most dangerous.
const (
	// Read: the tool only reads.
	Read SideEffect = "read"
	// Write: the tool changes state it owns (tickets, notes).
	Write SideEffect = "write"
	// Money: the tool moves money or commits the organisation to pay.
	Money SideEffect = "money"
)

// Valid reports whether s is one of Read, Write, Money.
func (s SideEffect) Valid() bool { return s == Read || s == Write || s == Money }

// Description is what Describe returns: enough for the gateway to offer the
// tool to a model as an OpenAI `tools` entry and for policy to judge a call.
type Description struct {
	// Name is the tool's name, [a-z0-9_]{1,64} (an OpenAI function name).
	Name string `json:"name"`
	// Description tells the model what the tool does, in a sentence or two.
	Description string `json:"description"`
	// ArgsSchema is the JSON Schema (draft 2020-12) of Invocation.Args.
	ArgsSchema json.RawMessage `json:"args_schema"`
	// ResultSchema is the JSON Schema of a successful result.
	ResultSchema json.RawMessage `json:"result_schema"`
	// SideEffect is the tool's side-effect class.
	SideEffect SideEffect `json:"side_effect"`
}

// Caller is who asked for an invocation, as the gateway authenticated them
// (molly_auth's Identity).
type Caller struct {
	// Member is the registry member name; never empty on a real call.
	Member string `json:"member"`
	// Scopes are the member's scopes as molly_auth writes them, e.g.
	// "tool:payments", "model:gpt-4o-mini", "tier:T1".
	Scopes []string `json:"scopes,omitempty"`
}

// Invocation is one call of a tool.
type Invocation struct {
	// Args is a JSON object matching Description.ArgsSchema.
	Args json.RawMessage `json:"args"`
	// Caller is the authenticated caller.
	Caller Caller `json:"caller"`
	// IdempotencyKey identifies the logical call: a retry carrying the same
	// key must return the first result and never repeat the side effect.
	// Tools with side effects may refuse an empty key.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
}

// Tool error codes (ToolError.Code).
const (
	CodeInvalidArgument    = "invalid_argument"    // the arguments are malformed or out of range
	CodeNotFound           = "not_found"           // a referenced object does not exist
	CodeConflict           = "conflict"            // e.g. an idempotency key reused with other arguments
	CodeFailedPrecondition = "failed_precondition" // the object is in the wrong state (e.g. refund > captured)
	CodeUnavailable        = "unavailable"         // the plugin is down, crashed mid-call or is restarting
	CodeInternal           = "internal"            // a bug or storage failure inside the tool
)

// ToolError is a failed invocation as the model and the audit log see it.
// Errors a tool returns travel in-band (they are results, not transport
// failures); the host turns transport failures into Code "unavailable".
type ToolError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *ToolError) Error() string { return "tool error " + e.Code + ": " + e.Message }

// Errorf builds a *ToolError with the given code.
func Errorf(code, format string, a ...any) *ToolError {
	return &ToolError{Code: code, Message: fmt.Sprintf(format, a...)}
}

// AsToolError returns err as a *ToolError: itself if it is one (or wraps
// one), else Code "internal" with err's text; nil for nil.
func AsToolError(err error) *ToolError {
	if err == nil {
		return nil
	}
	var te *ToolError
	if errors.As(err, &te) {
		return te
	}
	return &ToolError{Code: CodeInternal, Message: err.Error()}
}

// Tool is implemented by a plugin binary (served with Serve) and, on the host
// side, by the gRPC client stub the manager dispenses.
//
// Invoke returns the result JSON or an error; an error that is not a
// *ToolError reaches the host as Code "internal".
type Tool interface {
	Describe(ctx context.Context) (Description, error)
	Invoke(ctx context.Context, inv Invocation) (json.RawMessage, error)
}

// Handshake is the go-plugin handshake both sides must agree on. The cookie
// is not a secret; it only stops a user running a plugin binary by hand
// (https://github.com/hashicorp/go-plugin#security). Bump ProtocolVersion on
// an incompatible change of the Tool service.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  1,
	MagicCookieKey:   "MOLLY_TOOL_PLUGIN",
	MagicCookieValue: "2f6c0b1e9d4a4c7b8e3f5a6d7c8b9a0e",
}

// pluginName is the single plugin kind a Molly tool binary serves.
const pluginName = "tool"

// Serve runs t as a go-plugin gRPC plugin and returns when the host is done
// with it. Call it from a tool binary's main. It also starts a watchdog that
// exits the process when its parent (the host) goes away, so that no tool
// outlives a host that was killed (kill -9 gives the host no chance to kill
// its children; see watchParent).
func Serve(t Tool) {
	go watchParent()
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake,
		Plugins:         plugin.PluginSet{pluginName: &toolPlugin{impl: t}},
		GRPCServer:      plugin.DefaultGRPCServer,
	})
}

// DecodeArgs decodes inv.Args into v strictly (unknown fields refused) and
// requires a caller member: the checks every tool makes before its op.
// Errors are invalid_argument tool errors.
func DecodeArgs(inv Invocation, v any) error {
	dec := json.NewDecoder(bytes.NewReader(inv.Args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeInvalidArgument, "arguments: %v", err)
	}
	if inv.Caller.Member == "" {
		return Errorf(CodeInvalidArgument, "no caller member")
	}
	return nil
}
