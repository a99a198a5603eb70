package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/molly-gateway/molly/registry/sqlite"
)

// TestTwoMollysOnOneSQLiteFileKeepTheBudgetAcrossAKill: two Molly
// processes share one SQLite registry file; 8 clients split between them
// (whole and streamed requests) spend one member's budget, and process A
// is killed with SIGKILL once 40 answers are in, its usage journal left
// behind, while B goes on. A third process opened on the file replays A's
// journal (A dies with answered records not yet committed in about half
// the runs; the log says how many were replayed). The oracle is the file itself, read with the test's own SQL:
// the usage rows never sum past the budget, every answer a client got in
// full is there exactly once, no decision has two rows, the spend counters
// equal the sums of the rows, and the refusals are OpenAI's
// insufficient_quota.
func TestTwoMollysOnOneSQLiteFileKeepTheBudgetAcrossAKill(t *testing.T) {
	tr := startTiers(t)
	regPath := filepath.Join(t.TempDir(), "molly.db")
	adminA, adminB, adminC := adminSocket(t), adminSocket(t), adminSocket(t)
	ga := startMolly(t, authCaddyfile(tr, adminA, regPath, ""))
	gb := startMolly(t, authCaddyfile(tr, adminB, regPath, ""))
	const budget = 0.01 // an answer costs at most 0.0001 USD (5 + 5 tokens at 10 USD per 1M): about 100 answers
	if code, body := adminCall(t, adminA, http.MethodPost, "/molly/members", map[string]any{"name": "team", "budget_usd": budget}); code != http.StatusCreated {
		t.Fatalf("creating the member: %d %s", code, body)
	}
	key, _ := newKey(t, adminA, "team")

	var mu sync.Mutex
	var acked []string
	quota, down := 0, 0
	killA := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for i := range 8 {
		g := ga
		if i%2 == 1 {
			g = gb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := openai.NewClient(option.WithBaseURL(g.URL), option.WithAPIKey(key), option.WithMaxRetries(0), option.WithRequestTimeout(30*time.Second))
			for n := range 40 {
				p := chat(fmt.Sprintf("client %d request %d", i, n))
				p.MaxTokens = openai.Int(1)
				var resp *http.Response
				var err error
				if n%2 == 0 {
					_, err = c.Chat.Completions.New(context.Background(), p, option.WithResponseInto(&resp))
				} else {
					s := c.Chat.Completions.NewStreaming(context.Background(), p, option.WithResponseInto(&resp))
					for s.Next() {
					}
					err = s.Err()
				}
				mu.Lock()
				var apiErr *openai.Error
				switch {
				case err == nil:
					acked = append(acked, resp.Header.Get("X-Molly-Decision-Id"))
					if len(acked) == 40 {
						once.Do(func() { close(killA) })
					}
				case errors.As(err, &apiErr) && apiErr.StatusCode == http.StatusTooManyRequests && apiErr.Code == "insufficient_quota":
					quota++
				case g == ga:
					down++ // A is gone
				default:
					t.Errorf("client %d through B: %v", i, err)
				}
				mu.Unlock()
			}
		}()
	}
	<-killA
	if err := ga.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = ga.cmd.Wait()
	wg.Wait()
	db, err := sqlite.Open(regPath, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var before int
	if err := db.QueryRow(`SELECT COUNT(*) FROM usage`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	startMolly(t, authCaddyfile(tr, adminC, regPath, "")) // its Open replays A's journal
	var spent int64
	rowsOf := map[string]int{}
	rows, err := db.Query(`SELECT decision_id, cost_nusd FROM usage WHERE member = 'team'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d string
		var c int64
		if err := rows.Scan(&d, &c); err != nil {
			t.Fatal(err)
		}
		rowsOf[d]++
		spent += c
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	var counter int64
	if err := db.QueryRow(`SELECT COALESCE(SUM(spent_nusd), 0) FROM spend WHERE member = 'team'`).Scan(&counter); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d answered, %d refused for quota, %d failed with A down: %d of %d nano-USD spent in %d records (%d of them replayed from A's journal)",
		len(acked), quota, down, spent, int64(budget*1e9), len(rowsOf), len(rowsOf)-before)
	if spent > int64(budget*1e9) {
		t.Errorf("the two gateways spent %d nano-USD of a %d budget", spent, int64(budget*1e9))
	}
	if counter != spent {
		t.Errorf("the spend counter says %d nano-USD, the usage rows %d", counter, spent)
	}
	for d, n := range rowsOf {
		if n != 1 {
			t.Errorf("decision %s has %d usage rows", d, n)
		}
	}
	missing := 0
	for _, d := range acked {
		if rowsOf[d] == 0 {
			missing++
		}
	}
	if missing != 0 {
		t.Errorf("%d of %d answers clients got are not in the ledger", missing, len(acked))
	}
	if quota == 0 {
		t.Error("no request was refused for quota: the budget did not bind")
	}
}
