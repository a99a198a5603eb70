package orchestrate

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/identity"
	"github.com/molly-gateway/molly/router/route"
)

// testCard is a published test card number (Luhn-valid).
const testCard = "4111 1111 1111 1111"

var nonDigits = regexp.MustCompile(`[^0-9]`)

// holdsCard reports whether body carries the test card's digits, however
// they are spaced or escaped: an oracle that does not use the detectors.
func holdsCard(body []byte) bool {
	return strings.Contains(nonDigits.ReplaceAllString(string(body), ""), "4111111111111111")
}

func subtaskOf(rec gjson.Result, id string) gjson.Result {
	return rec.Get(`subtasks.#(id=="` + id + `")`)
}

func TestASubtaskThatSeesACardNeverReachesT3EvenWhenThePlanAllowsIt(t *testing.T) {
	_, ctl := controllerAnswering(t, `{"subtasks": [
		{"id": "card", "instruction": "Explain the charge.", "inputs": ["part:0"], "specialist": {"model": "m"}, "tier_ceiling": "T3"},
		{"id": "greet", "instruction": "Translate it.", "inputs": ["part:1"], "specialist": {"model": "m"}, "tier_ceiling": "T3"}]}`)
	lan, cloud := startScripted(t, "lan"), startScripted(t, "cloud")
	g := startGateway(t, setup{cfg: Config{Controller: "planner"},
		targets: []*route.Target{ctl, target("lan", "T1", lan.url(), 0.5, "m"), target("cloud", "T3", cloud.url(), 0.9, "m")}})
	prompt := "1. My card " + testCard + " was charged twice, explain the charge.\n2. Translate good morning into Italian."
	r := post(t, t.Context(), g.url, chat("m", prompt), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	rec := g.record(t, r)
	if c := subtaskOf(rec, "card"); c.Get("tier").String() != "T1" || c.Get("target").String() != "lan" || c.Get("tiers").Raw != `["T0","T1"]` {
		t.Errorf("the card subtask ran on %s/%s with tiers %s, want lan (T1) of T0,T1: %s", c.Get("tier"), c.Get("target"), c.Get("tiers").Raw, c.Raw)
	}
	if g := subtaskOf(rec, "greet"); g.Get("tier").String() != "T3" || g.Get("target").String() != "cloud" {
		t.Errorf("the greeting subtask ran on %s/%s, want cloud (T3): its data allows every tier", g.Get("tier"), g.Get("target"))
	}
	for _, c := range cloud.received() {
		if holdsCard(c.body) {
			t.Errorf("the T3 upstream received the card: %s", c.body)
		}
	}
	if len(cloud.received()) != 1 || len(lan.received()) != 1 || !holdsCard(lan.received()[0].body) {
		t.Errorf("cloud got %d requests, lan %d; want one each, the card on the LAN", len(cloud.received()), len(lan.received()))
	}
	content := gjson.Get(r.body, "choices.0.message.content").String()
	if !strings.Contains(content, "lan: ") || !strings.Contains(content, "cloud: ") || gjson.Get(r.body, "molly.plan_id").String() != r.header.Get(HeaderPlanID) {
		t.Errorf("the answer does not compose both outputs under the plan id: %s", r.body)
	}
	if got := r.header.Get("X-Molly-Tier"); got != "T3" {
		t.Errorf("X-Molly-Tier = %q, want T3 (the most exposed subtask's)", got)
	}
	lines := g.logs.FilterMessage("subtask").All()
	if len(lines) != 2 || lines[0].ContextMap()["plan_id"] != r.header.Get(HeaderPlanID) {
		t.Errorf("%d subtask log lines, want one per subtask with the plan id", len(lines))
	}
	for _, e := range g.logs.All() {
		if b, _ := json.Marshal(e.ContextMap()); holdsCard(b) || strings.Contains(string(b), "Translate good morning") {
			t.Errorf("a log line carries request text: %s %s", e.Message, b)
		}
	}
}

func TestAPlanOverBudgetIsDeniedBeforeAnySubtaskRuns(t *testing.T) {
	cloud := startScripted(t, "cloud")
	priced := target("cloud", "T3", cloud.url(), 0.9, "m")
	priced.PriceIn, priced.PriceOut = 10, 30 // USD per 1M tokens
	t.Run("the budget is over what the member has left", func(t *testing.T) {
		id := &identity.Identity{Member: "alice", Budgeted: true, RemainingUSD: 0.001}
		g := startGateway(t, setup{targets: []*route.Target{priced}, id: id})
		r := post(t, t.Context(), g.url, chat("m", "1. Translate hello into French.\n2. Summarise the plot of Hamlet."), HeaderMode, ModeOrchestrate)
		if r.status != http.StatusForbidden || gjson.Get(r.body, "error.code").String() != "plan_denied" {
			t.Fatalf("status %d: %s, want 403 plan_denied", r.status, r.body)
		}
		reasons := gjson.Get(r.body, "error.reasons").Array()
		if len(reasons) != 1 || !strings.Contains(reasons[0].String(), "USD left of member alice's budget") {
			t.Errorf("reasons %v, want the member's budget", reasons)
		}
		if rec := g.record(t, r); rec.Get("status").String() != StatusDenied || rec.Get("admission.allow").Bool() {
			t.Errorf("record: %s", rec.Raw)
		}
	})
	t.Run("the worst case is over the plan's own budget", func(t *testing.T) {
		_, ctl := controllerAnswering(t, `{"budget": {"max_cost_usd": 0.000001, "max_tokens": 100000}, "subtasks": [
			{"id": "a", "instruction": "Do it.", "specialist": {"model": "m"}, "budget": {"max_tokens": 400}}]}`)
		g := startGateway(t, setup{targets: []*route.Target{ctl, priced}, cfg: Config{Controller: "planner"}})
		r := post(t, t.Context(), g.url, chat("m", "Translate hello into French."), HeaderMode, ModeOrchestrate)
		if r.status != http.StatusForbidden {
			t.Fatalf("status %d: %s, want 403", r.status, r.body)
		}
		msg := gjson.Get(r.body, "error.message").String()
		// 400 completion tokens at 30 USD/1M alone are 0.012 USD.
		if !regexp.MustCompile(`worst case of 0\.01[0-9]* USD is over its budget of 1e-06 USD`).MatchString(msg) {
			t.Errorf("message %q, want the worst case over the budget", msg)
		}
	})
	if n := len(cloud.received()); n != 0 {
		t.Errorf("the specialist got %d requests; a denied plan runs nothing", n)
	}
}

func TestIndependentSubtasksOverlapAndADependentOneWaitsForThem(t *testing.T) {
	_, ctl := controllerAnswering(t, `{"subtasks": [
		{"id": "a", "instruction": "Task A.", "specialist": {"model": "m"}},
		{"id": "b", "instruction": "Task B.", "specialist": {"model": "m"}},
		{"id": "c", "instruction": "Task C.", "specialist": {"model": "m"}, "depends_on": ["a", "b"], "inputs": ["subtask:a", "subtask:b"]}],
		"compose": {"mode": "final", "subtask": "c"}}`)
	spec := startScripted(t, "spec")
	hold, both := barrier(2, 10*time.Second)
	spec.hold = hold
	g := startGateway(t, setup{targets: []*route.Target{ctl, target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Controller: "planner"}})
	r := post(t, t.Context(), g.url, chat("m", "Do the three tasks."), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	select {
	case <-both:
	default:
		t.Fatal("subtasks a and b were never in flight at the same time")
	}
	calls := map[string]call{}
	for _, c := range spec.received() {
		for _, id := range []string{"A", "B", "C"} {
			if strings.HasSuffix(lastUser(c.body), "Task: Task "+id+".") {
				calls[id] = c
			}
		}
	}
	a, b, c := calls["A"], calls["B"], calls["C"]
	if a.start.IsZero() || b.start.IsZero() || c.start.IsZero() {
		t.Fatalf("missing calls: %v", calls)
	}
	if !a.start.Before(b.end) || !b.start.Before(a.end) {
		t.Errorf("a [%v, %v] and b [%v, %v] do not overlap", a.start, a.end, b.start, b.end)
	}
	if c.start.Before(a.end) || c.start.Before(b.end) {
		t.Errorf("c started at %v, before a (%v) and b (%v) ended", c.start, a.end, b.end)
	}
	if u := lastUser(c.body); !strings.Contains(u, "Result of a:\nspec: ") || !strings.Contains(u, "Result of b:\nspec: ") {
		t.Errorf("c does not read a's and b's outputs: %q", u)
	}
	if got := gjson.Get(r.body, "choices.0.message.content").String(); !strings.HasPrefix(got, "spec: ") || !strings.Contains(got, "Task: Task C.") {
		t.Errorf("the answer is not c's output: %q", got)
	}
}

func TestAFailingSpecialistFallsBackInsideItsAllowedSet(t *testing.T) {
	bad, good := startScripted(t, "bad"), startScripted(t, "good")
	bad.answer = func([]byte) (int, string, string) { return http.StatusInternalServerError, "", "" }
	g := startGateway(t, setup{targets: []*route.Target{target("bad", "T1", bad.url(), 0.9, "m"), target("good", "T2", good.url(), 0.5, "m")}})
	r := post(t, t.Context(), g.url, chat("m", "Translate hello into French."), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	s := g.record(t, r).Get("subtasks.0")
	if s.Get("target").String() != "good" || s.Get("outcome").String() != OutcomeOK || !strings.HasPrefix(s.Get("fallbacks.0").String(), "bad: ") {
		t.Errorf("subtask %s, want answered by good after bad failed", s.Raw)
	}
	if len(bad.received()) != 1 || len(good.received()) != 1 {
		t.Errorf("bad got %d requests, good %d; want one each", len(bad.received()), len(good.received()))
	}
}

func TestRefinementStopsAtTheBudgetWithTheUncertaintyAnnotation(t *testing.T) {
	plan := func(budget string) string {
		return `{"max_refinements": 1, ` + budget + `"subtasks": [{"id": "s", "instruction": "Explain.", "specialist": {"model": "m"}, "budget": {"max_tokens": 64}}]}`
	}
	cut := func(body []byte) (int, string, string) { return http.StatusOK, "An answer cut", "length" }
	run := func(t *testing.T, budget string) (reply, *gateway, *scripted) {
		_, ctl := controllerAnswering(t, plan(budget))
		spec := startScripted(t, "spec")
		spec.answer = cut
		g := startGateway(t, setup{targets: []*route.Target{ctl, target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Controller: "planner"}})
		r := post(t, t.Context(), g.url, chat("m", "Explain the tides."), HeaderMode, ModeOrchestrate)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return r, g, spec
	}
	// With the default budget (the worst case plus one round) the
	// subtask is refined once, then max_refinements stops it.
	r, g, spec := run(t, "")
	calls := spec.received()
	if len(calls) != 2 || !strings.Contains(lastUser(calls[1].body), "cut off at its token budget") {
		t.Fatalf("the specialist got %d requests, want the answer and one refinement with the critique", len(calls))
	}
	if got := r.header.Get(HeaderUncertainty); !strings.HasPrefix(got, "stopped=max_refinements; coverage s: the answer was cut off") {
		t.Errorf("%s = %q", HeaderUncertainty, got)
	}
	worst := g.record(t, r).Get("admission.worst_case.tokens").Int()

	// A budget of exactly the worst case leaves nothing for refinement.
	r, g, spec = run(t, `"budget": {"max_tokens": `+strconv.FormatInt(worst, 10)+`}, `)
	if n := len(spec.received()); n != 1 {
		t.Errorf("the specialist got %d requests, want 1: the refinement does not fit the budget", n)
	}
	if got := r.header.Get(HeaderUncertainty); !strings.HasPrefix(got, "stopped=budget; coverage s: the answer was cut off") {
		t.Errorf("%s = %q", HeaderUncertainty, got)
	}
	m := gjson.Get(r.body, "molly")
	if !m.Get("uncertain").Bool() || m.Get("uncertainty.stopped").String() != StoppedBudget || m.Get("uncertainty.issues.0.kind").String() != IssueCoverage {
		t.Errorf("molly member %s, want the budget annotation", m.Raw)
	}
	if rec := g.record(t, r); rec.Get("status").String() != StatusUncertain || len(rec.Get("refinements").Array()) != 0 {
		t.Errorf("record %s", rec.Raw)
	}
}

func TestCancellingTheClientRequestCancelsEveryRunningSubtask(t *testing.T) {
	spec := startScripted(t, "spec")
	arrived, cancelled := make(chan struct{}, 4), make(chan struct{}, 4)
	spec.hold = func(r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-r.Context().Done():
			cancelled <- struct{}{}
		case <-time.After(20 * time.Second):
		}
	}
	g := startGateway(t, setup{targets: []*route.Target{target("spec", "T1", spec.url(), 0.5, "m")}})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url, strings.NewReader(chat("m", "1. Translate hello into French.\n2. Summarise the plot of Hamlet.")))
		req.Header.Set(HeaderMode, ModeOrchestrate)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for i := range 2 {
		select {
		case <-arrived:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of 2 subtasks reached the specialist", i)
		}
	}
	cancel()
	for i := range 2 {
		select {
		case <-cancelled:
		case <-time.After(10 * time.Second):
			t.Fatalf("only %d of 2 running subtasks saw the cancellation", i)
		}
	}
	<-done
}

func TestAStreamedOrchestrationSendsProgressCommentsThenTheAnswerAsChunks(t *testing.T) {
	spec := startScripted(t, "spec")
	g := startGateway(t, setup{targets: []*route.Target{target("spec", "T1", spec.url(), 0.5, "m")}})
	r := post(t, t.Context(), g.url, chat("m", "1. Translate hello into French.\n2. Summarise the plot of Hamlet.", "stream", "true",
		"stream_options", `{"include_usage":true}`), HeaderMode, ModeOrchestrate)
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %s: %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	id := r.header.Get(HeaderPlanID)
	for _, want := range []string{": molly plan " + id + ": 2 subtask(s)", ": molly subtask s1 started", ": molly subtask s1 ok tier=T1 target=spec",
		": molly subtask s2 ok tier=T1 target=spec"} {
		if !strings.Contains(r.body, want) {
			t.Errorf("the stream lacks the progress line %q:\n%s", want, r.body)
		}
	}
	var content strings.Builder
	var last, usage gjson.Result
	done := false
	for _, line := range strings.Split(r.body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		ch := gjson.Parse(data)
		content.WriteString(ch.Get("choices.0.delta.content").String())
		if ch.Get("choices.0.finish_reason").String() == "stop" {
			last = ch
		}
		switch u := ch.Get("usage"); {
		case u.IsObject():
			usage = ch
		case u.Raw != "null":
			t.Errorf("a chunk before the usage chunk has usage %q, want null (include_usage): %s", u.Raw, data)
		}
	}
	want := "### Translate hello into French.\n\nspec: Part 1 of the request:\nTranslate hello into French."
	if !done || !strings.HasPrefix(content.String(), want) || !strings.Contains(content.String(), "### Summarise the plot of Hamlet.") {
		t.Errorf("the chunks join to %q, want the sections (done %v)", content.String(), done)
	}
	if last.Get("molly.plan_id").String() != id || usage.Get("usage.total_tokens").Int() != 40 {
		t.Errorf("final chunk %s, usage %s: want the plan id and 2×20 tokens", last.Raw, usage.Raw)
	}
}

func TestAnInvalidPlanIsRepairedOnceOrRejected(t *testing.T) {
	cyclic := `{"subtasks": [{"id": "a", "instruction": "A.", "specialist": {"model": "m"}, "depends_on": ["b"]},
		{"id": "b", "instruction": "B.", "specialist": {"model": "m"}, "depends_on": ["a"]}]}`
	valid := `{"subtasks": [{"id": "a", "instruction": "A.", "specialist": {"model": "m"}}]}`
	spec := startScripted(t, "spec")
	t.Run("a second answer repairs it", func(t *testing.T) {
		c, ctl := controllerAnswering(t, cyclic, valid)
		g := startGateway(t, setup{targets: []*route.Target{ctl, target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Controller: "planner"}})
		r := post(t, t.Context(), g.url, chat("m", "Do it."), HeaderMode, ModeOrchestrate)
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		calls := c.received()
		if len(calls) != 2 || !strings.Contains(lastUser(calls[1].body), "The plan is invalid: dependency cycle: a -> b -> a") {
			t.Errorf("the controller got %d requests; the second must name the cycle", len(calls))
		}
		if rec := g.record(t, r); rec.Get("planner").String() != "controller:ctl" || len(rec.Get("plan_errors").Array()) != 1 {
			t.Errorf("record %s", rec.Raw)
		}
	})
	t.Run("a plan still invalid is rejected with the reasons", func(t *testing.T) {
		_, ctl := controllerAnswering(t, cyclic, `{"subtasks": [{"id": "a", "specialist": {"model": "m"}}]}`)
		g := startGateway(t, setup{targets: []*route.Target{ctl, target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Controller: "planner"}})
		r := post(t, t.Context(), g.url, chat("m", "Do it."), HeaderMode, ModeOrchestrate)
		if r.status != http.StatusBadGateway || gjson.Get(r.body, "error.code").String() != "invalid_plan" {
			t.Fatalf("status %d: %s, want 502 invalid_plan", r.status, r.body)
		}
		if got := gjson.Get(r.body, "error.reasons.0").String(); !strings.Contains(got, "at /subtasks/0: missing property 'instruction'") {
			t.Errorf("reason %q, want the schema violation", got)
		}
	})
}

func TestTriage(t *testing.T) {
	spec := startScripted(t, "spec")
	g := startGateway(t, setup{targets: []*route.Target{target("spec", "T1", spec.url(), 0.5, "m")}, cfg: Config{Auto: true}})
	for _, c := range []struct {
		name       string
		body       string
		header     []string
		status     int
		orchestrat bool
	}{
		{"a simple request keeps the single route", chat("m", "Translate hello into French."), nil, 200, false},
		{"two task categories are composite", chat("m", "Translate hello into French. Then write a Python function that reverses a list."), nil, 200, true},
		{"X-Molly-Mode single opts out", chat("m", "Translate hello into French. Then write a Python function that reverses a list."), []string{HeaderMode, "single"}, 200, false},
		{"X-Molly-Mode orchestrate asks for it", chat("m", "Hello."), []string{HeaderMode, "orchestrate"}, 200, true},
		{"the orchestrator model asks for it", chat(ModelName, "Hello."), nil, 200, true},
		{"an unknown mode is refused", chat("m", "Hello."), []string{HeaderMode, "agents"}, 400, false},
		{"client tools are refused", chat(ModelName, "Hello.", "tools", `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`), nil, 400, false},
		{"n above 1 is refused", chat(ModelName, "Hello.", "n", "2"), nil, 400, false},
	} {
		r := post(t, t.Context(), g.url, c.body, c.header...)
		orchestrated := r.header.Get(HeaderPlanID) != ""
		if r.status != c.status || orchestrated != c.orchestrat {
			t.Errorf("%s: status %d, orchestrated %v; want %d, %v (%s)", c.name, r.status, orchestrated, c.status, c.orchestrat, r.body)
		}
		if !orchestrated && r.status == 200 && r.header.Get("X-Molly-Strategy") != string(route.StrategySingle) {
			t.Errorf("%s: strategy %q, want the single route", c.name, r.header.Get("X-Molly-Strategy"))
		}
	}
}

func TestThePlanRecordIsKeptBounded(t *testing.T) {
	s := NewStore(2)
	for _, id := range []string{"a", "b", "c"} {
		s.add(&Record{ID: id, Status: StatusAnswered})
	}
	if _, ok := s.JSON("a"); ok {
		t.Error("the oldest record is still kept")
	}
	list := s.List()
	if len(list) != 2 || list[0].ID != "c" || list[1].ID != "b" {
		t.Errorf("list %+v, want c then b", list)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { s.add(&Record{ID: newID()}); s.List() })
	}
	wg.Wait()
}

