package registry

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The usage journal takes the ledger's transaction off the request path.
//
// Journal appends a usage record to a file of this handle (a checksummed
// frame copied into the segment's shared mapping; one write(2) where the
// file cannot be mapped) and returns: the record is then as durable as a
// commit in SQLite's WAL at synchronous=NORMAL — it survives kill -9 (a
// shared mapping's pages are the kernel's page cache, as write(2)'s bytes
// are), not a power loss — so the caller may acknowledge the request at
// once. BenchmarkJournalAppend on the 2-core VM, medians of 5 runs: 0.55
// µs per Journal call mapped against 4.3 µs with a write(2) and an
// fstat(2) per frame (one recorder; 16 at once: 0.44 against 4.4). A goroutine of the handle commits the
// journal's entries into the ledger in order, journalCommitDelay after the
// first, as many per transaction as have come (group commit: Gray &
// Reuter, "Transaction Processing", §9.4.7; recordBatch), together with the byte offset they end at (table
// usage_journals), so that every entry is committed exactly once even
// across a crash in the middle. It is the write-ahead log of ARIES
// (Mohan et al., 1992) at the level of ledger entries, redo only: entries
// are idempotent once their offset is known.
//
// Files: <registry file>.journals/<owner>.lock (held with flock(2) for the
// life of the handle) and <owner>.<n>.log, segments of
// journalSegmentBytes, preallocated (fallocate(2)) and mapped (mmap(2),
// MAP_SHARED): the zeros after the last frame are the segment's end. A handle whose process died leaves its lock file
// unlocked: the next handle opened on the registry file, and every live one
// on its lease-renewal tick, replays such segments from their committed
// offset, then removes them. A torn last frame (a kill during its copy, a
// power loss during its write) fails its checksum, or has no header yet,
// and is dropped: it was never acknowledged. A
// frame damaged in the middle is skipped (replaySegment). Replayed records
// keep the time they happened.
//
// Reads that must see this handle's records (Remaining, Reserve and Admit
// of a member with a budget or TPM, Held, Summarize, UsageRecords, the
// outbox counts) first wait until the journal's entries up to that moment
// are committed (at most journalSyncWait), so a handle reads its own
// writes. Other handles see them once committed (journalCommitDelay after
// the append, and the commit); budgets and TPM stay exact across handles
// because a reservation
// is released through the journal too, after the records that settle it:
// until their commit, the reservation still holds their worst case.

// journalSegmentBytes is a mapped segment's size (a frame that does not
// fit in what is left goes to a new segment), or the size past which a
// segment written by write(2) ends; a segment is removed once its entries
// are committed.
const journalSegmentBytes = 4 << 20

// journalMaxPending bounds the entries appended and not yet committed;
// past it Journal waits for the committer (the database is slower than the
// requests, or failing) for up to journalFullWait, then records directly.
const journalMaxPending = 1 << 16

// journalCommitDelay is how long the committer waits after an append for
// more before it commits, unless a reader of this handle waits for the
// commit (then at once). A commit's cost is mostly per transaction
// (BEGIN IMMEDIATE, the WAL frames of the pages it touches, COMMIT), so
// the fewer the better: in make bench's gateway table on 2 cores (2 KB
// requests, Molly's turn timed until its records are committed,
// interleaved runs), 16 clients reached 0.37–0.38× bare Caddy's
// throughput at 1 ms and 0.49–0.51× at 20 ms, and one client's p50 added
// 107–129 µs at 1 ms, 92–94 µs at 20 ms. (5 and 50 ms were measured only
// before the table timed the commits: 5 ms fell between, 50 ms level with
// 20 ms.) Other processes on the
// file see a record this much later; its durability does not depend on it
// (the journal's write).
const journalCommitDelay = 20 * time.Millisecond

// journalFullWait bounds how long Journal waits for room in a full journal
// before it fails.
const journalFullWait = 30 * time.Second

// journalRetry bounds the wait between two tries of a failed commit.
const journalRetry = 2 * time.Second

// Entry kinds.
const (
	entryRecord  = 'u' // a Usage, settling its Reservation when not 0
	entryRelease = 'r' // the release of a reservation
)

// entry is one journal entry: a record or a release.
type entry struct {
	kind byte
	u    Usage // entryRecord
	res  int64 // entryRelease
	seg  int   // the segment it is in
	end  int64 // the offset just past its frame there
}

