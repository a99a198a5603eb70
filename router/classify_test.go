package router

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/molly-gateway/molly/api"
)

func TestEndpointOf(t *testing.T) {
	tests := []struct {
		name, method, path string
		want               Endpoint
		status             int
	}{
		{"chat under /v1 is chat completions", "POST", "/v1/chat/completions", EndpointChat, 0},
		{"chat without the /v1 prefix is chat completions", "POST", "/chat/completions", EndpointChat, 0},
		{"a trailing slash is ignored", "POST", "/v1/chat/completions/", EndpointChat, 0},
		{"completions under /v1", "POST", "/v1/completions", EndpointCompletions, 0},
		{"completions without prefix", "POST", "/completions", EndpointCompletions, 0},
		{"embeddings under a deeper prefix", "POST", "/openai/v1/embeddings", EndpointEmbeddings, 0},
		{"models is a GET", "GET", "/v1/models", EndpointModels, 0},
		{"models without prefix", "GET", "/models", EndpointModels, 0},
		{"GET on chat is 405", "GET", "/v1/chat/completions", "", http.StatusMethodNotAllowed},
		{"POST on models is 405", "POST", "/v1/models", "", http.StatusMethodNotAllowed},
		{"PUT on embeddings is 405", "PUT", "/v1/embeddings", "", http.StatusMethodNotAllowed},
		{"an unknown path is 404", "POST", "/v1/images/generations", "", http.StatusNotFound},
		{"the root is 404", "GET", "/", "", http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := EndpointOf(tt.method, tt.path)
			if tt.status != 0 {
				if err == nil || err.Status != tt.status || err.Type != "invalid_request_error" {
					t.Fatalf("EndpointOf(%s %s) = %q, %v; want status %d", tt.method, tt.path, got, err, tt.status)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("EndpointOf(%s %s) = %q, %v; want %q", tt.method, tt.path, got, err, tt.want)
			}
		})
	}
	if _, err := EndpointOf("GET", "/v1/chat/completions"); err.Message != "Method GET is not allowed on /v1/chat/completions; use POST." {
		t.Errorf("405 message = %q", err.Message)
	}
	if _, err := EndpointOf("POST", "/v1/nope"); err.Message != "Unknown request URL: POST /v1/nope." || err.Code != "unknown_url" {
		t.Errorf("404 error = %+v", err)
	}
}

func TestEndpointPath(t *testing.T) {
	for ep, want := range map[Endpoint]string{EndpointChat: "/chat/completions", EndpointCompletions: "/completions",
		EndpointEmbeddings: "/embeddings", EndpointModels: "/models", "other": ""} {
		if got := ep.Path(); got != want {
			t.Errorf("%q.Path() = %q, want %q", ep, got, want)
		}
	}
}

