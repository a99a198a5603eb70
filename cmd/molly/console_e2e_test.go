package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/serving"
)

// chromium returns Debian's headless-capable Chromium (`make test`
// installs the chromium package when it is missing), or skips saying why.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH (Debian package chromium; `make test` installs it when apt-get can): the console browser test needs a real browser")
	return ""
}

// consoleCaddyfile serves the console at /console to member ops, the
// OpenAI API behind molly_auth, and four targets: the T0 engine (its
// billing adapter strong on billing questions), LAN, self-hosted and an
// external API (best for the rest). EMAIL is public here, so a request
// with an address reaches T3 with the address redacted.
func consoleCaddyfile(tr *tiers, admin string, db, models string) string {
	return `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		registry ` + db + `
		engine {
			model ` + filepath.Join(models, serving.DemoModelFile) + `
			adapters ` + filepath.Join(models, serving.DemoAdapterDir) + `
			n_seq_max 2
			n_ctx 1024
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
			latency 50ms
			quality 0.3
			quality billing 0.97
		}
		target lan {
			tier T1
			endpoint ` + tr.t1.URL() + `
			models chat=small-lan
			quality 0.6
		}
		target selfhosted {
			tier T2
			endpoint ` + tr.t2.URL() + `
			models chat=mid-remote
			price 0.2 0.6
			quality 0.75
		}
		target external {
			tier T3
			endpoint ` + tr.t3.URL() + `
			models chat=gpt-4o-mini
			price 0.15 0.6
			latency 800ms
			quality 0.95
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /console* {
		molly_console {
			members ops
		}
	}
	handle {
		molly_auth
		molly_classify {
			sensitivity EMAIL public
		}
		molly_policy
		molly_route
	}
}
`
}

