package classify

import (
	"encoding/base64"
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/redaction"
	"github.com/molly-gateway/molly/router/openai"
)

func TestClassifyScansEveryStringKeyAndNumber(t *testing.T) {
	tests := []struct {
		name string
		ep   openai.Endpoint
		body string
		want []string // "kind path=text", in document order
	}{
		{"chat string content of every role is scanned; model and roles are not", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`,
			[]string{"content messages.0.content=be brief", "content messages.1.content=hello"}},
		{"content parts in document order: text, an image URL, refusal; binary data URLs are left to Unscanned", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"again"}]},{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`,
			[]string{"content messages.0.content.0.text=look", "text messages.0.content.1.image_url.url=https://x/y.png",
				"content messages.0.content.3.text=again", "content messages.1.content.0.refusal=no"}},
		{"strings outside the message text, keys that are not the schema's and function names are scanned, with escaped paths", openai.EndpointChat,
			`{"model":"m","user":"u-1","metadata":{"a.b":"x"},"stop":["END"],"tools":[{"type":"function","function":{"name":"f","description":"d"}}],"messages":[{"role":"user","content":"q"}]}`,
			[]string{"text user=u-1", `key metadata.a\.b=a.b`, `text metadata.a\.b=x`, "text stop.0=END",
				"name tools.0.function.name=f", "text tools.0.function.description=d", "content messages.0.content=q"}},
		{"the keys the issue named are scanned wherever they are not the schema's position", openai.EndpointChat,
			`{"model":"m","metadata":{"data":"x","id":"y","type":"z"},"messages":[{"role":"user","content":"q"}]}`,
			[]string{"text metadata.data=x", "text metadata.id=y", "text metadata.type=z", "content messages.0.content=q"}},
		{"numbers are scanned as their literal text", openai.EndpointChat,
			`{"model":"m","temperature":0.2,"max_tokens":5,"metadata":{"k":4111111111111111},"messages":[{"role":"user","content":"q"}]}`,
			[]string{"number temperature=0.2", "number max_tokens=5", "key metadata.k=k", "number metadata.k=4111111111111111", "content messages.0.content=q"}},
		{"name comes before content of the same message", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","name":"alice","content":"hi"}]}`,
			[]string{"name messages.0.name=alice", "content messages.0.content=hi"}},
		{"tool call ids, names and arguments, function calls and tool results are scanned", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{\"b\":2}"}}]},{"role":"assistant","content":null,"function_call":{"name":"h","arguments":"{\"c\":3}"}},{"role":"tool","tool_call_id":"c1","content":"42"}]}`,
			[]string{"content messages.0.content=q",
				"text messages.1.tool_calls.0.id=c1", "name messages.1.tool_calls.0.function.name=f", `args messages.1.tool_calls.0.function.arguments={"a":1}`,
				"text messages.1.tool_calls.1.id=c2", "name messages.1.tool_calls.1.function.name=g", `args messages.1.tool_calls.1.function.arguments={"b":2}`,
				"name messages.2.function_call.name=h", `args messages.2.function_call.arguments={"c":3}`,
				"text messages.3.tool_call_id=c1", "content messages.3.content=42"}},
		{"an enum position holding something other than the schema's values is scanned", openai.EndpointChat,
			`{"model":"m","service_tier":"auto","reasoning_effort":"call me","tool_choice":"none","messages":[{"role":"user","content":"q"}]}`,
			[]string{"text reasoning_effort=call me", "content messages.0.content=q"}},
		{"JSON Schema property names and values of a response format are scanned", openai.EndpointChat,
			`{"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"email":{"type":"string"}}}}},"messages":[{"role":"user","content":"q"}]}`,
			[]string{"text response_format.json_schema.name=n", "text response_format.json_schema.schema.type=object",
				"key response_format.json_schema.schema.properties.email=email", "text response_format.json_schema.schema.properties.email.type=string",
				"content messages.0.content=q"}},
		{"a text data URL is decoded and scanned", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/svg+xml;base64,PHN2Zz5oaTwvc3ZnPg=="}},{"type":"text","text":"and data:,plain%20text"}]}]}`,
			[]string{"dataurl messages.0.content.0.image_url.url=<svg>hi</svg>", "content messages.0.content.1.text=and data:,plain%20text"}},
		{"escaped JSON strings are decoded", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"a\u0040b \"q\"\n"}]}`,
			[]string{"content messages.0.content=a@b \"q\"\n"}},
		{"a completions prompt string and its suffix", openai.EndpointCompletions,
			`{"model":"m","prompt":"def f(","suffix":"return x"}`,
			[]string{"prompt prompt=def f(", "text suffix=return x"}},
		{"a completions prompt array of strings", openai.EndpointCompletions,
			`{"model":"m","prompt":["one","two"]}`,
			[]string{"prompt prompt.0=one", "prompt prompt.1=two"}},
		{"an embeddings input string", openai.EndpointEmbeddings,
			`{"model":"m","input":"embed me"}`,
			[]string{"prompt input=embed me"}},
		{"an embeddings input array", openai.EndpointEmbeddings,
			`{"model":"m","input":["a","b","c"],"encoding_format":"float","dimensions":8}`,
			[]string{"prompt input.0=a", "prompt input.1=b", "prompt input.2=c", "number dimensions=8"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classifyBody(t, tt.ep, tt.body, "")
			if got := fieldList(a); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("fields =\n%q\nwant\n%q", got, tt.want)
			}
			if a.Body() != tt.body {
				t.Errorf("Body changed: %s", a.Body())
			}
		})
	}
}

func TestClassifyCapability(t *testing.T) {
	type capability struct {
		endpoint             openai.Endpoint
		model                string
		stream, includeUsage bool
		maxTokens            int
		modalities           []string
		promptTokens         int
		tools                bool
		task                 string
	}
	tests := []struct {
		name string
		ep   openai.Endpoint
		body string
		want capability
	}{
		// "hello there": ceil(11/4) = 3 tokens, +3 for the message, +3 for the reply.
		{"a plain chat request", openai.EndpointChat,
			`{"model":"gpt-x","messages":[{"role":"user","content":"hello there"}]}`,
			capability{openai.EndpointChat, "gpt-x", false, false, 0, []string{"text"}, 3 + 3 + 3, false, "chat"}},
		{"streaming with usage", openai.EndpointChat,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			capability{openai.EndpointChat, "m", true, true, 0, []string{"text"}, 1 + 6, false, "chat"}},
		{"max_tokens is the requested completion length, and numbers are no prompt tokens", openai.EndpointChat,
			`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
			capability{openai.EndpointChat, "m", false, false, 100, []string{"text"}, 7, false, "chat"}},
		{"the larger of max_tokens and max_completion_tokens", openai.EndpointChat,
			`{"model":"m","max_tokens":100,"max_completion_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
			capability{openai.EndpointChat, "m", false, false, 100, []string{"text"}, 7, false, "chat"}},
		{"null max_tokens counts as unset", openai.EndpointChat,
			`{"model":"m","max_tokens":null,"messages":[{"role":"user","content":"hi"}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text"}, 7, false, "chat"}},
		// "what is it" 3 tokens, the URL "x" 1, the binary data URL none.
		{"an image part adds the image modality", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text", "image"}, 3 + 1 + 6, false, "chat"}},
		{"an audio part adds the audio modality", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}]}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text", "audio"}, 6, false, "chat"}},
		// The file id "f" is scanned: 1 token.
		{"a file part adds the file modality", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text", "file"}, 1 + 6, false, "chat"}},
		// The function name "f" is prompt text the model reads: 1 token.
		{"declared tools mark tool use", openai.EndpointChat,
			`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text"}, 1 + 1 + 6, true, "chat"}},
		{"an empty tools array is no tool use", openai.EndpointChat,
			`{"model":"m","tools":[],"messages":[{"role":"user","content":"hi"}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text"}, 7, false, "chat"}},
		{"a function message marks tool use", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"function","name":"c","content":"ok"}]}`,
			capability{openai.EndpointChat, "m", false, false, 0, []string{"text"}, 1 + 1 + 6, true, "chat"}},
		{"completions count no message overhead", openai.EndpointCompletions,
			`{"model":"m","prompt":"12345678"}`,
			capability{openai.EndpointCompletions, "m", false, false, 0, []string{"text"}, 2, false, "chat"}},
		{"embeddings are the embedding task", openai.EndpointEmbeddings,
			`{"model":"e","input":"translate this code"}`,
			capability{openai.EndpointEmbeddings, "e", false, false, 0, []string{"text"}, 5, false, "embedding"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classifyBody(t, tt.ep, tt.body, "")
			if d := a.Difficulty(); d < 0 || d > 1 || (a.Task() == "embedding") != (d == 0) {
				t.Fatalf("Difficulty = %v, want in (0,1], or 0 for embeddings", d) // its value is asserted in router/capability
			}
			got := capability{a.Endpoint(), a.Model(), a.Stream(), a.IncludeUsage(), a.MaxTokens(), a.Modalities(), a.PromptTokens(), a.Tools(), a.Task()}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("capability = %+v\nwant         %+v", got, tt.want)
			}
		})
	}
}

func TestClassifyReadsTheLastUserTurnForTheTask(t *testing.T) {
	tests := []struct{ name, prompt, want string }{
		{"a greeting is chat", "hello, how are you?", "chat"},
		{"code is coding", "Why does this python function raise?", "coding"},
		{"a fenced block is coding", "```\nx := 1\n```", "coding"},
		{"translate is translation", "Translate this sentence please", "translation"},
		{"Italian translation", "traduci questa frase in inglese", "translation"},
		{"summarise is summarisation", "Please summarise the following article", "summarisation"},
		{"arithmetic is math", "what is 12 * 7", "math"},
		{"solve is math", "Solve x squared equals nine", "math"},
		{"extract is extraction", "Extract the names from the letter", "extraction"},
	}
	for _, tt := range tests {
		t.Run(tt.name+", whatever the system prompt says", func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"system","content":"translate everything"},{"role":"user","content":` + jsonString(tt.prompt) + `}]}`
			if got := classifyBody(t, openai.EndpointChat, body, "").Task(); got != tt.want {
				t.Fatalf("Task = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("the last user message decides, not the system prompt or an earlier turn", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"system","content":"translate everything"},{"role":"user","content":"translate this"},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"now summarise it"}]}]}`
		a := classifyBody(t, openai.EndpointChat, body, "")
		if a.LastUserText() != "now summarise it\n" || a.Task() != "summarisation" {
			t.Fatalf("LastUserText %q, Task %q; want the last turn and summarisation", a.LastUserText(), a.Task())
		}
	})
	t.Run("a completions prompt is read as a whole", func(t *testing.T) {
		a := classifyBody(t, openai.EndpointCompletions, `{"model":"m","prompt":["hi","def f(): return 1"]}`, "")
		if a.LastUserText() != "hi\ndef f(): return 1\n" || a.Task() != "coding" {
			t.Fatalf("LastUserText %q, Task %q; want both prompts and coding", a.LastUserText(), a.Task())
		}
	})
}

func TestClassifyRefusesInvalidRequests(t *testing.T) {
	// The validation itself is ParseRequest's (router/openai); Classify
	// passes its errors on and refuses model names that carry findings.
	for _, tc := range []struct {
		name, path, body, param, msg string
	}{
		{"a body ParseRequest refuses", "/v1/chat/completions", `{"model":"m","messages":[]}`, "messages", "empty array"},
		{"a model name carrying an e-mail address is refused without echoing it", "/v1/chat/completions",
			`{"model":"alice@example.com","messages":[{"role":"user","content":"hi"}]}`, "model", "the name contains what looks like a secret or personal data"},
		{"a listed model path carrying a key is refused", "/v1/models/sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd", "", "model", "looks like a secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := openai.EndpointChat
			if tc.body == "" {
				ep = openai.EndpointModels
			}
			a, err := testClassifier(t).Classify(Input{Endpoint: ep, Path: tc.path, Body: []byte(tc.body)})
			var ae *openai.Error
			if a != nil || !errors.As(err, &ae) || ae.Status != http.StatusBadRequest || ae.Param != tc.param || !strings.Contains(ae.Message, tc.msg) {
				t.Fatalf("Classify = %v, %v; want a 400 about %s saying %q", a, err, tc.param, tc.msg)
			}
			if strings.Contains(ae.Message, "alice@") || strings.Contains(ae.Message, "sk-proj") {
				t.Fatalf("the error echoes the value: %q", ae.Message)
			}
		})
	}
}

func TestClassifySensitivity(t *testing.T) {
	const key = "sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"
	tests := []struct {
		name     string
		ep       openai.Endpoint
		body     string
		declared string
		detected Sensitivity
		want     Sensitivity
		findings map[string]int
		opaque   bool
	}{
		{"plain text is public", openai.EndpointChat, chatBody("what is the capital of France?"), "", Public, Public, map[string]int{}, false},
		{"an email is internal", openai.EndpointChat, chatBody("mail alice@example.com"), "", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		{"a phone number is internal", openai.EndpointChat, chatBody("call +1 415 555 2671"), "", Internal, Internal, map[string]int{"PHONE": 1}, false},
		{"a Luhn-valid card is confidential", openai.EndpointChat, chatBody("card 4111 1111 1111 1111"), "", Confidential, Confidential, map[string]int{"CREDIT_CARD": 1}, false},
		{"a card failing Luhn is public", openai.EndpointChat, chatBody("card 4111 1111 1111 1112"), "", Public, Public, map[string]int{}, false},
		{"a mod-97-valid IBAN is confidential", openai.EndpointChat, chatBody("iban DE89370400440532013000"), "", Confidential, Confidential, map[string]int{"IBAN": 1}, false},
		{"an OpenAI-style key is restricted", openai.EndpointChat, chatBody("key " + key), "", Restricted, Restricted, map[string]int{"SECRET": 1}, false},
		{"the highest class of several findings wins", openai.EndpointChat, chatBody("alice@example.com and bob@example.org pay 4111 1111 1111 1111"), "", Confidential, Confidential, map[string]int{"EMAIL": 2, "CREDIT_CARD": 1}, false},
		{"a finding in a tool call argument counts", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"pay","arguments":"{\"card\":\"4111111111111111\"}"}}]}]}`, "", Confidential, Confidential, map[string]int{"CREDIT_CARD": 1}, false},
		{"a finding in a name counts", openai.EndpointChat, `{"model":"m","messages":[{"role":"user","name":"alice@example.com","content":"hi"}]}`, "", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		// The prompt ends its line: "x" directly before the suffix's
		// address would join it as a split local part ("xalice@…", see
		// redaction.Scanner.ScanAcross), two field findings of one value.
		{"a finding in the suffix counts", openai.EndpointCompletions, `{"model":"m","prompt":"x\n","suffix":"alice@example.com"}`, "", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		{"values under keys named data, id or type in metadata count", openai.EndpointChat,
			`{"model":"m","metadata":{"data":"alice@example.com","id":"4111 1111 1111 1111","type":"` + key + `"},"messages":[{"role":"user","content":"hi"}]}`, "",
			Restricted, Restricted, map[string]int{"EMAIL": 1, "CREDIT_CARD": 1, "SECRET": 1}, false},
		{"a finding in an object key counts", openai.EndpointChat, `{"model":"m","metadata":{"alice@example.com":"x"},"messages":[{"role":"user","content":"hi"}]}`, "", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		{"a card written as a JSON number counts", openai.EndpointChat, `{"model":"m","metadata":{"n":4111111111111111},"messages":[{"role":"user","content":"hi"}]}`, "", Confidential, Confidential, map[string]int{"CREDIT_CARD": 1}, false},
		{"a function name counts", openai.EndpointChat, `{"model":"m","tools":[{"type":"function","function":{"name":"` + key + `"}}],"messages":[{"role":"user","content":"hi"}]}`, "", Restricted, Restricted, map[string]int{"SECRET": 1}, false},
		{"an e-mail in an SVG data URL counts", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/svg+xml;base64,PHN2Zz5hbGljZUBleGFtcGxlLmNvbTwvc3ZnPg=="}}]}]}`, "", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		{"an e-mail where an enum value belongs counts", openai.EndpointChat, `{"model":"m","service_tier":"alice@example.com","messages":[{"role":"user","content":"hi"}]}`, "", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		{"the header raises public to confidential", openai.EndpointChat, chatBody("hello"), "confidential", Public, Confidential, map[string]int{}, false},
		{"the header is case-insensitive and trimmed", openai.EndpointChat, chatBody("hello"), " Restricted ", Public, Restricted, map[string]int{}, false},
		{"a repeated header keeps its highest class", openai.EndpointChat, chatBody("hello"), "internal, confidential,public", Public, Confidential, map[string]int{}, false},
		{"the header cannot lower a detected secret", openai.EndpointChat, chatBody("key " + key), "public", Restricted, Restricted, map[string]int{"SECRET": 1}, false},
		{"the header cannot lower a detected email", openai.EndpointChat, chatBody("alice@example.com"), "public", Internal, Internal, map[string]int{"EMAIL": 1}, false},
		// Opaque content does not raise the class here: the policy decides what it implies (residency.rego).
		{"token-id prompts are opaque, not raised by the classifier", openai.EndpointCompletions, `{"model":"m","prompt":[1,2,3]}`, "", Public, Public, map[string]int{}, true},
		{"nested token-id prompts are opaque", openai.EndpointCompletions, `{"model":"m","prompt":[[1,2],[3]]}`, "", Public, Public, map[string]int{}, true},
		{"token-id embeddings input is opaque", openai.EndpointEmbeddings, `{"model":"m","input":[[5,6]]}`, "", Public, Public, map[string]int{}, true},
		{"a binary image is opaque", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`, "", Public, Public, map[string]int{}, true},
		{"opaque content next to a secret stays restricted", openai.EndpointCompletions,
			`{"model":"m","prompt":["` + key + `",[1]]}`, "", Restricted, Restricted, map[string]int{"SECRET": 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classifyBody(t, tt.ep, tt.body, tt.declared)
			if a.Detected() != tt.detected || a.Sensitivity() != tt.want || a.Opaque() != tt.opaque {
				t.Fatalf("Detected, Sensitivity, Opaque = %s, %s, %v; want %s, %s, %v", a.Detected(), a.Sensitivity(), a.Opaque(), tt.detected, tt.want, tt.opaque)
			}
			got := a.Findings()
			if got == nil {
				got = map[string]int{}
			}
			if !reflect.DeepEqual(got, tt.findings) {
				t.Fatalf("Findings = %v, want %v", got, tt.findings)
			}
			n := 0
			for typ, c := range tt.findings {
				n += c
				if a.FindingCount(typ) != c {
					t.Fatalf("FindingCount(%s) = %d, want %d", typ, a.FindingCount(typ), c)
				}
			}
			if len(a.findings) != n {
				t.Fatalf("%d field findings, want %d", len(a.findings), n)
			}
		})
	}
}

func TestClassifyListsWhatItCouldNotScan(t *testing.T) {
	tests := []struct {
		name string
		ep   openai.Endpoint
		body string
		want []Unscanned
	}{
		{"a string prompt is scanned whole", openai.EndpointCompletions, `{"model":"m","prompt":"hello"}`, nil},
		{"token ids next to a string prompt", openai.EndpointCompletions, `{"model":"m","prompt":["hello",[1,2]]}`, []Unscanned{{"prompt", "token ids"}}},
		{"token-id embeddings input", openai.EndpointEmbeddings, `{"model":"m","input":[1,2]}`, []Unscanned{{"input", "token ids"}}},
		{"binary media by their paths and types", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/PNG;base64,AAAA"}},{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},{"type":"file","file":{"file_data":"JVBERi0=","filename":"a.pdf"}}]}]}`,
			[]Unscanned{{"messages.0.content.0.image_url.url", "binary image/png data URL"}, {"messages.0.content.1.input_audio.data", "audio data"},
				{"messages.0.content.2.file.file_data", "file data"}}},
		{"a text data URL that does not decode", openai.EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:text/plain;base64,!!!"}}]}]}`,
			[]Unscanned{{"messages.0.content.0.image_url.url", "undecodable base64 data URL"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classifyBody(t, tt.ep, tt.body, "")
			if got := a.Unscanned(); !reflect.DeepEqual(got, tt.want) || a.Opaque() != (len(tt.want) > 0) {
				t.Fatalf("Unscanned = %v (opaque %v), want %v", got, a.Opaque(), tt.want)
			}
		})
	}
	t.Run("the file name next to file data is scanned", func(t *testing.T) {
		a := classifyBody(t, openai.EndpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"file_data":"JVBERi0=","filename":"alice@example.com.pdf"}}]}]}`, "")
		if a.FindingCount("EMAIL") != 1 {
			t.Fatalf("findings %v, want the address in the file name", a.Findings())
		}
	})
}

func TestClassifyFindingOffsetsAddressTheField(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"write to alice@example.com or bob@example.org"}]}]}`
	a := classifyBody(t, openai.EndpointChat, body, "")
	var got []string
	for _, f := range a.findings {
		got = append(got, a.fieldPath(f.Field)+"="+a.fields[f.Field].text[f.Start:f.End])
	}
	want := []string{"messages.1.content.0.text=alice@example.com", "messages.1.content.0.text=bob@example.org"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("findings = %q, want %q", got, want)
	}
}

