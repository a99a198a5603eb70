package registry

// The statements of the request path, prepared once per handle at Open
// (Registry.stmt): auth, admission, recording, release.
const (
	// qInsertUsage appends a record of a decision (arguments: the decision
	// id three times, the member, the decision id, the other columns, the
	// member twice): its record id is the decision id for the decision's
	// first record, <decision id>:<n> for its n-th (the count of its
	// records, read in the same statement); it returns the record id and
	// the member's period and anchor (NULL for a member without a row: no
	// period). VALUES with scalar subqueries, not INSERT … SELECT: SQLite
	// copies a SELECT from the table being written into a temporary table.
	qInsertUsage = `INSERT INTO usage (record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts)
			VALUES ((SELECT CASE WHEN COUNT(*) = 0 THEN ? ELSE ? || ':' || (COUNT(*) + 1) END FROM usage WHERE decision_id = ?), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			RETURNING record_id, (SELECT period FROM members WHERE name = ?), (SELECT period_start FROM members WHERE name = ?)`
	// qInsertUsageNumbered appends a record without a decision id, numbered
	// usage-<n> after the ledger's last row, returning as qInsertUsage.
	qInsertUsageNumbered = `INSERT INTO usage (record_id, member, decision_id, model, target, tier, prompt_tokens, completion_tokens, estimated, cost_nusd, ts)
			VALUES ('usage-' || (SELECT COALESCE(MAX(id), 0) + 1 FROM usage), ?, '', ?, ?, ?, ?, ?, ?, ?, ?)
			RETURNING record_id, (SELECT period FROM members WHERE name = ?), (SELECT period_start FROM members WHERE name = ?)`
	qAddSpend = `INSERT INTO spend (member, period_start, spent_nusd, prompt_tokens, completion_tokens, records)
			VALUES (?, ?, ?, ?, ?, 1)
			ON CONFLICT (member, period_start) DO UPDATE SET spent_nusd = spend.spent_nusd + excluded.spent_nusd,
				prompt_tokens = spend.prompt_tokens + excluded.prompt_tokens,
				completion_tokens = spend.completion_tokens + excluded.completion_tokens, records = spend.records + 1`
	// qAddSpendN adds the sums of several records (the last argument: how
	// many) to a spend counter (recordBatch).
	qAddSpendN = `INSERT INTO spend (member, period_start, spent_nusd, prompt_tokens, completion_tokens, records)
			VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (member, period_start) DO UPDATE SET spent_nusd = spend.spent_nusd + excluded.spent_nusd,
				prompt_tokens = spend.prompt_tokens + excluded.prompt_tokens,
				completion_tokens = spend.completion_tokens + excluded.completion_tokens, records = spend.records + excluded.records`
	qMemberPeriod = `SELECT period, period_start FROM members WHERE name = ?`
	qSinks        = `SELECT name FROM outbox_sinks ORDER BY name`
	qSettle       = `UPDATE reservations SET
				nusd = CASE WHEN nusd > ? THEN nusd - ? ELSE 0 END,
				tokens = CASE WHEN tokens > ? THEN tokens - ? ELSE 0 END
				WHERE id = ? AND owner = ?`
	qQueue  = `INSERT INTO outbox (sink, record_id, next_at, created) SELECT name, ?, ?, ? FROM outbox_sinks`
	qExpire = `DELETE FROM reservations WHERE expires <= ?`
	// qReserve: the CASTs because PostgreSQL types a parameter compared
	// with the literal 0 as integer (int4: pgx's exec mode sends no
	// parameter types), which a budget over 2.1 USD in nano-USD overflows.
	qReserve = `INSERT INTO reservations (member, nusd, tokens, owner, created, expires)
			SELECT ?, ?, ?, ?, ?, ?
			WHERE (CAST(? AS BIGINT) = 0 OR COALESCE((SELECT spent_nusd FROM spend WHERE member = ? AND period_start = ?), 0)
					+ COALESCE((SELECT SUM(nusd) FROM reservations WHERE member = ?), 0) + ? <= ?)
			  AND (CAST(? AS BIGINT) = 0 OR COALESCE((SELECT SUM(prompt_tokens + completion_tokens) FROM usage WHERE member = ? AND ts > ?), 0)
					+ COALESCE((SELECT SUM(tokens) FROM reservations WHERE member = ?), 0) + ? <= ?)
			RETURNING id`
	// qRelease and qSettle name the reservation's owner too: ids are
	// reused once the highest is deleted, and a late release or
	// settlement (a dead process's journal replayed after its leases
	// expired) must not touch another handle's reservation.
	qRelease     = `DELETE FROM reservations WHERE id = ? AND owner = ?`
	qRPMPrune    = `DELETE FROM rate_requests WHERE member = ? AND ts <= ?`
	qRPMCount    = `SELECT COUNT(*) FROM rate_requests WHERE member = ?`
	qRPMOldest   = `SELECT ts FROM rate_requests WHERE member = ? ORDER BY ts LIMIT 1 OFFSET ?`
	qRPMAdmit    = `INSERT INTO rate_requests (member, ts) VALUES (?, ?)`
	qTokenWindow = `SELECT ts, prompt_tokens + completion_tokens FROM usage WHERE member = ? AND ts > ? ORDER BY ts, id`
)

// preparedQueries are prepared at Open; a statement run inside a
// transaction must be among them to use its prepared form (preparing needs
// the connection the transaction holds).
var preparedQueries = []string{
	lookupQuery, memberQuery, spentQuery, // auth
	qRPMPrune, qRPMCount, qRPMOldest, qRPMAdmit, qTokenWindow, // Admit
	qExpire, qReserve, qRelease, // Reserve, Release
	qInsertUsage, qInsertUsageNumbered, qAddSpend, qSettle, qQueue, // Record
	qAddSpendN, qMemberPeriod, qSinks, // recordBatch
	qJournalApplied, // the journal's committer
}
