package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"github.com/molly-gateway/molly/internal/upstreamtest"
	"github.com/molly-gateway/molly/serving"
)

// mathProblem is the one domain of the specialisation test: arithmetic
// word problems (the capability estimator's "math"), which the teacher
// answers in one template. solve is the oracle of that template.
func mathProblem(i int) string {
	a, b := 2+i%17, 3+(i*7)%13
	return fmt.Sprintf("Calculate: Sam has %d apples and buys %d more. How many apples now?", a, b)
}

var problemRe = regexp.MustCompile(`Sam has (\d+) apples and buys (\d+) more`)

func solve(prompt string) string {
	m := problemRe.FindStringSubmatch(prompt)
	if m == nil {
		return "I only do apples."
	}
	a, _ := strconv.Atoi(m[1])
	b, _ := strconv.Atoi(m[2])
	return fmt.Sprintf("Sam has %d + %d = %d apples.", a, b, a+b)
}

// molly runs the real binary's subcommand against the admin socket.
func mollyCmd(t *testing.T, admin string, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(mollyBin, append(args, "--address", admin)...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("molly %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String(), errb.String()
}

type cycleReport struct {
	Domains []struct {
		Domain    string `json:"domain"`
		NewTraces int    `json:"new_traces"`
		Skipped   string `json:"skipped"`
		Set       string `json:"set"`
		Curation  struct {
			Kept   int `json:"kept"`
			Edited int `json:"edited"`
		} `json:"curation"`
		Version    string `json:"version"`
		Promoted   bool   `json:"promoted"`
		Error      string `json:"error"`
		Evaluation *struct {
			Scores struct {
				IncumbentDomain struct{ NLL float64 } `json:"incumbent_domain"`
				CandidateDomain struct{ NLL float64 } `json:"candidate_domain"`
				BaseGeneral     struct{ NLL float64 } `json:"base_general"`
				CandidateGen    struct{ NLL float64 } `json:"candidate_general"`
			} `json:"scores"`
			Quality float64 `json:"quality"`
		} `json:"evaluation"`
		TrainTokensPerS float64 `json:"train_tokens_per_s"`
	} `json:"domains"`
}

// specialiseCaddyfile is the gateway of the specialisation tests: the
// engine (base, adapter folder dir) as a weak T0, the teacher as T1, the
// loop with tiny training settings, and /v1/feedback.
func specialiseCaddyfile(admin, db, base, dir, teacher string) string {
	return `{
	admin ` + admin + `|0600
	auto_https off
	persist_config off
	molly {
		registry ` + db + `
		engine {
			model ` + base + `
			adapters ` + dir + `
			n_seq_max 8
			n_ctx 4096
			threads 1
		}
		target device {
			tier T0
			kind engine
			models chat=molly-demo
			latency 50ms
			quality 0.05
		}
		target lan {
			tier T1
			endpoint ` + teacher + `
			models chat=small-lan
			price 0 0
			latency 300ms
			quality 0.3
		}
		specialise {
			min_traces 30
			rank 4
			steps 40
			batch_size 4
			learning_rate 0.02
			threads 2
		}
	}
}
http://127.0.0.1:{PORT} {
	handle /v1/feedback {
		molly_feedback
	}
	handle {
		molly_classify
		molly_policy
		molly_route
	}
}
`
}

// TestSpecialisationMovesADomainToT0: traffic of one domain goes to the T1
// teacher because T0 is weak at it; with consent its traces are captured;
// one cycle curates them, trains an adapter on the T0 demo base, evaluates
// it (held-out NLL ≥ 10% lower, general probes ≤ 1% worse) and promotes
// it; the next request of that category is served on T0 by the adapter,
// the route and the answer's fingerprint naming it, with no configuration
// edited. Then the member is forgotten and a later cycle sees nothing.
func TestSpecialisationMovesADomainToT0(t *testing.T) {
	teacher := upstreamtest.Start("t1")
	teacher.Answer = solve
	t.Cleanup(teacher.Close)
	models, empty, state := t.TempDir(), t.TempDir(), t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(models, serving.DemoModelFile)
	db := filepath.Join(state, "molly.db")
	admin := adminSocket(t)
	g := startMolly(t, specialiseCaddyfile(admin, db, base, empty, teacher.URL()))
	c := client(g)
	ctx := context.Background()
	ask := func(i int, trace string) (*openai.ChatCompletion, http.Header) {
		t.Helper()
		var resp *http.Response
		opts := []option.RequestOption{option.WithResponseInto(&resp)}
		if trace != "" {
			opts = append(opts, option.WithHeader("X-Molly-Trace", trace))
		}
		out, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(24),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(mathProblem(i))}}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return out, resp.Header
	}

	// 1. The domain's traffic goes to the teacher; consented requests are traced.
	const n = 60
	decisions := map[int]string{}
	for i := range n {
		out, h := ask(i, "on")
		if h.Get("X-Molly-Tier") != "T1" || out.Choices[0].Message.Content != solve(mathProblem(i)) {
			t.Fatalf("request %d: tier %s, answer %q; want T1's template", i, h.Get("X-Molly-Tier"), out.Choices[0].Message.Content)
		}
		decisions[i] = h.Get("X-Molly-Decision-Id")
	}
	// Feedback: a correction replaces an answer, a bad score drops one.
	edit := "Sam has " + strings.TrimPrefix(solve(mathProblem(0)), "Sam has ") + " Well done!"
	for i, fb := range map[int]map[string]any{0: {"score": 0.3, "edit": edit}, 1: {"score": 0.1}} {
		fb["decision_id"] = decisions[i]
		b, _ := json.Marshal(fb)
		resp, err := http.Post(g.URL+"/feedback", "application/json", strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		var got struct{ Traced bool }
		_ = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !got.Traced {
			t.Fatalf("feedback on %d: %d traced=%v", i, resp.StatusCode, got.Traced)
		}
	}
	_, _ = ask(n, "off") // refused consent: never traced
	ask(n+1, "")         // no consent given: default off
	var traces []struct {
		Member, Category, Tier string
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polling the condition
		code, body := adminCall(t, admin, http.MethodGet, "/molly/traces", nil)
		if code != http.StatusOK {
			t.Fatalf("GET /molly/traces: %d %s", code, body)
		}
		_ = json.Unmarshal([]byte(body), &traces)
		if len(traces) >= n || time.Now().After(deadline) {
			break
		}
	}
	if len(traces) != n {
		t.Fatalf("%d traces, want the %d consented", len(traces), n)
	}
	for _, tr := range traces {
		if tr.Category != "math" || tr.Tier != "T1" || tr.Member != "anonymous" {
			t.Fatalf("trace %+v, want math answered on T1 for anonymous", tr)
		}
	}

	// The export is OpenAI fine-tuning JSONL of the teacher's answers.
	out, _ := mollyCmd(t, admin, "traces", "export", "--domain", "math")
	lines := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var l struct {
			Messages []struct{ Role, Content string }
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || len(l.Messages) != 2 || l.Messages[1].Role != "assistant" {
			t.Fatalf("export line %q (%v)", sc.Text(), err)
		}
		want := solve(l.Messages[0].Content)
		switch l.Messages[0].Content {
		case mathProblem(0):
			want = edit
		case mathProblem(1):
			t.Fatalf("the answer scored 0.1 was exported: %s", sc.Text())
		}
		if l.Messages[1].Content != want {
			t.Fatalf("export line %q, want the answer %q", sc.Text(), want)
		}
		lines++
	}
	if lines != n-1 {
		t.Fatalf("export of %d pairs, want %d", lines, n-1)
	}

	// 2. One cycle, asked for as an operator would.
	out, _ = mollyCmd(t, admin, "specialise", "run", "--once")
	var rep cycleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Domains) != 1 {
		t.Fatalf("cycle report %q: %v", out, err)
	}
	d := rep.Domains[0]
	if d.Domain != "math" || !d.Promoted || d.Error != "" || d.Evaluation == nil || d.NewTraces != n || d.Curation.Kept != n-1 || d.Curation.Edited != 1 {
		t.Fatalf("domain report %+v", d)
	}
	s := d.Evaluation.Scores
	t.Logf("held-out NLL/token %.3f → %.3f, general %.3f → %.3f, quality prior %.3f, training %.0f tokens/s",
		s.IncumbentDomain.NLL, s.CandidateDomain.NLL, s.BaseGeneral.NLL, s.CandidateGen.NLL, d.Evaluation.Quality, d.TrainTokensPerS)
	if !(s.CandidateDomain.NLL <= 0.9*s.IncumbentDomain.NLL) || !(s.CandidateGen.NLL <= 1.01*s.BaseGeneral.NLL) {
		t.Fatalf("gate figures %+v", s)
	}

	// 3. The next request of the category is served on T0 by the new adapter.
	answer, h := ask(1000, "")
	route := h.Get("X-Molly-Route")
	if h.Get("X-Molly-Tier") != "T0" || !strings.HasPrefix(route, "device/molly-demo:math ") {
		t.Fatalf("after promotion: tier %s, route %q; want T0 on device/molly-demo:math", h.Get("X-Molly-Tier"), route)
	}
	file, err := os.ReadFile(filepath.Join(state, "specialise", "versions", d.Version+".gguf"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(file)
	if hex.EncodeToString(sum[:]) != d.Version || answer.SystemFingerprint != "sha256:"+d.Version {
		t.Fatalf("answered by version %q; the promoted file's hash is %x (reported %s)", answer.SystemFingerprint, sum, d.Version)
	}
	// The alias's pinned name serves the same version.
	pinned, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "molly-demo:math@" + d.Version[:12], MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || pinned.SystemFingerprint != "sha256:"+d.Version {
		t.Fatalf("pinned name: %v %+v", err, pinned)
	}
	// The share of the category's requests per tier shows the move.
	code, body := adminCall(t, admin, http.MethodGet, "/molly/specialise/share", nil)
	var share []struct {
		Category string
		Tiers    map[string]int
	}
	if err := json.Unmarshal([]byte(body), &share); code != http.StatusOK || err != nil {
		t.Fatalf("share: %d %s", code, body)
	}
	tiers := map[string]int{}
	for _, r := range share {
		if r.Category == "math" {
			for k, v := range r.Tiers {
				tiers[k] += v
			}
		}
	}
	if tiers["T1"] != n+2 || tiers["T0"] != 1 {
		t.Fatalf("math requests per tier %v, want %d on T1 and 1 on T0", tiers, n+2)
	}
	hist, _ := mollyCmd(t, admin, "adapters", "history", "math")
	if !strings.Contains(hist, "promote") || !strings.Contains(hist, d.Version[:12]) {
		t.Fatalf("history:\n%s", hist)
	}

	// A restart serves the promoted version again, and routes to it.
	if err := g.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = g.cmd.Wait()
	admin = adminSocket(t)
	g = startMolly(t, specialiseCaddyfile(admin, db, base, empty, teacher.URL()))
	c = client(g)
	answer, h = ask(1001, "")
	if h.Get("X-Molly-Tier") != "T0" || !strings.HasPrefix(h.Get("X-Molly-Route"), "device/molly-demo:math ") || answer.SystemFingerprint != "sha256:"+d.Version {
		t.Fatalf("after a restart: tier %s, route %q, version %q", h.Get("X-Molly-Tier"), h.Get("X-Molly-Route"), answer.SystemFingerprint)
	}

	// 4. Training by hand from the cycle's curated set, on this machine:
	// structured progress lines when not on a terminal.
	if err := os.Mkdir(filepath.Join(empty, "staged"), 0o755); err != nil { // a subfolder: the engine's folder watch leaves it alone
		t.Fatal(err)
	}
	adapterOut := filepath.Join(empty, "staged", "math2.gguf")
	out, errOut := mollyCmd(t, admin, "adapters", "train", "--set", d.Set, "--base", base, "--rank", "2", "--steps", "4",
		"--batch-size", "2", "--threads", "1", "--registry", db, "--out", adapterOut)
	if !strings.Contains(out, "wrote "+adapterOut) || !strings.Contains(errOut, `"event":"end"`) {
		t.Fatalf("train: stdout %q stderr %q", out, errOut)
	}
	if b, err := os.ReadFile(adapterOut); err != nil || string(b[:4]) != "GGUF" {
		t.Fatalf("trained file: %v", err)
	}

	// 5. Promotion under load: 8 greedy streams started on the first
	// version, a second version (the one just trained, imported) promoted
	// while they run: each completes on the version it started on.
	out, _ = mollyCmd(t, admin, "adapters", "import", "math", "staged/math2.gguf")
	var v2 struct{ Version string }
	if err := json.Unmarshal([]byte(out), &v2); err != nil || len(v2.Version) != 64 || v2.Version == d.Version {
		t.Fatalf("import: %q %v", out, err)
	}
	for _, path := range []string{"/etc/passwd", "../../etc/passwd", adapterOut + ".missing"} {
		code, body := adminCall(t, admin, http.MethodPost, "/molly/adapter-versions", map[string]string{"name": "math", "path": path})
		if want := map[bool]int{true: http.StatusBadRequest, false: http.StatusForbidden}[strings.HasSuffix(path, ".missing")]; code != want {
			t.Fatalf("importing %s: %d %s, want %d", path, code, body, want)
		}
	}
	streamParams := func(model string) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(48), Temperature: openai.Float(0),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(mathProblem(2000))}}
	}
	type streamed struct {
		text, versions string
		finish         string
	}
	read := func(st interface {
		Next() bool
		Current() openai.ChatCompletionChunk
		Err() error
	}, r *streamed, max int) {
		for i := 0; (max == 0 || i < max) && st.Next(); i++ {
			ch := st.Current()
			if ch.SystemFingerprint != "" && !strings.Contains(r.versions, ch.SystemFingerprint) {
				r.versions += ch.SystemFingerprint + " "
			}
			if len(ch.Choices) > 0 {
				r.text += ch.Choices[0].Delta.Content
				if ch.Choices[0].FinishReason != "" {
					r.finish = ch.Choices[0].FinishReason
				}
			}
		}
		if err := st.Err(); err != nil {
			t.Fatal(err)
		}
	}
	const streams = 8
	var open []*ssestream.Stream[openai.ChatCompletionChunk]
	results := make([]streamed, streams)
	for i := range streams {
		st := c.Chat.Completions.NewStreaming(ctx, streamParams("molly-demo:math"))
		read(st, &results[i], 2) // under way: its first chunks arrived
		open = append(open, st)
	}
	mollyCmd(t, admin, "adapters", "promote", "math", v2.Version[:12], "--reason", "under load")
	for i, st := range open {
		read(st, &results[i], 0)
		st.Close()
	}
	whole := func(model string) streamed {
		var r streamed
		st := c.Chat.Completions.NewStreaming(ctx, streamParams(model))
		read(st, &r, 0)
		st.Close()
		return r
	}
	first, second := whole("molly-demo:math@"+d.Version[:12]), whole("molly-demo:math")
	if strings.TrimSpace(second.versions) != "sha256:"+v2.Version || first.text == second.text {
		t.Fatalf("after the promotion math serves %q writing %q; the first version wrote %q", second.versions, second.text, first.text)
	}
	for i, r := range results {
		if strings.TrimSpace(r.versions) != "sha256:"+d.Version || r.text != first.text || r.finish == "" || r.finish != first.finish {
			t.Fatalf("stream %d: versions %q, finish %q, text %q; want only the first version's %q", i, r.versions, r.finish, r.text, first.text)
		}
	}

	// 6. Forgetting the member removes their traces; a later cycle sees none.
	out, _ = mollyCmd(t, admin, "traces", "delete", "--member", "anonymous")
	if !strings.Contains(out, fmt.Sprintf("deleted %d traces", n)) {
		t.Fatalf("delete: %q", out)
	}
	if code, body := adminCall(t, admin, http.MethodGet, "/molly/traces", nil); code != http.StatusOK || strings.TrimSpace(body) != "[]" {
		t.Fatalf("traces after deletion: %d %s", code, body)
	}
	out, _ = mollyCmd(t, admin, "specialise", "run", "--once")
	rep = cycleReport{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Domains) != 0 {
		t.Fatalf("a cycle after deletion: %s", out)
	}
}

