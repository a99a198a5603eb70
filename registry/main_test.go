package registry

import (
	"os"
	"testing"

	"github.com/molly-gateway/molly/internal/pgtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.Stop() // the PostgreSQL cluster of TestPostgres, if it started one
	os.Exit(code)
}
