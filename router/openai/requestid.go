package openai

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
)

// Correlation headers.
const (
	// HeaderRequestID is the request's id, sent on every response (OpenAI's
	// SDKs expose it as the response's request id) and forwarded upstream.
	HeaderRequestID = "X-Request-Id"
	// HeaderShouldRetry tells OpenAI's SDKs whether to retry ("true",
	// "false"), overriding their status-based rules.
	HeaderShouldRetry = "X-Should-Retry"
)

// MaxRequestID is the longest client request id kept, in bytes; a longer
// one, or one with bytes outside printable ASCII, is replaced by Molly's.
const MaxRequestID = 128

// RequestID returns the request's id and makes sure both the response and
// the request carry it in HeaderRequestID: the id already on the response
// (an earlier handler set it), else the client's (when printable ASCII of
// at most MaxRequestID bytes), else a new "req_" + 32 hex digits. Setting
// it on the request is what forwards Molly's id upstream.
func RequestID(w http.ResponseWriter, r *http.Request) string {
	id := w.Header().Get(HeaderRequestID)
	if id == "" {
		id = r.Header.Get(HeaderRequestID)
		if !printable(id) {
			var b [16]byte
			_, _ = rand.Read(b[:])
			id = "req_" + hex.EncodeToString(b[:])
		}
		w.Header().Set(HeaderRequestID, id)
	}
	if r.Header.Get(HeaderRequestID) != id {
		r.Header.Set(HeaderRequestID, id)
	}
	return id
}

func printable(s string) bool {
	if s == "" || len(s) > MaxRequestID {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
