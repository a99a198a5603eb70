package openai

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
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
		{"HEAD on models is GET without the body", "HEAD", "/v1/models", EndpointModels, 0},
		{"HEAD on one model", "HEAD", "/v1/models/gpt-4o", EndpointModels, 0},
		{"models without prefix", "GET", "/models", EndpointModels, 0},
		{"one model is a GET on its path", "GET", "/v1/models/gpt-4o", EndpointModels, 0},
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
	// A 405 lists the path's methods (RFC 9110 §15.5.6), and Write sends them.
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/chat/completions", "POST"}, {"DELETE", "/v1/embeddings", "POST"},
		{"POST", "/v1/models", "GET, HEAD"}, {"PUT", "/v1/models/gpt-4o", "GET, HEAD"},
	} {
		_, err := EndpointOf(c.method, c.path)
		if err == nil || err.Allow != c.allow {
			t.Fatalf("EndpointOf(%s %s) = %+v, want Allow %q", c.method, c.path, err, c.allow)
		}
		w := httptest.NewRecorder()
		err.Write(w)
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != c.allow {
			t.Errorf("written: %d Allow %q, want 405 Allow %q", w.Code, w.Header().Get("Allow"), c.allow)
		}
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

func TestModelPathID(t *testing.T) {
	for path, want := range map[string]string{"/v1/models/gpt-4o": "gpt-4o", "/models/m": "m", "/v1/models": "", "/v1/models/": "", "/v1/models/a/b": "a/b", "/v1/models/meta-llama/Llama-3.1-8B/": "meta-llama/Llama-3.1-8B"} {
		if got := ModelPathID(path); got != want {
			t.Errorf("ModelPathID(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestParseRequestReadsTheView(t *testing.T) {
	tests := []struct {
		name string
		ep   Endpoint
		body string
		want Request
	}{
		{"a plain chat request", EndpointChat, `{"model":"gpt-x","messages":[{"role":"user","content":"hello there"}]}`,
			Request{Endpoint: EndpointChat, Model: "gpt-x", N: 1, Messages: 1}},
		{"audio output asked for", EndpointChat, `{"model":"m","modalities":["text","audio"],"audio":{"voice":"alloy","format":"wav"},"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1, AudioOut: true}},
		{"text output only", EndpointChat, `{"model":"m","modalities":["text"],"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1}},
		{"streaming with usage", EndpointChat, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", Stream: true, IncludeUsage: true, N: 1, Messages: 1}},
		{"the larger of max_tokens and max_completion_tokens", EndpointChat, `{"model":"m","max_tokens":100,"max_completion_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", MaxTokens: 100, N: 1, Messages: 1}},
		{"the larger of max_completion_tokens and max_tokens", EndpointChat, `{"model":"m","max_completion_tokens":70,"max_tokens":20,"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", MaxTokens: 70, N: 1, Messages: 1}},
		{"null max_tokens counts as unset", EndpointChat, `{"model":"m","max_tokens":null,"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1}},
		{"declared tools and functions are listed by name", EndpointChat,
			`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"functions":[{"name":"g"}],"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1, Tools: []string{"f", "g"}}},
		{"a tool message is a tool turn", EndpointChat, `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"ok"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 2, ToolTurns: true}},
		{"chat logprobs, n and response_format", EndpointChat, `{"model":"m","logprobs":true,"n":3,"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 3, Logprobs: true, ResponseFormat: "json_object", Messages: 2}},
		{"a tool_choice mode", EndpointChat, `{"model":"m","tool_choice":"required","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1, Tools: []string{"f"}, ToolChoice: "required"}},
		{"a named tool_choice", EndpointChat, `{"model":"m","tool_choice":{"type":"function","function":{"name":"f"}},"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1, Tools: []string{"f"}, ToolChoice: "function"}},
		{"an allowed_tools tool_choice", EndpointChat, `{"model":"m","tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"f"}}]}},"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`,
			Request{Endpoint: EndpointChat, Model: "m", N: 1, Messages: 1, Tools: []string{"f"}, ToolChoice: "allowed_tools"}},
		{"completions best_of and logprobs", EndpointCompletions, `{"model":"m","prompt":"x","best_of":4,"n":2,"logprobs":0}`,
			Request{Endpoint: EndpointCompletions, Model: "m", N: 2, BestOf: 4, Logprobs: true, Prompts: 1}},
		{"a prompt array", EndpointCompletions, `{"model":"m","prompt":["a","b","c"],"n":2}`,
			Request{Endpoint: EndpointCompletions, Model: "m", N: 2, Prompts: 3}},
		{"token-id prompts", EndpointCompletions, `{"model":"m","prompt":["a",[1,2]]}`,
			Request{Endpoint: EndpointCompletions, Model: "m", N: 1, TokenPrompts: true, Prompts: 2}},
		{"one prompt of token ids", EndpointCompletions, `{"model":"m","prompt":[1,2,3]}`,
			Request{Endpoint: EndpointCompletions, Model: "m", N: 1, TokenPrompts: true, Prompts: 1}},
		{"token-id embeddings input", EndpointEmbeddings, `{"model":"m","input":[5,6]}`,
			Request{Endpoint: EndpointEmbeddings, Model: "m", N: 1, TokenPrompts: true, Prompts: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(tt.ep, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got.Endpoint != tt.want.Endpoint || got.Model != tt.want.Model || got.Stream != tt.want.Stream || got.IncludeUsage != tt.want.IncludeUsage ||
				got.MaxTokens != tt.want.MaxTokens || got.N != tt.want.N || got.BestOf != tt.want.BestOf || got.Logprobs != tt.want.Logprobs ||
				strings.Join(got.Tools, ",") != strings.Join(tt.want.Tools, ",") || got.ToolTurns != tt.want.ToolTurns ||
				got.ResponseFormat != tt.want.ResponseFormat || got.Messages != tt.want.Messages || got.TokenPrompts != tt.want.TokenPrompts ||
				got.Prompts != tt.want.Prompts {
				t.Fatalf("ParseRequest = %+v\nwant           %+v", *got, tt.want)
			}
		})
	}
	t.Run("choices is the larger of n and best_of, for each prompt", func(t *testing.T) {
		for _, c := range []struct {
			r    Request
			want int
		}{{Request{N: 1}, 1}, {Request{N: 2, BestOf: 5}, 5}, {Request{N: 3}, 3}, {Request{}, 1},
			{Request{Endpoint: EndpointCompletions, N: 2, BestOf: 3, Prompts: 4}, 12},
			{Request{Endpoint: EndpointEmbeddings, N: 1, Prompts: 4}, 1}} {
			if got := c.r.Choices(); got != c.want {
				t.Errorf("Choices(n=%d, best_of=%d, prompts=%d) = %d, want %d", c.r.N, c.r.BestOf, c.r.Prompts, got, c.want)
			}
		}
	})
}

// badBodies are refused by ParseRequest with a 400 naming param.
var badBodies = []struct {
	name  string
	ep    Endpoint
	body  string
	param string
	msg   string // a part of the message
}{
	{"an empty body", EndpointChat, ``, "", "empty"},
	{"malformed JSON", EndpointChat, `{"model":`, "", "not valid JSON"},
	{"invalid UTF-8", EndpointChat, "{\"model\":\"m\xff\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", "", "not valid UTF-8"},
	{"a JSON array body", EndpointChat, `[1]`, "", "must be an object, got an array"},
	{"a duplicate key smuggling a second messages array", EndpointChat,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"messages":[{"role":"user","content":"alice@example.com"}]}`, "", `the key "messages" appears twice`},
	{"a duplicate content key in a message", EndpointChat,
		`{"model":"m","messages":[{"role":"user","content":"hi","content":"alice@example.com"}]}`, "", `the key "content" appears twice`},
	{"a duplicate key spelled with an escape", EndpointChat,
		`{"model":"m","messages":[{"role":"user","content":"hi","cont\u0065nt":"x"}]}`, "", `the key "content" appears twice`},
	{"a duplicate key in a deep object", EndpointChat,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","x":{"k":1,"j":2,"k":3}}]}]}`, "", `the key "k" appears twice`},
	{"nesting deeper than the limit", EndpointChat,
		`{"model":"m","x":` + strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth) + `,"messages":[{"role":"user","content":"hi"}]}`, "", "nests deeper than 64 levels"},
	{"a missing model", EndpointChat, `{"messages":[{"role":"user","content":"hi"}]}`, "model", "You must provide a model parameter."},
	{"a numeric model", EndpointChat, `{"model":5,"messages":[{"role":"user","content":"hi"}]}`, "model", "expected a non-empty string, but got a number"},
	{"an empty model", EndpointChat, `{"model":"","messages":[{"role":"user","content":"hi"}]}`, "model", "non-empty string"},
	{"a model name over the limit", EndpointChat, `{"model":"` + strings.Repeat("m", MaxModelName+1) + `","messages":[{"role":"user","content":"hi"}]}`, "model", "longer than 256 bytes"},
	{"a string stream flag", EndpointChat, `{"model":"m","stream":"yes","messages":[{"role":"user","content":"hi"}]}`, "stream", "expected a boolean, but got a string"},
	{"a numeric include_usage", EndpointChat, `{"model":"m","stream_options":{"include_usage":1},"messages":[{"role":"user","content":"hi"}]}`, "stream_options.include_usage", "expected a boolean"},
	{"a zero max_tokens", EndpointChat, `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens", "expected a positive integer, but got 0"},
	{"a fractional max_completion_tokens", EndpointChat, `{"model":"m","max_completion_tokens":1.5,"messages":[{"role":"user","content":"hi"}]}`, "max_completion_tokens", "got 1.5"},
	{"a string max_tokens", EndpointChat, `{"model":"m","max_tokens":"9","messages":[{"role":"user","content":"hi"}]}`, "max_tokens", "positive integer"},
	{"a string temperature", EndpointChat, `{"model":"m","temperature":"hot","messages":[{"role":"user","content":"hi"}]}`, "temperature", "expected a number, but got a string"},
	{"a zero n", EndpointChat, `{"model":"m","n":0,"messages":[{"role":"user","content":"hi"}]}`, "n", "positive integer"},
	{"a response_format without a type", EndpointChat, `{"model":"m","response_format":{},"messages":[{"role":"user","content":"hi"}]}`, "response_format.type", "expected a string"},
	{"missing messages", EndpointChat, `{"model":"m"}`, "messages", "Missing required parameter: 'messages'."},
	{"messages as a string", EndpointChat, `{"model":"m","messages":"hi"}`, "messages", "expected an array, but got a string"},
	{"an empty messages array", EndpointChat, `{"model":"m","messages":[]}`, "messages", "empty array"},
	{"tools as an object", EndpointChat, `{"model":"m","tools":{},"messages":[{"role":"user","content":"hi"}]}`, "tools", "expected an array, but got an object"},
	{"a tool without a function name", EndpointChat, `{"model":"m","tools":[{"type":"function","function":{}}],"messages":[{"role":"user","content":"hi"}]}`, "tools[0].function.name", "expected a string"},
	{"a string chat logprobs", EndpointChat, `{"model":"m","logprobs":"yes","messages":[{"role":"user","content":"hi"}]}`, "logprobs", "expected a boolean"},
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
	// The ranges and shapes of the OpenAPI description.
	{"a temperature above 2", EndpointChat, `{"model":"m","temperature":2.5,"messages":[{"role":"user","content":"hi"}]}`, "temperature", "Expected a value <= 2, but got 2.5"},
	{"a negative temperature", EndpointChat, `{"model":"m","temperature":-0.1,"messages":[{"role":"user","content":"hi"}]}`, "temperature", "Expected a value >= 0"},
	{"a top_p above 1", EndpointChat, `{"model":"m","top_p":1.01,"messages":[{"role":"user","content":"hi"}]}`, "top_p", "Expected a value <= 1"},
	{"a presence_penalty of 5", EndpointChat, `{"model":"m","presence_penalty":5,"messages":[{"role":"user","content":"hi"}]}`, "presence_penalty", "Expected a value <= 2, but got 5"},
	{"a frequency_penalty of -3", EndpointChat, `{"model":"m","frequency_penalty":-3,"messages":[{"role":"user","content":"hi"}]}`, "frequency_penalty", "Expected a value >= -2, but got -3"},
	{"a temperature that overflows", EndpointCompletions, `{"model":"m","prompt":"a","temperature":1e400}`, "temperature", "above maximum"},
	{"a logit_bias of 200", EndpointChat, `{"model":"m","logit_bias":{"50256":200},"messages":[{"role":"user","content":"hi"}]}`, "logit_bias.50256", "Expected a value <= 100"},
	{"a logit_bias key that is no token id", EndpointChat, `{"model":"m","logit_bias":{"abc":1},"messages":[{"role":"user","content":"hi"}]}`, "logit_bias", `"abc" is not a token id`},
	{"a logit_bias array", EndpointCompletions, `{"model":"m","prompt":"a","logit_bias":[1]}`, "logit_bias", "expected an object"},
	{"a numeric user", EndpointChat, `{"model":"m","user":5,"messages":[{"role":"user","content":"hi"}]}`, "user", "expected a string, but got a number"},
	{"stream_options without stream", EndpointChat, `{"model":"m","stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, "stream_options", "only allowed when 'stream' is enabled"},
	{"a json_schema format without its schema", EndpointChat, `{"model":"m","response_format":{"type":"json_schema"},"messages":[{"role":"user","content":"hi"}]}`, "response_format.json_schema", "Missing required parameter"},
	{"a json_schema without a name", EndpointChat, `{"model":"m","response_format":{"type":"json_schema","json_schema":{"schema":{}}},"messages":[{"role":"user","content":"hi"}]}`, "response_format.json_schema.name", "expected a string"},
	{"a tool name with spaces", EndpointChat, `{"model":"m","tools":[{"type":"function","function":{"name":"bad name!*"}}],"messages":[{"role":"user","content":"hi"}]}`, "tools[0].function.name", "does not match pattern"},
	{"a tool name of 65 bytes", EndpointChat, `{"model":"m","tools":[{"type":"function","function":{"name":"` + strings.Repeat("f", 65) + `"}}],"messages":[{"role":"user","content":"hi"}]}`, "tools[0].function.name", "does not match pattern"},
	{"a tool message without tool_call_id", EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"tool","content":"42"}]}`, "messages[1].tool_call_id", "must have a 'tool_call_id'"},
	// OpenAI's answers to a tool message that answers no earlier tool call.
	{"a tool message without a tool call before it", EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"tool","tool_call_id":"c","content":"42"}]}`, "messages.[1].role", "must be a response to a preceeding message with 'tool_calls'"},
	{"a tool message answering an unknown call", EndpointChat, `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"d","content":"42"}]}`, "messages.[2].tool_call_id", "'tool_call_id' of 'd' not found in 'tool_calls'"},
	{"a numeric tool_call_id", EndpointChat, `{"model":"m","messages":[{"role":"tool","tool_call_id":7,"content":"42"}]}`, "messages[0].tool_call_id", "expected a string"},
	{"numeric tool call arguments", EndpointChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":5}}]}]}`, "messages[0].tool_calls[0].function.arguments", "expected a string, but got a number"},
	{"a custom tool without a name", EndpointChat, `{"model":"m","tools":[{"type":"custom","custom":{}}],"messages":[{"role":"user","content":"hi"}]}`, "tools[0].custom.name", "expected a string"},
	{"a custom tool call without input", EndpointChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"custom","custom":{"name":"grep"}}]}]}`, "messages[0].tool_calls[0].custom.input", "expected a string"},
	{"a tool call without a function", EndpointChat, `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"c"}]}]}`, "messages[0].tool_calls[0].function", "expected an object"},
	// tool_choice: ChatCompletionToolChoiceOption (a mode, or a named,
	// custom or allowed_tools object).
	{"an unknown tool_choice mode", EndpointChat, `{"model":"m","tool_choice":"x","messages":[{"role":"user","content":"hi"}]}`, "tool_choice", "Supported values are: 'none', 'auto' and 'required'"},
	{"a tool_choice mode in capitals", EndpointChat, `{"model":"m","tool_choice":"None","messages":[{"role":"user","content":"hi"}]}`, "tool_choice", "'None'"},
	{"a numeric tool_choice", EndpointChat, `{"model":"m","tool_choice":1,"messages":[{"role":"user","content":"hi"}]}`, "tool_choice", "expected a string or an object"},
	{"a tool_choice object without a type", EndpointChat, `{"model":"m","tool_choice":{},"messages":[{"role":"user","content":"hi"}]}`, "tool_choice.type", "expected a string, but got nothing"},
	{"a tool_choice of an unknown type", EndpointChat, `{"model":"m","tool_choice":{"type":"x"},"messages":[{"role":"user","content":"hi"}]}`, "tool_choice.type", "'x'"},
	{"a function tool_choice without its function", EndpointChat, `{"model":"m","tool_choice":{"type":"function"},"messages":[{"role":"user","content":"hi"}]}`, "tool_choice.function", "expected an object"},
	{"a function tool_choice without a name", EndpointChat, `{"model":"m","tool_choice":{"type":"function","function":{}},"messages":[{"role":"user","content":"hi"}]}`, "tool_choice.function.name", "expected a string"},
	{"a custom tool_choice with a numeric name", EndpointChat, `{"model":"m","tool_choice":{"type":"custom","custom":{"name":1}},"messages":[{"role":"user","content":"hi"}]}`, "tool_choice.custom.name", "expected a string, but got a number"},
	{"an allowed_tools tool_choice without the list", EndpointChat, `{"model":"m","tool_choice":{"type":"allowed_tools"},"messages":[{"role":"user","content":"hi"}]}`, "tool_choice.allowed_tools", "expected an object"},
	// modalities: an array of "text" and "audio"; embeddings' encoding_format
	// "float" or "base64" and dimensions a positive integer.
	{"modalities as a string", EndpointChat, `{"model":"m","modalities":"audio","messages":[{"role":"user","content":"hi"}]}`, "modalities", "expected an array, but got a string"},
	{"an unknown modality", EndpointChat, `{"model":"m","modalities":["text","video"],"messages":[{"role":"user","content":"hi"}]}`, "modalities[1]", `"video"`},
	{"a numeric modality", EndpointChat, `{"model":"m","modalities":[1],"messages":[{"role":"user","content":"hi"}]}`, "modalities[0]", "Supported values are: 'text' and 'audio'"},
	{"a numeric encoding_format", EndpointEmbeddings, `{"model":"m","input":"x","encoding_format":5}`, "encoding_format", "Supported values are: 'float' and 'base64'"},
	{"an unknown encoding_format", EndpointEmbeddings, `{"model":"m","input":"x","encoding_format":"int8"}`, "encoding_format", `"int8"`},
	{"a string dimensions", EndpointEmbeddings, `{"model":"m","input":"x","dimensions":"64"}`, "dimensions", "expected a positive integer"},
	{"a zero dimensions", EndpointEmbeddings, `{"model":"m","input":"x","dimensions":0}`, "dimensions", "expected a positive integer"},
	{"a missing prompt", EndpointCompletions, `{"model":"m"}`, "prompt", "Missing required parameter: 'prompt'."},
	{"an object prompt", EndpointCompletions, `{"model":"m","prompt":{}}`, "prompt", "expected a string or an array, but got an object"},
	{"an object inside the prompt array", EndpointCompletions, `{"model":"m","prompt":["a",{}]}`, "prompt[1]", "expected a string or token ids"},
	{"a fractional best_of", EndpointCompletions, `{"model":"m","prompt":"a","best_of":2.5}`, "best_of", "positive integer"},
	{"a boolean completions logprobs", EndpointCompletions, `{"model":"m","prompt":"a","logprobs":true}`, "logprobs", "expected an integer"},
	// Integer ranges of the OpenAPI description: top_logprobs 0..20 (chat),
	// logprobs 0..5 (completions), n 1..128, best_of 0..20.
	{"a top_logprobs of 30", EndpointChat, `{"model":"m","logprobs":true,"top_logprobs":30,"messages":[{"role":"user","content":"hi"}]}`, "top_logprobs", "Expected a value <= 20, but got 30"},
	{"a negative top_logprobs", EndpointChat, `{"model":"m","logprobs":true,"top_logprobs":-1,"messages":[{"role":"user","content":"hi"}]}`, "top_logprobs", "Expected a value >= 0, but got -1"},
	{"a fractional top_logprobs", EndpointChat, `{"model":"m","logprobs":true,"top_logprobs":2.5,"messages":[{"role":"user","content":"hi"}]}`, "top_logprobs", "expected an integer, but got a number"},
	{"a string top_logprobs", EndpointChat, `{"model":"m","logprobs":true,"top_logprobs":"3","messages":[{"role":"user","content":"hi"}]}`, "top_logprobs", "expected an integer, but got a string"},
	{"a completions logprobs of 6", EndpointCompletions, `{"model":"m","prompt":"a","logprobs":6}`, "logprobs", "Expected a value <= 5, but got 6"},
	{"a negative completions logprobs", EndpointCompletions, `{"model":"m","prompt":"a","logprobs":-1}`, "logprobs", "Expected a value >= 0, but got -1"},
	{"a fractional completions logprobs", EndpointCompletions, `{"model":"m","prompt":"a","logprobs":2.5}`, "logprobs", "expected an integer, but got a number"},
	{"an n of 129", EndpointChat, `{"model":"m","n":129,"messages":[{"role":"user","content":"hi"}]}`, "n", "Expected a value <= 128, but got 129"},
	{"a completions n of 200", EndpointCompletions, `{"model":"m","prompt":"a","n":200}`, "n", "Expected a value <= 128, but got 200"},
	{"a best_of of 21", EndpointCompletions, `{"model":"m","prompt":"a","best_of":21}`, "best_of", "Expected a value <= 20, but got 21"},
	{"a missing input", EndpointEmbeddings, `{"model":"m"}`, "input", "Missing required parameter: 'input'."},
	{"a boolean input", EndpointEmbeddings, `{"model":"m","input":true}`, "input", "but got a boolean"},
}

func TestParseRequestRejectsBadBodies(t *testing.T) {
	for _, tt := range badBodies {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(tt.ep, []byte(tt.body))
			if r != nil || err == nil {
				t.Fatalf("ParseRequest = %+v, %v; want an error", r, err)
			}
			if err.Status != http.StatusBadRequest || err.Type != "invalid_request_error" || err.Param != tt.param {
				t.Fatalf("error = %+v; want 400 invalid_request_error with param %q", err, tt.param)
			}
			if !strings.Contains(err.Message, tt.msg) {
				t.Fatalf("message %q does not say %q", err.Message, tt.msg)
			}
		})
	}
}

func TestCheckStructure(t *testing.T) {
	tests := []struct {
		name, in, key string
		dup, deep     bool
	}{
		{"distinct keys", `{"a":1,"b":{"a":2},"c":[{"a":3},{"a":4}]}`, "", false, false},
		{"keys that only look equal inside strings", `{"a":"{\"a\":1,\"a\":2}","b":"a"}`, "", false, false},
		{"a top-level duplicate", `{"a":1,"b":2,"a":3}`, "a", true, false},
		{"a duplicate of the second key", `{"a":1,"b":2,"c":3,"b":4}`, "b", true, false},
		{"a duplicate in an array element", `[{"x":1},{"y":1,"y":2}]`, "y", true, false},
		{"an escaped duplicate", `{"\u0061":1,"a":2}`, "a", true, false},
		{"a key with an escaped quote", `{"a\"b":1,"a\"b":2}`, `a"b`, true, false},
		{"64 levels are accepted", strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth), "", false, false},
		{"65 levels are refused", strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1), "", false, true},
		{"deep nesting is refused before any stack grows", strings.Repeat(`{"a":[`, 10000) + strings.Repeat(`]}`, 10000), "", false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, dup, deep := CheckStructure([]byte(tt.in))
			if k != tt.key || dup != tt.dup || deep != tt.deep {
				t.Fatalf("CheckStructure = %q, %v, %v; want %q, %v, %v", k, dup, deep, tt.key, tt.dup, tt.deep)
			}
		})
	}
}

