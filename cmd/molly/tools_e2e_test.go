package main

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"
	_ "modernc.org/sqlite"

	"github.com/molly-gateway/molly/internal/upstreamtest"
)

// TestGovernedPaymentsTool runs the real payments plugin behind the real
// gateway: a LAN model asks for create_intent, the gateway runs it under the
// tool policy and asks again with the result, and the final answer comes
// back. The model then repeats the same call (same tool call id, same
// decision): the idempotency key is the same, so the ledger holds one intent.
func TestGovernedPaymentsTool(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "payments")
	build := exec.Command("go", "build", "-o", bin, "../../plugins/payments")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the payments plugin: %v\n%s", err, out)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	db := filepath.Join(dir, "ledger.db")

	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	call := upstreamtest.ToolCall{ID: "call_1", Name: "payments",
		Arguments: `{"op":"create_intent","amount":500,"currency":"EUR","customer":"cust_42"}`}
	lan.ToolCalls = func(body []byte) []upstreamtest.ToolCall {
		// Ask twice (the second time a retry of the same call), then answer.
		if n := strings.Count(gjson.GetBytes(body, "messages.#.role").Raw, `"tool"`); n < 2 {
			return []upstreamtest.ToolCall{call}
		}
		return nil
	}
	g := startMolly(t, `{
	admin off
	auto_https off
	persist_config off
	molly {
		tool payments {
			path `+bin+`
			sha256 `+hex.EncodeToString(sum[:])+`
			env MOLLY_PAYMENTS_DB `+db+`
		}
		tool_steps 3
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
			price 0 0
		}
	}
}
http://127.0.0.1:{PORT} {
	molly_classify
	molly_policy
	molly_route
}
`)
	var resp *http.Response
	out, err := client(g).Chat.Completions.New(t.Context(), chat("Charge cust_42 five euros"), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Choices[0].Message.Content; got != "t1 says: Charge cust_42 five euros" {
		t.Fatalf("answer %q", got)
	}
	bodies := lan.Received()
	if len(bodies) != 3 {
		t.Fatalf("the model got %d requests, want 3", len(bodies))
	}
	if got := gjson.GetBytes(bodies[0], `tools.0.function.name`).Str; got != "payments" {
		t.Fatalf("offered tool %q", got)
	}
	first := gjson.GetBytes(bodies[1], "messages.2.content").Str
	again := gjson.GetBytes(bodies[2], "messages.4.content").Str
	intent := gjson.Get(first, "intent.id").Str
	if !strings.HasPrefix(intent, "pi_") || gjson.Get(first, "intent.amount").Int() != 500 || gjson.Get(first, "intent.member").Str != "anonymous" {
		t.Fatalf("first tool result %s", first)
	}
	if gjson.Get(again, "intent.id").Str != intent {
		t.Fatalf("the retried call made another intent: %s", again)
	}

	ledger, err := sql.Open("sqlite", "file:"+db+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer ledger.Close()
	var n int
	var amount int64
	var currency string
	if err := ledger.QueryRow(`SELECT COUNT(*), MAX(amount), MAX(currency) FROM intents`).Scan(&n, &amount, &currency); err != nil {
		t.Fatal(err)
	}
	if n != 1 || amount != 500 || currency != "EUR" {
		t.Fatalf("ledger holds %d intents (%d %s), want one of 500 EUR", n, amount, currency)
	}
	id := resp.Header.Get("X-Molly-Decision-Id")
	// Log lines are written off the request path (internal/asynclog): wait
	// for the second audit line before reading them.
	g.waitLogs(regexp.MustCompile(`(?s)"msg":"tool call".*"msg":"tool call"`))
	logs := g.logs.String()
	if strings.Count(logs, `"msg":"tool call"`) != 2 || !strings.Contains(logs, `"decision_id":"`+id+`","tool":"payments"`) ||
		!strings.Contains(logs, `"outcome":"ok"`) {
		t.Fatalf("no audit lines for %s in:\n%s", id, logs)
	}
	if strings.Contains(logs, "cust_42") {
		t.Fatal("the logs carry the tool arguments")
	}
}