// journal is a handle's usage journal, made by the first Journal call.
type journal struct {
	r     *Registry
	dir   string
	owner string
	lock  *os.File // <owner>.lock, flock'd exclusively

	mu        sync.Mutex
	f         *os.File      // current segment
	fd        int           // f's descriptor, for gone's fstat(2)
	opened    time.Time     // when the journal opened (its monotonic reading)
	checked   time.Duration // when (since opened) goneNow last asked gone
	m         []byte        // f mapped (MAP_SHARED, journalSegmentBytes), or nil: appends write(2) to f
	seg       int           // its number
	size      int64         // the bytes of frames in it
	segs      []int         // segments not yet removed, oldest first (current last)
	queue     []entry       // queue[head:]: appended, not committed, in order
	head      int           // queue[:head]: committed, cleared (commitQueued)
	pending   int           // len(queue)
	written   uint64        // entries appended since the journal opened
	applied   uint64        // entries committed since the journal opened
	changed   chan struct{} // closed (and replaced) whenever applied moves
	err       error         // the last commit error, nil after a success
	appendErr error         // the last append error, nil after a success
	buf       []byte

	kick  chan struct{} // an entry was appended
	hurry chan struct{} // a reader waits: commit now
	stop  chan struct{}
	done  chan struct{}
}

// JournalDir is the folder of the usage journals of the registry file at
// path (journal.go).
// The path's symbolic links are resolved (when it exists), so that every
// process on the file finds the same folder however it names the file.
func JournalDir(path string) string {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		if abs, err := filepath.Abs(real); err == nil {
			path = abs
		}
	}
	return path + ".journals" // not -journal: SQLite's rollback journal
}

// Journal records u like Record, but returns once u is appended to this
// handle's usage journal, before the ledger's transaction (see the comment
// at the top of journal.go): durable across a crash of the process, in the
// ledger a moment later, and seen at once by this handle's reads of usage,
// spend and reservations. The record's id is assigned at its commit, as
// Record's. When the journal cannot take the record (its file system is
// full or failing, journalMaxPending records already wait for a ledger
// that fails), Journal is Record for it. Errors: ErrInvalid as Record's;
// both the journal and Record failed (nothing is recorded). On
// PostgreSQL, at synchronous=FULL, or when the journal's folder cannot be
// made, Journal is Record.
func (r *Registry) Journal(ctx context.Context, u Usage) error {
	if u.Member == "" || u.PromptTokens < 0 || u.CompletionTokens < 0 || u.CostUSD < 0 {
		return fmt.Errorf("usage for %q: member, non-negative tokens and cost are required: %w", u.Member, ErrInvalid)
	}
	j := r.openJournal()
	if j == nil {
		_, err := r.Record(ctx, u)
		return err
	}
	if err := j.append(ctx, entry{kind: entryRecord, u: u}); err != nil {
		// The journal cannot take it (its file system is full or gone):
		// the ledger directly. Its settlement commutes with the journal's
		// (sums); only its record id may come before an earlier record's
		// of the same decision.
		if _, rerr := r.Record(ctx, u); rerr != nil {
			return fmt.Errorf("%w; and recording it directly: %w", err, rerr)
		}
	}
	return nil
}

// releaseJournaled releases reservation id through the journal when this
// handle has one, after the records before it; false when it has none.
func (r *Registry) releaseJournaled(ctx context.Context, id int64) bool {
	r.jmu.Lock()
	j := r.journal
	r.jmu.Unlock()
	if j == nil {
		return false
	}
	if j.append(ctx, entry{kind: entryRelease, res: id}) == nil {
		return true
	}
	// Directly (the caller), once the records before it are committed, so
	// that the reservation is not gone before they count.
	_ = r.syncJournal(ctx)
	return false
}

// CommitJournal returns once every usage record this handle journaled
// before the call is committed in the ledger (at once when there is
// none), asking the committer not to wait out its commit delay. Errors as
// syncJournal's.
func (r *Registry) CommitJournal(ctx context.Context) error { return r.syncJournal(ctx) }

