package registry

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/molly-gateway/molly/registry/sqlite"
)

// journalChildEnv names the registry file a child process of
// TestJournaledRecordsSurviveKill9 journals into.
const journalChildEnv = "MOLLY_REGISTRY_JOURNAL_CHILD"

// journalUsage is the i-th record of the kill test: decision k-<i>, except
// that records 100.. repeat decision k-99 for their first one (a
// decision's second record, numbered at its commit), with costs and
// tokens the test sums on its own.
func journalUsage(i int) Usage {
	d := "k-" + strconv.Itoa(i)
	if i == 100 {
		d = "k-99"
	}
	return Usage{Member: "alice", DecisionID: d, Model: "m", Target: "t", Tier: "T1",
		PromptTokens: 10 + i, CompletionTokens: i % 7, CostUSD: float64(1+i) * 1e-6, Time: time.Now()}
}

// journalChild opens the registry named by journalChildEnv and, for each
// line "<from> <to>" read on stdin, journals records from..to-1 and
// answers "ok <applied>" once appended; "sync" waits until the journal is
// committed and answers "synced". It never closes the registry: the test
// kills it.
func journalChild() {
	r, err := Open(os.Getenv(journalChildEnv), Options{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(2)
	}
	ctx := context.Background()
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := sc.Text()
		if line == "sync" {
			if err := r.syncJournal(ctx); err != nil {
				fmt.Println("error", err)
				os.Exit(2)
			}
			fmt.Println("synced")
			continue
		}
		var from, to int
		if _, err := fmt.Sscanf(line, "%d %d", &from, &to); err != nil {
			fmt.Println("error", err)
			os.Exit(2)
		}
		for i := from; i < to; i++ {
			if err := r.Journal(ctx, journalUsage(i)); err != nil {
				fmt.Println("error", err)
				os.Exit(2)
			}
		}
		fmt.Println("ok", r.JournalStats().Applied)
	}
	select {}
}

