package registry

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/molly-gateway/molly/registry/sqlite"
)

// mappedChildEnv names, for a child process of
// TestAJournalKilledMidSegmentReplaysEveryRecordOnce, "<registry
// file>|<records>|<mapped: 1 or 0>".
const mappedChildEnv = "MOLLY_REGISTRY_MAPPED_CHILD"

// mappedUsage is the i-th record of the mapped kill test: a decision id
// of 200 bytes (so that 40,000 records fill two 4 MB segments and part of a third)
// and values the test checks on their own.
func mappedUsage(i int) Usage {
	return Usage{Member: "anonymous", DecisionID: fmt.Sprintf("m-%06d-%s", i, strings.Repeat("x", 191)), Model: "model-" + strconv.Itoa(i%3),
		Target: "t", Tier: "T2", PromptTokens: 1000 + i, CompletionTokens: i % 11, Estimated: i%2 == 1,
		CostUSD: float64(i) * 1e-6, Time: time.UnixMilli(1767225600000 + int64(i))}
}

// mappedChild journals the records mappedChildEnv asks for while holding
// the file's write lock (so that none is committed), prints how the
// journal holds them, and kills itself with SIGKILL.
func mappedChild() {
	parts := strings.Split(os.Getenv(mappedChildEnv), "|")
	n, _ := strconv.Atoi(parts[1])
	journalMapped = parts[2] == "1"
	fail := func(err error) { fmt.Println("error", err); os.Exit(2) }
	ctx := context.Background()
	r, err := Open(parts[0], Options{})
	if err != nil {
		fail(err)
	}
	db, err := sqlite.Open(parts[0], sqlite.Options{}, migrations()...)
	if err != nil {
		fail(err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		fail(err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		fail(err)
	}
	for i := range n {
		if err := r.Journal(ctx, mappedUsage(i)); err != nil {
			fail(err)
		}
	}
	j := r.openJournal()
	j.mu.Lock()
	mapped, seg := j.m != nil, j.seg
	j.mu.Unlock()
	fmt.Println("journaled", mapped, seg, r.JournalStats().Applied)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

// TestAJournalKilledMidSegmentReplaysEveryRecordOnce: a process journals
// 40,000 records (two segments and part of a third) that the ledger has
// not committed (its write lock is held) and kills itself (SIGKILL) with
// the last segment mapped and mostly zeros; the next handle commits each
// record exactly once with its values, and removes the journal. Mapped,
// every segment is preallocated to journalSegmentBytes; with write(2) (the
// fallback), none is longer than its frames. The oracle is mappedUsage.
func TestAJournalKilledMidSegmentReplaysEveryRecordOnce(t *testing.T) {
	const n = 40000
	for _, mapped := range []bool{true, false} {
		t.Run(fmt.Sprintf("mapped=%v", mapped), func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "molly.db")
			setup, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			setup.Close()
			exe, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			m := "0"
			if mapped {
				m = "1"
			}
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), mappedChildEnv+"="+path+"|"+strconv.Itoa(n)+"|"+m)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, os.Stderr
			err = cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("child: %v, want killed by SIGKILL (%q)", err, out.String())
			}
			if want := fmt.Sprintf("journaled %v 2 0\n", mapped); out.String() != want {
				t.Fatalf("child: %q, want %q (segment 2 current, nothing committed)", out.String(), want)
			}
			segs, _ := filepath.Glob(filepath.Join(JournalDir(path), "*.log"))
			if len(segs) != 3 {
				t.Fatalf("segments %v, want 3", segs)
			}
			for _, s := range segs {
				fi, err := os.Stat(s)
				if err != nil {
					t.Fatal(err)
				}
				if mapped && fi.Size() != journalSegmentBytes || !mapped && fi.Size() > journalSegmentBytes+1024 {
					t.Fatalf("segment %s: %d bytes, mapped=%v", s, fi.Size(), mapped)
				}
			}

			r, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			seen := make([]bool, n)
			count := 0
			for after := int64(0); ; {
				page, last, err := r.UsageRecords(ctx, after, 1000)
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					break
				}
				after = last
				for _, u := range page {
					i, err := strconv.Atoi(strings.TrimPrefix(u.RecordID[:8], "m-"))
					if err != nil || i < 0 || i >= n {
						t.Fatalf("record %q is none of the journaled", u.RecordID)
					}
					if seen[i] {
						t.Fatalf("record %d committed twice", i)
					}
					seen[i] = true
					count++
					want := mappedUsage(i)
					want.RecordID = want.DecisionID
					if u.Member != want.Member || u.DecisionID != want.DecisionID || u.Model != want.Model || u.Tier != want.Tier ||
						u.PromptTokens != want.PromptTokens || u.CompletionTokens != want.CompletionTokens || u.Estimated != want.Estimated ||
						math.Abs(u.CostUSD-want.CostUSD) > 1e-9 || !u.Time.Equal(want.Time) {
						t.Fatalf("record %d: %+v, want %+v", i, u, want)
					}
				}
			}
			if count != n {
				t.Fatalf("%d records replayed, want %d", count, n)
			}
			left, _ := os.ReadDir(JournalDir(path))
			var rows int
			if err := r.db.QueryRow(`SELECT COUNT(*) FROM usage_journals`).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if len(left) != 0 || rows != 0 {
				t.Fatalf("after the replay: files %v, %d usage_journals rows; want none", left, rows)
			}
		})
	}
}

