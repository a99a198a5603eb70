package egress

import (
	"encoding/json"
	"reflect"
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