// TestConsoleInABrowser loads the console in headless Chromium against a
// running Molly with scripted traffic and checks the rendered page against
// what the clients saw: tier counts from the X-Molly-Tier headers, a
// denial's row with the reasons of its 403, a redacted request's count,
// the spend the registry recorded, the attempts of a fallback. It saves a
// screenshot (in $MOLLY_ARTIFACTS when set, else the test's temp dir) and
// fails on any console error.
func TestConsoleInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Molly, the engine and a browser")
	}
	browser := chromium(t)
	tr := startTiers(t)
	models := t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	admin := adminSocket(t)
	g := startMolly(t, consoleCaddyfile(tr, admin, filepath.Join(t.TempDir(), "molly.db"), models))
	for _, m := range []map[string]any{{"name": "ops"}, {"name": "alice"}, {"name": "bob", "models": []string{"other-model"}}} {
		if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", m); code != http.StatusCreated {
			t.Fatalf("member %v: %d %s", m["name"], code, body)
		}
	}
	opsKey, _ := newKey(t, admin, "ops")
	aliceKey, _ := newKey(t, admin, "alice")
	bobKey, _ := newKey(t, admin, "bob")
	base := strings.TrimSuffix(g.URL, "/v1")

	// The state is refused without a key and to a member not listed.
	for _, c := range []struct {
		key  string
		want int
	}{{"", 401}, {aliceKey, 403}, {"sk-molly-not-a-key", 401}, {opsKey, 200}} {
		req, _ := http.NewRequest(http.MethodGet, base+"/console/state", nil)
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("GET /console/state with key %.12q: %d, want %d", c.key, resp.StatusCode, c.want)
		}
	}

	// Scripted traffic; what each client saw is the oracle.
	alice := keyClient(g, aliceKey)
	tiers := map[string]int{}
	routes := map[string]string{} // decision id → X-Molly-Route
	send := func(text string) (id string) {
		var resp *http.Response
		_, err := alice.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(4),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(text)}}, option.WithResponseInto(&resp))
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		tiers[resp.Header.Get("X-Molly-Tier")]++
		id = resp.Header.Get("X-Molly-Decision-Id")
		routes[id] = resp.Header.Get("X-Molly-Route")
		return id
	}
	send("Translate to English: domani piove")
	send("I was charged twice on my last invoice")
	redactedID := send("Please write to jane.doe@example.com about the meeting")
	fallbackID := send("FAIL500 summarise the quarterly numbers") // every HTTP upstream fails; the engine answers
	if tr.t3.Contains("jane.doe@example.com") || !tr.t3.Contains("FAIL500") {
		t.Fatalf("T3 saw the address, or never saw the failing request")
	}
	var resp *http.Response
	_, err := keyClient(g, bobKey).Chat.Completions.New(context.Background(), chat("hello"), option.WithResponseInto(&resp))
	denial := apiError(t, err)
	var body struct {
		Error struct {
			Reasons    []string `json:"reasons"`
			DecisionID string   `json:"decision_id"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(denial.RawJSON()), &body.Error); err != nil || denial.StatusCode != 403 || len(body.Error.Reasons) == 0 {
		t.Fatalf("bob: %d %s", denial.StatusCode, denial.RawJSON())
	}
	deniedID := resp.Header.Get("X-Molly-Decision-Id")
	tiers["none"]++
	spent := usageOf(t, admin, "alice").SpentUSD

	// The browser.
	artifacts := os.Getenv("MOLLY_ARTIFACTS")
	if artifacts == "" {
		artifacts = t.TempDir()
	}
	home := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.UserDataDir(filepath.Join(home, "profile")), chromedp.WindowSize(1440, 1100),
		chromedp.Env("HOME="+home, "XDG_CONFIG_HOME="+home, "XDG_CACHE_HOME="+home, "XDG_DATA_HOME="+home))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	defer cancelTimeout()
	var mu sync.Mutex
	var consoleErrors []string
	chromedp.ListenTarget(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError || ev.Type == runtime.APITypeWarning {
				var parts []string
				for _, a := range ev.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				consoleErrors = append(consoleErrors, "console."+string(ev.Type)+": "+strings.Join(parts, " "))
			}
		case *runtime.EventExceptionThrown:
			consoleErrors = append(consoleErrors, "exception: "+ev.ExceptionDetails.Error())
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.LevelError || ev.Entry.Level == cdplog.LevelWarning {
				consoleErrors = append(consoleErrors, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
			}
		}
	})
	type page struct {
		Tiers     map[string]int `json:"tiers"`
		Members   map[string]string
		Denied    string `json:"denied"`
		DenLabel  string `json:"denLabel"`
		Redacted  string `json:"redacted"`
		Targets   int    `json:"targets"`
		Adapters  int    `json:"adapters"`
		HitCells  int    `json:"hitCells"`
		Policy    string `json:"policy"`
		Route     string `json:"route"`
		Attempts  int    `json:"attempts"`
		Delivered int    `json:"delivered"`
		Points    int    `json:"points"`
	}
	var got page
	var shot []byte
	row := func(id string) string { return `tr.decision[data-id="` + id + `"]` }
	err = chromedp.Run(ctx, cdplog.Enable(), runtime.Enable(),
		chromedp.Navigate(base+"/console#key="+opsKey),
		chromedp.WaitVisible(`body[data-loaded="true"]`, chromedp.ByQuery),
		chromedp.WaitVisible(row(fallbackID), chromedp.ByQuery),
		chromedp.Click(row(fallbackID), chromedp.ByQuery),
		chromedp.WaitVisible(`tr.details-row code.route`, chromedp.ByQuery),
		chromedp.Evaluate(`(() => {
			const q = s => document.querySelector(s), all = s => [...document.querySelectorAll(s)];
			const tiers = {};
			all('.tier-count').forEach(e => { tiers[e.dataset.tier] = +e.textContent; });
			const members = {};
			all('#members tr[data-member]').forEach(r => { members[r.dataset.member] = r.lastChild.textContent; });
			const den = q('tr.decision[data-id="`+deniedID+`"]');
			return {tiers, Members: members, denied: den ? den.textContent : "", denLabel: den ? den.dataset.label : "",
				redacted: (q('tr.decision[data-id="`+redactedID+`"] td.redacted') || {}).textContent || "",
				targets: all('#targets tr[data-target]').length, adapters: all('#adapters tr[data-adapter]').length,
				hitCells: all('#adapters tr[data-adapter] td[data-hit-rate]').length,
				policy: q('#policy-status').textContent, route: q('tr.details-row code.route').textContent,
				attempts: all('tr.details-row tbody.attempts tr').length,
				delivered: all('tr.details-row tbody.attempts .badge.ok').length,
				points: all('#t0-share circle').length};
		})()`, &got),
		chromedp.FullScreenshot(&shot, 100), // quality 100: PNG,
	)
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	path := filepath.Join(artifacts, "console.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshot: %s", path)

	for _, tier := range []string{"T0", "T1", "T2", "T3", "none"} {
		if got.Tiers[tier] != tiers[tier] {
			t.Errorf("tier %s: page shows %d, clients saw %d (page %v)", tier, got.Tiers[tier], tiers[tier], got.Tiers)
		}
	}
	if got.DenLabel != "denied" || !strings.Contains(got.Denied, body.Error.Reasons[0]) || !strings.Contains(got.Denied, "bob") {
		t.Errorf("denial row: label %q, text %q; want the reason %q", got.DenLabel, got.Denied, body.Error.Reasons[0])
	}
	if got.Redacted != "1" {
		t.Errorf("redacted request's row shows %q values redacted, want 1", got.Redacted)
	}
	if want := fmt.Sprintf("%.6f", spent); got.Members["alice"] != want || spent <= 0 {
		t.Errorf("alice's spend: page %q, registry %s", got.Members["alice"], want)
	}
	// Every HTTP upstream answered the failing request with a 500 before
	// the engine answered it.
	if got.Route != routes[fallbackID] || got.Attempts != 4 || got.Delivered != 1 {
		t.Errorf("fallback detail: route %q (header %q), %d attempts, %d delivered", got.Route, routes[fallbackID], got.Attempts, got.Delivered)
	}
	if got.Targets != 4 || got.Adapters != len(serving.DemoAdapters) || got.HitCells != got.Adapters || got.Policy != "loaded" || got.Points == 0 {
		t.Errorf("targets %d, adapters %d (%d with a hit rate), policy %q, T0-share points %d", got.Targets, got.Adapters, got.HitCells, got.Policy, got.Points)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(consoleErrors) > 0 {
		t.Errorf("browser console errors:\n%s", strings.Join(consoleErrors, "\n"))
	}
}

// TestConsoleStateHeadNeedsAKey: HEAD /console/state is answered as GET
// is (RFC 9110 §9.3.2) — 401 without a key or with a wrong one, 403 to a
// member the console does not list, each in OpenAI's error shape, and 200
// only with a listed member's key — so no header of the state (its
// Content-Length) and none of its registry reads are had without a key.
func TestConsoleStateHeadNeedsAKey(t *testing.T) {
	lan := upstreamtest.Start("t1")
	t.Cleanup(lan.Close)
	admin := adminSocket(t)
	g := startMolly(t, `{
	admin `+admin+`|0600
	auto_https off
	persist_config off
	molly {
		registry `+filepath.Join(t.TempDir(), "molly.db")+`
		target lan {
			tier T1
			endpoint `+lan.URL()+`
			models chat=small-lan
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /console* {
		molly_console {
			members ops
		}
	}
	handle {
		molly_auth
		molly_classify
		molly_policy
		molly_route
	}
}
`)
	for _, m := range []string{"ops", "alice"} {
		if code, body := adminCall(t, admin, http.MethodPost, "/molly/members", map[string]any{"name": m}); code != http.StatusCreated {
			t.Fatalf("member %s: %d %s", m, code, body)
		}
	}
	opsKey, _ := newKey(t, admin, "ops")
	aliceKey, _ := newKey(t, admin, "alice")
	base := strings.TrimSuffix(g.URL, "/v1")
	for _, c := range []struct {
		key  string
		want int
	}{{"", 401}, {"sk-molly-not-a-key", 401}, {aliceKey, 403}, {opsKey, 200}} {
		for _, method := range []string{http.MethodHead, http.MethodGet} {
			req, _ := http.NewRequest(method, base+"/console/state", nil)
			if c.key != "" {
				req.Header.Set("Authorization", "Bearer "+c.key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Fatalf("%s /console/state with key %.12q: %d, want %d", method, c.key, resp.StatusCode, c.want)
			}
			if c.want == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Fatalf("%s: a 401 without WWW-Authenticate", method)
			}
			if method == http.MethodGet && c.want != 200 && (gjson.GetBytes(b, "error.message").Str == "" || gjson.GetBytes(b, "error.type").Str == "") {
				t.Fatalf("GET /console/state with key %.12q: %d %s, not an OpenAI error", c.key, resp.StatusCode, b)
			}
		}
	}
	// The page at its documented paths; an unknown path below it is a 404.
	for path, want := range map[string]int{"/console": 200, "/console/": 200, "/console/anything-unknown": 404, "/console/state/x": 404} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || want == 404 && gjson.GetBytes(b, "error.code").Str != "not_found" {
			t.Fatalf("GET %s: %d %s, want %d", path, resp.StatusCode, b, want)
		}
	}
}
