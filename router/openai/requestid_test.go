package openai

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestRequestID(t *testing.T) {
	tests := []struct {
		name, client, earlier string
		want                  *regexp.Regexp
	}{
		{"the client's id is kept", "abc-123", "", regexp.MustCompile(`^abc-123$`)},
		{"without one Molly makes one", "", "", regexp.MustCompile(`^req_[0-9a-f]{32}$`)},
		{"an id with spaces is replaced", "a b", "", regexp.MustCompile(`^req_[0-9a-f]{32}$`)},
		{"an id over the limit is replaced", strings.Repeat("x", MaxRequestID+1), "", regexp.MustCompile(`^req_[0-9a-f]{32}$`)},
		{"an earlier handler's id wins", "abc", "req_earlier", regexp.MustCompile(`^req_earlier$`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			if tt.client != "" {
				r.Header.Set(HeaderRequestID, tt.client)
			}
			w := httptest.NewRecorder()
			if tt.earlier != "" {
				w.Header().Set(HeaderRequestID, tt.earlier)
			}
			id := RequestID(w, r)
			if !tt.want.MatchString(id) || w.Header().Get(HeaderRequestID) != id || r.Header.Get(HeaderRequestID) != id {
				t.Fatalf("id %q, response %q, request %q", id, w.Header().Get(HeaderRequestID), r.Header.Get(HeaderRequestID))
			}
			if again := RequestID(w, r); again != id {
				t.Fatalf("a second call gave %q, want %q", again, id)
			}
		})
	}
}
