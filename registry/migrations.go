package registry

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/molly-gateway/molly/registry/sqlite"
)

// The registry's schema, as versioned migrations (registry/sqlite applies
// the new ones at Open). Append, never edit: a file in the field has run
// the old text. The SQL keeps to what PostgreSQL shares (BIGINT, ON
// CONFLICT, RETURNING, window functions, UPDATE … FROM); a pgx backend
// mirrors each version with its own text where the types differ
// (INTEGER PRIMARY KEY → BIGINT GENERATED ALWAYS AS IDENTITY, BLOB → BYTEA).
func migrations() []sqlite.Migration {
	return []sqlite.Migration{
		{Version: 1, Name: "members, keys, usage", SQL: schemaV1},
		{Version: 2, Name: "record ids, spend counters, reservations, rate windows, outbox, priors", SQL: schemaV2, Up: backfillSpend},
		{Version: 3, Name: "stored responses (Responses API)", SQL: schemaV3},
		{Version: 4, Name: "traces, curated sets, adapter versions, promotions (specialisation loop)", SQL: schemaV4},
		{Version: 5, Name: "usage journals (records acknowledged before their commit)", SQL: schemaV5},
	}
}

// schemaV5 keeps, per usage journal segment (journal.go), the byte offset
// up to which its entries are committed in the ledger: set in the same
// transaction as the entries, so a replay after a crash applies each entry
// exactly once. Portable as written.
const schemaV5 = `
CREATE TABLE IF NOT EXISTS usage_journals (
	name    TEXT PRIMARY KEY,
	applied BIGINT NOT NULL
);
`

// schemaV1 is the first schema (keys and budgets); IF NOT EXISTS so a
// file made before migrations were versioned adopts it as version 1.
const schemaV1 = `
CREATE TABLE IF NOT EXISTS members (
	name         TEXT PRIMARY KEY,
	budget_nusd  INTEGER NOT NULL DEFAULT 0, -- budget per period in nano-USD (1e-9 USD); 0: none
	period       TEXT NOT NULL DEFAULT '',   -- '', 'day' or 'month'
	period_start INTEGER NOT NULL DEFAULT 0, -- anchor of the periods, unix ms UTC
	rpm          INTEGER NOT NULL DEFAULT 0, -- requests per minute; 0: unlimited
	tpm          INTEGER NOT NULL DEFAULT 0, -- tokens per minute; 0: unlimited
	models       TEXT NOT NULL DEFAULT '',   -- scope: space-separated client model names; '': any
	tiers        TEXT NOT NULL DEFAULT '',   -- scope: space-separated tiers; '': any
	tools        TEXT NOT NULL DEFAULT '',   -- scope: space-separated tool names; '': any
	created      INTEGER NOT NULL            -- unix ms
);
CREATE TABLE IF NOT EXISTS keys (
	hash    BLOB PRIMARY KEY,                -- SHA-256 of the whole key
	prefix  TEXT NOT NULL UNIQUE,            -- first characters, for display and revocation
	member  TEXT NOT NULL REFERENCES members(name),
	name    TEXT NOT NULL DEFAULT '',
	created INTEGER NOT NULL,                -- unix ms
	revoked INTEGER NOT NULL DEFAULT 0       -- unix ms; 0: live
);
CREATE TABLE IF NOT EXISTS usage (
	id                INTEGER PRIMARY KEY,
	member            TEXT NOT NULL,
	decision_id       TEXT NOT NULL,
	model             TEXT NOT NULL,
	target            TEXT NOT NULL,
	tier              TEXT NOT NULL,
	prompt_tokens     INTEGER NOT NULL,
	completion_tokens INTEGER NOT NULL,
	estimated         INTEGER NOT NULL DEFAULT 0, -- 1: tokens counted by Molly, not reported by the upstream
	cost_nusd         INTEGER NOT NULL,           -- nano-USD
	ts                INTEGER NOT NULL            -- unix ms
);
CREATE INDEX IF NOT EXISTS usage_member_ts ON usage(member, ts);
`

