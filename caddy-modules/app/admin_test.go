package app

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/molly-gateway/molly/caddy-modules/admin"
	"github.com/molly-gateway/molly/policies"
	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/pipeline"
)

// fakeRunner is one tool, "echo", that returns its call; "fail" in the
// arguments makes it fail with code "conflict".
type fakeRunner struct{ calls []string }

func (f *fakeRunner) Tools() []pipeline.ToolSpec {
	return []pipeline.ToolSpec{{Name: "echo", Description: "echoes", Parameters: json.RawMessage(`{"type":"object"}`), SideEffect: "write",
		Result: json.RawMessage(`{"type":"object"}`)}}
}

func (f *fakeRunner) Invoke(_ context.Context, name string, args []byte, member string, scopes []string, key string) ([]byte, error) {
	f.calls = append(f.calls, name+" "+string(args)+" "+member+" "+strings.Join(scopes, ",")+" "+key)
	if strings.Contains(string(args), "fail") {
		return nil, &pipeline.ToolError{Code: "conflict", Message: "key reused"}
	}
	return []byte(`{"ok":true}`), nil
}

func TestToolsAdmin(t *testing.T) {
	scanner, err := redaction.NewScanner(redaction.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cl := classify.New(scanner, nil)
	runner := &fakeRunner{}
	policy, err := policies.New(context.Background(), policies.Options{}) // the embedded default tools.rego
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	f := &pipeline.Pipeline{Tools: runner, Policy: policy, Logger: zap.New(core)}
	do := func(method, path, body string) (int, string) {
		w := httptest.NewRecorder()
		if err := serveTools(w, httptest.NewRequest(method, path, strings.NewReader(body)), f, cl); err != nil {
			e := admin.Error(err) // as admin.Guard answers it
			return e.Status, string(e.Body())
		}
		return w.Code, strings.TrimSpace(w.Body.String())
	}
	tests := []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"list", "GET", "/molly/tools", "", 200,
			`[{"name":"echo","description":"echoes","side_effect":"write","args_schema":{"type":"object"},"result_schema":{"type":"object"}}]`},
		{"call", "POST", "/molly/tools/echo", `{"member":"ann","scopes":["tool:echo","tier:T1"],"arguments":{"x":1},"idempotency_key":"k1"}`, 200,
			`{"result":{"ok":true}}`},
		{"denied", "POST", "/molly/tools/echo", `{"member":"bob","scopes":["tool:other"],"arguments":{}}`, 403,
			`{"error":{"code":"permission_denied","message":"policy: tool echo is not in the tool scope of member bob","param":null,"reasons":["tool echo is not in the tool scope of member bob"],"type":"policy_denied"}}`},
		{"tool error", "POST", "/molly/tools/echo", `{"member":"ann","arguments":{"fail":true},"idempotency_key":"k2"}`, 502,
			`{"error":{"code":"conflict","message":"key reused","param":null,"type":"upstream_error"}}`},
		{"unknown tool", "POST", "/molly/tools/nope", `{"member":"ann","arguments":{}}`, 404,
			`{"error":{"code":"not_found","message":"no tool \"nope\" is configured","param":null,"type":"invalid_request_error"}}`},
		{"no member", "POST", "/molly/tools/echo", `{"arguments":{}}`, 400,
			`{"error":{"code":null,"message":"member is required","param":null,"type":"invalid_request_error"}}`},
		{"arguments not an object", "POST", "/molly/tools/echo", `{"member":"ann","arguments":[1]}`, 400,
			`{"error":{"code":null,"message":"arguments must be a JSON object","param":null,"type":"invalid_request_error"}}`},
		{"unknown field", "POST", "/molly/tools/echo", `{"member":"ann","arguments":{},"colour":1}`, 400,
			`{"error":{"code":null,"message":"decoding body: json: unknown field \"colour\"","param":null,"type":"invalid_request_error"}}`},
		{"bad scope", "POST", "/molly/tools/echo", `{"member":"ann","scopes":["admin"],"arguments":{}}`, 400,
			`{"error":{"code":null,"message":"scope \"admin\": want model:\u003cname\u003e, tier:\u003ctier\u003e or tool:\u003cname\u003e","param":null,"type":"invalid_request_error"}}`},
		{"a body over 1 MiB", "POST", "/molly/tools/echo", `{"member":"ann","arguments":{"x":"` + strings.Repeat("a", 1<<20) + `"}}`, 413,
			`{"error":{"code":"request_too_large","message":"the body is over the route's limit of 1048576 bytes","param":null,"type":"invalid_request_error"}}`},
		{"list by POST", "POST", "/molly/tools", "", 405,
			`{"error":{"code":"method_not_supported","message":"POST is not supported on /molly/tools; use GET","param":null,"type":"invalid_request_error"}}`},
		{"call by GET", "GET", "/molly/tools/echo", "", 405,
			`{"error":{"code":"method_not_supported","message":"GET is not supported on /molly/tools/echo; use POST","param":null,"type":"invalid_request_error"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := do(tt.method, tt.path, tt.body)
			if code != tt.code || body != tt.want {
				t.Fatalf("got %d %s\nwant %d %s", code, body, tt.code, tt.want)
			}
		})
	}
	wantCalls := []string{`echo {"x":1} ann tier:T1,tool:echo k1`, `echo {"fail":true} ann  k2`}
	if !reflect.DeepEqual(runner.calls, wantCalls) {
		t.Fatalf("invocations %q, want %q", runner.calls, wantCalls)
	}
	var outcomes []string
	for _, e := range logs.FilterMessage("tool call").All() {
		m := e.ContextMap()
		outcomes = append(outcomes, m["member"].(string)+" "+m["tool_call_id"].(string)+" "+m["target"].(string)+" "+m["tier"].(string)+" "+m["outcome"].(string))
	}
	wantAudit := []string{"ann k1 direct T0 ok", "bob  direct T0 denied", "ann k2 direct T0 error:conflict"}
	if !reflect.DeepEqual(outcomes, wantAudit) {
		t.Fatalf("audit %q, want %q", outcomes, wantAudit)
	}
}