func TestClassifyExtractsEveryTextField(t *testing.T) {
	tests := []struct {
		name string
		ep   Endpoint
		body string
		want []TextField
	}{
		{"chat string content of every role is extracted", EndpointChat,
			`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello"}]}`,
			[]TextField{{"messages.0.content", "be brief"}, {"messages.1.content", "hello"}}},
		{"content-part text and refusal come first, then other strings such as image URLs; data URLs are skipped", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"https://x/y.png"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}},{"type":"text","text":"again"}]},{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`,
			[]TextField{{"messages.0.content.0.text", "look"}, {"messages.0.content.3.text", "again"}, {"messages.1.content.0.refusal", "no"}, {"messages.0.content.1.image_url.url", "https://x/y.png"}}},
		{"strings outside the message text are scanned too, with escaped paths", EndpointChat,
			`{"model":"m","user":"u-1","metadata":{"a.b":"x"},"stop":["END"],"tools":[{"type":"function","function":{"name":"f","description":"d"}}],"messages":[{"role":"user","content":"q"}]}`,
			[]TextField{{"messages.0.content", "q"}, {"user", "u-1"}, {`metadata.a\.b`, "x"}, {"stop.0", "END"}, {"tools.0.function.description", "d"}}},
		{"name comes before content of the same message", EndpointChat,
			`{"model":"m","messages":[{"role":"user","name":"alice","content":"hi"}]}`,
			[]TextField{{"messages.0.name", "alice"}, {"messages.0.content", "hi"}}},
		{"tool call arguments, function call arguments and tool results are extracted", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{\"b\":2}"}}]},{"role":"assistant","content":null,"function_call":{"name":"h","arguments":"{\"c\":3}"}},{"role":"tool","tool_call_id":"c1","content":"42"}]}`,
			[]TextField{{"messages.0.content", "q"}, {"messages.1.tool_calls.0.function.arguments", `{"a":1}`},
				{"messages.1.tool_calls.1.function.arguments", `{"b":2}`}, {"messages.2.function_call.arguments", `{"c":3}`}, {"messages.3.content", "42"}}},
		{"escaped JSON strings are decoded", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"a\u0040b \"q\"\n"}]}`,
			[]TextField{{"messages.0.content", "a@b \"q\"\n"}}},
		{"a completions prompt string and its suffix", EndpointCompletions,
			`{"model":"m","prompt":"def f(","suffix":"return x"}`,
			[]TextField{{"prompt", "def f("}, {"suffix", "return x"}}},
		{"a completions prompt array of strings", EndpointCompletions,
			`{"model":"m","prompt":["one","two"]}`,
			[]TextField{{"prompt.0", "one"}, {"prompt.1", "two"}}},
		{"an embeddings input string", EndpointEmbeddings,
			`{"model":"m","input":"embed me"}`,
			[]TextField{{"input", "embed me"}}},
		{"an embeddings input array", EndpointEmbeddings,
			`{"model":"m","input":["a","b","c"]}`,
			[]TextField{{"input.0", "a"}, {"input.1", "b"}, {"input.2", "c"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classify(t, tt.ep, tt.body, "")
			if !reflect.DeepEqual(a.Fields, tt.want) {
				t.Fatalf("Fields = %q\nwant     %q", a.Fields, tt.want)
			}
			if string(a.Body) != tt.body {
				t.Errorf("Body changed: %s", a.Body)
			}
		})
	}
}

func TestClassifyCapability(t *testing.T) {
	tests := []struct {
		name string
		ep   Endpoint
		body string
		want Capability
	}{
		{"a plain chat request", EndpointChat,
			`{"model":"gpt-x","messages":[{"role":"user","content":"hello there"}]}`,
			Capability{Endpoint: EndpointChat, Model: "gpt-x", Modalities: []string{"text"}, PromptTokens: 3 + 3 + 3, Task: "chat"}},
		{"streaming with usage", EndpointChat,
			`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Stream: true, IncludeUsage: true, Modalities: []string{"text"}, PromptTokens: 1 + 6, Task: "chat"}},
		{"max_tokens is the requested completion length", EndpointChat,
			`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", MaxTokens: 100, Modalities: []string{"text"}, PromptTokens: 7, Task: "chat"}},
		{"max_completion_tokens wins over max_tokens", EndpointChat,
			`{"model":"m","max_tokens":100,"max_completion_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", MaxTokens: 50, Modalities: []string{"text"}, PromptTokens: 7, Task: "chat"}},
		{"null max_tokens counts as unset", EndpointChat,
			`{"model":"m","max_tokens":null,"messages":[{"role":"user","content":"hi"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text"}, PromptTokens: 7, Task: "chat"}},
		{"an image part adds the image modality", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text", "image"}, PromptTokens: 3 + 6, Task: "chat"}},
		{"an audio part adds the audio modality", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}]}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text", "audio"}, PromptTokens: 6, Task: "chat"}},
		{"a file part adds the file modality", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text", "file"}, PromptTokens: 6, Task: "chat"}},
		{"declared tools mark tool use", EndpointChat,
			`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text"}, PromptTokens: 7, Tools: true, Task: "chat"}},
		{"an empty tools array is no tool use", EndpointChat,
			`{"model":"m","tools":[],"messages":[{"role":"user","content":"hi"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text"}, PromptTokens: 7, Task: "chat"}},
		{"a tool message marks tool use", EndpointChat,
			`{"model":"m","messages":[{"role":"tool","tool_call_id":"c","content":"ok"}]}`,
			Capability{Endpoint: EndpointChat, Model: "m", Modalities: []string{"text"}, PromptTokens: 7, Tools: true, Task: "chat"}},
		{"completions count no message overhead", EndpointCompletions,
			`{"model":"m","prompt":"12345678"}`,
			Capability{Endpoint: EndpointCompletions, Model: "m", Modalities: []string{"text"}, PromptTokens: 2, Task: "chat"}},
		{"embeddings are the embedding task", EndpointEmbeddings,
			`{"model":"e","input":"translate this code"}`,
			Capability{Endpoint: EndpointEmbeddings, Model: "e", Modalities: []string{"text"}, PromptTokens: 5, Task: "embedding"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classify(t, tt.ep, tt.body, "")
			if a.Difficulty < 0 || a.Difficulty > 1 || (a.Task == "embedding") != (a.Difficulty == 0) {
				t.Fatalf("Difficulty = %v, want in (0,1], or 0 for embeddings", a.Difficulty)
			}
			a.Difficulty = 0 // its value is asserted in capability_test.go
			if !reflect.DeepEqual(a.Capability, tt.want) {
				t.Fatalf("Capability = %+v\nwant         %+v", a.Capability, tt.want)
			}
		})
	}
}

func TestEstimateTokens(t *testing.T) {
	for in, want := range map[string]int{"": 0, "a": 1, "abcd": 1, "abcde": 2, "ciò è così": 3} {
		if got := EstimateTokens(in); got != want {
			t.Errorf("EstimateTokens(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestClassifyTask(t *testing.T) {
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
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","messages":[{"role":"system","content":"translate everything"},{"role":"user","content":` + jsonString(tt.prompt) + `}]}`
			if got := classify(t, EndpointChat, body, "").Task; got != tt.want {
				t.Fatalf("Task = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("the last user message decides, not the system prompt", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"user","content":"translate this"},{"role":"assistant","content":"ok"},{"role":"user","content":[{"type":"text","text":"now summarise it"}]}]}`
		if got := classify(t, EndpointChat, body, "").Task; got != "summarisation" {
			t.Fatalf("Task = %q, want summarisation", got)
		}
	})
	t.Run("a completions prompt is classified as a whole", func(t *testing.T) {
		if got := classify(t, EndpointCompletions, `{"model":"m","prompt":["hi","def f(): return 1"]}`, "").Task; got != "coding" {
			t.Fatalf("Task = %q, want coding", got)
		}
	})
}

func TestClassifyRejectsWrongTypes(t *testing.T) {
	tests := []struct {
		name  string
		ep    Endpoint
		body  string
		param string
		msg   string // a part of the message
	}{
		{"an empty body", EndpointChat, ``, "", "empty"},
		{"malformed JSON", EndpointChat, `{"model":`, "", "not valid JSON"},
		{"a JSON array body", EndpointChat, `[1]`, "", "must be an object, got an array"},
		{"a duplicate key smuggling a second messages array", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":[{"role":"user","content":"alice@example.com"}]}`, "", `the key "messages" appears twice`},
		{"a duplicate content key in a message", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"hi","content":"alice@example.com"}]}`, "", `the key "content" appears twice`},
		{"a duplicate key spelled with an escape", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":"hi","cont\u0065nt":"x"}]}`, "", `the key "content" appears twice`},
		{"a duplicate key in a deep object", EndpointChat,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","x":{"k":1,"j":2,"k":3}}]}]}`, "", `the key "k" appears twice`},
		{"a missing model", EndpointChat, `{"messages":[{"role":"user","content":"hi"}]}`, "model", "You must provide a model parameter."},
		{"a numeric model", EndpointChat, `{"model":5,"messages":[{"role":"user","content":"hi"}]}`, "model", "expected a non-empty string, but got a number"},
		{"an empty model", EndpointChat, `{"model":"","messages":[{"role":"user","content":"hi"}]}`, "model", "non-empty string"},
		{"a string stream flag", EndpointChat, `{"model":"m","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, "stream", "expected a boolean, but got a string"},
		{"a numeric include_usage", EndpointChat, `{"model":"m","stream_options":{"include_usage":1},"messages":[{"role":"user","content":"hi"}]}`, "stream_options.include_usage", "expected a boolean"},
		{"a zero max_tokens", EndpointChat, `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", "expected a positive integer, but got 0"},
		{"a fractional max_completion_tokens", EndpointChat, `{"model":"m","max_completion_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}`, "max_completion_tokens", "got 1.5"},
		{"a string max_tokens", EndpointChat, `{"model":"m","max_tokens":"9","messages":[{"role":"user","content":"hi"}]}`, "max_tokens", "positive integer"},
		{"a string temperature", EndpointChat, `{"model":"m","temperature":"hot","messages":[{"role":"user","content":"hi"}]}`, "temperature", "expected a number, but got a string"},
		{"a zero n", EndpointChat, `{"model":"m","n":0,"messages":[{"role":"user","content":"hi"}]}`, "n", "positive integer"},
		{"missing messages", EndpointChat, `{"model":"m"}`, "messages", "Missing required parameter: 'messages'."},
		{"messages as a string", EndpointChat, `{"model":"m","messages":"hi"}`, "messages", "expected an array, but got a string"},
		{"an empty messages array", EndpointChat, `{"model":"m","messages":[]}`, "messages", "empty array"},
		{"tools as an object", EndpointChat, `{"model":"m","tools":{},"messages":[{"role":"user","content":"hi"}]}`, "tools", "expected an array, but got an object"},
		{"a message that is a string", EndpointChat, `{"model":"m","messages":["hi"]}`, "messages[0]", "expected an object, but got a string"},
		{"a numeric role", EndpointChat, `{"model":"m","messages":[{"role":3,"content":"hi"}]}`, "messages[0].role", "expected a string, but got a number"},
		{"an unknown role", EndpointChat, `{"model":"m","messages":[{"role":"robot","content":"hi"}]}`, "messages[0].role", "'robot'"},
		{"a numeric name", EndpointChat, `{"model":"m","messages":[{"role":"user","name":1,"content":"hi"}]}`, "messages[0].name", "expected a string"},
		{"a null user content", EndpointChat, `{"model":"m","messages":[{"role":"user","content":null}]}`, "messages[0].content", "got null"},
		{"a numeric content in the second message", EndpointChat, `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":5}]}`, "messages[1].content", "but got a number"},
		{"a content part that is a string", EndpointChat, `{"model":"m","messages":[{"role":"user","content":["hi"]}]}`, "messages[0].content[0]", "expected an object"},
		{"an unknown content part type", EndpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"video"}]}]}`, "messages[0].content[1].type", "'video'"},
		{"a numeric content-part text", EndpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":5}]}]}`, "messages[0].content[0].text", "expected a string"},
		{"tool_calls as an object", EndpointChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":{}}]}`, "messages[0].tool_calls", "expected an array"},
		{"a missing prompt", EndpointCompletions, `{"model":"m"}`, "prompt", "Missing required parameter: 'prompt'."},
		{"an object prompt", EndpointCompletions, `{"model":"m","prompt":{}}`, "prompt", "expected a string or an array, but got an object"},
		{"an object inside the prompt array", EndpointCompletions, `{"model":"m","prompt":["a",{}]}`, "prompt[1]", "expected a string or token ids"},
		{"a missing input", EndpointEmbeddings, `{"model":"m"}`, "input", "Missing required parameter: 'input'."},
		{"a boolean input", EndpointEmbeddings, `{"model":"m","input":true}`, "input", "but got a boolean"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := testClassifier(t).Classify(tt.ep, []byte(tt.body), "", "")
			var ae *api.Error
			if !errors.As(err, &ae) {
				t.Fatalf("Classify = %+v, %v; want an *api.Error", a, err)
			}
			if a != nil || ae.Status != http.StatusBadRequest || ae.Type != "invalid_request_error" || ae.Param != tt.param {
				t.Fatalf("error = %+v; want 400 invalid_request_error with param %q", ae, tt.param)
			}
			if !strings.Contains(ae.Message, tt.msg) {
				t.Fatalf("message %q does not say %q", ae.Message, tt.msg)
			}
		})
	}
}