// syncJournal waits until every entry this handle appended before the call
// is committed: at most journalSyncWait (the registry file's busy timeout),
// then an error, as a transaction waiting for the file's lock fails; ctx's
// error when it ends first. No journal: nil at once.
func (r *Registry) syncJournal(ctx context.Context) error {
	r.jmu.Lock()
	j := r.journal
	r.jmu.Unlock()
	if j == nil {
		return nil
	}
	ctx, cancel := context.WithTimeoutCause(ctx, journalSyncWait, errJournalBehind)
	defer cancel()
	if err := j.wait(ctx, j.mark()); err != nil {
		if c := context.Cause(ctx); errors.Is(c, errJournalBehind) {
			j.mu.Lock()
			last := j.err
			j.mu.Unlock()
			return fmt.Errorf("registry: %w (%d records wait; last commit error: %v)", errJournalBehind, j.queued(), last)
		}
		return err
	}
	return nil
}

// journalSyncWait bounds syncJournal, as the busy timeout bounds a
// transaction's wait for the file's lock (a variable for tests).
var journalSyncWait = 5 * time.Second

var errJournalBehind = errors.New("the usage journal is not committed in time")

// JournalStats are a journal's counts.
type JournalStats struct {
	Pending int    // entries appended, not yet committed
	Written uint64 // entries appended since the handle opened
	Applied uint64 // entries committed since the handle opened
	Err     error  // the last commit's error while commits fail, else the last append's while appends fail, else nil
}

// JournalStats returns this handle's journal counts (zero without one).
func (r *Registry) JournalStats() JournalStats {
	r.jmu.Lock()
	j := r.journal
	r.jmu.Unlock()
	if j == nil {
		return JournalStats{}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.err
	if err == nil {
		err = j.appendErr
	}
	return JournalStats{Pending: j.pending, Written: j.written, Applied: j.applied, Err: err}
}

// openJournal returns the handle's journal, opening it on first use; nil
// when the handle journals nothing (PostgreSQL, synchronous=FULL, closed)
// or its files cannot be made (then Journal is Record).
func (r *Registry) openJournal() *journal {
	r.jmu.Lock()
	defer r.jmu.Unlock()
	if r.journal != nil || r.noJournal {
		return r.journal
	}
	select {
	case <-r.stop:
		return nil
	default:
	}
	j, err := newJournal(r)
	if err != nil {
		r.noJournal = true // Record, from now on
		return nil
	}
	r.journal = j
	go j.run()
	return j
}

func newJournal(r *Registry) (*journal, error) {
	dir := JournalDir(r.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	lf, err := takeLock(dir, r.owner)
	if err != nil {
		return nil, err
	}
	j := &journal{r: r, dir: dir, owner: r.owner, lock: lf, seg: -1, opened: time.Now(), checked: -journalGoneEvery, changed: make(chan struct{}),
		kick: make(chan struct{}, 1), hurry: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if err := j.rotate(); err != nil {
		j.removeFiles()
		return nil, err
	}
	return j, nil
}

// takeLock makes and flocks <owner>.lock in dir. The lock is taken before
// the file has its name, so that no replay can take a live handle's lock
// file for an orphan's.
func takeLock(dir, owner string) (*os.File, error) {
	tmp := filepath.Join(dir, owner+".lock.tmp")
	lf, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, owner+".lock")); err != nil {
		lf.Close()
		os.Remove(tmp)
		return nil, err
	}
	return lf, nil
}

// rotate starts the next segment (under mu, or before the journal runs).
// When the folder or the lock file was removed while running, it makes
// them again, so that a crash leaves a journal the next handle replays.
func (j *journal) rotate() error {
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return err
	}
	if j.lock != nil {
		if _, err := os.Stat(filepath.Join(j.dir, j.owner+".lock")); errors.Is(err, os.ErrNotExist) {
			lf, err := takeLock(j.dir, j.owner)
			if err != nil {
				return err
			}
			j.lock.Close()
			j.lock = lf
		}
	}
	// Not O_APPEND: a mapped segment is never written through f, and one
	// that is not is written from 0 on, in order.
	f, err := os.OpenFile(j.segPath(j.owner, j.seg+1), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	j.closeSegment()
	j.seg++
	// Fd leaves a regular file as it is (it is never in the poller).
	j.f, j.fd, j.size = f, int(f.Fd()), 0
	if journalMapped {
		j.m = mapSegment(f)
	}
	j.segs = append(j.segs, j.seg)
	return nil
}

// journalMapped: rotate maps new segments (mapSegment); false, appends
// write(2) every frame (a variable for tests and the A/B benchmark).
var journalMapped = true

// mapSegment allocates f's blocks to journalSegmentBytes (fallocate(2), so
// that a full disk fails here, not as a SIGBUS at a later append) and maps
// them shared and writable; nil when either fails (a file system without
// fallocate or mmap, a full disk), f then empty again for write(2).
func mapSegment(f *os.File) []byte {
	fd := int(f.Fd())
	if err := unix.Fallocate(fd, 0, 0, journalSegmentBytes); err != nil {
		_ = f.Truncate(0)
		return nil
	}
	m, err := unix.Mmap(fd, 0, journalSegmentBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = f.Truncate(0)
		return nil
	}
	return m
}

// closeSegment unmaps and closes the current segment, if any (under mu).
// What was copied into the mapping stays in the page cache, written back
// as write(2)'s bytes are.
func (j *journal) closeSegment() {
	if j.m != nil {
		_ = unix.Munmap(j.m)
		j.m = nil
	}
	if j.f != nil {
		j.f.Close()
		j.f = nil
	}
}

// errMapFault: a copy into a segment's mapping faulted (SIGBUS: the file
// was truncated under it, or its blocks could not be had).
var errMapFault = errors.New("registry: the usage journal's mapping faulted")

// copyFrame copies frame into dst (a segment's mapping at the end of its
// frames), the 8-byte header last: a copy cut short by kill -9 leaves a
// zero length word, the end of the segment's frames, or at worst a frame
// whose checksum fails. A fault (SIGBUS) is errMapFault, not a crash
// (debug.SetPanicOnFault, meant for mapped files).
func copyFrame(dst, frame []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			if _, ok := p.(interface{ Addr() uintptr }); !ok {
				panic(p)
			}
			err = errMapFault
		}
	}()
	copy(dst[8:len(frame)], frame[8:])
	copy(dst[:8], frame[:8])
	return nil
}

