package registry

import (
	"os"
	"testing"

	"github.com/molly-gateway/molly/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(journalChildEnv) != "" {
		journalChild() // a process of TestJournaledRecordsSurviveKill9; never returns
	}
	if os.Getenv(mappedChildEnv) != "" {
		mappedChild() // a process of TestAJournalKilledMidSegmentReplaysEveryRecordOnce; never returns
	}
	code := m.Run()
	pgtest.Stop() // the PostgreSQL cluster of TestPostgres, if it started one
	os.Exit(code)
}
