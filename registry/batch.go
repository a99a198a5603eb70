package registry

import (
	"database/sql"
	"fmt"
	"strings"
)

// recordBatch writes records inside tx, which holds the write lock (on
// SQLite), with the effect of recordIn on each in order — the same rows,
// record ids, spend counters, settlements and outbox rows — in a few
// statements for the whole batch instead of three or four per record:
// one read of each member's period, one count of the decisions' earlier
// records, one multi-row insert of the usage rows, one upsert per spend
// counter touched, one settlement per reservation, one read of the sinks
// and one multi-row insert of the outbox rows. A record without a decision
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
	// batch's earlier ones.
	seen := map[string]int{}
	var b strings.Builder
	args := make([]any, 0, len(records))
	b.WriteString(`SELECT decision_id, COUNT(*) FROM usage WHERE decision_id IN (`)
	for _, u := range records {
		if _, ok := seen[u.DecisionID]; ok {
			continue
		}
		seen[u.DecisionID] = 0
		if len(args) > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('?')
		args = append(args, u.DecisionID)
	}
	b.WriteString(`) GROUP BY decision_id`)
	rows, err := tx.rows(b.String(), args...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var d string
		var n int
		if err := rows.Scan(&d, &n); err != nil {
			rows.Close()
			return nil, err
		}
		seen[d] = n
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	for i, u := range records {
		n := seen[u.DecisionID] + 1
		seen[u.DecisionID] = n
		ids[i] = u.DecisionID
		if n > 1 {
			ids[i] = fmt.Sprintf("%s:%d", u.DecisionID, n)
		}
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

	b.Reset()
	args = args[:0]
	b.WriteString(`INSERT INTO usage (record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts) VALUES `)
	for i, u := range records {
		if u.Time.Before(commit) && !(keepTime && !u.Time.IsZero()) {
			u.Time = commit
		}
		est := 0
		if u.Estimated {
			est = 1
		}
		cost := nusd(u.CostUSD)
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`(?,?,?,?,?,?,?,?,?,?,?)`)
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
	if _, err := tx.exec(b.String(), args...); err != nil {
		return nil, err
	}
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
	b.Reset()
	args = args[:0]
	b.WriteString(`INSERT INTO outbox (sink, record_id, next_at, created) VALUES `)
	for i, id := range ids {
		for j, s := range sinks {
			if i > 0 || j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`(?,?,?,?)`)
			args = append(args, s, id, now, now)
		}
	}
	if _, err := tx.exec(b.String(), args...); err != nil {
		return nil, err
	}
	return ids, nil
}

func hasUndecided(records []Usage) bool {
	for _, u := range records {
		if u.DecisionID == "" {
			return true
		}
	}
	return false
}