func (j *journal) segPath(owner string, seg int) string {
	return filepath.Join(j.dir, owner+"."+strconv.Itoa(seg)+".log")
}

func segName(owner string, seg int) string { return owner + "." + strconv.Itoa(seg) }

// journalGoneEvery bounds how often append asks whether its segment was
// removed (gone; a variable for tests). gone's fstat(2) costs about 0.5 µs
// on the 2-core VM, as much as the rest of a mapped append; at most one
// per 10 ms is ~20 ns per record at the gateway's 3,000 a second. The
// records appended in the 10 ms after a removal go to the removed file:
// committed from memory as every entry is, lost only if the process also
// dies before their commit — as the entries appended before the removal
// and not yet committed (up to journalCommitDelay of them) always were.
var journalGoneEvery = 10 * time.Millisecond

// goneNow is gone at most once per journalGoneEvery (false between), the
// time read from the monotonic clock alone (time.Since of a monotonic
// time: one vDSO read, where time.Now reads two clocks). Under j.mu.
func (j *journal) goneNow() bool {
	at := time.Since(j.opened)
	if at-j.checked < journalGoneEvery {
		return false
	}
	j.checked = at
	return j.gone()
}

// gone reports whether the current segment's file was removed (its folder
// deleted while running): what is appended there could not be replayed
// after a crash. One fstat(2). Entries appended before the removal are
// still committed from memory; only a crash before that commit loses
// them. Called with j.mu held and j.f open, so j.fd is f's.
func (j *journal) gone() bool {
	var st syscall.Stat_t // on the stack: os.File.Stat would allocate a FileInfo
	if err := syscall.Fstat(j.fd, &st); err != nil {
		return true
	}
	return st.Nlink == 0
}

// mark is the count of entries appended so far.
func (j *journal) mark() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.written
}

// wait returns once n entries are committed, or with ctx's error.
func (j *journal) wait(ctx context.Context, n uint64) error {
	for {
		j.mu.Lock()
		if j.applied >= n {
			j.mu.Unlock()
			return nil
		}
		ch := j.changed
		j.mu.Unlock()
		select {
		case j.hurry <- struct{}{}:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("registry: waiting for the usage journal: %w", ctx.Err())
		case <-j.done:
			j.mu.Lock()
			ok := j.applied >= n
			j.mu.Unlock()
			if ok {
				return nil
			}
			return errors.New("registry: the usage journal stopped before committing")
		}
	}
}

