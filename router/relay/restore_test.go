package relay

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/molly-gateway/molly/redaction"
)

// vaultFor redacts the e-mail addresses of text into a new vault and
// returns the vault and the redacted text.
func vaultFor(t *testing.T, text string) (*redaction.Vault, string) {
	t.Helper()
	sc, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	v := redaction.NewVault()
	return v, v.Redact(text, sc.Scan(text), map[string]bool{"EMAIL": true})
}

func TestStripLogprobsNullsEveryChoice(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"choices":[{"index":0,"logprobs":{"content":[]}},{"index":1,"logprobs":{"content":[]}}]}`,
			`{"choices":[{"index":0,"logprobs":null},{"index":1,"logprobs":null}]}`},
		{`{"choices":[{"index":0,"logprobs":null},{"index":1}]}`, `{"choices":[{"index":0,"logprobs":null},{"index":1}]}`},
		{`{"object":"list"}`, `{"object":"list"}`},
	} {
		if got := string(StripLogprobs([]byte(tc.in))); got != tc.want {
			t.Errorf("StripLogprobs(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestRestoreBody(t *testing.T) {
	v, red := vaultFor(t, "alice@example.com bob@example.org")
	if red != "[EMAIL_1] [EMAIL_2]" {
		t.Fatalf("redacted %q", red)
	}
	body := `{"choices":[{"index":0,"message":{"role":"assistant","content":"write to [EMAIL_1]","tool_calls":[{"id":"c","type":"function","function":{"name":"send","arguments":"{\"to\":\"[EMAIL_2]\"}"}}]}}]}`
	out := RestoreBody(v, []byte(body))
	if !gjson.ValidBytes(out) {
		t.Fatalf("not JSON: %s", out)
	}
	if got := gjson.GetBytes(out, "choices.0.message.content").String(); got != "write to alice@example.com" {
		t.Errorf("content %q", got)
	}
	args := gjson.GetBytes(out, "choices.0.message.tool_calls.0.function.arguments").String()
	if !gjson.Valid(args) || gjson.Get(args, "to").String() != "bob@example.org" {
		t.Errorf("arguments %q", args)
	}
}

// TestStreamRestoreAcrossChunks: a placeholder cut at any point across
// chunks is restored; the text held back is released on the choice's
// finish_reason chunk, or in one extra chunk when the stream ends without.
func TestStreamRestoreAcrossChunks(t *testing.T) {
	v, _ := vaultFor(t, "alice@example.com")
	chunk := func(content string, finish bool) []byte {
		fr := "null"
		if finish {
			fr = `"stop"`
		}
		return []byte(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"` + content + `"},"finish_reason":` + fr + `}]}`)
	}
	const answer = "mail [EMAIL_1] now"
	for cut := 1; cut < len(answer); cut++ {
		s := NewStreamRestore(v, nil)
		var got strings.Builder
		for _, c := range [][]byte{chunk(answer[:cut], false), chunk(answer[cut:], false), chunk("", true)} {
			got.WriteString(gjson.GetBytes(s.Event(c), "choices.0.delta.content").String())
		}
		if got.String() != "mail alice@example.com now" {
			t.Fatalf("cut at %d: streamed %q", cut, got.String())
		}
		if s.Final() != nil {
			t.Fatalf("cut at %d: a final chunk after the finish_reason released everything", cut)
		}
	}
	t.Run("reasoning_content deltas are restored across chunks too", func(t *testing.T) {
		reasoning := func(text string, finish bool) []byte {
			fr := "null"
			if finish {
				fr = `"stop"`
			}
			return []byte(`{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"` + text + `"},"finish_reason":` + fr + `}]}`)
		}
		for cut := 1; cut < len(answer); cut++ {
			s := NewStreamRestore(v, nil)
			var got strings.Builder
			for _, c := range [][]byte{reasoning(answer[:cut], false), reasoning(answer[cut:], false), reasoning("", true)} {
				got.WriteString(gjson.GetBytes(s.Event(c), "choices.0.delta.reasoning_content").String())
			}
			if got.String() != "mail alice@example.com now" {
				t.Fatalf("cut at %d: streamed reasoning %q", cut, got.String())
			}
		}
		s := NewStreamRestore(v, nil)
		s.Event(reasoning("think [EMAIL", false))
		if final := s.Final(); gjson.GetBytes(final, "choices.0.delta.reasoning_content").String() != "[EMAIL" {
			t.Fatalf("final %s", final)
		}
	})
	t.Run("a stream ending without a finish_reason gets the rest in a final chunk", func(t *testing.T) {
		s := NewStreamRestore(v, nil)
		first := gjson.GetBytes(s.Event(chunk("to [EMAIL", false)), "choices.0.delta.content").String()
		final := s.Final()
		if first != "to " || gjson.GetBytes(final, "choices.0.delta.content").String() != "[EMAIL" || gjson.GetBytes(final, "id").String() != "c" {
			t.Fatalf("first %q, final %s", first, final)
		}
	})
}