func TestClassifySensitivity(t *testing.T) {
	tests := []struct {
		name     string
		ep       Endpoint
		body     string
		declared string
		detected Sensitivity
		want     Sensitivity
		findings map[string]int
	}{
		{"plain text is public", EndpointChat, chatBody("what is the capital of France?"), "", Public, Public, nil},
		{"an email is internal", EndpointChat, chatBody("mail alice@example.com"), "", Internal, Internal, map[string]int{"EMAIL": 1}},
		{"a phone number is internal", EndpointChat, chatBody("call +1 415 555 2671"), "", Internal, Internal, map[string]int{"PHONE": 1}},
		{"a Luhn-valid card is confidential", EndpointChat, chatBody("card 4111 1111 1111 1111"), "", Confidential, Confidential, map[string]int{"CREDIT_CARD": 1}},
		{"a card failing Luhn is public", EndpointChat, chatBody("card 4111 1111 1111 1112"), "", Public, Public, nil},
		{"a mod-97-valid IBAN is confidential", EndpointChat, chatBody("iban DE89370400440532013000"), "", Confidential, Confidential, map[string]int{"IBAN": 1}},
		{"an OpenAI-style key is restricted", EndpointChat, chatBody("key sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"), "", Restricted, Restricted, map[string]int{"SECRET": 1}},
		{"the highest class of several findings wins", EndpointChat, chatBody("alice@example.com and bob@example.org pay 4111 1111 1111 1111"), "", Confidential, Confidential, map[string]int{"EMAIL": 2, "CREDIT_CARD": 1}},
		{"a finding in a tool call argument counts", EndpointChat,
			`{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"pay","arguments":"{\"card\":\"4111111111111111\"}"}}]}]}`, "", Confidential, Confidential, map[string]int{"CREDIT_CARD": 1}},
		{"a finding in a name counts", EndpointChat, `{"model":"m","messages":[{"role":"user","name":"alice@example.com","content":"hi"}]}`, "", Internal, Internal, map[string]int{"EMAIL": 1}},
		{"a finding in the suffix counts", EndpointCompletions, `{"model":"m","prompt":"x","suffix":"alice@example.com"}`, "", Internal, Internal, map[string]int{"EMAIL": 1}},
		{"the header raises public to confidential", EndpointChat, chatBody("hello"), "confidential", Public, Confidential, nil},
		{"the header is case-insensitive and trimmed", EndpointChat, chatBody("hello"), " Restricted ", Public, Restricted, nil},
		{"the header cannot lower a detected secret", EndpointChat, chatBody("key sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd"), "public", Restricted, Restricted, map[string]int{"SECRET": 1}},
		{"the header cannot lower a detected email", EndpointChat, chatBody("alice@example.com"), "public", Internal, Internal, map[string]int{"EMAIL": 1}},
		{"token-id prompts are opaque and confidential", EndpointCompletions, `{"model":"m","prompt":[1,2,3]}`, "", Confidential, Confidential, nil},
		{"nested token-id prompts are opaque", EndpointCompletions, `{"model":"m","prompt":[[1,2],[3]]}`, "", Confidential, Confidential, nil},
		{"token-id embeddings input is opaque", EndpointEmbeddings, `{"model":"m","input":[[5,6]]}`, "", Confidential, Confidential, nil},
		{"opaque content is raised to confidential but a secret stays restricted", EndpointCompletions,
			`{"model":"m","prompt":["sk-proj-abcdefghijklmnopqrstuvwxyzABCDEF0123456789abcd",[1]]}`, "", Restricted, Restricted, map[string]int{"SECRET": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := classify(t, tt.ep, tt.body, tt.declared)
			if a.Detected != tt.detected || a.Sensitivity != tt.want {
				t.Fatalf("Detected, Sensitivity = %s, %s; want %s, %s", a.Detected, a.Sensitivity, tt.detected, tt.want)
			}
			if !reflect.DeepEqual(a.Sovereignty.Findings, tt.findings) {
				t.Fatalf("Findings = %v, want %v", a.Sovereignty.Findings, tt.findings)
			}
			n := 0
			for _, c := range tt.findings {
				n += c
			}
			if len(a.Findings) != n {
				t.Fatalf("%d field findings, want %d", len(a.Findings), n)
			}
			if tt.declared != "" {
				want, _ := ParseSensitivity(tt.declared)
				if a.Declared != want {
					t.Fatalf("Declared = %s, want %s", a.Declared, want)
				}
			}
		})
	}
}

