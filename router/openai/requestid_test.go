package openai

import (
	"crypto/rand"
	"encoding/hex"
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

// TestMintedRequestIDs: Molly's ids have the documented shape, are all
// different, and Minted knows them, and only them: random ids of the same
// shape (crypto/rand, not the minter), ids with one digit changed or put
// in upper case and other shapes are not Molly's.
func TestMintedRequestIDs(t *testing.T) {
	shape := regexp.MustCompile(`^req_[0-9a-f]{32}$`)
	seen := map[string]bool{}
	const n = 10000
	for range n {
		id := NewRequestID()
		if !shape.MatchString(id) || !Minted(id) || seen[id] {
			t.Fatalf("NewRequestID() = %q: shape %v, minted %v, seen before %v", id, shape.MatchString(id), Minted(id), seen[id])
		}
		seen[id] = true
	}
	for range n {
		var b [16]byte
		_, _ = rand.Read(b[:])
		if id := "req_" + hex.EncodeToString(b[:]); Minted(id) {
			t.Fatalf("a random id %q passes as minted", id)
		}
	}
	id := NewRequestID()
	for i := 4; i < len(id); i++ {
		d := byte('0')
		if id[i] == '0' {
			d = 'f'
		}
		if changed := id[:i] + string(d) + id[i+1:]; Minted(changed) {
			t.Fatalf("%q (digit %d of %q changed) passes as minted", changed, i, id)
		}
	}
	upper := "" // a minted id with one letter digit in upper case: the same bytes
	for upper == "" {
		m := NewRequestID()
		if i := strings.IndexAny(m[4:], "abcdef"); i >= 0 {
			upper = m[:4+i] + strings.ToUpper(m[4+i:5+i]) + m[5+i:]
		}
	}
	for _, bad := range []string{"", "req_", id[:len(id)-1], id + "0", "xyz_" + id[4:], id[:len(id)-1] + "g", upper, "REQ_" + id[4:]} {
		if Minted(bad) {
			t.Fatalf("Minted(%q) = true", bad)
		}
	}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	if got := RequestID(httptest.NewRecorder(), r); !Minted(got) {
		t.Fatalf("RequestID made %q, which is not minted", got)
	}
	r.Header.Set(HeaderRequestID, "abc-123")
	if got := RequestID(httptest.NewRecorder(), r); got != "abc-123" || Minted(got) {
		t.Fatalf("RequestID kept %q (minted %v)", got, Minted(got))
	}
}
