package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

func TestValidateRefusesAdminEndpointsOtherUsersCanReach(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    *caddy.AdminConfig
		refuse bool
	}{
		{"no admin block: Molly's socket", nil, false},
		{"an empty listen address: Molly's socket", &caddy.AdminConfig{}, false},
		{"a socket of the owner", &caddy.AdminConfig{Listen: "unix//run/molly/admin.sock|0600"}, false},
		{"a socket of the owner and group", &caddy.AdminConfig{Listen: "unix//run/molly/admin.sock|0660"}, false},
		{"a socket with Caddy's default mode", &caddy.AdminConfig{Listen: "unix//run/molly/admin.sock"}, false},
		{"socket activation", &caddy.AdminConfig{Listen: "fd/3"}, false},
		{"a disabled endpoint", &caddy.AdminConfig{Disabled: true, Listen: "localhost:2019"}, false},
		{"Caddy's default localhost:2019", &caddy.AdminConfig{Listen: "localhost:2019"}, true},
		{"a loopback address", &caddy.AdminConfig{Listen: "127.0.0.1:2019"}, true},
		{"every interface", &caddy.AdminConfig{Listen: ":2019"}, true},
		{"tcp6", &caddy.AdminConfig{Listen: "tcp6/[::1]:2019"}, true},
		{"a socket every user may write", &caddy.AdminConfig{Listen: "unix//tmp/admin.sock|0666"}, true},
		{"a socket others may write", &caddy.AdminConfig{Listen: "unix//tmp/admin.sock|0602"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.cfg)
			if tc.refuse != errors.Is(err, ErrPlaintextAdmin) {
				t.Fatalf("Validate = %v, want refused %v", err, tc.refuse)
			}
			if tc.refuse && !strings.Contains(err.Error(), "remote admin") && !strings.Contains(err.Error(), "|0600") {
				t.Fatalf("the refusal does not say what to do: %v", err)
			}
		})
	}
}

func TestMollysDefaultIsASocketOfTheOwner(t *testing.T) {
	if caddy.DefaultAdminListen != DefaultListen() {
		t.Fatalf("caddy.DefaultAdminListen = %q, want %q (CADDY_ADMIN unset)", caddy.DefaultAdminListen, DefaultListen())
	}
	if want := "unix/" + filepath.Join(caddy.AppDataDir(), "molly", "admin.sock") + "|0600"; DefaultListen() != want {
		t.Fatalf("DefaultListen = %q, want %q", DefaultListen(), want)
	}
}

// TestFromContextReadsTheConfigsAdminBlock: the reflection on Caddy's
// context finds the admin block of the config it belongs to (a Caddy
// upgrade that changes the shape fails here, and FromContext fails
// closed).
func TestFromContextReadsTheConfigsAdminBlock(t *testing.T) {
	for _, listen := range []string{"localhost:2019", "unix//run/x.sock|0600"} {
		ctx, err := caddy.ProvisionContext(&caddy.Config{Admin: &caddy.AdminConfig{Listen: listen}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := FromContext(ctx)
		if err != nil || got == nil || got.Listen != listen {
			t.Fatalf("FromContext = %+v, %v; want listen %q", got, err, listen)
		}
		err = CheckContext(ctx)
		if refused := errors.Is(err, ErrPlaintextAdmin); refused != (listen == "localhost:2019") {
			t.Fatalf("CheckContext(%s) = %v", listen, err)
		}
	}
	ctx, err := caddy.ProvisionContext(&caddy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := FromContext(ctx); err != nil || got != nil {
		t.Fatalf("no admin block: %+v, %v", got, err)
	}
}

// TestGuardAnswersOnlyOnTheSocket: the same handler behind Guard answers
// over a Unix socket and refuses plaintext TCP.
func TestGuardAnswersOnlyOnTheSocket(t *testing.T) {
	h := Guard(caddy.AdminHandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		_, err := io.WriteString(w, "secret")
		return err
	}))
	serve := func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, r); err != nil {
			t.Errorf("Guard returned %v to Caddy: it answers errors itself", err)
		}
	}
	tcp := httptest.NewServer(http.HandlerFunc(serve))
	t.Cleanup(tcp.Close)
	resp, err := http.Get(tcp.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || strings.Contains(string(b), "secret") {
		t.Fatalf("over TCP: %d %s", resp.StatusCode, b)
	}

	sock := filepath.Join(t.TempDir(), "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	us := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(serve)}}
	us.Start()
	t.Cleanup(us.Close)
	c := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	resp, err = c.Get("http://admin/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "secret" {
		t.Fatalf("over the socket: %d %s", resp.StatusCode, b)
	}
}

// TestGuardAnswersErrorsInOpenAIShape: an error a Molly admin route
// returns reaches the client over the socket as OpenAI's error object with
// the route's status — not Caddy's {"error": "..."} — a 405 with Allow, a
// body over a MaxBytesReader's limit as 413, and an error after the route
// began its answer leaves that answer alone.
func TestGuardAnswersErrorsInOpenAIShape(t *testing.T) {
	routes := map[string]caddy.AdminHandlerFunc{
		"/missing": func(http.ResponseWriter, *http.Request) error {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New(`no key "sk-molly-ab"`)}
		},
		"/bad": func(http.ResponseWriter, *http.Request) error {
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: errors.New("name is required")}
		},
		"/method": func(_ http.ResponseWriter, r *http.Request) error {
			return MethodNotAllowed(r, http.MethodGet, http.MethodPost)
		},
		"/large": func(w http.ResponseWriter, r *http.Request) error {
			_, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 8))
			return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf("decoding body: %w", err)}
		},
		"/plain": func(http.ResponseWriter, *http.Request) error { return errors.New("registry: disk full") },
		"/begun": func(w http.ResponseWriter, _ *http.Request) error {
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "[1,")
			return errors.New("encoding failed half-way")
		},
	}
	mux := http.NewServeMux()
	for p, h := range routes {
		g := Guard(h)
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			if err := g.ServeHTTP(w, r); err != nil {
				t.Errorf("%s: Guard returned %v to Caddy, which would answer it in its own shape", p, err)
			}
		})
	}
	sock := filepath.Join(t.TempDir(), "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	us := &httptest.Server{Listener: ln, Config: &http.Server{Handler: mux}}
	us.Start()
	t.Cleanup(us.Close)
	c := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	for _, tc := range []struct {
		path, method, body string
		status             int
		want, allow        string
	}{
		{"/missing", "GET", "", 404, `{"error":{"code":"not_found","message":"no key \"sk-molly-ab\"","param":null,"type":"invalid_request_error"}}`, ""},
		{"/bad", "POST", "{}", 400, `{"error":{"code":null,"message":"name is required","param":null,"type":"invalid_request_error"}}`, ""},
		{"/method", "DELETE", "", 405, `{"error":{"code":"method_not_supported","message":"DELETE is not supported on /method; use GET, POST","param":null,"type":"invalid_request_error"}}`, "GET, POST"},
		{"/large", "POST", "0123456789", 413, `{"error":{"code":"request_too_large","message":"the body is over the route's limit of 8 bytes","param":null,"type":"invalid_request_error"}}`, ""},
		{"/plain", "GET", "", 500, `{"error":{"code":null,"message":"registry: disk full","param":null,"type":"server_error"}}`, ""},
		{"/begun", "GET", "", 200, `[1,`, ""},
	} {
		resp, b := adminDo(t, c, tc.method, tc.path, tc.body)
		if resp.StatusCode != tc.status || string(b) != tc.want || resp.Header.Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d %s (Allow %q)\nwant %d %s (Allow %q)", tc.method, tc.path, resp.StatusCode, b, resp.Header.Get("Allow"), tc.status, tc.want, tc.allow)
		}
		if tc.status >= 400 && resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: Content-Type %q", tc.path, resp.Header.Get("Content-Type"))
		}
	}
}