func TestClassifyOpaqueMarksTokenIDs(t *testing.T) {
	a := classify(t, EndpointCompletions, `{"model":"m","prompt":["hello",[1,2]]}`, "")
	if !a.Opaque || !reflect.DeepEqual(a.Fields, []TextField{{"prompt.0", "hello"}}) {
		t.Fatalf("Opaque, Fields = %v, %q; want true, [prompt.0 hello]", a.Opaque, a.Fields)
	}
	if a := classify(t, EndpointCompletions, `{"model":"m","prompt":"hello"}`, ""); a.Opaque {
		t.Fatal("a string prompt is marked opaque")
	}
}

func TestClassifyFindingOffsetsAddressTheField(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":[{"type":"text","text":"write to alice@example.com or bob@example.org"}]}]}`
	a := classify(t, EndpointChat, body, "")
	var got []string
	for _, f := range a.Findings {
		got = append(got, a.Fields[f.Field].Path+"="+a.Fields[f.Field].Text[f.Start:f.End])
	}
	want := []string{"messages.1.content.0.text=alice@example.com", "messages.1.content.0.text=bob@example.org"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("findings = %q, want %q", got, want)
	}
}

func TestClassifyHeaders(t *testing.T) {
	c := testClassifier(t)
	_, err := c.Classify(EndpointChat, []byte(chatBody("hi")), "secret", "")
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 400 || ae.Param != "X-Molly-Sensitivity" {
		t.Fatalf("an unknown declared class: %v; want 400 about X-Molly-Sensitivity", err)
	}
	a, err := c.Classify(EndpointChat, []byte(chatBody("hi")), "", "  EU ")
	if err != nil || a.Residency != "EU" {
		t.Fatalf("Residency = %q, %v; want EU", a.Residency, err)
	}
	a, err = c.Classify(EndpointModels, nil, "internal", "")
	if err != nil || a.Sensitivity != Internal || !reflect.DeepEqual(a.Modalities, []string{"text"}) {
		t.Fatalf("models: %+v, %v; want internal text with no body", a, err)
	}
}

