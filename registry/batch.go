package registry

import (
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
)

// recordBatch writes records inside tx, which holds the write lock (on
// SQLite), with the effect of recordIn on each in order — the same rows,
// record ids, spend counters, settlements and outbox rows — in a few
// statements for the whole batch instead of three or four per record:
// one read of each member's period, multi-row inserts of the usage rows
// (a count of the decisions' earlier records only when one of them has
// some: numberRecords), one upsert per spend
// counter touched, one settlement per reservation, one read of the sinks
// and multi-row inserts of the outbox rows (the multi-row statements in
// chunks of batchChunks rows, prepared at Open). A record without a decision
// id (numbered after the ledger's last row) makes the batch go record by
// record. ids[i] is records[i]'s record id. It is what the group commit
// and the usage journal's committer call; a batch of one is recordIn.
func (r *Registry) recordBatch(tx q, records []Usage) (ids []string, err error) {
	return r.recordBatchAs(tx, records, r.owner, false)
}

// recordBatchAs is recordBatch for the records of owner's reservations;
// keepTime as recordAs's.
func (r *Registry) recordBatchAs(tx q, records []Usage, owner string, keepTime bool) (ids []string, err error) {
	ids = make([]string, len(records))
	if len(records) == 1 || r.pg || hasUndecided(records) {
		for i, u := range records {
			if ids[i], err = r.recordAs(tx, u, owner, keepTime); err != nil {
				return nil, err
			}
		}
		return ids, nil
	}
	commit := r.now() // under the write lock, as recordIn
	now := ms(commit)

	members := map[string]*Member{}
	for _, u := range records {
		if _, ok := members[u.Member]; ok {
			continue
		}
		var period sql.NullString
		var anchor sql.NullInt64
		err := tx.row(qMemberPeriod, u.Member).Scan(&period, &anchor)
		if err != nil && err != sql.ErrNoRows {
			return nil, err
		}
		members[u.Member] = &Member{Period: period.String, PeriodStart: fromMS(anchor.Int64)}
	}

	// Record ids: the decision id for a decision's first record,
	// "<decision id>:<n>" for its n-th, counting the ledger's rows and the
	// batch's earlier ones. When no decision of the batch is one this
	// handle recorded lately, they are numbered as if none had a record in
	// the ledger yet, without reading it: the usage insert's unique index
	// on record_id checks that (numberRecords). Otherwise (a decision whose
	// records straddle two commits) the ledger's counts are read first.
	renumbered := false
	if r.recent.any(records) {
		renumbered = true
		if err := r.countRecords(tx, records, ids); err != nil {
			return nil, err
		}
	} else {
		numberRecords(records, ids, nil)
	}

	type spendKey struct {
		member string
		start  int64
	}
	type spendSum struct{ nusd, prompt, completion, records int64 }
	spend := map[spendKey]*spendSum{}
	var spendOrder []spendKey
	type settle struct{ nusd, tokens int64 }
	settles := map[int64]*settle{}
	var settleOrder []int64

	args := make([]any, 0, usageColumns*len(records))
	for i, u := range records {
		if u.Time.Before(commit) && !(keepTime && !u.Time.IsZero()) {
			u.Time = commit
		}
		est := 0
		if u.Estimated {
			est = 1
		}
		cost := nusd(u.CostUSD)
		args = append(args, ids[i], u.Member, u.DecisionID, u.Model, u.Target, u.Tier, u.PromptTokens, u.CompletionTokens, est, cost, ms(u.Time))

		k := spendKey{u.Member, periodKey(members[u.Member], u.Time)}
		s := spend[k]
		if s == nil {
			s = &spendSum{}
			spend[k] = s
			spendOrder = append(spendOrder, k)
		}
		s.nusd += cost
		s.prompt += int64(u.PromptTokens)
		s.completion += int64(u.CompletionTokens)
		s.records++
		if u.Reservation != 0 {
			st := settles[u.Reservation]
			if st == nil {
				st = &settle{}
				settles[u.Reservation] = st
				settleOrder = append(settleOrder, u.Reservation)
			}
			// Settling a+b at once is settling a then b: max(0, max(0, x-a)-b) = max(0, x-a-b) for a, b ≥ 0.
			st.nusd += cost
			st.tokens += int64(u.PromptTokens) + int64(u.CompletionTokens)
		}
	}
	err = inChunks(len(records), func(off, n int) error {
		_, err := tx.exec(qInsertUsageRows[n], args[off*usageColumns:(off+n)*usageColumns]...)
		if err != nil && !renumbered && isConstraint(err) {
			// A decision from this chunk on has records in the ledger (or a
			// record id is taken otherwise: numbered exactly, the insert
			// fails again, as it would have at once). The chunks before
			// are numbered right; the rest are numbered again against the
			// ledger as it is now, which holds those chunks' rows.
			renumbered = true
			if err := r.countRecords(tx, records[off:], ids[off:]); err != nil {
				return err
			}
			for i := off; i < len(records); i++ {
				args[i*usageColumns] = ids[i]
			}
			_, err = tx.exec(qInsertUsageRows[n], args[off*usageColumns:(off+n)*usageColumns]...)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	r.recent.add(records)
	for _, k := range spendOrder {
		s := spend[k]
		if _, err := tx.exec(qAddSpendN, k.member, k.start, s.nusd, s.prompt, s.completion, s.records); err != nil {
			return nil, err
		}
	}
	for _, id := range settleOrder {
		st := settles[id]
		if _, err := tx.exec(qSettle, st.nusd, st.nusd, st.tokens, st.tokens, id, owner); err != nil {
			return nil, err
		}
	}

	var sinks []string
	srows, err := tx.rows(qSinks)
	if err != nil {
		return nil, err
	}
	for srows.Next() {
		var s string
		if err := srows.Scan(&s); err != nil {
			srows.Close()
			return nil, err
		}
		sinks = append(sinks, s)
	}
	if err := srows.Close(); err != nil {
		return nil, err
	}
	if len(sinks) == 0 {
		return ids, nil
	}
	args = args[:0]
	for _, id := range ids {
		for _, s := range sinks {
			args = append(args, s, id, now, now)
		}
	}
	err = inChunks(len(ids)*len(sinks), func(off, n int) error {
		_, err := tx.exec(qInsertOutboxRows[n], args[off*outboxColumns:(off+n)*outboxColumns]...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// numberRecords sets ids[i] to records[i]'s record id given prior, each
// decision's count of records in the ledger before the batch (nil: none has
// any): the decision id for its first record, "<decision id>:<n>" for its
// n-th.
//
// Numbered with prior nil, a batch's ids are right exactly when the
// insert of their usage rows does not fail on the unique index on
// record_id (recordBatchAs): if a decision d of the batch has a record in
// the ledger, one of them has the record id d — its first, as every writer
// numbers (recordIn, recordBatch, the schemaV2 migration) and no row of
// usage is ever deleted — and the batch's first record of d, numbered d,
// collides with it; if none has one, prior is all zeros. A chunk of the
// insert that succeeds holds the first batch record of each of its
// records' decisions or comes after it, so its ids are right.
func numberRecords(records []Usage, ids []string, prior map[string]int) {
	seen := make(map[string]int, len(records))
	for i, u := range records {
		n, ok := seen[u.DecisionID]
		if !ok {
			n = prior[u.DecisionID]
		}
		n++
		seen[u.DecisionID] = n
		ids[i] = u.DecisionID
		if n > 1 {
			ids[i] = u.DecisionID + ":" + strconv.Itoa(n)
		}
	}
}

// countRecords numbers records (ids[i] for records[i]) after the records
// their decisions have in the ledger, read in tx.
func (r *Registry) countRecords(tx q, records []Usage, ids []string) error {
	prior := map[string]int{}
	var decisions []any
	for _, u := range records {
		if _, ok := prior[u.DecisionID]; ok {
			continue
		}
		prior[u.DecisionID] = 0
		decisions = append(decisions, u.DecisionID)
	}
	err := inChunks(len(decisions), func(off, n int) error {
		rows, err := tx.rows(qDecisionCounts[n], decisions[off:off+n]...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var d string
			var c int
			if err := rows.Scan(&d, &c); err != nil {
				rows.Close()
				return err
			}
			prior[d] = c
		}
		return rows.Close()
	})
	if err != nil {
		return err
	}
	numberRecords(records, ids, prior)
	return nil
}

// recentDecisions bounds a generation of recentSet: a decision is
// remembered for its last 4,096 to 8,192 decisions.
const recentDecisions = 4096

// recentSet holds the decision ids of the records a handle wrote lately
// (two generations of maps), so that a batch holding a decision's later
// record reads the ledger's counts at once instead of failing an insert
// first (recordBatchAs). It only picks the way ids are numbered, never
// what they are: one it lacks or keeps too long costs time, no error.
type recentSet struct {
	mu       sync.Mutex
	cur, old map[string]struct{}
}

// any reports whether a decision of records is in the set.
func (s *recentSet) any(records []Usage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range records {
		if _, ok := s.cur[u.DecisionID]; ok {
			return true
		}
		if _, ok := s.old[u.DecisionID]; ok {
			return true
		}
	}
	return false
}

// add puts the decisions of records into the set.
func (s *recentSet) add(records []Usage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range records {
		if len(s.cur) >= recentDecisions {
			s.old, s.cur = s.cur, nil
		}
		if s.cur == nil {
			s.cur = make(map[string]struct{}, recentDecisions)
		}
		s.cur[u.DecisionID] = struct{}{}
	}
}

// isConstraint reports whether err is SQLite's SQLITE_CONSTRAINT (a
// statement that failed a constraint: SQLite undid that statement alone
// and the transaction goes on).
func isConstraint(err error) bool {
	var e interface{ Code() int }
	return errors.As(err, &e) && e.Code()&0xff == sqliteConstraint
}

// sqliteConstraint is SQLITE_CONSTRAINT, the primary result code.
const sqliteConstraint = 19

// batchChunks are the row counts of recordBatch's multi-row statements,
// largest first. A batch of n rows runs as chunks of these sizes, taken
// greedily (n = 150: 64, 64, 16, 4, 2), so that each statement is one of
// a few texts prepared at Open: SQLite compiles a statement in about the
// time it takes to run a small one, and a text per batch size would be
// compiled per batch. Powers of two, so that a batch of n < 64 rows is
// popcount(n) statements: a statement's fixed cost (database/sql, the
// driver, binding, SQLite's VM setup) is about that of several rows, and
// the journal's usual group of about 60 records took 6 statements per
// table with {64, 16, 4, 1} and takes 4 (BenchmarkApplyEntries).
var batchChunks = [...]int{64, 32, 16, 8, 4, 2, 1}

// The multi-row statements, by chunk size; prepared at Open (queries.go).
var (
	qDecisionCounts   = map[int]string{}
	qInsertUsageRows  = map[int]string{}
	qInsertOutboxRows = map[int]string{}
)

const (
	usageColumns  = 11 // qInsertUsageRows' placeholders per row
	outboxColumns = 4  // qInsertOutboxRows'
)

func init() {
	list := func(n int, row string) string {
		return strings.TrimSuffix(strings.Repeat(row+",", n), ",")
	}
	for _, n := range batchChunks {
		qDecisionCounts[n] = `SELECT decision_id, COUNT(*) FROM usage WHERE decision_id IN (` + list(n, "?") + `) GROUP BY decision_id`
		qInsertUsageRows[n] = `INSERT INTO usage (record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts) VALUES ` +
			list(n, "("+list(usageColumns, "?")+")")
		qInsertOutboxRows[n] = `INSERT INTO outbox (sink, record_id, next_at, created) VALUES ` + list(n, "("+list(outboxColumns, "?")+")")
		preparedQueries = append(preparedQueries, qDecisionCounts[n], qInsertUsageRows[n], qInsertOutboxRows[n])
	}
}

// inChunks calls f(off, n) for consecutive chunks [off, off+n) of total
// rows, n from batchChunks, in order; it stops at f's first error.
func inChunks(total int, f func(off, n int) error) error {
	off := 0
	for _, n := range batchChunks {
		for total-off >= n {
			if err := f(off, n); err != nil {
				return err
			}
			off += n
		}
	}
	return nil
}

func hasUndecided(records []Usage) bool {
	for _, u := range records {
		if u.DecisionID == "" {
			return true
		}
	}
	return false
}
