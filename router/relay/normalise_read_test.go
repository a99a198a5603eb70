package relay

import (
	"bytes"
	"testing"
	"unsafe"

	oai "github.com/molly-gateway/molly/router/openai"
)

// TestNormaliseReadMatchesGolden: NormaliseRead, given what
// openai.ReadJSON read of each corpus answer, writes for every
// goldenAnswers request the bytes recorded in
// testdata/normalise_golden.jsonl (the output of NormaliseBody before it
// was made faster, commit 437871b), and at least one answer of each
// endpoint it can leave plain takes the path that does not read the body
// again.
func TestNormaliseReadMatchesGolden(t *testing.T) {
	corpus := readLines(t, "testdata/normalise_corpus.jsonl")
	want := readLines(t, "testdata/normalise_golden.jsonl")
	if len(want) != len(corpus)*len(goldenAnswers) {
		t.Fatalf("%d golden outputs for %d answers", len(want), len(corpus))
	}
	plain := map[oai.Endpoint]int{}
	for i, body := range corpus {
		for j, ans := range goldenAnswers {
			in := []byte(body)
			d, valid, _, dup, deep := oai.ReadJSON(in)
			if !valid || dup || deep {
				d = oai.Doc{}
			}
			out := NormaliseRead(ans, &d, in)
			if body != string(in) {
				t.Fatalf("NormaliseRead changed its input %s", body)
			}
			if got := madeUpID.ReplaceAllString(string(out), "${1}<id>"); got != want[i*len(goldenAnswers)+j] {
				t.Errorf("answer %d for request %d:\n got %s\nwant %s", i, j, got, want[i*len(goldenAnswers)+j])
			}
			if d.Len() > 0 {
				if _, ok := plainAnswer(ans, &d); ok {
					plain[ans.Endpoint]++
				}
			}
		}
	}
	for _, ep := range []oai.Endpoint{oai.EndpointChat, oai.EndpointCompletions} {
		if plain[ep] == 0 {
			t.Errorf("no %s answer of the corpus is plain", ep)
		}
	}
}

// TestNormaliseReadPlain: the answer of an OpenAI-compatible upstream,
// already in the spec's shape, comes back as it is for a client that
// asked for its model name, and with only the name replaced for one
// that asked for an alias (the bytes written by hand).
func TestNormaliseReadPlain(t *testing.T) {
	const head, tail = `{"id":"chatcmpl-1","object":"chat.completion","created":1767225600,"model":`,
		`,"choices":[{"index":0,"finish_reason":"stop","logprobs":null,"message":{"role":"assistant","content":"Hi.","refusal":null}}],` +
			`"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`
	body := []byte(head + `"up-model"` + tail)
	d, _, _, _, _ := oai.ReadJSON(body)
	ans := Answer{Endpoint: oai.EndpointChat, Model: "up-model", Created: created, Usage: &Counts{Prompt: 5, Completion: 2}}
	if out := NormaliseRead(ans, &d, body); unsafe.SliceData(out) != unsafe.SliceData(body) || len(out) != len(body) {
		t.Errorf("an answer that needs no change came back as %s", out)
	}
	ans.Model = `al"ias`
	if out, want := NormaliseRead(ans, &d, body), head+`"al\"ias"`+tail; string(out) != want {
		t.Errorf("got  %s\nwant %s", out, want)
	}
	// A Doc of other bytes (a body replaced after it was read) is not used.
	other := bytes.Replace(body, []byte(`"index":0`), []byte(`"index":null`), 1)
	if out := NormaliseRead(ans, &d, other); !bytes.Contains(out, []byte(`"index":0`)) {
		t.Errorf("the Doc of another body was used: %s", out)
	}
}

// FuzzNormaliseRead: for any bytes, NormaliseRead given what
// openai.ReadJSON read writes what NormaliseBody writes (made-up ids
// masked), for every goldenAnswers request.
func FuzzNormaliseRead(f *testing.F) {
	for _, body := range readLines(f, "testdata/normalise_corpus.jsonl") {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		d, valid, _, dup, deep := oai.ReadJSON(body)
		if !valid || dup || deep {
			return // the pipeline relays no such answer
		}
		for _, ans := range goldenAnswers {
			want := madeUpID.ReplaceAll(NormaliseBody(ans, body), []byte("${1}<id>"))
			if got := madeUpID.ReplaceAll(NormaliseRead(ans, &d, body), []byte("${1}<id>")); !bytes.Equal(got, want) {
				t.Fatalf("%s for %+v:\n got %s\nwant %s", body, ans, got, want)
			}
		}
	})
}
