package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// TestBillingConsumesUsage runs the real billing plugin as the gateway's
// usage_tool: two chat requests (one whole answer, one stream) without
// molly_auth are recorded for member "anonymous", each under its decision
// id, and the billing plugin's usage op, called through the admin route
// POST /molly/tools/billing, reports exactly those two events. The admin
// route also lists the tools, refuses an unknown tool (404) and a call out
// of the member's tool scope (403, with the policy's reason).
func TestBillingConsumesUsage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "billing")
	build := exec.Command("go", "build", "-o", bin, "../../plugins/billing")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the billing plugin: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)

	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		tool billing {
			path `+bin+`
			sha256 `+hex.EncodeToString(sum[:])+`
			env MOLLY_BILLING_DB `+filepath.Join(dir, "billing.db")+`
		}
		usage_tool billing
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
			price 10 10
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	c := client(g)
	// A whole answer: 5 prompt + 5 completion tokens at USD 10 per 1M = 100000 nano-USD.
	var resp *http.Response
	if _, err := c.Chat.Completions.New(t.Context(), chat("Hello billing"), option.WithResponseInto(&resp)); err != nil {
		t.Fatal(err)
	}
	ids := []string{resp.Header.Get("X-Molly-Decision-Id")}
	// A stream: its usage chunk says 5 prompt + 4 completion tokens = 90000 nano-USD.
	stream := c.Chat.Completions.NewStreaming(context.Background(), chat("Hello again, streaming"), option.WithResponseInto(&resp))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	ids = append(ids, resp.Header.Get("X-Molly-Decision-Id"))
	if ids[0] == "" || ids[1] == "" || ids[0] == ids[1] {
		t.Fatalf("decision ids %q", ids)
	}

	month := time.Now().UTC().Format("2006-01")
	call := map[string]any{"member": "auditor", "arguments": map[string]any{"op": "usage", "month": month, "member": "anonymous"}}
	want := `{"result":{"member":"anonymous","period":"` + month + `","lines":[{"model":"chat","tier":"T1","target":"lan","events":2,` +
		`"prompt_tokens":10,"completion_tokens":9,"cost_nano_usd":190000,"cost_usd":"0.000190000"}]}}`
	var code, polls int
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// Usage goes to billing in the background, after the answer.
		code, body = adminCall(t, admin, http.MethodPost, "/molly/tools/billing", call)
		polls++
		if (code == 200 && strings.TrimSpace(body) == want) || time.Now().After(deadline) {
			break
		}
	}
	if code != 200 || strings.TrimSpace(body) != want {
		t.Fatalf("usage: %d %s\nwant 200 %s", code, body, want)
	}
	// Each event was booked under its decision id: recording one again is a replay.
	for i, id := range ids {
		prompt, completion, cost := 5, 5, 100000
		if i == 1 {
			completion, cost = 4, 90000
		}
		code, body = adminCall(t, admin, http.MethodPost, "/molly/tools/billing", map[string]any{"member": "molly-gateway", "idempotency_key": id,
			"arguments": map[string]any{"op": "record_usage", "decision_id": id, "member": "anonymous", "model": "chat", "tier": "T1", "target": "lan",
				"prompt_tokens": prompt, "completion_tokens": completion, "cost_nano_usd": cost + 1}})
		if code != 502 || gjson.Get(body, "error.code").Str != "conflict" || gjson.Get(body, "error.type").Str != "upstream_error" {
			t.Fatalf("recording decision %s again with another cost: %d %s, want 502 conflict", id, code, body)
		}
	}

	code, body = adminCall(t, admin, http.MethodGet, "/molly/tools", nil)
	if code != 200 || gjson.Get(body, "#").Int() != 1 || gjson.Get(body, "0.name").Str != "billing" || gjson.Get(body, "0.side_effect").Str != "write" ||
		!gjson.Get(body, "0.args_schema").IsObject() || !gjson.Get(body, "0.result_schema").IsObject() {
		t.Fatalf("GET /molly/tools: %d %s", code, body)
	}
	code, body = adminCall(t, admin, http.MethodPost, "/molly/tools/payments", call)
	if code != 404 || strings.TrimSpace(body) != `{"error":{"code":"not_found","message":"no tool \"payments\" is configured","param":null,"type":"invalid_request_error"}}` {
		t.Fatalf("unknown tool: %d %s", code, body)
	}
	call["scopes"] = []string{"tool:support"}
	code, body = adminCall(t, admin, http.MethodPost, "/molly/tools/billing", call)
	if code != 403 || gjson.Get(body, "error.code").Str != "permission_denied" || gjson.Get(body, "error.type").Str != "policy_denied" ||
		gjson.Get(body, "error.reasons").Raw != `["tool billing is not in the tool scope of member auditor"]` {
		t.Fatalf("out of scope: %d %s", code, body)
	}

	// One audit line per call that reached the policy: the polls, two
	// records, the denial (the process's output arrives a moment later).
	audit := regexp.MustCompile(`"msg":"tool call".*"tool":"billing"`)
	if !g.waitLogs(regexp.MustCompile(fmt.Sprintf(`(?s)(%s.*){%d}`, audit, polls+3))) {
		t.Fatalf("fewer than %d tool call audit lines:\n%s", polls+3, g.logs.String())
	}
	logs := g.logs.String()
	if n := len(audit.FindAllString(logs, -1)); n != polls+3 {
		t.Fatalf("%d tool call audit lines, want %d:\n%s", n, polls+3, logs)
	}
	if !strings.Contains(logs, `"tool_call_id":"`+ids[0]+`","member":"molly-gateway","target":"direct","tier":"T0"`) ||
		!strings.Contains(logs, `"allow":false,"reasons":["tool billing is not in the tool scope of member auditor"],"outcome":"denied"`) {
		t.Fatalf("audit lines:\n%s", logs)
	}
	if strings.Contains(logs, "Hello billing") || strings.Contains(logs, "recording usage in the usage tool failed") {
		t.Fatalf("logs carry the prompt or a failed record:\n%s", logs)
	}
}
