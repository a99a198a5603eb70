package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestEveryMollyAdminRouteIsGuarded: each admin route of every Molly admin
// module in the binary answers a request that came over TCP without a
// verified client certificate with 403 (admin.Guard), before its handler
// runs — whatever listener let it in.
func TestEveryMollyAdminRouteIsGuarded(t *testing.T) {
	n := 0
	for _, id := range caddy.GetModules("admin.api") {
		if !strings.HasPrefix(id.ID.Name(), "molly") {
			continue
		}
		router, ok := id.New().(caddy.AdminRouter)
		if !ok {
			continue
		}
		for _, route := range router.Routes() {
			n++
			for _, method := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
				r := httptest.NewRequest(method, route.Pattern, strings.NewReader("{}"))
				r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2019}))
				w := httptest.NewRecorder()
				err := route.Handler.ServeHTTP(w, r)
				var api caddy.APIError
				if !errors.As(err, &api) || api.HTTPStatus != http.StatusForbidden {
					t.Errorf("%s %s (module %s) over TCP: %v, status %d; want 403 from admin.Guard", method, route.Pattern, id.ID, err, w.Code)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d Molly admin routes; the modules are not in the binary", n)
	}
}
