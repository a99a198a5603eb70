package route

import (
	"strings"
	"testing"

	"github.com/molly-gateway/molly/router/classify"
	"github.com/molly-gateway/molly/router/openai"
)

// The prompt bound admission reserves holds a real tokenizer's count: the
// T0 engine's (llama.cpp on the demo GGUF, whose vocabulary is nearly one
// token per byte: a worst case) for prompts whose estimate is several times
// short — CJK, emoji, digits, punctuation, base64, tool schemas, many
// turns — and, for plain bodies, is exactly the documented sum: the body's
// bytes, BoundPerRequest, BoundPerMessage per message and BoundPerFinding
// per finding.
func TestPromptBoundHoldsTheEnginesCount(t *testing.T) {
	eng := demoEngine(t)
	cls := testClassifier(t)
	tools := `,"tools":[{"type":"function","function":{"name":"lookup","description":"Look a thing up","parameters":{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"}},"required":["q"]}}}]`
	prompts := []string{
		"hello",
		strings.Repeat("请联系我们的客服团队以获取更多信息。", 40),
		strings.Repeat("👨‍👩‍👧‍👦🇫🇷😀", 60),
		strings.Repeat("31415926535 27182818284 ", 50),
		strings.Repeat("!@#$%^&*()_+{}|:<>?~`-=[];',./", 30),
		strings.Repeat("QmFzZTY0IGlzIG5vdCBwcm9zZQ==", 40),
		strings.Repeat("Ünïcödé ελληνικά русский עברית العربية हिन्दी ", 20),
	}
	for _, text := range prompts {
		for _, extra := range []string{"", tools} {
			for _, turns := range []int{1, 5} {
				var msgs []string
				for i := range turns {
					role := "user"
					if i%2 == 1 {
						role = "assistant"
					}
					msgs = append(msgs, `{"role":"`+role+`","content":"`+text+`"}`)
				}
				body := `{"model":"molly-demo","messages":[` + strings.Join(msgs, ",") + `]` + extra + `}`
				a, err := cls.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
				if err != nil {
					t.Fatal(err)
				}
				n, err := eng.ChatPromptTokens([]byte(body))
				if err != nil {
					t.Fatalf("%.60s: %v", body, err)
				}
				if a.PromptBound() < n || a.PromptBound() < a.PromptTokens() {
					t.Errorf("%.60s… (%d turns, tools %v): bound %d, the engine counts %d, estimate %d", text, turns, extra != "", a.PromptBound(), n, a.PromptTokens())
				}
				if extra == "" && len(a.Findings()) == 0 {
					if want := len(body) + classify.BoundPerRequest + classify.BoundPerMessage*turns; a.PromptBound() != want {
						t.Errorf("%.60s… (%d turns): bound %d, want %d (bytes %d)", text, turns, a.PromptBound(), want, len(body))
					}
				}
			}
		}
	}
	// A finding may grow into a longer placeholder; an image counts as
	// BoundPerMedia whatever its bytes.
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"mail a@b.co"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("iVBORw0KGgo", 3000) + `"}}]}]}`
	a, err := cls.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	payload := len("data:image/png;base64,") + 11*3000
	want := len(body) - payload + classify.BoundPerRequest + classify.BoundPerMessage + classify.BoundPerMedia + classify.BoundPerFinding*len(a.Findings())
	if len(a.Findings()) != 1 || a.PromptBound() != want {
		t.Errorf("bound %d with %d findings, want %d with 1", a.PromptBound(), len(a.Findings()), want)
	}
}

// TestPromptBoundCountsFilesAndLongAudio: a file part's data (a PDF, which
// providers read as its pages' text and images) stays in the bound byte
// for byte, and an audio part adds its bytes / BoundAudioBytesPerToken to
// BoundPerMedia, so an hour of mp3 is not bounded by 2,048 tokens; an
// image's bytes are still replaced by BoundPerMedia.
func TestPromptBoundCountsFilesAndLongAudio(t *testing.T) {
	cls := testClassifier(t)
	data := strings.Repeat("JVBERi0xLjcKJcfs", 4000) // 64,000 base64 bytes
	for _, c := range []struct {
		name, part string
		want       func(body string) int
	}{
		{"a file data URL", `{"type":"file","file":{"filename":"a.pdf","file_data":"data:application/pdf;base64,` + data + `"}}`,
			func(body string) int { return len(body) + classify.BoundPerMedia }},
		{"raw file data", `{"type":"file","file":{"filename":"a.pdf","file_data":"` + data + `"}}`,
			func(body string) int { return len(body) + classify.BoundPerMedia }},
		{"audio", `{"type":"input_audio","input_audio":{"format":"mp3","data":"` + data + `"}}`,
			func(body string) int {
				return len(body) - len(data) + classify.BoundPerMedia + len(data)/classify.BoundAudioBytesPerToken
			}},
		{"an image", `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data + `"}}`,
			func(body string) int {
				return len(body) - len("data:image/png;base64,") - len(data) + classify.BoundPerMedia
			}},
	} {
		body := `{"model":"m","messages":[{"role":"user","content":[` + c.part + `]}]}`
		a, err := cls.Classify(classify.Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
		if err != nil {
			t.Fatal(err)
		}
		if want := c.want(body) + classify.BoundPerRequest + classify.BoundPerMessage; a.PromptBound() != want {
			t.Errorf("%s: bound %d, want %d", c.name, a.PromptBound(), want)
		}
	}
}
