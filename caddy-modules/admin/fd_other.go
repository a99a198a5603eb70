//go:build !unix

package admin

// checkInherited cannot inspect an inherited descriptor here; see
// fd_unix.go.
func checkInherited(listen, host string) error { return nil }