// TestCheckBodyIsParsesFirstChecks: CheckBody answers every body as Parse
// does up to its first parameter — the same error, or none when Parse gets
// as far as the parameters.
func TestCheckBodyIsParsesFirstChecks(t *testing.T) {
	for _, body := range []string{
		"", "{", `{"model":"m"}x`, "{\"model\":\"m\",\"input\":\"\xff\xfe\"}", "{\"model\":\"\xc3\"}", "{\"\xffkey\":1}",
		`{"a":1,"a":2}`, strings.Repeat("[", MaxJSONDepth+1) + strings.Repeat("]", MaxJSONDepth+1), "{\"bad\":\"\xff\",\"a\":1,\"a\":2}",
		`{"model":"m","messages":[]}`, `[]`, `{"model":"m","input":"caf\u00e9 \ud83d\ude00"}`, "{\"model\":\"m\",\"input\":\"café 😀\"}",
	} {
		_, _, perr := Parse(EndpointChat, body)
		err := CheckBody([]byte(body))
		parseFirst := perr != nil && perr.Param == "" && (strings.HasPrefix(perr.Message, "We could not parse") || strings.HasPrefix(perr.Message, "The request body is empty"))
		switch {
		case parseFirst && (err == nil || err.Message != perr.Message || err.Status != 400 || err.Type != "invalid_request_error"):
			t.Errorf("%q: CheckBody = %v, Parse = %v", body, err, perr)
		case !parseFirst && err != nil:
			t.Errorf("%q: CheckBody = %v, but Parse reads on to the parameters (%v)", body, err, perr)
		}
	}
	if err := CheckBody([]byte("{\"input\":\"\xff\"}")); err == nil || !strings.Contains(err.Message, "not valid UTF-8") {
		t.Fatalf("invalid UTF-8: %v", err)
	}
}

