package registry

// schemaV4: the specialisation loop's tables (learning/): consented
// traces with their quality signals, consent and retention per member and
// key, curated sets, adapter versions pinned to their base, the traces
// each version was trained on, aliases and their history.
const schemaV4 = `
-- Consent to capture traces, per member (name = member) or key (name = key prefix);
-- a request's X-Molly-Trace header overrides both. retention_days (member scope): days a
-- trace is kept; 0: the loop's default.
CREATE TABLE trace_consent (
	scope          TEXT NOT NULL,               -- member | key
	name           TEXT NOT NULL,
	trace          INTEGER NOT NULL,            -- 1 on, 0 off
	retention_days BIGINT NOT NULL DEFAULT 0,
	updated        BIGINT NOT NULL,             -- unix ms
	PRIMARY KEY (scope, name)
);

-- One consented request: what the answering tier saw (its dispatch body, redacted for it),
-- the route, the answer as that tier wrote it, and the quality signals.
CREATE TABLE traces (
	id           INTEGER PRIMARY KEY,
	decision_id  TEXT NOT NULL UNIQUE,
	member       TEXT NOT NULL,
	category     TEXT NOT NULL,                 -- the capability estimator's task category
	model        TEXT NOT NULL,                 -- the client's model name
	label        TEXT NOT NULL,                 -- how the request ended (pipeline.Outcome.Label)
	strategy     TEXT NOT NULL,
	route        TEXT NOT NULL,                 -- JSON: candidates and attempts (no text)
	tier         TEXT NOT NULL,                 -- the answering attempt's tier
	target       TEXT NOT NULL,
	served_model TEXT NOT NULL,                 -- the upstream model; a T0 adapter is <base>:<adapter>
	request      TEXT NOT NULL,                 -- the chat body as the answering tier saw it (JSON)
	answer       TEXT NOT NULL,                 -- the answer's text as that tier wrote it
	escalations  BIGINT NOT NULL DEFAULT 0,     -- answers escalated away from before this one
	score        REAL NOT NULL DEFAULT 0,       -- the answer's mean token log-probability or self-check
	score_kind   TEXT NOT NULL DEFAULT '',
	feedback     REAL NOT NULL DEFAULT -1,      -- explicit score in [0,1]; -1: none
	edit         TEXT NOT NULL DEFAULT '',      -- the client's corrected answer; '': none
	created      BIGINT NOT NULL                -- unix ms
);
CREATE INDEX traces_member ON traces(member, created);
CREATE INDEX traces_category ON traces(category, id);

-- Curated sets: pairs from traces (trace_id) or imported (trace_id 0), split train/heldout.
CREATE TABLE curated_sets (
	name    TEXT PRIMARY KEY,
	domain  TEXT NOT NULL,
	source  TEXT NOT NULL,                      -- traces | import
	created BIGINT NOT NULL
);
CREATE TABLE curated_items (
	set_name TEXT NOT NULL REFERENCES curated_sets(name) ON DELETE CASCADE,
	seq      BIGINT NOT NULL,
	trace_id BIGINT NOT NULL DEFAULT 0,
	member   TEXT NOT NULL DEFAULT '',
	split    TEXT NOT NULL,                     -- train | heldout
	teacher  TEXT NOT NULL DEFAULT '',          -- the tier whose answer is the target (distillation)
	messages TEXT NOT NULL,                     -- the prompt, a JSON array of chat messages
	answer   TEXT NOT NULL,
	PRIMARY KEY (set_name, seq)
);
CREATE INDEX curated_items_member ON curated_items(member);

-- Adapter versions, by content hash, pinned to the base they were made for.
CREATE TABLE adapter_versions (
	version       TEXT PRIMARY KEY,             -- hex SHA-256 of the GGUF file
	name          TEXT NOT NULL,                -- the adapter (domain) name it serves under
	base_checksum TEXT NOT NULL,
	base_quant    TEXT NOT NULL,                -- the base's weight type when it was made (F32, Q8_0, ...)
	path          TEXT NOT NULL,
	set_name      TEXT NOT NULL DEFAULT '',
	source        TEXT NOT NULL,                -- trained | external | import
	scores        TEXT NOT NULL DEFAULT '',     -- the evaluation (JSON); '' before it
	verdict       TEXT NOT NULL DEFAULT '',     -- promoted | refused | ''
	forgotten     BIGINT NOT NULL DEFAULT 0,    -- training traces since deleted with their member
	created       BIGINT NOT NULL
);
CREATE INDEX adapter_versions_name ON adapter_versions(name, created);
-- The traces each version was trained on.
CREATE TABLE adapter_traces (
	version  TEXT NOT NULL,
	trace_id BIGINT NOT NULL,
	member   TEXT NOT NULL,
	PRIMARY KEY (version, trace_id)
);
CREATE INDEX adapter_traces_member ON adapter_traces(member);
-- Aliases: the version an adapter name serves now; events: every change, promoted or not.
CREATE TABLE adapter_aliases (
	name    TEXT PRIMARY KEY,
	version TEXT NOT NULL,
	updated BIGINT NOT NULL
);
CREATE TABLE adapter_events (
	id      INTEGER PRIMARY KEY,
	name    TEXT NOT NULL,
	version TEXT NOT NULL,
	action  TEXT NOT NULL,                      -- promote | rollback | refuse | evaluate
	reason  TEXT NOT NULL DEFAULT '',
	created BIGINT NOT NULL
);
CREATE INDEX adapter_events_name ON adapter_events(name, id);
`