// TestAcknowledgedTracesSurviveKill9: every trace the admin API listed
// (committed) before a kill -9 in the middle of consented traffic is
// there after the restart.
func TestAcknowledgedTracesSurviveKill9(t *testing.T) {
	teacher := upstreamtest.Start("t1")
	teacher.Answer = solve
	t.Cleanup(teacher.Close)
	models, empty, state := t.TempDir(), t.TempDir(), t.TempDir()
	if err := serving.WriteDemo(models, 1, "tiny"); err != nil {
		t.Fatal(err)
	}
	base, db := filepath.Join(models, serving.DemoModelFile), filepath.Join(state, "molly.db")
	admin := adminSocket(t)
	g := startMolly(t, specialiseCaddyfile(admin, db, base, empty, teacher.URL()))
	c := client(g)
	stop := make(chan struct{})
	sent := make(chan error, 4)
	for w := range 4 {
		go func() {
			for i := w; ; i += 4 {
				select {
				case <-stop:
					sent <- nil
					return
				default:
				}
				if _, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "chat", MaxTokens: openai.Int(8),
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(mathProblem(i))}},
					option.WithHeader("X-Molly-Trace", "on")); err != nil {
					sent <- nil // the kill ends requests in flight
					return
				}
			}
		}()
	}
	listed := func(admin string) map[string]bool {
		code, body := adminCall(t, admin, http.MethodGet, "/molly/traces", nil)
		var ts []struct {
			DecisionID string `json:"decision_id"`
		}
		if err := json.Unmarshal([]byte(body), &ts); code != http.StatusOK || err != nil {
			t.Fatalf("GET /molly/traces: %d %s", code, body)
		}
		out := map[string]bool{}
		for _, tr := range ts {
			out[tr.DecisionID] = true
		}
		return out
	}
	var acked map[string]bool
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) { // polling the condition
		if acked = listed(admin); len(acked) >= 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d traces stored in 30s", len(acked))
		}
	}
	if err := g.cmd.Process.Kill(); err != nil { // SIGKILL while the workers still send
		t.Fatal(err)
	}
	_ = g.cmd.Wait()
	close(stop)
	for range 4 {
		<-sent
	}
	admin2 := adminSocket(t)
	startMolly(t, specialiseCaddyfile(admin2, db, base, empty, teacher.URL()))
	after := listed(admin2)
	for id := range acked {
		if !after[id] {
			t.Fatalf("acknowledged trace %s lost across kill -9 (%d acknowledged, %d after)", id, len(acked), len(after))
		}
	}
	t.Logf("%d traces acknowledged before the kill, %d stored after the restart", len(acked), len(after))
}
