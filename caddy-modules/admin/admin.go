// Package admin keeps Caddy's admin endpoint out of reach of other local
// users: Molly's default admin address is a Unix socket (mode 0600, in a
// 0700 folder) instead of Caddy's localhost:2019; a config whose admin
// endpoint listens on TCP in plaintext is refused when it loads (only
// Caddy's remote admin, authenticated by mutual TLS with per-identity
// path and method permissions, may listen on a network); and Molly's own
// admin routes (keys, budgets, usage, tools, adapters, targets) answer
// only on the socket or the remote endpoint (Guard).
//
// Caddy's local admin endpoint has no authentication of its own: whoever
// can connect may read the config and pprof data, POST /stop and /load —
// so on TCP any local user could. A Unix socket is guarded by the
// operating system's file permissions. See the README's "Running it
// safely".
package admin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// SocketMode is the mode of Molly's default admin socket: owner only.
const SocketMode = 0o600

// ErrPlaintextAdmin is the refusal of an admin endpoint that other local
// users could reach (plaintext TCP, or a socket others may write to).
var ErrPlaintextAdmin = errors.New("the admin endpoint would be reachable without authentication")

// DefaultSocket is the path of Molly's default admin socket:
// <Caddy's data directory>/molly/admin.sock (the registry's folder).
func DefaultSocket() string {
	return filepath.Join(caddy.AppDataDir(), "molly", "admin.sock")
}

// DefaultListen is Molly's default admin address, "unix/<DefaultSocket>|0600".
func DefaultListen() string {
	return "unix/" + DefaultSocket() + "|0" + strconv.FormatUint(SocketMode, 8)
}

func init() {
	caddy.RegisterModule(Check{})
	// Caddy's default is localhost:2019, which every local user can reach.
	// CADDY_ADMIN, Caddy's own override, still wins (and is checked).
	if _, set := os.LookupEnv("CADDY_ADMIN"); !set {
		caddy.DefaultAdminListen = DefaultListen()
	}
}

// Validate refuses admin configs other local users could abuse: a local
// admin endpoint on TCP (plaintext, unauthenticated by Caddy's design) or
// on a Unix socket whose mode lets others connect. Unix sockets with the
// owner's (and group's) permissions, socket activation (fd/) of a Unix
// socket (an inherited TCP socket is refused, checkInherited), a disabled
// endpoint and Caddy's remote admin (mutual TLS, access_control with
// per-identity paths and methods) are accepted. A nil or empty listen
// address is caddy.DefaultAdminListen. Errors wrap ErrPlaintextAdmin and
// say what to do instead.
func Validate(a *caddy.AdminConfig) error {
	if a != nil && a.Disabled {
		return nil
	}
	listen := ""
	if a != nil {
		listen = a.Listen
	}
	if listen == "" {
		listen = caddy.DefaultAdminListen
	}
	expanded, err := caddy.NewReplacer().ReplaceOrErr(listen, true, true)
	if err != nil {
		return fmt.Errorf("admin: listen %q: %w", listen, err)
	}
	addr, err := caddy.ParseNetworkAddress(expanded)
	if err != nil {
		return fmt.Errorf("admin: listen %q: %w", listen, err)
	}
	switch {
	case addr.IsUnixNetwork():
		path, bits, hasMode := strings.Cut(addr.Host, "|")
		if !hasMode {
			return nil // Caddy's default socket mode is 0200
		}
		mode, err := strconv.ParseUint(bits, 8, 32)
		if err != nil {
			return fmt.Errorf("admin: listen %q: socket mode %q is not octal", listen, bits)
		}
		if mode&0o007 != 0 {
			return fmt.Errorf("admin: the socket %s would have mode %04o, so every local user could mint keys, raise budgets and stop the gateway: "+
				"use |0600 (or |0660 for a group): %w", path, mode, ErrPlaintextAdmin)
		}
		return nil
	case addr.IsFdNetwork():
		return checkInherited(listen, addr.Host)
	}
	return fmt.Errorf("admin: listen %q is plaintext %s, which any local user can reach to mint keys, raise budgets, read invoices and pprof data "+
		"and stop the gateway; use a Unix socket (Molly's default when the admin block names no address: %s) and, to manage Molly over a network, "+
		"Caddy's remote admin (admin.remote with access_control: mutual TLS, permissions per identity): %w",
		listen, addr.Network, DefaultListen(), ErrPlaintextAdmin)
}

