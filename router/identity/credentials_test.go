package identity

import (
	"net/http"
	"testing"
)

func TestScrubURIRedactsCredentialParameters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/v1/chat/completions", "/v1/chat/completions"},
		{"/v1/models?api_key=sk-live-123456", "/v1/models?api_key=REDACTED"},
		{"/v1/models?key=AIzaSyA0123456789&alt=json", "/v1/models?key=REDACTED&alt=json"},
		{"/v1/models?limit=3&access_token=abc.def.ghi&x=1", "/v1/models?limit=3&access_token=REDACTED&x=1"},
		{"/v1/models?X-Amz-Signature=abcd&X-Amz-Date=2026", "/v1/models?X-Amz-Signature=REDACTED&X-Amz-Date=2026"},
		{"/v1/models?q=sk-molly-AbCdEfGhIjKlMnOpQrStUvWxYz", "/v1/models?q=REDACTED"},
		{"/v1/models?api%5Fkey=s3cr3t", "/v1/models?api%5Fkey=REDACTED"},
		{"/v1/models?sk-proj-abcdefghijkl", "/v1/models?REDACTED"},
		{"/v1/models?password=&user=ann", "/v1/models?password=REDACTED&user=ann"},
		{"/v1/models?monkey=business", "/v1/models?monkey=REDACTED"}, // by name, erring on the side of redaction
		{"/v1/models?model=gpt&stream=true", "/v1/models?model=gpt&stream=true"},
		{"/v1/models?%zz=1&secret=%zz", "/v1/models?%zz=1&secret=REDACTED"},
		// A whole key in the path (where a display prefix belongs) keeps
		// only its first 17 bytes; a display prefix is kept as it is.
		{"/molly/keys/sk-molly-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefg", "/molly/keys/sk-molly-AbCdEfGhREDACTED"},
		{"/molly/keys/sk-molly-AbCdEfGh", "/molly/keys/sk-molly-AbCdEfGh"},
		{"/molly/keys/sk%2Dmolly-AbCdEfGhIjKlMnOpQrStUvWxYz?x=1", "/molly/keys/sk-molly-AbCdEfGhREDACTED?x=1"},
		{"/v1/models/gpt-4o?", "/v1/models/gpt-4o?"},
	} {
		if got := ScrubURI(tc.in); got != tc.want {
			t.Errorf("ScrubURI(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestScrubHeaderRedactsCredentialHeadersAndLeavesTheOriginal(t *testing.T) {
	h := http.Header{
		"Authorization":       {"Bearer sk-molly-xyz0123456789"},
		"Proxy-Authorization": {"Basic YWxhZGRpbjpvcGVuc2VzYW1l"},
		"X-Api-Key":           {"k-123"},
		"Api-Key":             {"k-456"},
		"X-Auth-Token":        {"t"},
		"Cookie":              {"session=1"},
		"X-Custom":            {"sk-proj-abcdefghijklmnop"},
		"Content-Type":        {"application/json"},
		"X-Molly-Max-Cost":    {"0.01"},
		"User-Agent":          {"OpenAI/Python 1.0"},
	}
	got := ScrubHeader(h)
	for k, v := range got {
		secret := k != "Content-Type" && k != "X-Molly-Max-Cost" && k != "User-Agent"
		if secret != (v[0] == Redacted) {
			t.Errorf("%s: %q", k, v[0])
		}
	}
	if h.Get("X-Api-Key") != "k-123" {
		t.Fatal("ScrubHeader changed its argument")
	}
	clean := http.Header{"Accept": {"*/*"}}
	if got := ScrubHeader(clean); got.Get("Accept") != "*/*" {
		t.Fatalf("%v", got)
	}
}
