package orchestrate

import (
	"errors"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/router/capability"
	"github.com/molly-gateway/molly/router/pipeline"
)

func mustParse(t *testing.T, text string) *Plan {
	t.Helper()
	p, errs := ParsePlan([]byte(text))
	if len(errs) > 0 {
		t.Fatalf("ParsePlan: %v", errs)
	}
	return p
}

func TestParsePlanChecksThePublishedSchema(t *testing.T) {
	for _, c := range []struct {
		name, plan, want string
	}{
		{"no subtasks", `{"subtasks": []}`, "at /subtasks: minItems: got 0, want 1"},
		{"an unknown member", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "tier": "T3"}]}`, "at /subtasks/0: additional properties 'tier' not allowed"},
		{"a bad id", `{"subtasks": [{"id": "a b", "instruction": "x", "specialist": {"model": "m"}}]}`, "at /subtasks/0/id: 'a b' does not match pattern"},
		{"an unknown tier", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "tier_ceiling": "T9"}]}`, "at /subtasks/0/tier_ceiling: value must be one of"},
		{"a bad input", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "inputs": ["everything"]}]}`, "at /subtasks/0/inputs/0: 'everything' does not match pattern"},
		{"not JSON", `{"subtasks": [`, "not one JSON document"},
	} {
		_, errs := ParsePlan([]byte(c.plan))
		if len(errs) == 0 || !errors.Is(errs[0], ErrSchema) || !strings.Contains(errs[0].Error(), c.want) {
			t.Errorf("%s: errors %v, want ErrSchema with %q", c.name, errs, c.want)
		}
	}
}

func TestValidateFindsWhatTheSchemaCannot(t *testing.T) {
	b := Bounds{Messages: 2, Parts: 2}
	for _, c := range []struct {
		name, plan string
		want       error
	}{
		{"duplicate ids", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}}, {"id": "a", "instruction": "y", "specialist": {"model": "m"}}]}`, ErrDuplicateID},
		{"an unknown dependency", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "depends_on": ["z"]}]}`, ErrUnknownDep},
		{"a self dependency", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "depends_on": ["a"]}]}`, ErrUnknownDep},
		{"a cycle", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "depends_on": ["b"]}, {"id": "b", "instruction": "y", "specialist": {"model": "m"}, "depends_on": ["a"]}]}`, ErrCycle},
		{"reading a subtask it does not wait for", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}}, {"id": "b", "instruction": "y", "specialist": {"model": "m"}, "inputs": ["subtask:a"]}]}`, ErrInputNotDep},
		{"a part out of range", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "inputs": ["part:2"]}]}`, ErrInputRange},
		{"a message out of range", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "inputs": ["message:5"]}]}`, ErrInputRange},
		{"compose names no subtask", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}}], "compose": {"mode": "final"}}`, ErrComposeNoTarget},
		{"compose names an unknown one", `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}}], "compose": {"mode": "sections", "order": ["q"]}}`, ErrComposeUnknown},
	} {
		errs := mustParse(t, c.plan).Validate(b)
		if len(errs) != 1 || !errors.Is(errs[0], c.want) {
			t.Errorf("%s: errors %v, want one %v", c.name, errs, c.want)
		}
	}
	ok := mustParse(t, `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "inputs": ["part:1", "message:1", "conversation"]}]}`)
	if errs := ok.Validate(b); len(errs) != 0 {
		t.Errorf("a valid plan: %v", errs)
	}
}

func TestRepairAddsTheDependencyAnInputNeeds(t *testing.T) {
	p := mustParse(t, `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}},
		{"id": "b", "instruction": "y", "specialist": {"model": "m"}, "inputs": ["subtask:a"]}]}`)
	if !p.Repair() || len(p.Validate(Bounds{Messages: 1, Parts: 1})) != 0 || strings.Join(p.Subtasks[1].DependsOn, ",") != "a" {
		t.Errorf("after Repair: %+v", p.Subtasks[1])
	}
	cyc := mustParse(t, `{"subtasks": [{"id": "a", "instruction": "x", "specialist": {"model": "m"}, "depends_on": ["b"]},
		{"id": "b", "instruction": "y", "specialist": {"model": "m"}, "inputs": ["subtask:a"]}]}`)
	if cyc.Repair() {
		t.Error("Repair added a dependency that makes a cycle")
	}
}

func TestDepthAndFanOut(t *testing.T) {
	// r → a, b, c; a → d; b, d → e: depth 3 (a, d, e), fan-out 3 (the request's).
	p := mustParse(t, `{"subtasks": [
		{"id": "a", "instruction": "x", "specialist": {"model": "m"}},
		{"id": "b", "instruction": "x", "specialist": {"model": "m"}},
		{"id": "c", "instruction": "x", "specialist": {"model": "m"}},
		{"id": "d", "instruction": "x", "specialist": {"model": "m"}, "depends_on": ["a"]},
		{"id": "e", "instruction": "x", "specialist": {"model": "m"}, "depends_on": ["b", "d"]}]}`)
	if d, f := p.Depth(); d != 3 || f != 3 {
		t.Errorf("depth %d, fan-out %d; want 3, 3", d, f)
	}
	if got := strings.Join(p.dependents([]string{"a"}), ","); got != "a,d,e" {
		t.Errorf("dependents of a: %s, want a,d,e", got)
	}
	p.normalize(Defaults{Ceiling: "T3", Tokens: 100, Refinements: 1})
	if p.Compose.Mode != ComposeSections || strings.Join(p.Compose.Order, ",") != "c,e" || p.Subtasks[0].Inputs[0] != InputLastUser || p.Subtasks[0].Budget.MaxTokens != 100 {
		t.Errorf("normalised: compose %+v, subtask %+v", p.Compose, p.Subtasks[0])
	}
}

func TestSplitParts(t *testing.T) {
	est := capability.NewEstimator(func() []string { return []string{"billing", "legal"} })
	for _, c := range []struct {
		name, text string
		items      []string
		preamble   string
	}{
		{"list items", "Two questions:\n1. Why was I charged twice on my last invoice?\n2. Is the termination clause of my contract enforceable?",
			[]string{"Why was I charged twice on my last invoice?", "Is the termination clause of my contract enforceable?"}, "Two questions:"},
		{"an item continues on the next line", "- first line\n  more of it\n- second", []string{"first line\nmore of it", "second"}, ""},
		{"sentences of one category stay together", "Translate hello into French. Translate goodbye into German.", []string{"Translate hello into French. Translate goodbye into German."}, ""},
		{"sentences of two categories split", "Translate hello into French. Write a Python function that reverses a list.",
			[]string{"Translate hello into French.", "Write a Python function that reverses a list."}, ""},
		{"a chat sentence joins its neighbour", "Hi there. Translate hello into French.", []string{"Hi there. Translate hello into French."}, ""},
		{"inline list markers open their part", "1. Why was I charged twice on my last invoice? 2. Is the termination clause of my contract enforceable?",
			[]string{"Why was I charged twice on my last invoice?", "Is the termination clause of my contract enforceable?"}, ""},
	} {
		p := SplitParts(c.text, est)
		if strings.Join(p.Items, "|") != strings.Join(c.items, "|") || p.Preamble != c.preamble {
			t.Errorf("%s: items %q preamble %q, want %q %q", c.name, p.Items, p.Preamble, c.items, c.preamble)
		}
	}
	p := SplitParts("1. Why was I charged twice on my last invoice?\n2. Is the termination clause of my contract enforceable?", est)
	if strings.Join(p.Tasks, ",") != "billing,legal" {
		t.Errorf("tasks %v, want billing,legal", p.Tasks)
	}
	if !buildsOnPrevious("Then, using that, write a summary.") || buildsOnPrevious("Thenceforth nothing.") || !buildsOnPrevious("Summarise the result in a line.") {
		t.Error("dependency cues misread")
	}
}

func TestFuseVotesWhereAnswersCompareAndScoresOtherwise(t *testing.T) {
	ans := func(content, target string, score, logprob float64) pipeline.Answer {
		return pipeline.Answer{Status: 200, Content: content, Target: target, Score: score, BestScore: 0.9, Quality: 0.8, Logprob: logprob, LogprobTokens: 3}
	}
	none := []error{nil, nil, nil}
	// The best scored answer disagrees with the two others: the majority wins.
	best, fusion, disagree, _ := fuse([]pipeline.Answer{ans("42", "a", 0.9, -0.1), ans("41.", "b", 0.5, -2), ans("41", "c", 0.4, -2)}, none)
	if best != 1 || fusion != "vote: 2 of 3 agree" || disagree != nil {
		t.Errorf("vote: best %d (%s), disagree %v; want b by 2 of 3", best, fusion, disagree)
	}
	// No two agree: the best score, flagged as a disagreement.
	best, _, disagree, _ = fuse([]pipeline.Answer{ans("1", "a", 0.5, -2), ans("2", "b", 0.9, -0.1), ans("3", "c", 0.4, -2)}, none)
	if best != 1 || len(disagree) != 3 {
		t.Errorf("no majority: best %d, disagree %v; want b and three answers", best, disagree)
	}
	// Long answers are not voted on: e^(0.9-0.9)·0.8·e^-0.1 beats e^(0.5-0.9)·0.8·e^-0.1.
	long := strings.Repeat("word ", VoteWords+1)
	best, fusion, _, scores := fuse([]pipeline.Answer{ans(long+"x", "a", 0.5, -0.1), ans(long+"y", "b", 0.9, -0.1)}, []error{nil, nil})
	if best != 1 || !strings.HasPrefix(fusion, "score:") || scores[1].fused < 0.72 || scores[1].fused > 0.73 {
		t.Errorf("long answers: best %d (%s), fused %v; want b at 0.8·e^-0.1 ≈ 0.7239", best, fusion, scores[1].fused)
	}
	if best, _, _, _ := fuse([]pipeline.Answer{{Status: 500}, ans("ok", "b", 0.5, -1)}, []error{nil, nil}); best != 1 {
		t.Errorf("a failed alternative was chosen")
	}
	if best, _, _, _ := fuse([]pipeline.Answer{{}}, []error{errors.New("down")}); best != -1 {
		t.Errorf("no answer: best %d, want -1", best)
	}
}