func TestClassifyFindsValuesSplitAcrossFields(t *testing.T) {
	cases := []struct {
		name     string
		body     string
		findings map[string]int
		parts    []string // "path:TYPE:text"
	}{
		{"card digits over two user messages",
			`{"model":"m","messages":[{"role":"user","content":"my card is 4111 1111"},{"role":"user","content":"1111 1111 thanks"}]}`,
			map[string]int{"CREDIT_CARD": 1},
			[]string{"messages.0.content:CREDIT_CARD:4111 1111", "messages.1.content:CREDIT_CARD:1111 1111"}},
		{"an address over two content parts",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"write to anna.rossi@"},{"type":"text","text":"example.it now"}]}]}`,
			map[string]int{"EMAIL": 1},
			[]string{"messages.0.content.0.text:EMAIL:anna.rossi@", "messages.0.content.1.text:EMAIL:example.it"}},
		{"an address over two arguments of one tool call",
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":` + jsonString(`{"user":"mario.rossi","domain":"@example.it"}`) + `}}]}]}`,
			map[string]int{"EMAIL": 1},
			[]string{"messages.1.tool_calls.0.function.arguments:EMAIL:mario.rossi", "messages.1.tool_calls.0.function.arguments:EMAIL:@example.it"}},
		{"an IBAN over two tool calls",
			`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[` +
				`{"id":"a","type":"function","function":{"name":"f","arguments":` + jsonString(`{"iban":"IT60 X054 2811"}`) + `}},` +
				`{"id":"b","type":"function","function":{"name":"f","arguments":` + jsonString(`{"rest":"1010 0000 0123 456"}`) + `}}]}]}`,
			map[string]int{"IBAN": 1},
			[]string{"messages.1.tool_calls.0.function.arguments:IBAN:IT60 X054 2811", "messages.1.tool_calls.1.function.arguments:IBAN:1010 0000 0123 456"}},
		{"an address over two completions prompts",
			`{"model":"m","prompt":["mail anna.rossi@","example.it"]}`,
			map[string]int{"EMAIL": 1},
			[]string{"prompt.0:EMAIL:anna.rossi@", "prompt.1:EMAIL:example.it"}},
		{"card digits over a completions prompt and its suffix",
			`{"model":"m","prompt":"my card is 4111 1111","suffix":"1111 1111 thanks"}`,
			map[string]int{"CREDIT_CARD": 1},
			[]string{"prompt:CREDIT_CARD:4111 1111", "suffix:CREDIT_CARD:1111 1111"}},
		{"an address over a completions suffix and its prompt",
			`{"model":"m","prompt":"example.it is the domain","suffix":"write to anna.rossi@"}`,
			map[string]int{"EMAIL": 1},
			[]string{"prompt:EMAIL:example.it", "suffix:EMAIL:anna.rossi@"}},
		{"an address over a suffix and the second of two prompts",
			`{"model":"m","prompt":["hello","example.it is the domain"],"suffix":"write to anna.rossi@"}`,
			map[string]int{"EMAIL": 1},
			[]string{"prompt.1:EMAIL:example.it", "suffix:EMAIL:anna.rossi@"}},
		{"a whole value next to the following message is not split",
			`{"model":"m","messages":[{"role":"user","content":"reply to alice@example.com"},{"role":"user","content":"cc bob"}]}`,
			map[string]int{"EMAIL": 1},
			[]string{"messages.0.content:EMAIL:alice@example.com"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ep := openai.EndpointChat
			if strings.Contains(tc.body, `"prompt"`) {
				ep = openai.EndpointCompletions
			}
			a := classifyBody(t, ep, tc.body, "")
			if !reflect.DeepEqual(a.Findings(), tc.findings) {
				t.Errorf("findings = %v, want %v", a.Findings(), tc.findings)
			}
			var got []string
			for _, f := range a.findings {
				fl := a.fields[f.Field]
				got = append(got, a.fieldPath(f.Field)+":"+f.Type+":"+fl.text[f.Start:f.End])
			}
			if !reflect.DeepEqual(got, tc.parts) {
				t.Errorf("findings\n got %q\nwant %q", got, tc.parts)
			}
		})
	}
}