func TestAlternativesAreFusedAndDisagreementIsRefinedWithTheCritique(t *testing.T) {
	plan := `{"max_refinements": 1, "subtasks": [{"id": "q", "instruction": "Answer with a number.", "specialist": {"model": "m"}, "alternatives": 2}]}`
	t.Run("agreeing alternatives are voted", func(t *testing.T) {
		_, ctl := controllerAnswering(t, plan)
		a, b := startScripted(t, "a"), startScripted(t, "b")
		a.answer = func([]byte) (int, string, string) { return 200, "Forty-two.", "stop" }
		b.answer = func([]byte) (int, string, string) { return 200, "forty two", "stop" }
		g := startGateway(t, setup{targets: []*route.Target{ctl, target("a", "T1", a.url(), 0.9, "m"), target("b", "T1", b.url(), 0.5, "m")}, cfg: Config{Controller: "planner"}})
		r := post(t, t.Context(), g.url, chat("m", "How many?"), HeaderMode, ModeOrchestrate)
		q := g.record(t, r).Get("subtasks.0")
		if r.status != 200 || q.Get("fusion").String() != "vote: 2 of 2 agree" || q.Get("alternatives.#").Int() != 2 || q.Get("target").String() != "a" {
			t.Fatalf("status %d, subtask %s: want a vote of a and b, a's answer (the higher score)", r.status, q.Raw)
		}
		if !gjson.GetBytes(a.received()[0].body, "logprobs").Bool() || r.header.Get(HeaderUncertainty) != "" {
			t.Errorf("alternatives are asked for logprobs and agree: logprobs %v, uncertainty %q", gjson.GetBytes(a.received()[0].body, "logprobs"), r.header.Get(HeaderUncertainty))
		}
	})
	t.Run("disagreeing alternatives are asked again with both answers", func(t *testing.T) {
		_, ctl := controllerAnswering(t, plan)
		a, b := startScripted(t, "a"), startScripted(t, "b")
		a.answer = func([]byte) (int, string, string) { return 200, "41", "stop" }
		b.answer = func([]byte) (int, string, string) { return 200, "43", "stop" }
		g := startGateway(t, setup{targets: []*route.Target{ctl, target("a", "T1", a.url(), 0.9, "m"), target("b", "T1", b.url(), 0.5, "m")}, cfg: Config{Controller: "planner"}})
		r := post(t, t.Context(), g.url, chat("m", "How many?"), HeaderMode, ModeOrchestrate)
		if r.status != 200 || len(a.received()) != 2 || len(b.received()) != 2 {
			t.Fatalf("status %d; a got %d requests, b %d: want the answers and one refinement each", r.status, len(a.received()), len(b.received()))
		}
		refine := lastUser(a.received()[1].body)
		if !strings.Contains(refine, "its 2 alternatives disagree") || !strings.Contains(refine, `"41", "43"`) {
			t.Errorf("the critique %q does not name the disagreement", refine)
		}
		if got := r.header.Get(HeaderUncertainty); got != "stopped=max_refinements; consistency q: its 2 alternatives disagree" {
			t.Errorf("%s = %q", HeaderUncertainty, got)
		}
	})
}