// TestReplayEndsAtTheZerosOfAMappedSegment: in a preallocated segment,
// the zeros after the frames are its end, not damage: a segment of whole
// frames and zeros, one whose last frame has its payload but not yet its
// header (a copy cut short: the header goes last), and one whose last
// frame has its header and part of its payload, each replay their whole
// frames only and are removed. Zeros with whole frames after them (pages
// lost to a power cut) are damage: the frames after still count and the
// segment is kept as .corrupt. The oracle is the count of whole frames
// each segment is built with.
func TestReplayEndsAtTheZerosOfAMappedSegment(t *testing.T) {
	rec := func(i int) []byte {
		return encodeEntry(nil, entry{kind: entryRecord, u: Usage{Member: "anonymous", DecisionID: fmt.Sprintf("z%d", i),
			PromptTokens: 1, CostUSD: 1e-6, Time: time.UnixMilli(1767225600000)}})
	}
	zeros := func(n int) []byte { return make([]byte, n) }
	whole := func(from, to int) []byte {
		var b []byte
		for i := from; i < to; i++ {
			b = append(b, rec(i)...)
		}
		return b
	}
	torn := rec(99)
	headless := append(zeros(8), torn[8:]...)
	for _, c := range []struct {
		name    string
		data    []byte
		records int
		corrupt bool
	}{
		{"whole frames, then zeros", append(whole(0, 5), zeros(journalSegmentBytes-len(whole(0, 5)))...), 5, false},
		{"a frame without its header, then zeros", append(append(whole(0, 5), headless...), zeros(4096)...), 5, false},
		{"a frame cut in its payload, then zeros", append(append(whole(0, 5), torn[:len(torn)-4]...), zeros(4096)...), 5, false},
		{"zeros, then whole frames", append(append(whole(0, 3), zeros(8192)...), whole(3, 7)...), 7, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "molly.db")
			seg := deadJournal(t, path, "0ddba11", c.data)
			r, err := Open(path, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			list, _, err := r.UsageRecords(ctx, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != c.records {
				t.Fatalf("%d records replayed, want %d", len(list), c.records)
			}
			_, err = os.Stat(seg + ".corrupt")
			if c.corrupt != (err == nil) {
				t.Fatalf("kept as .corrupt: %v, want %v", err == nil, c.corrupt)
			}
		})
	}
}