func TestClassifyHeaders(t *testing.T) {
	c := testClassifier(t)
	_, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("hi")), Declared: "secret"})
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "X-Molly-Sensitivity" {
		t.Fatalf("an unknown declared class: %v; want 400 about X-Molly-Sensitivity", err)
	}
	a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("hi")), Residency: "  EU "})
	if err != nil || a.Residency() != "EU" {
		t.Fatalf("Residency = %v, %v; want EU", a, err)
	}
	_, err = c.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("hi")), Residency: "EU; drop table"})
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "X-Molly-Residency" || strings.Contains(ae.Message, "drop") {
		t.Fatalf("a malformed residency: %v; want 400 about X-Molly-Residency without the value", err)
	}
	a, err = c.Classify(Input{Endpoint: openai.EndpointModels, Path: "/v1/models", Declared: "internal"})
	if err != nil || a.Sensitivity() != Internal || !reflect.DeepEqual(a.Modalities(), []string{"text"}) || a.Body() != "" || a.Model() != "" {
		t.Fatalf("models: %+v, %v; want internal text with no body", a, err)
	}
	a, err = c.Classify(Input{Endpoint: openai.EndpointModels, Path: "/v1/models/gpt-4o"})
	if err != nil || a.Model() != "gpt-4o" || a.Path() != "/v1/models/gpt-4o" {
		t.Fatalf("one model: %+v, %v; want gpt-4o", a, err)
	}
}