// pgSchemaV4 mirrors schemaV4 with PostgreSQL's identity and float types.
const pgSchemaV4 = `
CREATE TABLE trace_consent (
	scope          TEXT NOT NULL,
	name           TEXT NOT NULL,
	trace          INTEGER NOT NULL,
	retention_days BIGINT NOT NULL DEFAULT 0,
	updated        BIGINT NOT NULL,
	PRIMARY KEY (scope, name)
);
CREATE TABLE traces (
	id           BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
	decision_id  TEXT NOT NULL UNIQUE,
	member       TEXT NOT NULL,
	category     TEXT NOT NULL,
	model        TEXT NOT NULL,
	label        TEXT NOT NULL,
	strategy     TEXT NOT NULL,
	route        TEXT NOT NULL,
	tier         TEXT NOT NULL,
	target       TEXT NOT NULL,
	served_model TEXT NOT NULL,
	request      TEXT NOT NULL,
	answer       TEXT NOT NULL,
	escalations  BIGINT NOT NULL DEFAULT 0,
	score        DOUBLE PRECISION NOT NULL DEFAULT 0,
	score_kind   TEXT NOT NULL DEFAULT '',
	feedback     DOUBLE PRECISION NOT NULL DEFAULT -1,
	edit         TEXT NOT NULL DEFAULT '',
	created      BIGINT NOT NULL
);
CREATE INDEX traces_member ON traces(member, created);
CREATE INDEX traces_category ON traces(category, id);
CREATE TABLE curated_sets (
	name    TEXT PRIMARY KEY,
	domain  TEXT NOT NULL,
	source  TEXT NOT NULL,
	created BIGINT NOT NULL
);
CREATE TABLE curated_items (
	set_name TEXT NOT NULL REFERENCES curated_sets(name) ON DELETE CASCADE,
	seq      BIGINT NOT NULL,
	trace_id BIGINT NOT NULL DEFAULT 0,
	member   TEXT NOT NULL DEFAULT '',
	split    TEXT NOT NULL,
	teacher  TEXT NOT NULL DEFAULT '',
	messages TEXT NOT NULL,
	answer   TEXT NOT NULL,
	PRIMARY KEY (set_name, seq)
);
CREATE INDEX curated_items_member ON curated_items(member);
CREATE TABLE adapter_versions (
	version       TEXT PRIMARY KEY,
	name          TEXT NOT NULL,
	base_checksum TEXT NOT NULL,
	base_quant    TEXT NOT NULL,
	path          TEXT NOT NULL,
	set_name      TEXT NOT NULL DEFAULT '',
	source        TEXT NOT NULL,
	scores        TEXT NOT NULL DEFAULT '',
	verdict       TEXT NOT NULL DEFAULT '',
	forgotten     BIGINT NOT NULL DEFAULT 0,
	created       BIGINT NOT NULL
);
CREATE INDEX adapter_versions_name ON adapter_versions(name, created);
CREATE TABLE adapter_traces (
	version  TEXT NOT NULL,
	trace_id BIGINT NOT NULL,
	member   TEXT NOT NULL,
	PRIMARY KEY (version, trace_id)
);
CREATE INDEX adapter_traces_member ON adapter_traces(member);
CREATE TABLE adapter_aliases (
	name    TEXT PRIMARY KEY,
	version TEXT NOT NULL,
	updated BIGINT NOT NULL
);
CREATE TABLE adapter_events (
	id      BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
	name    TEXT NOT NULL,
	version TEXT NOT NULL,
	action  TEXT NOT NULL,
	reason  TEXT NOT NULL DEFAULT '',
	created BIGINT NOT NULL
);
CREATE INDEX adapter_events_name ON adapter_events(name, id);
`
