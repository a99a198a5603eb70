package app

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"

	"github.com/molly-gateway/molly/plugins"
	"github.com/molly-gateway/molly/router/pipeline"
)

// provisionTools starts the configured tool plugins (plugins.Manager); nil
// when none is configured. go-plugin's log and the plugins' stderr go to
// the "tools" logger.
func (a *App) provisionTools() (*plugins.Manager, error) {
	if len(a.Tools) == 0 {
		return nil, nil
	}
	out := zap.NewStdLog(a.logger.Named("tools")).Writer()
	m, err := plugins.NewManager(a.Tools, plugins.Options{
		Logger: hclog.New(&hclog.LoggerOptions{Name: "plugins", Level: hclog.Warn, Output: out, DisableTime: true}),
	})
	if err != nil {
		return nil, err
	}
	a.logger.Info("tool plugins started", zap.Strings("tools", m.Names()))
	return m, nil
}

// toolRunner is pipeline.ToolRunner on a plugins.Manager.
type toolRunner struct{ m *plugins.Manager }

// Tools describes every configured tool as its plugin last described itself.
func (t toolRunner) Tools() []pipeline.ToolSpec {
	var out []pipeline.ToolSpec
	for _, n := range t.m.Names() {
		d, err := t.m.Describe(n)
		if err != nil || d.Name == "" {
			continue
		}
		out = append(out, pipeline.ToolSpec{Name: d.Name, Description: d.Description, Parameters: d.ArgsSchema, SideEffect: string(d.SideEffect), Result: d.ResultSchema})
	}
	return out
}

// Invoke runs one call; failures are *pipeline.ToolError with the tool's code.
func (t toolRunner) Invoke(ctx context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	res, err := t.m.Invoke(ctx, name, plugins.Invocation{Args: args, Caller: plugins.Caller{Member: member, Scopes: scopes}, IdempotencyKey: key})
	if err != nil {
		te := plugins.AsToolError(err)
		return nil, &pipeline.ToolError{Code: te.Code, Message: te.Message}
	}
	return res, nil
}

// validateTools rejects tool entries that cannot start and a negative
// step limit (NewManager checks names and checksums in full).
func validateTools(tools []plugins.Config, steps int) error {
	if steps < 0 {
		return fmt.Errorf("tool_steps must not be negative")
	}
	seen := map[string]bool{}
	for _, t := range tools {
		if t.Name == "" || t.Path == "" || t.SHA256 == "" {
			return fmt.Errorf("tool %q needs a name, a path and a sha256", t.Name)
		}
		if seen[t.Name] {
			return fmt.Errorf("tool %q is declared twice", t.Name)
		}
		seen[t.Name] = true
	}
	return nil
}