func TestErrorBodyAndMatching(t *testing.T) {
	e := &Error{Status: 403, Type: "policy_denied", Code: "model_not_allowed", Message: "no.", Extra: map[string]any{"reasons": []string{"r"}}}
	if got, want := string(e.Body()), `{"error":{"code":"model_not_allowed","message":"no.","param":null,"reasons":["r"],"type":"policy_denied"}}`; got != want {
		t.Fatalf("Body = %s, want %s", got, want)
	}
	wrapped := errors.Join(errors.New("context"), &Error{Status: 404, Code: "model_not_found"})
	if !errors.Is(wrapped, ErrModelNotFound) || errors.Is(wrapped, ErrNoTarget) || errors.Is(wrapped, &Error{Code: "model_not_found", Status: 400}) {
		t.Fatal("errors.Is does not match by code (and status when given)")
	}
}

// TestCustomToolsAreAccepted: custom tools (type "custom", their name at
// custom.name) and their calls (custom.name, custom.input) are valid, as
// the OpenAPI description has them.
func TestCustomToolsAreAccepted(t *testing.T) {
	body := `{"model":"m","tools":[{"type":"custom","custom":{"name":"grep","description":"search"}},{"type":"function","function":{"name":"f"}}],` +
		`"messages":[{"role":"user","content":"find x"},{"role":"assistant","tool_calls":[{"id":"c1","type":"custom","custom":{"name":"grep","input":"x"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"x:1"}]}`
	r, err := ParseRequest(EndpointChat, []byte(body))
	if err != nil {
		t.Fatalf("ParseRequest: %v", err)
	}
	if len(r.Tools) != 2 || r.Tools[0] != "grep" || r.Tools[1] != "f" || !r.ToolTurns {
		t.Fatalf("tools %v, tool turns %v", r.Tools, r.ToolTurns)
	}
}
