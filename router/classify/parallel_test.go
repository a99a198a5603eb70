package classify

import (
	"encoding/json"
	"maps"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/router/openai"
)

// TestTheTextPassesGiveTheSameAnnotationOnOneGoroutineOrTwo: a chat whose
// texts are over parallelMin has its capability estimate and its split-value
// scan run beside the field scan when a core is spare; the annotation is
// the one the passes give in turn: the same findings (an e-mail address in
// the long message, a card number cut across two messages: counted by
// hand), task, difficulty, unscanned list and digest.
func TestTheTextPassesGiveTheSameAnnotationOnOneGoroutineOrTwo(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // a second core, so the passes may run on two goroutines
	defer func(n int) { parallelMin = n }(parallelMin)
	long := strings.Repeat("Could you check the configuration of the routing rules and tell us whether the latency targets are realistic? ", 12) +
		"You can reach me at giulia.bianchi@example.com."
	body, err := json.Marshal(map[string]any{"model": "m", "messages": []any{
		map[string]any{"role": "system", "content": "You are a helpful support assistant."},
		map[string]any{"role": "user", "content": long},
		map[string]any{"role": "user", "content": "my card is 4111 1111"},
		map[string]any{"role": "user", "content": "1111 1111 thanks"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	c := New(testScanner(t), nil)
	classify := func(min int) *Annotation {
		parallelMin = min
		a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	inTurn, beside := classify(math.MaxInt), classify(0)
	want := map[string]int{"EMAIL": 1, "CREDIT_CARD": 1}
	for name, a := range map[string]*Annotation{"in turn": inTurn, "beside": beside} {
		if got := a.Findings(); !maps.Equal(got, want) {
			t.Errorf("%s: findings %v, want %v", name, got, want)
		}
		if a.ScanFailed() || len(a.Unscanned()) != 0 {
			t.Errorf("%s: scan failed %v, unscanned %v", name, a.ScanFailed(), a.Unscanned())
		}
	}
	if inTurn.Task() == "" || beside.Task() != inTurn.Task() || beside.Difficulty() != inTurn.Difficulty() || beside.TaskEntropy() != inTurn.TaskEntropy() {
		t.Errorf("estimate beside: %q %v %v, in turn: %q %v %v", beside.Task(), beside.Difficulty(), beside.TaskEntropy(),
			inTurn.Task(), inTurn.Difficulty(), inTurn.TaskEntropy())
	}
	if beside.Digest() != inTurn.Digest() {
		t.Error("the digests differ")
	}
}

// BenchmarkClassifyBeside measures Classify with the real detectors on
// chat bodies of 2 and 32 KB (prose, an e-mail address), its passes in
// turn and beside the field scan (see classifyText): the time per request
// is what the request waits for on an otherwise idle machine with two
// cores or more.
func BenchmarkClassifyBeside(b *testing.B) {
	defer func(n int) { parallelMin = n }(parallelMin)
	c := New(testScanner(b), nil)
	for _, kb := range []int{2, 32} {
		body := benchChat(kb)
		for _, mode := range []struct {
			name string
			min  int
		}{{"in-turn", math.MaxInt}, {"beside", 1024}} {
			b.Run(strconv.Itoa(kb)+"KB/"+mode.name, func(b *testing.B) {
				parallelMin = mode.min
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: body}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
