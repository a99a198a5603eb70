package admin

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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
			var ae caddy.APIError
			if errors.As(err, &ae) {
				http.Error(w, ae.Err.Error(), ae.HTTPStatus)
			}
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
