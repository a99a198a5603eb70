package admin

import (
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/spf13/cobra"
)

// TestCallSaysTheRoutesMessage: a Molly command (molly keys, molly
// adapters …) that gets an admin route's error prints the status and the
// route's message, not the OpenAI error object's JSON.
func TestCallSaysTheRoutesMessage(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "a.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := Guard(caddy.AdminHandlerFunc(func(http.ResponseWriter, *http.Request) error {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New(`key "sk-molly-ab": registry: not found`)}
	}))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _ = g.ServeHTTP(w, r) })}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	cmd := &cobra.Command{Use: "keys"}
	Flags(cmd)
	if err := cmd.ParseFlags([]string{"--address", "unix/" + sock}); err != nil {
		t.Fatal(err)
	}
	err = Call(cmd, http.MethodDelete, "/molly/keys/sk-molly-ab", nil, nil)
	if want := `DELETE /molly/keys/sk-molly-ab: HTTP 404: key "sk-molly-ab": registry: not found`; err == nil || err.Error() != want {
		t.Fatalf("Call = %v\nwant %s", err, want)
	}
}