// schemaV2: the usage table becomes the book of record (durable record ids,
// spend counters written in the same transaction, an outbox for the billing
// tool), reservations and RPM windows move from memory to the file, and the
// priors join the registry (they had a file of their own).
const schemaV2 = `
-- The record id: the decision id for a decision's first record, <decision id>:<n> for its n-th;
-- records of older files get the same scheme, in id order ('usage-<id>' without a decision id).
ALTER TABLE usage ADD COLUMN record_id TEXT NOT NULL DEFAULT '';
UPDATE usage SET record_id = CASE
		WHEN usage.decision_id = '' THEN 'usage-' || usage.id
		WHEN n.n = 1 THEN usage.decision_id
		ELSE usage.decision_id || ':' || n.n END
	FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY decision_id ORDER BY id) AS n FROM usage) AS n
	WHERE n.id = usage.id;
CREATE UNIQUE INDEX usage_record_id ON usage(record_id);
CREATE INDEX usage_decision_id ON usage(decision_id);

-- Spend per member and budget period, updated with every usage record: Remaining reads one row.
CREATE TABLE spend (
	member            TEXT NOT NULL,
	period_start      BIGINT NOT NULL,            -- unix ms; 0 for a member without a period (all time)
	spent_nusd        BIGINT NOT NULL DEFAULT 0,
	prompt_tokens     BIGINT NOT NULL DEFAULT 0,
	completion_tokens BIGINT NOT NULL DEFAULT 0,
	records           BIGINT NOT NULL DEFAULT 0,
	PRIMARY KEY (member, period_start)
);

-- What requests in flight hold (Reserve): settled by their usage records, deleted on release,
-- and ignored (then deleted) once expired: the lease of a process that died with them.
CREATE TABLE reservations (
	id      INTEGER PRIMARY KEY,
	member  TEXT NOT NULL,
	nusd    BIGINT NOT NULL,                     -- cost still held, nano-USD
	tokens  BIGINT NOT NULL,                     -- tokens still held
	owner   TEXT NOT NULL,                       -- the registry handle (process) that renews the lease
	created BIGINT NOT NULL,                     -- unix ms
	expires BIGINT NOT NULL                      -- unix ms
);
CREATE INDEX reservations_member ON reservations(member, expires);
CREATE INDEX reservations_owner ON reservations(owner);
CREATE INDEX reservations_expires ON reservations(expires);

-- The RPM window: one row per admitted request of a member with an RPM, pruned past the minute.
CREATE TABLE rate_requests (
	member TEXT NOT NULL,
	ts     BIGINT NOT NULL                       -- unix ms
);
CREATE INDEX rate_requests_member_ts ON rate_requests(member, ts);

-- Transactional outbox: each usage record gets a row per registered sink in the same
-- transaction; a Deliverer sends pending rows and marks them.
CREATE TABLE outbox_sinks (
	name    TEXT PRIMARY KEY,
	created BIGINT NOT NULL
);
CREATE TABLE outbox (
	sink        TEXT NOT NULL REFERENCES outbox_sinks(name),
	record_id   TEXT NOT NULL,                   -- usage.record_id, the idempotency key
	state       TEXT NOT NULL DEFAULT 'pending', -- pending | delivered | failed
	attempts    INTEGER NOT NULL DEFAULT 0,
	next_at     BIGINT NOT NULL,                 -- unix ms: not sent before
	claim_until BIGINT NOT NULL DEFAULT 0,       -- unix ms: a deliverer is sending it until then
	last_error  TEXT NOT NULL DEFAULT '',
	created     BIGINT NOT NULL,
	delivered   BIGINT NOT NULL DEFAULT 0,       -- unix ms
	PRIMARY KEY (sink, record_id)
);
CREATE INDEX outbox_due ON outbox(sink, state, next_at);

-- Learned routing priors (they had their own file, priors.db, before).
CREATE TABLE priors (
	kind     TEXT NOT NULL,                      -- quality | ttfb_s | total_s
	target   TEXT NOT NULL,
	model    TEXT NOT NULL DEFAULT '',           -- the upstream model; a T0 adapter is <base>:<adapter>
	category TEXT NOT NULL DEFAULT '',           -- the task category
	value    REAL NOT NULL,                      -- quality in [0,1], or seconds
	n        BIGINT NOT NULL,                    -- observations
	updated  BIGINT NOT NULL,                    -- unix ms
	PRIMARY KEY (kind, target, model, category)
);

-- One-off facts about the file, e.g. which legacy priors file was imported.
CREATE TABLE meta (
	key   TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
`

// schemaV3: responses of the Responses API kept for previous_response_id
// (responses.go), with the conversation that led to them.
const schemaV3 = `
CREATE TABLE responses (
	id          TEXT PRIMARY KEY,                -- resp_...
	member      TEXT NOT NULL,                   -- only its member may continue it
	model       TEXT NOT NULL,                   -- the client's model name
	decision_id TEXT NOT NULL DEFAULT '',
	messages    TEXT NOT NULL,                   -- the chat messages so far, the answer last (JSON array)
	response    TEXT NOT NULL,                   -- the Response object sent (JSON)
	created     BIGINT NOT NULL                  -- unix ms
);
CREATE INDEX responses_created ON responses(created);
`

// backfillSpend builds the spend counters of an upgraded file from its usage
// rows: each row counts in its member's period that holds its time (a member
// no longer in the table counts all time). Done once, in Go, because month
// periods need calendar arithmetic (Member.PeriodAt).
func backfillSpend(ctx context.Context, tx *sql.Tx) error {
	members := map[string]Member{}
	rows, err := tx.QueryContext(ctx, `SELECT `+memberCols+` FROM members m`)
	if err != nil {
		return err
	}
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			rows.Close()
			return err
		}
		members[m.Name] = m
	}
	if err := rows.Close(); err != nil {
		return err
	}
	type key struct {
		member string
		start  int64
	}
	type sums struct{ nusd, prompt, completion, records int64 }
	acc := map[key]*sums{}
	rows, err = tx.QueryContext(ctx, `SELECT member, ts, prompt_tokens, completion_tokens, cost_nusd FROM usage`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var member string
		var ts, p, c, cost int64
		if err := rows.Scan(&member, &ts, &p, &c, &cost); err != nil {
			rows.Close()
			return err
		}
		m := members[member]
		k := key{member, periodKey(&m, fromMS(ts))}
		s := acc[k]
		if s == nil {
			s = &sums{}
			acc[k] = s
		}
		s.nusd, s.prompt, s.completion, s.records = s.nusd+cost, s.prompt+p, s.completion+c, s.records+1
	}
	if err := rows.Close(); err != nil {
		return err
	}
	for k, s := range acc {
		if _, err := tx.ExecContext(ctx, `INSERT INTO spend (member, period_start, spent_nusd, prompt_tokens, completion_tokens, records)
			VALUES (?, ?, ?, ?, ?, ?)`, k.member, k.start, s.nusd, s.prompt, s.completion, s.records); err != nil {
			return fmt.Errorf("spend of %s: %w", k.member, err)
		}
	}
	return nil
}
