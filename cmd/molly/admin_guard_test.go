package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/tidwall/gjson"
)

// TestEveryMollyAdminRouteIsGuarded: every route of every Molly admin API
// module registered in this binary (admin.api.molly_*) answers 403 to a
// request that reached it over plaintext TCP — neither the Unix socket nor
// the mutual-TLS remote endpoint (admin.Guard) — before its handler reads
// anything, and answers a request over the socket with its own status.
func TestEveryMollyAdminRouteIsGuarded(t *testing.T) {
	tcp := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2019}
	unix := &net.UnixAddr{Name: "/run/molly/admin.sock", Net: "unix"}
	routes := 0
	for _, info := range caddy.GetModules("admin.api") {
		if !strings.HasPrefix(string(info.ID), "admin.api.molly_") {
			continue
		}
		router, ok := info.New().(caddy.AdminRouter)
		if !ok {
			continue
		}
		for _, route := range router.Routes() {
			routes++
			path := route.Pattern
			for _, over := range []net.Addr{tcp, unix} {
				methods := []string{http.MethodGet}
				if over == tcp {
					methods = append(methods, http.MethodPost, http.MethodDelete) // refused whatever the method
				}
				for _, method := range methods {
					r := httptest.NewRequest(method, "http://localhost"+path, strings.NewReader("{}"))
					r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, over))
					w := httptest.NewRecorder()
					if err := route.Handler.ServeHTTP(w, r); err != nil {
						t.Errorf("%s %s %s: the route returned %v to Caddy, which answers it as {\"error\": \"...\"}", info.ID, method, path, err)
					}
					// Every refusal is OpenAI's error object.
					forbidden := w.Code == http.StatusForbidden && gjson.Get(w.Body.String(), "error.code").Str == "permission_denied"
					if over == tcp && (!forbidden || !strings.Contains(gjson.Get(w.Body.String(), "error.message").Str, "Unix socket")) {
						t.Errorf("%s %s %s over TCP: %d %s, want 403", info.ID, method, path, w.Code, w.Body)
					}
					if over == unix && forbidden {
						t.Errorf("%s %s %s over the socket: 403 %s", info.ID, method, path, w.Body)
					}
					if w.Code >= 400 && (!gjson.Get(w.Body.String(), "error.message").Exists() || !gjson.Get(w.Body.String(), "error.type").Exists()) {
						t.Errorf("%s %s %s: %d %s is not OpenAI's error shape", info.ID, method, path, w.Code, w.Body)
					}
				}
			}
		}
	}
	if routes < 10 {
		t.Fatalf("only %d Molly admin routes are registered", routes)
	}
}