func TestNewClassifierOverrides(t *testing.T) {
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
			a, err := NewClassifier(testScanner(t), tt.overrides).Classify(EndpointChat, []byte(chatBody(tt.prompt)), "", "")
			if err != nil || a.Sensitivity != tt.want {
				t.Fatalf("Sensitivity = %v, %v; want %s", a, err, tt.want)
			}
		})
	}
	if DefaultEntityClasses["EMAIL"] != Internal {
		t.Fatal("NewClassifier changed DefaultEntityClasses")
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
	a := &Annotation{}
	if got := AnnotationFrom(WithAnnotation(t.Context(), a)); got != a {
		t.Fatal("AnnotationFrom does not return what WithAnnotation stored")
	}
	if AnnotationFrom(t.Context()) != nil {
		t.Fatal("AnnotationFrom of a bare context is not nil")
	}
}

func TestDuplicateKey(t *testing.T) {
	tests := []struct {
		name, in, key string
		dup           bool
	}{
		{"distinct keys", `{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`, "", false},
		{"keys that only look equal inside strings", `{"a":"{\"a\":1,\"a\":2}","b":"a"}`, "", false},
		{"a top-level duplicate", `{"a":1,"b":2,"a":3}`, "a", true},
		{"a duplicate in an array element", `[{"x":1},{"y":1,"y":2}]`, "y", true},
		{"an escaped duplicate", `{"\u0061":1,"a":2}`, "a", true},
		{"a key with an escaped quote", `{"a\"b":1,"a\"b":2}`, `a"b`, true},
		{"deep nesting without duplicates", strings.Repeat(`{"a":[`, 10000) + strings.Repeat(`]}`, 10000), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, dup := duplicateKey([]byte(tt.in))
			if k != tt.key || dup != tt.dup {
				t.Fatalf("duplicateKey = %q, %v; want %q, %v", k, dup, tt.key, tt.dup)
			}
		})
	}
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

func TestCheckStructureBoundsTheNesting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		depth int
		deep  bool
	}{
		{"64 levels are accepted", MaxJSONDepth, false},
		{"65 levels are refused", MaxJSONDepth + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := []byte(strings.Repeat("[", tc.depth) + strings.Repeat("]", tc.depth))
			if _, dup, deep := checkStructure(b); deep != tc.deep || dup {
				t.Fatalf("checkStructure at depth %d: dup %v deep %v, want deep %v", tc.depth, dup, deep, tc.deep)
			}
		})
	}
}
