package pipeline

import (
	"net/http"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/molly-gateway/molly/router/openai"
)

// FuzzWholeAnswerReadOnce: for any bytes, the attempt's one read of a
// whole answer (wholeAnswer, then usageMember and meanLogprob over its
// Doc) says what the stages said when each read the body again
// (wholeAnswerBefore, gjson's "usage", MeanLogprob), for every endpoint.
func FuzzWholeAnswerReadOnce(f *testing.F) {
	for _, s := range []string{
		benchAnswer,
		`{"choices":[{"index":0,"message":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.5},{"token":"b","logprob":-1.5}]}}],"usage":{"prompt_tokens":3}}`,
		`{"choices":[{"text":"a","logprobs":{"token_logprobs":[-1,null,-2]}}]}`,
		`{"choices":{"a":{"logprobs":{"token_logprobs":[-1]}}}}`,
		`{"error":{"message":"slow down","type":"rate_limit_error","code":429}}`,
		`{"error":{"message":"boom","code":"429"}}`,
		`{"error":"boom","choices":[]}`,
		`{"error":null,"choices":null,"usage":null}`,
		`{"choices":[1]}`, `{"choices":"x"}`, `[{"error":{"message":"x"}}]`, `"x"`,
		`{"a":1,"a":2}`, `{"choices":[{"logprob\u0073":{"content":[{"logprob":-2}]}}]}`,
		`{"usage":{"prompt_tokens":1,"completion_tokens":2}, "choices":[]} `, `{"choices":[`,
	} {
		f.Add([]byte(s))
	}
	resp := &http.Response{Header: http.Header{"Content-Type": {"application/json"}}}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, ep := range []openai.Endpoint{openai.EndpointChat, openai.EndpointCompletions, openai.EndpointEmbeddings} {
			d, kind, why := wholeAnswer(ep, resp, body)
			wantKind, wantWhy := wholeAnswerBefore(ep, resp, body)
			if kind != wantKind || why != wantWhy {
				t.Fatalf("%s for %s: %q %q, before %q %q", body, ep, kind, why, wantKind, wantWhy)
			}
			if kind != failNone {
				continue
			}
			if got, want := usageMember(&d), gjson.GetBytes(body, "usage"); got.Exists() != want.Exists() || got.Raw != want.Raw {
				t.Fatalf("%s: usage %q, gjson %q", body, got.Raw, want.Raw)
			}
			mean, n := meanLogprob(&d, body)
			if wantMean, wantN := MeanLogprob(body); mean != wantMean || n != wantN {
				t.Fatalf("%s: mean logprob %v of %d, before %v of %d", body, mean, n, wantMean, wantN)
			}
		}
	})
}
