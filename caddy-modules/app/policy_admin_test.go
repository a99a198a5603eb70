package app

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/molly-gateway/molly/caddy-modules/admin"
)

// TestPolicyRouteWithoutAnAppIsNotFound: with no molly app running,
// GET /molly/policy is 404 not_found, as the engine, specialise and
// federation routes answer a feature that is not configured (503 would
// tell a client to retry something no retry changes).
func TestPolicyRouteWithoutAnAppIsNotFound(t *testing.T) {
	saved := current.Swap(nil)
	t.Cleanup(func() { current.Store(saved) })
	err := servePolicy(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/molly/policy", nil))
	if e := admin.Error(err); e.Status != http.StatusNotFound || e.Code != "not_found" {
		t.Fatalf("got %v, want 404 not_found", err)
	}
}