// append writes e as one frame (a copy into the mapped segment, or one
// write(2)) and queues it for the committer.
func (j *journal) append(ctx context.Context, e entry) error {
	j.mu.Lock()
	var full <-chan time.Time
	for j.pending >= journalMaxPending {
		if full == nil {
			t := time.NewTimer(journalFullWait)
			defer t.Stop()
			full = t.C
		}
		ch, last := j.changed, j.err
		j.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("registry: the usage journal is full: %w", ctx.Err())
		case <-full:
			return fmt.Errorf("registry: the usage journal is full: %d records wait for the ledger (last commit error: %v)", journalMaxPending, last)
		case <-j.done:
			return errors.New("registry: the usage journal is closed")
		}
		j.mu.Lock()
	}
	defer j.mu.Unlock()
	if j.f == nil {
		return errors.New("registry: the usage journal is closed")
	}
	j.buf = encodeEntry(j.buf[:0], e)
	if len(j.buf)-8 > maxFrame {
		return fmt.Errorf("registry: a usage record of %d bytes is over the journal's %d", len(j.buf)-8, maxFrame)
	}
	ended := j.size >= journalSegmentBytes
	if j.m != nil {
		ended = j.size+int64(len(j.buf)) > int64(len(j.m)) // the rest stays zeros: the end
	}
	if ended || j.goneNow() {
		if err := j.rotate(); err != nil {
			j.appendErr = fmt.Errorf("registry: starting a usage journal segment: %w", err)
			return j.appendErr
		}
	}
	if j.m != nil {
		if err := copyFrame(j.m[j.size:], j.buf); err != nil {
			// What was copied is a torn frame, the segment's last.
			_ = j.rotate()
			j.appendErr = fmt.Errorf("registry: writing the usage journal: %w", err)
			return j.appendErr
		}
		j.size += int64(len(j.buf))
	} else {
		n, err := j.f.Write(j.buf)
		if err != nil {
			// A partial frame fails its checksum at replay, which then looks
			// for the next whole frame; the segment ends here anyway.
			j.size += int64(n)
			_ = j.rotate()
			j.appendErr = fmt.Errorf("registry: writing the usage journal: %w", err)
			return j.appendErr
		}
		j.size += int64(n)
	}
	j.appendErr = nil
	e.seg, e.end = j.seg, j.size
	j.queue = append(j.queue, e)
	j.pending++
	j.written++
	select {
	case j.kick <- struct{}{}:
	default:
	}
	return nil
}

// run commits queued entries until stop, then what is left.
func (j *journal) run() {
	defer close(j.done)
	backoff := 10 * time.Millisecond
	for {
		select {
		case <-j.kick:
		case <-j.hurry:
		case <-j.stop:
			for j.commitQueued() == nil && j.queued() > 0 {
			}
			return
		}
		// Commit delay (PostgreSQL's commit_delay): entries appended in
		// the next moment share this commit, which costs the CPU of one
		// transaction instead of one each; a reader waiting (wait) or a
		// full group cuts it short.
		if j.queued() < maxGroup {
			t := time.NewTimer(journalCommitDelay)
			select {
			case <-t.C:
			case <-j.hurry:
			case <-j.stop:
			}
			t.Stop()
		}
		for j.queued() > 0 {
			if err := j.commitQueued(); err != nil {
				select {
				case <-time.After(backoff):
				case <-j.stop:
					return // what is left is replayed by the next handle
				}
				backoff = min(2*backoff, journalRetry)
				continue
			}
			backoff = 10 * time.Millisecond
		}
	}
}

func (j *journal) queued() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.pending
}

// commitQueued commits up to maxGroup queued entries in one transaction,
// then removes the segments whose entries are all committed.
func (j *journal) commitQueued() error {
	j.mu.Lock()
	q := j.queue[j.head:]
	batch := slices.Clone(q[:min(len(q), maxGroup)])
	j.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := j.r.applyEntries(ctx, j.owner, batch, false)
	j.mu.Lock()
	if err != nil {
		j.err = err
		j.mu.Unlock()
		return err
	}
	j.err = nil
	j.dequeue(len(batch))
	j.pending -= len(batch)
	j.applied += uint64(len(batch))
	close(j.changed)
	j.changed = make(chan struct{})
	// Segments older than the oldest queued entry's (and than the current
	// one) are all committed.
	oldest := j.seg
	if j.head < len(j.queue) {
		oldest = j.queue[j.head].seg
	}
	var done []int
	for len(j.segs) > 0 && j.segs[0] < oldest {
		done = append(done, j.segs[0])
		j.segs = j.segs[1:]
	}
	j.mu.Unlock()
	j.r.nudge()
	for _, s := range done {
		_ = j.r.dropSegment(ctx, j.segPath(j.owner, s), segName(j.owner, s)) // what stays is not replayed twice (its row)
	}
	return nil
}

