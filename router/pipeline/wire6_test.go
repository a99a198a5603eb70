package pipeline

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/internal/openapitest"
	"github.com/molly-gateway/molly/router/route"
)

// A stream the upstream ends ([DONE]) with a choice it never finished — a
// server that sends finish_reason for choice 0 of n=2 only, or for a tool
// call never — reaches the client with every choice finished before
// [DONE]: the spec's choices end with a finish_reason, and the SDKs'
// stream helpers (openai-node's finalChatCompletion: "missing
// finish_reason for choice 1") refuse one without. The choice finishes
// "stop", or "tool_calls" when it streamed a call; choice 0 keeps the
// upstream's; every chunk is spec-valid.
func TestUnfinishedChoicesAreFinishedAtTheStreamsEnd(t *testing.T) {
	spec := openapitest.Load(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := `data: {"id":"c","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[%s]}` + "\n\n"
		fmt.Fprintf(w, chunk, `{"index":0,"delta":{"role":"assistant","content":"Hi"},"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":"Yo"},"finish_reason":null}`)
		fmt.Fprintf(w, chunk, `{"index":2,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":null}`)
		fmt.Fprintf(w, chunk, `{"index":0,"delta":{},"finish_reason":"length"}`)
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(up.Close)
	gw, _ := startGateway(t, setup{targets: []*route.Target{{Name: "lan", Tier: "T1", Endpoint: up.URL + "/v1", Models: []string{"m"}}}})
	resp, err := http.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"m","n":3,"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	finish := map[int64]string{}
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		spec.Validate(t, "CreateChatCompletionStreamResponse", []byte(data))
		gjson.Get(data, "choices").ForEach(func(_, ch gjson.Result) bool {
			if fr := ch.Get("finish_reason"); fr.Type == gjson.String {
				if _, twice := finish[ch.Get("index").Int()]; twice {
					t.Errorf("choice %d finished twice: %s", ch.Get("index").Int(), data)
				}
				finish[ch.Get("index").Int()] = fr.Str
			}
			return true
		})
	}
	if want := map[int64]string{0: "length", 1: "stop", 2: "tool_calls"}; !done || fmt.Sprint(finish) != fmt.Sprint(want) {
		t.Fatalf("finish reasons %v ([DONE] %v), want %v", finish, done, want)
	}
}