func TestNewOverridesTheEntityClasses(t *testing.T) {
	tests := []struct {
		name      string
		overrides map[string]Sensitivity
		prompt    string
		want      Sensitivity
	}{
		{"an email can be made public", map[string]Sensitivity{"EMAIL": Public}, "alice@example.com", Public},
		{"a card can be made restricted", map[string]Sensitivity{"CREDIT_CARD": Restricted}, "4111 1111 1111 1111", Restricted},
		{"an override leaves the other defaults", map[string]Sensitivity{"EMAIL": Public}, "4111 1111 1111 1111", Confidential},
		{"no overrides keep the defaults", nil, "alice@example.com", Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(testScanner(t), tt.overrides).Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody(tt.prompt))})
			if err != nil || a.Sensitivity() != tt.want {
				t.Fatalf("Sensitivity = %v, %v; want %s", a, err, tt.want)
			}
		})
	}
	if DefaultEntityClasses["EMAIL"] != Internal {
		t.Fatal("New changed DefaultEntityClasses")
	}
}

func TestSensitivityText(t *testing.T) {
	for _, s := range []Sensitivity{Public, Internal, Confidential, Restricted} {
		b, _ := s.MarshalText()
		var back Sensitivity
		if err := back.UnmarshalText(b); err != nil || back != s {
			t.Errorf("%s round trip = %s, %v", s, back, err)
		}
	}
	if got := Sensitivity(7).String(); got != "Sensitivity(7)" {
		t.Errorf("String of 7 = %q", got)
	}
	var s Sensitivity
	if err := s.UnmarshalText([]byte("top-secret")); err == nil || !strings.Contains(err.Error(), `"top-secret"`) {
		t.Errorf("UnmarshalText(top-secret) = %v", err)
	}
}