// journalQueueKeep is the capacity of entries an empty queue keeps for
// the next appends; a larger one (after a backlog) is let go.
const journalQueueKeep = 4096 // of 192 bytes

// dequeue removes the n oldest queued entries (under mu). The queue's
// array is kept and reused (appends do not grow a new one after every
// commit): emptied, it starts again at 0; half committed, the rest moves
// down (each entry moves at most once per time the queue's length is
// halved, so O(1) per entry).
func (j *journal) dequeue(n int) {
	clear(j.queue[j.head : j.head+n]) // let their strings go
	j.head += n
	switch {
	case j.head == len(j.queue) && cap(j.queue) > journalQueueKeep:
		j.queue, j.head = nil, 0
	case j.head == len(j.queue):
		j.queue, j.head = j.queue[:0], 0
	case j.head >= len(j.queue)/2:
		k := copy(j.queue, j.queue[j.head:])
		clear(j.queue[k:])
		j.queue, j.head = j.queue[:k], 0
	}
}

// dropSegment removes a committed segment: the file first, then its row
// (a row without its file is never read again; a file without its row
// would be replayed from 0).
func (r *Registry) dropSegment(ctx context.Context, path, name string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err // its row stays: it is not replayed again
	}
	_, err := r.db.ExecContext(ctx, `DELETE FROM usage_journals WHERE name = ?`, name)
	return err
}

// applyEntries commits entries (in order, of one owner's journal) in one
// transaction with the offset each segment is committed to.
//
// replay: the entries are a dead handle's, replayed now: records keep
// their time (recordAs).
func (r *Registry) applyEntries(ctx context.Context, owner string, entries []entry, replay bool) error {
	return r.txq(ctx, func(tx q) error {
		// Runs of records are written together (recordBatch); a release
		// comes after the records before it.
		var run []Usage
		flush := func() error {
			if len(run) == 0 {
				return nil
			}
			_, err := r.recordBatchAs(tx, run, owner, replay)
			run = run[:0]
			if err != nil {
				return fmt.Errorf("registry: recording usage: %w", err)
			}
			return nil
		}
		for _, e := range entries {
			switch e.kind {
			case entryRecord:
				run = append(run, e.u)
			case entryRelease:
				if err := flush(); err != nil {
					return err
				}
				if _, err := tx.exec(qRelease, e.res, owner); err != nil {
					return fmt.Errorf("registry: releasing reservation %d: %w", e.res, err)
				}
			}
		}
		if err := flush(); err != nil {
			return err
		}
		ends := map[int]int64{}
		for _, e := range entries {
			ends[e.seg] = e.end
		}
		for seg, end := range ends {
			if _, err := tx.exec(qJournalApplied, segName(owner, seg), end); err != nil {
				return err
			}
		}
		return nil
	})
}

// qJournalApplied sets the offset a segment's entries are committed to
// (applyEntries, once per group: prepared at Open, as a statement of the
// committer's every transaction).
const qJournalApplied = `INSERT INTO usage_journals (name, applied) VALUES (?, ?)
				ON CONFLICT (name) DO UPDATE SET applied = excluded.applied`

// close commits what is queued (unless the database keeps failing: the
// next handle replays it), then removes the journal's files.
func (j *journal) close() {
	close(j.stop)
	<-j.done
	j.mu.Lock()
	j.closeSegment()
	left := j.pending
	j.mu.Unlock()
	if left == 0 {
		j.removeFiles()
	} else {
		j.lock.Close() // unlocked: an orphan for the next handle to replay
	}
}

// removeFiles removes a journal with nothing left to commit.
func (j *journal) removeFiles() {
	j.closeSegment()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range j.segs {
		_ = j.r.dropSegment(ctx, j.segPath(j.owner, s), segName(j.owner, s)) // what stays is not replayed twice (its row)
	}
	os.Remove(filepath.Join(j.dir, j.owner+".lock"))
	j.lock.Close()
}

