package federation

import (
	"os"
	"testing"
)

// TestMain removes the shared fixture's folder after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if fix != nil {
		fix.ev.Close()
		os.RemoveAll(fix.dir)
	}
	os.Exit(code)
}
