package classify

import (
	"encoding/json"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
)

// conversation is a chat body: a long user message holding an e-mail
// address and a card number, a long assistant answer holding an IBAN,
// then the last user message.
func conversation(t *testing.T, last string) []byte {
	t.Helper()
	filler := strings.Repeat("We checked the routing rules and the latency targets of the support assistant once more. ", 14)
	b, err := json.Marshal(map[string]any{"model": "m", "messages": []any{
		map[string]any{"role": "system", "content": "You are a support assistant."},
		map[string]any{"role": "user", "content": filler + "Write to giulia.bianchi@example.com, card 4111 1111 1111 1111."},
		map[string]any{"role": "assistant", "content": filler + "The refund goes to DE89 3704 0044 0532 0130 00."},
		map[string]any{"role": "user", "content": last},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// scanLog wraps c's scan and records the texts it reads.
type scanLog struct {
	mu    sync.Mutex
	texts []string
}

func (l *scanLog) wrap(c *Classifier) {
	scan := c.scan
	c.scan = func(text string) ([]redaction.Finding, error) {
		l.mu.Lock()
		l.texts = append(l.texts, text)
		l.mu.Unlock()
		return scan(text)
	}
}

// long counts the texts of scanCacheMin bytes or more read since reset.
func (l *scanLog) long() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.texts {
		if len(s) >= scanCacheMin {
			n++
		}
	}
	l.texts = nil
	return n
}

// TestEarlierMessagesAreNotScannedAgain: the next turn of a conversation
// sends its two long earlier messages again; the detectors read only the
// new message, and the annotation is the one a classifier that never saw
// the conversation makes: the same findings (counted by hand) and the same
// redacted body.
func TestEarlierMessagesAreNotScannedAgain(t *testing.T) {
	c := New(testScanner(t), nil)
	var log scanLog
	log.wrap(c)
	classify := func(c *Classifier, body []byte) *Annotation {
		t.Helper()
		a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: body})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	want := map[string]int{"EMAIL": 1, "CREDIT_CARD": 1, "IBAN": 1}
	classify(c, conversation(t, "Thanks, what happens next?"))
	if n := log.long(); n != 2 {
		t.Fatalf("first turn: %d long texts scanned, want the 2 long messages", n)
	}
	next := conversation(t, "And when does the refund arrive? "+strings.Repeat("Please answer in detail. ", 50))
	a := classify(c, next)
	if n := log.long(); n != 1 {
		t.Fatalf("next turn: %d long texts scanned, want only the new last message", n)
	}
	fresh := classify(New(testScanner(t), nil), next)
	if got := a.Findings(); !maps.Equal(got, want) || !maps.Equal(fresh.Findings(), want) {
		t.Fatalf("findings %v (a new classifier: %v), want %v", got, fresh.Findings(), want)
	}
	types := []string{"EMAIL", "CREDIT_CARD", "IBAN"}
	r1, err1 := a.Redact(types)
	r2, err2 := fresh.Redact(types)
	if err1 != nil || err2 != nil || r1.Body != r2.Body {
		t.Fatalf("redacted bodies differ (%v, %v):\n%s\n%s", err1, err2, r1.Body, r2.Body)
	}
	for _, v := range []string{"giulia.bianchi@example.com", "4111 1111 1111 1111", "DE89 3704 0044 0532 0130 00"} {
		if strings.Contains(r1.Body, v) {
			t.Errorf("redacted body still holds %q", v)
		}
	}

	// The last user message is new by nature: sent twice, it is read twice.
	classify(c, next)
	if n := log.long(); n != 1 {
		t.Fatalf("the same turn again: %d long texts scanned, want the last message's 1", n)
	}
}

// TestAScanCutShortIsNotKept: a long earlier message the scan budget cut
// short is unscanned on every turn, never a clean text on the next.
func TestAScanCutShortIsNotKept(t *testing.T) {
	scanner, err := redaction.NewScanner(redaction.Config{MaxScanBytes: 512})
	if err != nil {
		t.Fatal(err)
	}
	c := New(scanner, nil)
	for turn := range 2 {
		a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: conversation(t, "next")})
		if err != nil {
			t.Fatal(err)
		}
		if len(a.Unscanned()) == 0 {
			t.Fatalf("turn %d: nothing unscanned, findings %v", turn, a.Findings())
		}
	}
}

// TestABodyHandedOverIsTheBodyCopied: a body handed over is annotated as
// the same bytes copied are (findings, digest, body text); a body not
// handed over is copied, so the caller's later writes to its slice change
// nothing.
func TestABodyHandedOverIsTheBodyCopied(t *testing.T) {
	c := New(testScanner(t), nil)
	body := conversation(t, "and write to mario.rossi@example.it too")
	copied, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	handed, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: append([]byte(nil), body...), BodyHandedOver: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"EMAIL": 2, "CREDIT_CARD": 1, "IBAN": 1}
	if !maps.Equal(copied.Findings(), want) || !maps.Equal(handed.Findings(), want) || copied.Digest() != handed.Digest() || copied.Body() != handed.Body() {
		t.Fatalf("copied %v, handed over %v (want %v); digests equal %v", copied.Findings(), handed.Findings(), want, copied.Digest() == handed.Digest())
	}
	before := copied.Body()
	for i := range body {
		body[i] = 'x'
	}
	if copied.Body() != before || strings.Contains(copied.Body(), "xxxx") {
		t.Fatal("a body not handed over changed with the caller's slice")
	}
}