func TestAnnotationContext(t *testing.T) {
	a := classifyBody(t, openai.EndpointChat, chatBody("hi"), "")
	if got := From(WithAnnotation(t.Context(), a)); got != a {
		t.Fatal("From does not return what WithAnnotation stored")
	}
	if From(t.Context()) != nil {
		t.Fatal("From of a bare context is not nil")
	}
}

func TestPolicyInputCarriesCountsNeverValues(t *testing.T) {
	c := testClassifier(t)
	a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Declared: "confidential", Residency: "EU",
		Body: []byte(`{"model":"m","stream":true,"max_tokens":9,"n":2,"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":[{"type":"text","text":"mail alice@example.com"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	got := a.PolicyInput()
	capab := got["capability"].(map[string]any)
	if d, ok := capab["difficulty"].(float64); !ok || d <= 0 || d > 1 {
		t.Fatalf("difficulty %v", capab["difficulty"])
	}
	delete(capab, "difficulty") // its value is the estimator's, asserted in router/capability
	// "mail alice@example.com" is 6 tokens, "f" 1, +3 for the message, +3 for the reply.
	want := map[string]any{
		"request": map[string]any{"endpoint": "chat.completions", "model": "m", "stream": true, "tools": []any{"f"}, "choices": 2,
			"api": "", "stored_conversation": false},
		"capability": map[string]any{"task": "chat", "modalities": []any{"text", "image"}, "prompt_tokens": 13, "max_tokens": 9, "tools": true},
		"sovereignty": map[string]any{"sensitivity": "confidential", "detected": "internal", "declared": "confidential",
			"findings": map[string]any{"EMAIL": 1}, "opaque": true, "scan_failed": false, "residency": "EU",
			"unscanned": []any{map[string]any{"path": "messages.0.content.1.image_url.url", "reason": "binary image/png data URL"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("PolicyInput =\n%v\nwant\n%v", got, want)
	}
}

func TestDigestBindsTheContent(t *testing.T) {
	c := testClassifier(t)
	in := Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("mail alice@example.com"))}
	a1, _ := c.Classify(in)
	a2, _ := c.Classify(in)
	if a1.Digest() != a2.Digest() {
		t.Fatal("the same request classified twice has two digests")
	}
	for _, tc := range []struct {
		name string
		c    *Classifier
		in   Input
	}{
		{"another body", c, Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("mail bob@example.com"))}},
		{"one more space", c, Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("mail  alice@example.com"))}},
		{"a declared class", c, Input{Endpoint: openai.EndpointChat, Body: in.Body, Declared: "internal"}},
		{"a residency", c, Input{Endpoint: openai.EndpointChat, Body: in.Body, Residency: "EU"}},
		{"a translated API", c, Input{Endpoint: openai.EndpointChat, Body: in.Body, API: "messages"}},
		{"a stored conversation", c, Input{Endpoint: openai.EndpointChat, Body: in.Body, API: "responses", StoredConversation: true}},
		{"another endpoint", c, Input{Endpoint: openai.EndpointCompletions, Body: []byte(`{"model":"m","prompt":"mail alice@example.com"}`)}},
		{"another classifier", New(testScanner(t), nil), in},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := tc.c.Classify(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if a.Digest() == a1.Digest() {
				t.Fatal("the digest does not tell the two apart")
			}
		})
	}
}

func TestDeriveKeepsTheHeadersAndClassifier(t *testing.T) {
	c := testClassifier(t)
	a, err := c.Classify(Input{Endpoint: openai.EndpointChat, Path: "/v1/chat/completions", Body: []byte(chatBody("hi")), Declared: "internal", Residency: "EU",
		API: "responses", StoredConversation: true})
	if err != nil {
		t.Fatal(err)
	}
	if in := a.PolicyInput()["request"].(map[string]any); in["api"] != "responses" || in["stored_conversation"] != true {
		t.Fatalf("policy input request %v", in)
	}
	d, err := a.Derive([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"4111 1111 1111 1111"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Declared() != Internal || d.Residency() != "EU" || d.Classifier() != c || d.Sensitivity() != Confidential || d.Endpoint() != openai.EndpointChat ||
		d.API() != "responses" || !d.StoredConversation() {
		t.Fatalf("derived: declared %s residency %q sensitivity %s", d.Declared(), d.Residency(), d.Sensitivity())
	}
	if d.Digest() == a.Digest() {
		t.Fatal("the derived request has its parent's digest")
	}
	if _, err := a.Derive([]byte(`{"model":"m"}`)); err == nil {
		t.Fatal("an invalid derived body was classified")
	}
}

func TestAFailedScanFailsClosed(t *testing.T) {
	cls := FailScansOn(New(testScanner(t), map[string]Sensitivity{"EMAIL": Public}), "BOOM")
	a, err := cls.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"mail alice@example.com"},{"role":"user","content":"BOOM"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	// The classifier reports the failure; the policy decides what it
	// implies (residency.rego: a failed scan is treated as restricted).
	if !a.ScanFailed() || a.Detected() != Public || a.Sensitivity() != Public {
		t.Fatalf("ScanFailed %v, Detected %v, Sensitivity %v; want true, public, public", a.ScanFailed(), a.Detected(), a.Sensitivity())
	}
	if got := a.PolicyInput()["sovereignty"].(map[string]any)["scan_failed"]; got != true {
		t.Fatalf("input.sovereignty.scan_failed = %v", got)
	}
	t.Run("a clean request is unaffected", func(t *testing.T) {
		a, _ := cls.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(chatBody("mail alice@example.com"))})
		if a.ScanFailed() || a.Sensitivity() != Public {
			t.Fatalf("ScanFailed %v Sensitivity %v", a.ScanFailed(), a.Sensitivity())
		}
	})
	t.Run("a failure in a key or a number fails closed too", func(t *testing.T) {
		for _, body := range []string{
			`{"model":"m","metadata":{"BOOM":"x"},"messages":[{"role":"user","content":"hi"}]}`,
			`{"model":"m","metadata":{"a":"BOOM"},"messages":[{"role":"user","content":"hi"}]}`,
		} {
			a, _ := cls.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(body)})
			if !a.ScanFailed() {
				t.Fatalf("%s: ScanFailed false", body)
			}
		}
	})
	t.Run("a failure while joining fields fails closed too", func(t *testing.T) {
		c := New(testScanner(t), nil)
		c.scanAcross = func([]string) ([]redaction.SegmentFinding, error) { panic("join failure") }
		a, _ := c.Classify(Input{Endpoint: openai.EndpointChat, Body: []byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}]}`)})
		if !a.ScanFailed() {
			t.Fatal("ScanFailed false")
		}
	})
}

