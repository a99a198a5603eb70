package classify

import (
	"strings"
	"sync"
	"testing"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
)

// The scanner compiles every detector pattern once; tests share it.
var (
	scannerOnce sync.Once
	scannerVal  *redaction.Scanner
	scannerErr  error
)

func testScanner(tb testing.TB) *redaction.Scanner {
	tb.Helper()
	scannerOnce.Do(func() { scannerVal, scannerErr = redaction.NewScanner(redaction.Config{}) })
	if scannerErr != nil {
		tb.Fatalf("NewScanner: %v", scannerErr)
	}
	return scannerVal
}

func testClassifier(tb testing.TB) *Classifier {
	tb.Helper()
	return New(testScanner(tb), nil)
}

// classifyBody runs the default classifier and fails the test on an error.
func classifyBody(tb testing.TB, ep openai.Endpoint, body, declared string) *Annotation {
	tb.Helper()
	a, err := testClassifier(tb).Classify(Input{Endpoint: ep, Body: []byte(body), Declared: declared})
	if err != nil {
		tb.Fatalf("Classify(%s, %s): %v", ep, body, err)
	}
	return a
}

func chatBody(prompt string) string {
	return `{"model":"m","messages":[{"role":"user","content":` + jsonString(prompt) + `}]}`
}

func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

var kindNames = map[fieldKind]string{kindText: "text", kindContent: "content", kindName: "name", kindArgs: "args",
	kindPrompt: "prompt", kindNumber: "number", kindKey: "key", kindDataURL: "dataurl"}

// fieldList writes the scanned fields as "kind path=text".
func fieldList(a *Annotation) []string {
	out := make([]string, len(a.fields))
	for i, f := range a.fields {
		out[i] = kindNames[f.kind] + " " + a.fieldPath(i) + "=" + f.text
	}
	return out
}