// recoverJournals replays the journals of handles that are gone (their
// lock file unlocked) and removes them; a journal whose replay fails stays
// for the next try. Errors are the first replay's failure.
func (r *Registry) recoverJournals(ctx context.Context) error {
	dir := JournalDir(r.path)
	names, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var first error
	for _, de := range names {
		owner, ok := strings.CutSuffix(de.Name(), ".lock")
		if !ok || owner == r.owner {
			continue
		}
		if err := r.recoverJournal(ctx, dir, owner); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// recoverJournal replays owner's segments when its lock is free. A lock
// or segment it cannot open or remove (another user's files, a read-only
// file system) is an error naming it: Open fails rather than leave
// acknowledged records out of the ledger unsaid.
func (r *Registry) recoverJournal(ctx context.Context, dir, owner string) error {
	lp := filepath.Join(dir, owner+".lock")
	lf, err := os.OpenFile(lp, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil // replayed and removed meanwhile
	}
	if err != nil {
		if fi, serr := os.Stat(lp); serr == nil && fi.IsDir() {
			return nil // not a lock file
		}
		return fmt.Errorf("registry: the usage journal %s of an earlier process cannot be opened, so its records cannot be replayed: %w", lp, err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return nil // alive
	}
	if fi, err := os.Stat(lp); err != nil || !os.SameFile(fi, mustStat(lf)) {
		return nil // replayed and removed by another handle since we opened it
	}
	segs, err := filepath.Glob(filepath.Join(dir, owner+".*.log"))
	if err != nil {
		return err
	}
	nums := make([]int, 0, len(segs))
	for _, s := range segs {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(s), owner+"."), ".log"))
		if err == nil {
			nums = append(nums, n)
		}
	}
	slices.Sort(nums)
	for _, n := range nums {
		if err := r.replaySegment(ctx, dir, owner, n); err != nil {
			return fmt.Errorf("registry: replaying usage journal %s: %w", filepath.Join(dir, segName(owner, n)+".log"), err)
		}
	}
	if err := os.Remove(lp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("registry: removing the replayed usage journal %s: %w", lp, err)
	}
	return nil
}

func mustStat(f *os.File) os.FileInfo {
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	return fi
}

