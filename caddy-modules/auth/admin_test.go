package auth

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/molly-gateway/molly/caddy-modules/admin"
)

// TestKeyRoutesWithoutMollyAuthAreNotFound: with no molly_auth handler
// running there is no registry; the key, member and usage routes answer
// 404 not_found (a feature not configured, as the engine, specialise and
// federation routes answer it), not 503, which says "retry".
func TestKeyRoutesWithoutMollyAuthAreNotFound(t *testing.T) {
	saved := active.Swap(nil)
	t.Cleanup(func() { active.Store(saved) })
	var a Admin
	for _, tc := range []struct {
		path string
		h    func(http.ResponseWriter, *http.Request) error
	}{{"/molly/members", a.members}, {"/molly/keys", a.keys}, {"/molly/usage", a.usage}} {
		err := tc.h(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, tc.path, nil))
		if e := admin.Error(err); e.Status != http.StatusNotFound || e.Code != "not_found" {
			t.Fatalf("%s: got %v, want 404 not_found", tc.path, err)
		}
	}
}