// TestJournaledRecordsSurviveKill9 kills (SIGKILL) a process holding
// journaled records the ledger has not committed — its commits are held
// off by this test's write lock on the file — and checks that the next
// handle opened on the file commits every one of them exactly once: the
// 100 committed before the lock are not committed again, the 51 journaled
// under it are, a torn frame at the end is dropped, and the journal's
// files are gone. The oracle is the test's own sums of journalUsage.
func TestJournaledRecordsSurviveKill9(t *testing.T) {
	path := filepath.Join(t.TempDir(), "molly.db")
	ctx := context.Background()
	setup, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := setup.PutMember(ctx, Member{Name: "alice"}); err != nil {
		t.Fatal(err)
	}
	setup.Close()

	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), journalChildEnv+"="+path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := bufio.NewScanner(stdout)
	say := func(line string) string {
		t.Helper()
		if _, err := io.WriteString(stdin, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if !out.Scan() {
			t.Fatalf("the child ended: %v", out.Err())
		}
		if s := out.Text(); !strings.HasPrefix(s, "ok") && s != "synced" {
			t.Fatalf("child: %s", s)
		}
		return out.Text()
	}
	say("0 100")
	say("sync")

	// Hold the file's write lock: the child's commits wait (and fail after
	// the busy timeout, and retry) while it journals 51 more.
	db, err := sqlite.Open(path, sqlite.Options{}, migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	if got := say("100 151"); got != "ok 100" {
		t.Fatalf("child: %q, want 100 committed before the lock", got)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	conn.Close()

	// A torn frame after the last whole one: a write the crash cut short.
	segs, _ := filepath.Glob(filepath.Join(JournalDir(path), "*.log"))
	if len(segs) != 1 {
		t.Fatalf("journal segments %v, want one", segs)
	}
	whole := encodeEntry(nil, entry{kind: entryRecord, u: journalUsage(999)})
	f, err := os.OpenFile(segs[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(whole[:len(whole)-3])
	f.Close()

	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got := map[string]Usage{}
	for after := int64(0); ; {
		page, last, err := r.UsageRecords(ctx, after, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, u := range page {
			if _, dup := got[u.RecordID]; dup {
				t.Fatalf("record %s committed twice", u.RecordID)
			}
			got[u.RecordID] = u
		}
		after = last
	}
	var wantIDs []string
	var wantNUSD, wantPrompt int64
	for i := range 151 {
		u := journalUsage(i)
		id := u.DecisionID
		if i == 100 {
			id = "k-99:2"
		}
		wantIDs = append(wantIDs, id)
		wantNUSD += int64(math.Round(u.CostUSD * 1e9))
		wantPrompt += int64(u.PromptTokens)
		if g, ok := got[id]; !ok || g.PromptTokens != u.PromptTokens || g.CompletionTokens != u.CompletionTokens {
			t.Errorf("record %s: %+v, want the tokens of %+v", id, g, u)
		}
	}
	gotIDs := make([]string, 0, len(got))
	for id := range got {
		gotIDs = append(gotIDs, id)
	}
	slices.Sort(gotIDs)
	slices.Sort(wantIDs)
	if !slices.Equal(gotIDs, wantIDs) {
		t.Fatalf("records %d, want %d (%v)", len(gotIDs), len(wantIDs), gotIDs)
	}
	var spent, prompt, records int64
	if err := r.db.QueryRow(`SELECT spent_nusd, prompt_tokens, records FROM spend WHERE member = 'alice'`).Scan(&spent, &prompt, &records); err != nil {
		t.Fatal(err)
	}
	if spent != wantNUSD || prompt != wantPrompt || records != 151 {
		t.Fatalf("spend %d nano-USD, %d prompt tokens, %d records; want %d, %d, 151", spent, prompt, records, wantNUSD, wantPrompt)
	}
	left, _ := os.ReadDir(JournalDir(path))
	var rows int
	if err := r.db.QueryRow(`SELECT COUNT(*) FROM usage_journals`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 || rows != 0 {
		t.Fatalf("after the replay: files %v, %d usage_journals rows; want none", left, rows)
	}
}

// TestJournalReadsItsOwnWrites: what a handle journals is in its reads at
// once (usage, spend, the outbox), a reservation released through the
// journal holds until the record that settles it is committed and is gone
// after, and Close commits the rest and removes the journal's files.
func TestJournalReadsItsOwnWrites(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "molly.db")
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := put(t, r, Member{Name: "bob", BudgetUSD: 1})
	if err := r.RegisterSink(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	res, err := r.Reserve(ctx, m, 100, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		u := Usage{Member: "bob", DecisionID: "d", Model: "m", Target: "t", Tier: "T3", PromptTokens: 3, CompletionTokens: 2,
			CostUSD: 0.01, Time: time.Now(), Reservation: res.ID}
		if err := r.Journal(ctx, u); err != nil {
			t.Fatal(i, err)
		}
	}
	if err := res.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := r.Summarize(ctx, "bob", 100)
	if err != nil {
		t.Fatal(err)
	}
	if s.Requests != 20 || s.PromptTokens != 60 || math.Abs(s.SpentUSD-0.2) > 1e-12 {
		t.Fatalf("summary %+v, want 20 records, 60 prompt tokens, 0.2 USD", s)
	}
	if usdHeld, tokens, err := r.Held(ctx, "bob"); err != nil || usdHeld != 0 || tokens != 0 {
		t.Fatalf("held %v USD, %d tokens, %v after the release; want none", usdHeld, tokens, err)
	}
	ob, err := r.Outbox(ctx, "billing")
	if err != nil || ob.Pending != 20 {
		t.Fatalf("outbox %+v, %v; want 20 pending", ob, err)
	}
	ids := map[string]bool{}
	for _, u := range s.Recent {
		ids[u.RecordID] = true
	}
	if !ids["d"] || !ids["d:20"] || len(ids) != 20 {
		t.Fatalf("record ids %v, want d, d:2 … d:20", ids)
	}
	if err := r.Journal(ctx, Usage{Member: "bob", DecisionID: "e", PromptTokens: 1, CostUSD: 0.001}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(JournalDir(path)); len(left) != 0 {
		t.Fatalf("files left after Close: %v", left)
	}
	db, err := sqlite.Open(path, sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM usage WHERE member = 'bob'`).Scan(&n); err != nil && err != sql.ErrNoRows {
		t.Fatal(err)
	}
	if n != 21 {
		t.Fatalf("%d records after Close, want 21", n)
	}
	if err := r.Journal(ctx, Usage{Member: "bob", PromptTokens: 1}); err == nil {
		t.Fatal("Journal on a closed registry succeeded")
	}
}

// TestJournalFramesRoundTrip: every field of a record, and a release,
// comes back from its frame; a frame with any byte changed fails its
// checksum or its decoding, never decoding to a different entry silently.
func TestJournalFramesRoundTrip(t *testing.T) {
	in := []entry{
		{kind: entryRecord, u: Usage{Member: "m ü\x00", DecisionID: "d:1", Model: "gpt-x", Target: "lan", Tier: "T1",
			PromptTokens: 1 << 30, CompletionTokens: 7, Estimated: true, CostUSD: 0.1 + 0.2, Time: time.Unix(0, 1767225600123456789),
			Reservation: 42}},
		{kind: entryRelease, res: 1 << 40},
	}
	var buf []byte
	for _, e := range in {
		buf = encodeEntry(buf, e)
	}
	off := 0
	for i, want := range in {
		got, n, err := decodeFrame(buf[off:])
		if err != nil {
			t.Fatal(i, err)
		}
		off += n
		if n != len(encodeEntry(nil, want)) || got.kind != want.kind || got.res != want.res || got.u != want.u {
			t.Fatalf("entry %d (%d bytes): %+v, want %+v", i, n, got, want)
		}
	}
	if _, _, err := decodeFrame(buf[off:]); err != errShort {
		t.Fatalf("after the last frame: %v, want errShort", err)
	}
	one := encodeEntry(nil, in[0])
	for i := range one {
		bad := slices.Clone(one)
		bad[i] ^= 0x20
		got, _, err := decodeFrame(bad)
		if err == nil { // CRC-32C detects every 1-bit error
			t.Fatalf("byte %d changed: decoded %+v without an error", i, got)
		}
	}
}

// deadJournal writes, in dir, the journal of a handle that died: an
// unlocked lock file and one segment holding frames.
func deadJournal(t *testing.T, path, owner string, frames ...[]byte) string {
	t.Helper()
	dir := JournalDir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, owner+".lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	seg := filepath.Join(dir, owner+".0.log")
	var data []byte
	for _, f := range frames {
		data = append(data, f...)
	}
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return seg
}

// TestReplayKeepsTheUsagesTimeAndSkipsDamage: a dead journal replayed two
// days later books its records at the time they happened (the period and
// minute they belong to), not at the replay; a frame damaged in the middle
// is skipped and the whole frames after it are still committed, the
// segment kept as <name>.corrupt; a release naming a reservation of
// another handle (its id reused) leaves that reservation alone.
func TestReplayKeepsTheUsagesTimeAndSkipsDamage(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "molly.db")
	c := &clock{t: t0}
	live := open(t, path, c)
	m := put(t, live, Member{Name: "dana", BudgetUSD: 10, Period: PeriodDay, TPM: 1 << 20})
	other, err := live.Reserve(ctx, m, 100, 1)
	if err != nil {
		t.Fatal(err)
	}
	happened := t0.Add(-48 * time.Hour)
	var frames [][]byte
	for i := range 10 {
		frames = append(frames, encodeEntry(nil, entry{kind: entryRecord, u: Usage{Member: "dana", DecisionID: fmt.Sprintf("r%d", i),
			Model: "m", Target: "t", Tier: "T3", PromptTokens: 10, CompletionTokens: 1, CostUSD: 0.001, Time: happened}}))
	}
	frames[3][12] ^= 0x40 // a bit flipped inside the 4th frame's payload
	frames = append(frames, encodeEntry(nil, entry{kind: entryRelease, res: other.ID}))
	seg := deadJournal(t, path, "deadbeef", frames...)

	r, err := Open(path, Options{Now: c.now}) // replays the dead journal
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	list, _, err := r.UsageRecords(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 9 {
		t.Fatalf("%d records replayed, want the 9 whole ones", len(list))
	}
	for _, u := range list {
		if u.RecordID == "r3" || !u.Time.Equal(happened) {
			t.Fatalf("replayed %s at %v, want the 9 undamaged records at %v", u.RecordID, u.Time, happened)
		}
	}
	var then, today int64
	dayStart := func(tm time.Time) int64 { s, _ := m.PeriodAt(tm); return ms(s) }
	_ = r.db.QueryRow(`SELECT COALESCE(SUM(spent_nusd), 0) FROM spend WHERE member = 'dana' AND period_start = ?`, dayStart(happened)).Scan(&then)
	_ = r.db.QueryRow(`SELECT COALESCE(SUM(spent_nusd), 0) FROM spend WHERE member = 'dana' AND period_start = ?`, dayStart(t0)).Scan(&today)
	if then != 9*NanoUSD(0.001) || today != 0 {
		t.Fatalf("spend %d nano-USD in the period it happened, %d today; want %d and 0", then, today, 9*NanoUSD(0.001))
	}
	if usdHeld, _, err := r.Held(ctx, "dana"); err != nil || usdHeld != 1 {
		t.Fatalf("the live handle's reservation holds %v USD (%v) after a dead journal released its id; want 1", usdHeld, err)
	}
	if _, err := os.Stat(seg + ".corrupt"); err != nil {
		t.Fatalf("the damaged segment is not kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(JournalDir(path), "deadbeef.lock")); !os.IsNotExist(err) {
		t.Fatalf("the dead journal's lock is still there: %v", err)
	}
}

// TestAJournalThatCannotBeReadFailsOpen: a dead journal whose lock cannot
// be opened (here a symbolic link loop) makes Open fail naming it, instead
// of starting without its records.
func TestAJournalThatCannotBeReadFailsOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "molly.db")
	setup, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	setup.Close()
	dir := JournalDir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lock := filepath.Join(dir, "feedface.lock")
	if err := os.Symlink(lock, lock); err != nil {
		t.Fatal(err)
	}
	r, err := Open(path, Options{})
	if err == nil {
		r.Close()
		t.Fatal("Open succeeded with a dead journal it cannot read")
	}
	if !strings.Contains(err.Error(), lock) || !strings.Contains(err.Error(), "cannot be opened") {
		t.Fatalf("error %q does not name the journal", err)
	}
}

// TestJournalFailuresLoseNothing: a journal whose folder is removed while
// running makes it again (folder, lock, segment) at its next append
// (here, with journalGoneEvery 0; otherwise within that of appends), so a
// crash still leaves a journal to replay; an append that fails goes to the ledger directly
// and shows in JournalStats; a read waiting for commits that cannot
// happen (the file's write lock held elsewhere) fails after
// journalSyncWait instead of hanging.
func TestJournalFailuresLoseNothing(t *testing.T) {
	savedGone := journalGoneEvery
	journalGoneEvery = 0 // every append asks whether its segment is gone
	defer func() { journalGoneEvery = savedGone }()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "molly.db")
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := put(t, r, Member{Name: "eve", BudgetUSD: 100})
	rec := func(i int) {
		t.Helper()
		if err := r.Journal(ctx, Usage{Member: "eve", DecisionID: fmt.Sprintf("f%d", i), PromptTokens: 1, CostUSD: 1e-6}); err != nil {
			t.Fatal(i, err)
		}
	}
	rec(0)
	if err := os.RemoveAll(JournalDir(path)); err != nil {
		t.Fatal(err)
	}
	rec(1)
	for _, name := range []string{r.owner + ".lock", r.owner + ".1.log"} {
		if _, err := os.Stat(filepath.Join(JournalDir(path), name)); err != nil {
			t.Fatalf("after its folder was removed the journal lacks %s: %v", name, err)
		}
	}

	j := r.openJournal()
	j.mu.Lock()
	j.closeSegment()             // unmapped: appends write(2) to f
	j.f, _ = os.Open(os.DevNull) // read-only: every write fails
	j.size = 0
	j.mu.Unlock()
	if err := os.Chmod(JournalDir(path), 0o500); err != nil { // and no new segment can be made
		t.Fatal(err)
	}
	rec(2) // to the ledger directly
	if err := os.Chmod(JournalDir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if s := r.JournalStats(); s.Err == nil {
		t.Fatalf("stats %+v: no error after a failed append", s)
	}
	if s, err := r.Summarize(ctx, "eve", 10); err != nil || s.Requests != 3 {
		t.Fatalf("summary %+v, %v; want the 3 records", s, err)
	}

	saved := journalSyncWait
	journalSyncWait = 200 * time.Millisecond
	defer func() { journalSyncWait = saved }()
	db, err := sqlite.Open(path, sqlite.Options{}, migrations()...)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	j.mu.Lock()
	j.f.Close()
	j.f, _ = os.OpenFile(filepath.Join(JournalDir(path), r.owner+".9.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	j.mu.Unlock()
	rec(3) // journaled; its commit waits for the lock
	if _, _, err := r.Remaining(ctx, m); !errors.Is(err, errJournalBehind) {
		t.Fatalf("Remaining with the ledger locked: %v, want errJournalBehind", err)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	journalSyncWait = saved // the commit now waits only for SQLite's busy handler to try again
	if left, _, err := r.Remaining(ctx, m); err != nil || math.Abs(left-(100-4e-6)) > 1e-9 {
		t.Fatalf("remaining %v, %v once the lock is gone; want 100 - 4e-6", left, err)
	}
	r.Close()
}