// FromContext returns the admin block of the config ctx was made for.
// Caddy gives modules no accessor for it, so it is read by reflection
// from the context's config (fields Admin, Listen, Disabled, Remote…),
// copied into a fresh value; when that shape is not found (another Caddy
// version) the error says so and the caller refuses the config (fail
// closed). Only the fields Validate reads are copied.
func FromContext(ctx caddy.Context) (*caddy.AdminConfig, error) {
	v := reflect.ValueOf(ctx)
	cfg := v.FieldByName("cfg")
	if !cfg.IsValid() || cfg.Kind() != reflect.Pointer {
		return nil, errors.New("admin: this Caddy version's context has no config to check the admin endpoint against")
	}
	if cfg.IsNil() {
		return nil, nil
	}
	adm := cfg.Elem().FieldByName("Admin")
	if !adm.IsValid() || adm.Kind() != reflect.Pointer {
		return nil, errors.New("admin: this Caddy version's config has no admin field to check")
	}
	if adm.IsNil() {
		return nil, nil
	}
	e := adm.Elem()
	listen, disabled := e.FieldByName("Listen"), e.FieldByName("Disabled")
	if listen.Kind() != reflect.String || disabled.Kind() != reflect.Bool {
		return nil, errors.New("admin: this Caddy version's admin config has no listen address to check")
	}
	return &caddy.AdminConfig{Listen: listen.String(), Disabled: disabled.Bool()}, nil
}

// Check is the admin API module admin.api.molly_admin_check. Caddy
// provisions every admin API module before it binds an admin listener, and
// Check's Provision refuses the config (so nothing is bound, and the load
// fails) when Validate refuses its admin block. That covers `molly run`,
// `reload`, `--watch`, `--resume` and POST /load alike. It also creates
// the folder of Molly's default socket (mode 0700). Its one route is the
// fallback of Molly's admin paths (Routes).
type Check struct{}

// CaddyModule returns the Caddy module information.
func (Check) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.molly_admin_check", New: func() caddy.Module { return new(Check) }}
}

// Provision validates the admin block of the config being loaded.
func (Check) Provision(ctx caddy.Context) error {
	return CheckContext(ctx)
}

// CheckContext validates the admin block of ctx's config (FromContext,
// Validate) and, when the endpoint is Molly's default socket, makes its
// folder with mode 0700 (tightening an existing one).
func CheckContext(ctx caddy.Context) error {
	a, err := FromContext(ctx)
	if err != nil {
		return err
	}
	if err := Validate(a); err != nil {
		return err
	}
	if (a == nil || a.Listen == "") && caddy.DefaultAdminListen == DefaultListen() {
		dir := filepath.Dir(DefaultSocket())
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("admin: the socket's folder: %w", err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("admin: the socket's folder: %w", err)
		}
	}
	return nil
}

// Routes returns the fallback of Molly's admin paths: /molly and any path
// under /molly/ that no module's route serves is, behind Guard (so 403
// permission_denied first off the socket and the remote endpoint, as on
// every Molly route), a 404 not_found in OpenAI's error shape naming the
// method and path, instead of the plain-text 404 of Caddy's admin mux.
// Longer patterns (/molly/keys, /molly/keys/ …) win over it.
func (Check) Routes() []caddy.AdminRoute {
	unknown := Guard(caddy.AdminHandlerFunc(func(_ http.ResponseWriter, r *http.Request) error { return NotRouted(r, nil) }))
	return []caddy.AdminRoute{{Pattern: "/molly", Handler: unknown}, {Pattern: "/molly/", Handler: unknown}}
}

// Guard wraps one of Molly's admin handlers: it answers only requests that
// came over a Unix socket (the OS checked the caller) or over Caddy's
// remote admin endpoint (a verified client certificate, whose access
// control Caddy enforced). Anything else — a plaintext TCP admin listener
// that got past Validate somehow — is 403. An error h returns is answered
// here in OpenAI's error shape (Error), not Caddy's {"error": "..."}, and
// logged as Caddy logs it; Guard then returns nil.
func Guard(h caddy.AdminHandler) caddy.AdminHandler {
	return caddy.AdminHandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		tw := &trackingWriter{ResponseWriter: w}
		var err error
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la.Network() == "unix" {
			err = h.ServeHTTP(tw, r)
		} else if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
			err = h.ServeHTTP(tw, r)
		} else {
			err = caddy.APIError{HTTPStatus: http.StatusForbidden,
				Err: errors.New("Molly's admin routes answer only on the admin Unix socket or on the remote admin endpoint (mutual TLS)")}
		}
		if err != nil {
			writeError(tw, err)
		}
		return nil
	})
}

// Interface guards.
var (
	_ caddy.Provisioner = (*Check)(nil)
	_ caddy.AdminRouter = Check{}
)