// TestUnknownMollyAdminPathsAreOpenAI404s: with a real Caddy config loaded
// in-process on an admin socket, a path under /molly/ (or /molly itself)
// that no route serves is a 404 in OpenAI's error shape
// ({"error":{"message","type","param","code"}}, code not_found as Error
// gives every admin 404), not the plain-text 404 of Caddy's admin mux;
// Caddy's own routes and its 404 outside /molly/ are unchanged. Over
// plaintext TCP the fallback is refused 403 before it answers, as every
// Molly route is (Guard).
func TestUnknownMollyAdminPathsAreOpenAI404s(t *testing.T) {
	dir, err := os.MkdirTemp("", "ma") // socket paths are limited to about 104 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "admin.sock")
	if err := caddy.Load([]byte(`{"admin":{"listen":"unix/`+sock+`|0600"}}`), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	c := &http.Client{Transport: &http.Transport{Dial: func(_, _ string) (net.Conn, error) { return net.Dial("unix", sock) }}}
	for _, tc := range []struct {
		method, path string
		status       int
		want, ctype  string
	}{
		{"GET", "/molly/nope", 404, `{"error":{"code":"not_found","message":"no route GET /molly/nope","param":null,"type":"invalid_request_error"}}`, "application/json"},
		{"POST", "/molly/a/b", 404, `{"error":{"code":"not_found","message":"no route POST /molly/a/b","param":null,"type":"invalid_request_error"}}`, "application/json"},
		{"DELETE", "/molly/", 404, `{"error":{"code":"not_found","message":"no route DELETE /molly/","param":null,"type":"invalid_request_error"}}`, "application/json"},
		{"GET", "/molly", 404, `{"error":{"code":"not_found","message":"no route GET /molly","param":null,"type":"invalid_request_error"}}`, "application/json"},
		// Caddy's: its config, and its 404 outside Molly's paths.
		{"GET", "/config/", 200, "{\"admin\":{\"listen\":\"unix/" + sock + "|0600\"}}\n", "application/json"},
		{"GET", "/nope", 404, "404 page not found\n", "text/plain; charset=utf-8"},
	} {
		resp, b := adminDo(t, c, tc.method, tc.path, "")
		if resp.StatusCode != tc.status || string(b) != tc.want || resp.Header.Get("Content-Type") != tc.ctype {
			t.Errorf("%s %s: %d %q (%s)\nwant %d %q (%s)", tc.method, tc.path, resp.StatusCode, b, resp.Header.Get("Content-Type"), tc.status, tc.want, tc.ctype)
		}
	}

	routes := Check{}.Routes()
	if len(routes) == 0 {
		t.Fatal("Check has no fallback route")
	}
	tcp := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2019}
	for _, route := range routes {
		r := httptest.NewRequest(http.MethodGet, "http://localhost"+route.Pattern+"nope", nil)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, tcp))
		w := httptest.NewRecorder()
		if err := route.Handler.ServeHTTP(w, r); err != nil || w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), `"code":"permission_denied"`) {
			t.Errorf("%s over TCP: %v %d %s, want 403 permission_denied", route.Pattern, err, w.Code, w.Body)
		}
	}
}

// adminDo sends method path (with body) to the admin endpoint c reaches
// and returns the response, its body read and closed.
func adminDo(t *testing.T, c *http.Client, method, path, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://admin"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b
}