// TestStreamRestoreCoversEveryDeltaText: besides content, a delta's
// refusal, reasoning_content, an upstream's own reasoning field and the
// legacy function_call arguments are text the model wrote: a placeholder
// cut across their chunks is restored, and an address the model wrote
// there is masked by the guard, cut at any point. The oracle is the text
// written by hand.
func TestStreamRestoreCoversEveryDeltaText(t *testing.T) {
	v, _ := vaultFor(t, "alice@example.com")
	sc, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	g := sc.NewGuard(redaction.GuardPolicy{Default: redaction.GuardMask}, v.Values()...)
	const answer = `to [EMAIL_1] or bob.builder@corp-mail.org`
	const want = `to alice@example.com or [EMAIL]`
	for _, field := range []string{"refusal", "reasoning_content", "reasoning", "function_call.arguments"} {
		chunk := func(text string, finish bool) []byte {
			fr := "null"
			if finish {
				fr = `"stop"`
			}
			b := []byte(`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":` + fr + `}]}`)
			if text != "" {
				b, _ = sjson.SetBytes(b, "choices.0.delta."+field, text)
			}
			return b
		}
		for cut := 1; cut < len(answer); cut++ {
			s := NewStreamRestore(v, g)
			var got strings.Builder
			for _, c := range [][]byte{chunk(answer[:cut], false), chunk(answer[cut:], false), chunk("", true)} {
				got.WriteString(gjson.GetBytes(s.Event(c), "choices.0.delta."+field).String())
			}
			if got.String() != want {
				t.Fatalf("%s cut at %d: streamed %q, want %q", field, cut, got.String(), want)
			}
		}
	}
}

// TestStreamRestoreHoldsLogprobsUnderAGuard: with a guard, a stream's
// logprobs tokens would spell what the guard holds back and masks; they
// are held and come whole with the finish_reason chunk, or not at all
// when the guard masked the choice's content. The oracle is the tokens
// written by hand.
func TestStreamRestoreHoldsLogprobsUnderAGuard(t *testing.T) {
	sc, err := redaction.NewScanner(redaction.Config{Types: []string{redaction.TypeEmail}})
	if err != nil {
		t.Fatal(err)
	}
	g := sc.NewGuard(redaction.GuardPolicy{Default: redaction.GuardMask})
	chunk := func(tok string, finish bool) []byte {
		fr := "null"
		if finish {
			fr = `"stop"`
		}
		b := []byte(`{"id":"c","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":` + fr + `}]}`)
		if tok != "" {
			b, _ = sjson.SetBytes(b, "choices.0.delta.content", tok)
			b, _ = sjson.SetRawBytes(b, "choices.0.logprobs", []byte(`{"content":[{"token":`+strconv.Quote(tok)+`,"logprob":-1,"bytes":null,"top_logprobs":[]}],"refusal":null}`))
		}
		return b
	}
	run := func(tokens []string) (text string, lps []string, out string) {
		s := NewStreamRestore(nil, g)
		var all strings.Builder
		for i, tok := range append(tokens, "") {
			ev := s.Event(chunk(tok, i == len(tokens)))
			all.Write(ev)
			text += gjson.GetBytes(ev, "choices.0.delta.content").String()
			for _, e := range gjson.GetBytes(ev, "choices.0.logprobs.content").Array() {
				lps = append(lps, e.Get("token").String())
			}
		}
		return text, lps, all.String()
	}
	clean := []string{"hello", " there", ", friend"}
	if text, lps, _ := run(clean); text != "hello there, friend" || !slices.Equal(lps, clean) {
		t.Errorf("clean stream: text %q, logprobs tokens %q", text, lps)
	}
	text, lps, out := run([]string{"write ", "bob.bui", "lder@corp-mail.org", " now"})
	if text != "write [EMAIL] now" || lps != nil || strings.Contains(out, "lder@corp") {
		t.Errorf("masked stream: text %q, logprobs %q, chunks %s", text, lps, out)
	}
}
