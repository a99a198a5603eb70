//go:build unix

package admin

import (
	"fmt"
	"strconv"
	"syscall"
)

// checkInherited refuses an inherited admin listener (socket activation,
// fd/<n>) that is a network socket: a TCP listener handed to the gateway
// is as open as one it bound itself. A descriptor that is not open in
// this process (molly validate, run apart from the service manager) cannot
// be told apart and passes; the gateway's own load checks it again.
func checkInherited(listen, host string) error {
	fd, err := strconv.Atoi(host)
	if err != nil {
		return nil // not a descriptor number: Caddy refuses it when it listens
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		return nil
	}
	switch sa.(type) {
	case *syscall.SockaddrUnix:
		return nil
	case *syscall.SockaddrInet4, *syscall.SockaddrInet6:
		return fmt.Errorf("admin: listen %q is an inherited TCP socket, which any local user (or anyone on its network) can reach to mint keys, raise budgets "+
			"and stop the gateway; hand it a Unix socket instead (mode 0600), or use Caddy's remote admin (mutual TLS): %w", listen, ErrPlaintextAdmin)
	}
	return fmt.Errorf("admin: listen %q is an inherited socket of an unknown family, refused: %w", listen, ErrPlaintextAdmin)
}