// replaySegment commits a dead owner's segment from its committed offset
// and removes it. A frame that fails its checksum with more of the file
// after it (the disk damaged it) is skipped by looking for the next whole
// frame at each following byte (a false match has odds of 2^-32 per
// position); the segment is then kept, renamed <segment>.log.corrupt, as
// the evidence. A damaged last frame is a write a crash cut short (never
// acknowledged): dropped.
func (r *Registry) replaySegment(ctx context.Context, dir, owner string, seg int) error {
	path := filepath.Join(dir, owner+"."+strconv.Itoa(seg)+".log")
	var applied int64
	err := r.db.QueryRowContext(ctx, `SELECT applied FROM usage_journals WHERE name = ?`, segName(owner, seg)).Scan(&applied)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var batch []entry
	// bad: a frame did not decode; damaged: a whole frame came after one
	// (a torn last frame is bad and not damaged).
	bad, damaged := false, false
	for off := min(applied, int64(len(data))); off < int64(len(data)); {
		e, n, err := decodeFrame(data[off:])
		if err != nil {
			bad = true
			off = nextFrameAt(data, off)
			continue
		}
		damaged = damaged || bad
		off += int64(n)
		e.seg, e.end = seg, off
		batch = append(batch, e)
		if len(batch) == maxGroup {
			if err := r.applyEntries(ctx, owner, batch, true); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		if err := r.applyEntries(ctx, owner, batch, true); err != nil {
			return err
		}
	}
	r.nudge()
	if damaged {
		return os.Rename(path, path+".corrupt")
	}
	return r.dropSegment(ctx, path, segName(owner, seg))
}

// nextFrameAt is the next offset after off at which a frame may start,
// when the frame at off did not decode: off+1, or, in a run of zeros (the
// unwritten rest of a mapped segment, or damage), the first offset whose
// length word is not zero (a frame's is not), at most len(data). The same
// frames are found as by trying every byte, without the 4 MB of tries.
func nextFrameAt(data []byte, off int64) int64 {
	if int64(len(data))-off < 4 || binary.LittleEndian.Uint32(data[off:]) != 0 {
		return off + 1
	}
	k := off + 4
	for k+8 <= int64(len(data)) && binary.LittleEndian.Uint64(data[k:]) == 0 {
		k += 8
	}
	for k < int64(len(data)) && data[k] == 0 {
		k++
	}
	if k == int64(len(data)) {
		return k // zeros to the end
	}
	return max(off+1, k-3) // data[k] is the first non-zero byte: a frame's length word holds it
}

// A frame is: payload length (uint32, little-endian), CRC-32C of the
// payload (uint32, little-endian), payload. A record's payload is 'u',
// then member, decision id, model, target, tier as uvarint-length-prefixed
// bytes, then prompt tokens, completion tokens, estimated (0/1) and the
// reservation as uvarints, the cost as the IEEE-754 bits of CostUSD
// (uint64, little-endian) and the time in Unix nanoseconds (varint). A
// release's payload is 'r' and the reservation id (uvarint). A mapped
// segment is preallocated: its frames are followed by zeros, which no
// frame begins with (its length is not 0), so replay skips them
// (nextFrameAt) as the torn end they are. Segments written by write(2)
// (before mapping, or where it fails) have no zeros after their frames;
// both replay alike.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// maxFrame bounds a frame's payload (append refuses a larger entry, which
// then goes to the ledger directly), so that a damaged length at replay
// costs little.
const maxFrame = 64 << 10

func encodeEntry(b []byte, e entry) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = append(b, e.kind)
	switch e.kind {
	case entryRecord:
		for _, s := range []string{e.u.Member, e.u.DecisionID, e.u.Model, e.u.Target, e.u.Tier} {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
		est := uint64(0)
		if e.u.Estimated {
			est = 1
		}
		b = binary.AppendUvarint(b, uint64(e.u.PromptTokens))
		b = binary.AppendUvarint(b, uint64(e.u.CompletionTokens))
		b = binary.AppendUvarint(b, est)
		b = binary.AppendUvarint(b, uint64(e.u.Reservation))
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(e.u.CostUSD))
		b = binary.AppendVarint(b, e.u.Time.UnixNano())
	case entryRelease:
		b = binary.AppendUvarint(b, uint64(e.res))
	}
	payload := b[start+8:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(payload, castagnoli))
	return b
}

var (
	errFrame = errors.New("registry: bad usage journal frame")
	errShort = errors.New("registry: usage journal frame runs past the end")
)

// decodeFrame decodes the frame at the start of b; n is its length in
// bytes. errShort: b ends inside it (or is empty); errFrame: it is not a
// whole, valid frame.
func decodeFrame(b []byte) (entry, int, error) {
	if len(b) < 8 {
		return entry{}, 0, errShort
	}
	size := binary.LittleEndian.Uint32(b[0:4])
	if size == 0 || size > maxFrame {
		return entry{}, 0, errFrame
	}
	if uint64(len(b)-8) < uint64(size) {
		return entry{}, 0, errShort
	}
	payload := b[8 : 8+size]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(b[4:8]) {
		return entry{}, 0, errFrame
	}
	e, err := decodePayload(payload)
	return e, 8 + int(size), err
}

func decodePayload(p []byte) (entry, error) {
	e := entry{kind: p[0]}
	p = p[1:]
	uv := func() uint64 {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			p = nil
			return 0
		}
		p = p[n:]
		return v
	}
	switch e.kind {
	case entryRecord:
		var s [5]string
		for i := range s {
			n := uv()
			if uint64(len(p)) < n {
				return entry{}, errFrame
			}
			s[i], p = string(p[:n]), p[n:]
		}
		e.u.Member, e.u.DecisionID, e.u.Model, e.u.Target, e.u.Tier = s[0], s[1], s[2], s[3], s[4]
		e.u.PromptTokens, e.u.CompletionTokens = int(uv()), int(uv())
		e.u.Estimated = uv() == 1
		e.u.Reservation = int64(uv())
		if len(p) < 8 {
			return entry{}, errFrame
		}
		e.u.CostUSD = math.Float64frombits(binary.LittleEndian.Uint64(p))
		p = p[8:]
		t, n := binary.Varint(p)
		if n <= 0 {
			return entry{}, errFrame
		}
		e.u.Time = time.Unix(0, t)
	case entryRelease:
		e.res = int64(uv())
		if p == nil {
			return entry{}, errFrame
		}
	default:
		return entry{}, errFrame
	}
	return e, nil
}
