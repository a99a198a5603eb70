package curate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/registry"
)

func body(prompt string) string {
	b, _ := json.Marshal(map[string]any{"model": "chat", "messages": []map[string]string{
		{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}}})
	return string(b)
}

func trace(id int64, prompt, answer string) registry.Trace {
	return registry.Trace{ID: id, Member: "alice", Category: "support", Label: "routed", Tier: "T1", Request: body(prompt), Answer: answer, Feedback: -1}
}

// TestFiltersByQualitySignals: only delivered answers are pairs; negative
// feedback drops one, a correction replaces it, a T0 answer needs
// positive feedback, tool turns are not text pairs.
func TestFiltersByQualitySignals(t *testing.T) {
	failed := trace(1, "order 1 late", "x")
	failed.Label = "upstream_error"
	negative := trace(2, "order 2 late", "Go away.")
	negative.Feedback = 0.1
	edited := trace(3, "order 3 late", "It ships Monday.")
	edited.Feedback, edited.Edit = 0.2, "Order 3 ships on Monday; sorry for the wait."
	self := trace(4, "order 4 late", "T0 guessed.")
	self.Tier = "T0"
	praised := trace(5, "order 5 late", "T0 answered well.")
	praised.Tier, praised.Feedback = "T0", 0.9
	tool := trace(6, "order 6 late", "done")
	tool.Request = `{"messages":[{"role":"user","content":"look up"},{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"{}"}]}`
	other := trace(7, "order 7 late", "fine")
	other.Category = "billing"
	teacher := trace(8, "order 8 late", "Order 8 ships tomorrow.")
	set, rep := Curate("s", "support", []registry.Trace{failed, negative, edited, self, praised, tool, other, teacher}, Options{})
	want := map[string]int{DropNoAnswer: 1, DropNegative: 1, DropSelf: 1, DropUnparseable: 1}
	for k, v := range want {
		if rep.Dropped[k] != v {
			t.Errorf("dropped %s: %d, want %d (%v)", k, rep.Dropped[k], v, rep.Dropped)
		}
	}
	if rep.Seen != 7 || rep.Kept != 3 || rep.Edited != 1 || rep.Teacher != 1 {
		t.Fatalf("report %+v", rep)
	}
	answers := map[int64]registry.CuratedItem{}
	for _, it := range set.Items {
		answers[it.TraceID] = it
	}
	if answers[3].Answer != edited.Edit || answers[3].Teacher != "edit" || answers[5].Teacher != "T0" || answers[8].Teacher != "T1" {
		t.Fatalf("items %+v", set.Items)
	}
	var msgs []map[string]string
	if err := json.Unmarshal([]byte(answers[8].Messages), &msgs); err != nil || len(msgs) != 2 || msgs[0]["role"] != "system" || msgs[1]["content"] != "order 8 late" {
		t.Fatalf("messages %s (%v)", answers[8].Messages, err)
	}
}

// TestDuplicatesAndNearDuplicatesAreRemoved: exact duplicates up to case
// and spacing, and a paraphrase that changes one word of a long reply,
// are dropped; distinct pairs stay.
func TestDuplicatesAndNearDuplicatesAreRemoved(t *testing.T) {
	long := "Your parcel left our warehouse in Lyon this morning and the carrier expects to deliver it to your door on Thursday between nine and noon, please keep your phone nearby"
	ts := []registry.Trace{
		trace(1, "Where is my parcel?", long),
		trace(2, "  where is MY parcel? ", strings.ToUpper(long[:1])+long[1:]), // exact up to normalisation
		trace(3, "Where is my parcel?", strings.Replace(long, "Thursday", "Friday", 1)),
		trace(4, "How do I reset my password?", "Open settings, choose security, then reset password."),
		trace(5, "Can I pay by invoice?", "Yes, invoices are available for business accounts."),
	}
	_, rep := Curate("s", "support", ts, Options{})
	if rep.Duplicates != 1 || rep.NearDupes != 1 || rep.Kept != 3 {
		t.Fatalf("report %+v: want 1 duplicate, 1 near-duplicate, 3 kept", rep)
	}
	// Unrelated pairs are not near-duplicates of each other.
	var many []registry.Trace
	for i := range 200 {
		many = append(many, trace(int64(i), fmt.Sprintf("Order %d: where is it, and what about item %d?", i, i*7919%1000),
			fmt.Sprintf("Order %d ships from depot %d on day %d.", i, i%13, i%29)))
	}
	if _, rep := Curate("m", "support", many, Options{}); rep.Kept != 200 {
		t.Fatalf("distinct pairs: kept %d of 200 (%+v)", rep.Kept, rep)
	}
}

// TestHeldOutSplitIsByPrompt: the split depends on the normalised prompt
// only (one prompt never lands in both splits, whatever its answers), and
// the held-out share is near the option's (binomial bound, 4.5σ).
func TestHeldOutSplitIsByPrompt(t *testing.T) {
	var ts []registry.Trace
	const n = 2000
	for i := range n {
		ts = append(ts, trace(int64(i), fmt.Sprintf("question number %d about shipping", i), fmt.Sprintf("answer %d", i)))
		ts = append(ts, trace(int64(n+i), fmt.Sprintf("Question number %d about shipping", i), fmt.Sprintf("another answer, %d", i)))
	}
	set, rep := Curate("s", "support", ts, Options{HeldOut: 0.25})
	split := map[string]string{}
	for _, it := range set.Items {
		var msgs []struct{ Content string }
		_ = json.Unmarshal([]byte(it.Messages), &msgs)
		p := strings.ToLower(msgs[len(msgs)-1].Content)
		if s, ok := split[p]; ok && s != it.Split {
			t.Fatalf("prompt %q in both splits", p)
		}
		split[p] = it.Split
	}
	held := 0
	for _, s := range split {
		if s == registry.SplitHeldOut {
			held++
		}
	}
	sigma := math.Sqrt(n * 0.25 * 0.75)
	if math.Abs(float64(held)-0.25*n) > 4.5*sigma {
		t.Fatalf("%d of %d prompts held out, want about %d", held, n, n/4)
	}
	if rep.Train+rep.HeldOut != rep.Kept || len(rep.TrainTraces) != rep.Train {
		t.Fatalf("report %+v", rep)
	}
}

// TestJSONLRoundTrip: a set written as fine-tuning JSONL and imported
// again holds the same pairs.
func TestJSONLRoundTrip(t *testing.T) {
	ts := []registry.Trace{
		trace(1, "Where is my parcel?", "On its way <3 & \"soon\"."),
		trace(2, "How do I reset my password?", "Settings → security → reset."),
	}
	set, _ := Curate("s", "support", ts, Options{HeldOut: 0.01})
	var buf bytes.Buffer
	n, err := WriteJSONL(&buf, set, "")
	if err != nil || n != 2 {
		t.Fatalf("wrote %d (%v)", n, err)
	}
	if !strings.Contains(buf.String(), `"role":"assistant","content":"On its way <3 & \"soon\"."`) {
		t.Fatalf("JSONL %s", buf.String())
	}
	back, rep, err := Import("i", "support", &buf, Options{})
	if err != nil || rep.Kept != 2 || back.Source != "import" {
		t.Fatalf("import %+v %v", rep, err)
	}
	a, _ := Pairs(set, "")
	b, _ := Pairs(back, "")
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("round trip:\n%s\n%s", ja, jb)
	}
	if _, _, err := Import("bad", "support", strings.NewReader("{\"messages\": 3}\n"), Options{}); err == nil || !strings.Contains(err.Error(), "1") {
		t.Fatalf("a malformed line: %v, want an error naming line 1", err)
	}
}