// TestNextFrameAtFindsWhatEveryByteFinds: replay's skip over zeros finds
// the frames that trying every byte after a bad one finds (the oracle,
// written here), on segments of frames, zero runs and random bytes —
// among the frames, payloads of 256 and 512 bytes, whose length word's
// first byte is 0, right after zeros.
func TestNextFrameAtFindsWhatEveryByteFinds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	frame := func(payload int) []byte {
		// A record whose decision id makes the payload that long, or
		// the next length a record can have.
		for id := 0; ; id++ {
			b := encodeEntry(nil, entry{kind: entryRecord, u: Usage{Member: "a", DecisionID: strings.Repeat("d", id), Time: time.UnixMilli(int64(id))}})
			if len(b)-8 >= payload {
				return b
			}
		}
	}
	scan := func(data []byte, next func([]byte, int64) int64) (ends []int64) {
		for off := int64(0); off < int64(len(data)); {
			if _, n, err := decodeFrame(data[off:]); err == nil {
				off += int64(n)
				ends = append(ends, off)
				continue
			}
			off = next(data, off)
		}
		return ends
	}
	everyByte := func(_ []byte, off int64) int64 { return off + 1 }
	for k := range 200 {
		var data []byte
		for range 1 + rng.IntN(12) {
			switch rng.IntN(4) {
			case 0:
				data = append(data, make([]byte, rng.IntN(40))...)
			case 1:
				junk := make([]byte, rng.IntN(10))
				for i := range junk {
					junk[i] = byte(rng.IntN(3)) // mostly zeros and ones
				}
				data = append(data, junk...)
			case 2:
				data = append(data, frame([]int{256, 512}[rng.IntN(2)])...)
			default:
				data = append(data, frame(20+rng.IntN(60))...)
			}
		}
		want, got := scan(data, everyByte), scan(data, nextFrameAt)
		if fmt.Sprint(want) != fmt.Sprint(got) {
			t.Fatalf("case %d (%d bytes): frames end at %v, want %v", k, len(data), got, want)
		}
	}
	if b := frame(256); b[0] != 0 || binary.LittleEndian.Uint32(b) != 256 || binary.LittleEndian.Uint32(frame(512)) != 512 {
		t.Fatalf("a 256-byte payload's frame starts %x: the case of a length word with a zero first byte is not tested", b[:4])
	}
}

// TestAMappingThatFaultsGoesToTheLedger: when the current segment's file
// is truncated under its mapping (another process), the copy faults
// (SIGBUS); the record goes to the ledger directly instead of crashing
// the process, the fault shows in JournalStats, and the next record is
// journaled in a new segment.
func TestAMappingThatFaultsGoesToTheLedger(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "molly.db")
	r, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	rec := func(i int) {
		t.Helper()
		if err := r.Journal(ctx, Usage{Member: "anonymous", DecisionID: fmt.Sprintf("s%d", i), PromptTokens: 1, CostUSD: 1e-6}); err != nil {
			t.Fatal(i, err)
		}
	}
	rec(0)
	j := r.openJournal()
	if j.m == nil {
		t.Fatal("the segment is not mapped")
	}
	if err := os.Truncate(j.segPath(j.owner, 0), 0); err != nil {
		t.Fatal(err)
	}
	rec(1) // faults: to the ledger
	if s := r.JournalStats(); s.Err == nil || !errors.Is(s.Err, errMapFault) {
		t.Fatalf("stats %+v: want the mapping's fault", s)
	}
	rec(2)
	if _, err := os.Stat(j.segPath(j.owner, 1)); err != nil {
		t.Fatalf("no new segment after the fault: %v", err)
	}
	if s := r.JournalStats(); s.Err != nil || s.Written != 2 {
		t.Fatalf("stats %+v: want 2 journaled (s0, s2) and no error", s)
	}
	list, _, err := r.UsageRecords(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, u := range list {
		ids[u.RecordID] = true
	}
	if len(ids) != 3 || !ids["s0"] || !ids["s1"] || !ids["s2"] {
		t.Fatalf("records %v, want s0, s1, s2", ids)
	}
}
