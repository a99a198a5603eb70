package egress

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// TestWithModelSetsTheTopLevelModelOnly: the body sent upstream names the
// target's model and is otherwise the client's, member for member, as
// encoding/json reads both; a "model" nested in a message is the client's.
func TestWithModelSetsTheTopLevelModelOnly(t *testing.T) {
	for _, body := range []string{
		`{"model":"chat","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":"hi","model":"inner"}],"model":"chat"}`,
		`{ "stream" : true , "model" : "a \"quoted\" name" , "max_tokens":5}`,
		`{"model":7,"messages":[]}`,
		`{"messages":[{"role":"user","content":"no model here"}]}`,
		`{"model":"chat\u00e9","metadata":{"model":"keep"}}`,
	} {
		for _, model := range []string{"small-lan", `we"ird\name`, "<b>&"} {
			got, err := withModel(body, model)
			if err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			var in, out map[string]any
			if err := json.Unmarshal([]byte(body), &in); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got, &out); err != nil {
				t.Fatalf("%s with %q: not JSON: %s", body, model, got)
			}
			in["model"] = model
			if !reflect.DeepEqual(in, out) {
				t.Errorf("%s with %q:\n got %s\nwant %v", body, model, got, in)
			}
		}
	}
}

// TestWithModelWritesTheNameAsEncodingJSONDoes: the model name is spliced
// in byte for byte as json.Marshal writes it (the oracle), for names of
// every ASCII byte, HTML characters, unicode and invalid UTF-8.
func TestWithModelWritesTheNameAsEncodingJSONDoes(t *testing.T) {
	const body = `{"messages":[{"role":"user","content":"hi"}],"model":"chat","stream":false}`
	models := []string{"", "gpt-4o-mini", "a b~c", "é", "\u2028", "\xff", "<b>&", "DEL\x7f"}
	for c := 0; c < 0x80; c++ {
		models = append(models, "m"+string(rune(c))+"n")
	}
	for _, model := range models {
		got, err := withModel(body, model)
		if err != nil {
			t.Fatal(err)
		}
		q, _ := json.Marshal(model)
		want := `{"messages":[{"role":"user","content":"hi"}],"model":` + string(q) + `,"stream":false}`
		if string(got) != want {
			t.Errorf("model %q:\n got %s\nwant %s", model, got, want)
		}
	}
}

// BenchmarkWithModel measures renaming the model of a 2 KB chat request.
func BenchmarkWithModel(b *testing.B) {
	body := `{"messages":[{"role":"user","content":"` + strings.Repeat("Please check the routing rules. ", 64) + `"}],"model":"chat","max_tokens":256}`
	b.ReportAllocs()
	for b.Loop() {
		if _, err := withModel(body, "gpt-4o-mini-2024-07-18"); err != nil {
			b.Fatal(err)
		}
	}
}