// TestAScanOverItsBudgetMakesTheRequestOpaque: text the detectors may not
// finish (here: over the scanner's byte budget) is not scanned, is listed
// with the reason, and makes the request opaque — never silently passed.
func TestAScanOverItsBudgetMakesTheRequestOpaque(t *testing.T) {
	scanner, err := redaction.NewScanner(redaction.Config{MaxScanBytes: 64})
	if err != nil {
		t.Fatal(err)
	}
	c := New(scanner, nil)
	long := strings.Repeat("plain words ", 20) // 240 bytes: over the budget
	a, err := c.Classify(Input{Endpoint: openai.EndpointChat,
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":"` + long + `"}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	want := []Unscanned{{Path: "messages.1.content", Reason: ReasonScanBudget},
		{Path: "messages.0.content", Reason: ReasonScanBudget + " (values split across fields)"}}
	if !a.Opaque() || !reflect.DeepEqual(a.Unscanned(), want) {
		t.Fatalf("opaque %v, unscanned %+v; want %+v", a.Opaque(), a.Unscanned(), want)
	}
}

// TestDataURLsAsAURLParserReadsThem: an image or a file given as a data:
// URL whose scheme is upper case, or preceded by spaces, or cut by a line
// break, is a data: URL to a URL parser (RFC 3986 §3.1, WHATWG URL §4.4):
// its binary bytes are listed as unscanned (the request is opaque), and a
// text one is decoded and scanned. They used to be scanned as plain text,
// so the image went to T3 as if it had been read.
func TestDataURLsAsAURLParserReadsThem(t *testing.T) {
	for _, url := range []string{"DATA:image/png;base64,iVBORw0KGgo=", " data:image/png;base64,iVBORw0KGgo=", "da\nta:image/png;BASE64,iVBORw0KGgo=", "Data:image/png ; base64,iVBORw0KGgo="} {
		body := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":` + strconv.Quote(url) + `}}]}]}`
		a := classifyBody(t, openai.EndpointChat, body, "")
		if !a.Opaque() || len(a.Unscanned()) != 1 || !strings.HasPrefix(a.Unscanned()[0].Reason, "binary image/png") {
			t.Errorf("%q: opaque %v, unscanned %v; want the image unscanned", url, a.Opaque(), a.Unscanned())
		}
	}
	body := `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"filename":"a.txt","file_data":"DATA:text/plain;base64,` +
		base64.StdEncoding.EncodeToString([]byte("mail anna.rossi@example.it")) + `"}}]}]}`
	a := classifyBody(t, openai.EndpointChat, body, "")
	if a.Opaque() || a.Findings()["EMAIL"] != 1 {
		t.Errorf("a text file: opaque %v, findings %v; want the address found", a.Opaque(), a.Findings())
	}
	// Prose that starts like a URL is still prose.
	if a := classifyBody(t, openai.EndpointChat, `{"model":"m","messages":[{"role":"user","content":"Data: 3, 4 and 5"}]}`, ""); a.Opaque() {
		t.Errorf("prose starting with Data: is opaque: %v", a.Unscanned())
	}
}
