-- inbox: SQLite 3.35 or later, advisory-lock form. SQLite has no session locks:
-- the process holds the keys in work, so one process serves a database file.
-- Described as inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before",
--     DeadTable: "jobs_dead"}.
-- Every name here is yours to change: name the tables and columns in inbox.Table.
--
-- AUTOINCREMENT is required: without it SQLite gives a new row the id of the
-- deleted row with the highest id, so two jobs would share an id, and a stale
-- holder's token (id, attempt) could match the new job. CheckSchema refuses such
-- a table.

CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    attempt INTEGER NOT NULL DEFAULT 1,
    payload BLOB NOT NULL,
    not_before TEXT
);

-- Where Delivery.Dead moves a job: the queue table's id, attempt and data columns.
CREATE TABLE IF NOT EXISTS jobs_dead (
    id INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    payload BLOB NOT NULL
);

-- Recommended with not_before: ready rows in id order.
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (not_before, id);

-- Optional columns (docs/schema.md), each named in inbox.Table: LastError,
-- Priority, EnqueuedAt. To add them, run these lines without their "-- ".
-- ALTER TABLE jobs ADD COLUMN last_error TEXT;
-- ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
-- ALTER TABLE jobs ADD COLUMN enqueued_at TEXT;
-- With LastError, the dead table keeps the error each job died with:
-- ALTER TABLE jobs_dead ADD COLUMN last_error TEXT;
-- For Queue.ListDead and Queue.PurgeDead (Table.DeadAt): when each job died, a column
-- of the dead table that Dead writes; ListDead pages newest first by this index. Jobs
-- already dead when it is added keep it NULL: ListDead lists them last, as the oldest.
-- ALTER TABLE jobs_dead ADD COLUMN dead_at TEXT;
-- CREATE INDEX jobs_dead_at ON jobs_dead (dead_at, id);
-- With a priority, the rows in claim order:
-- CREATE INDEX jobs_priority ON jobs (priority DESC, id);
-- For Queue.Stats (with EnqueuedAt): the counts and the oldest ready job.
-- CREATE INDEX jobs_age ON jobs (not_before, enqueued_at);
-- For unique jobs (Table.UniqueKey, docs/unique.md): a job's key, unique while it is in the queue.
-- ALTER TABLE jobs ADD COLUMN unique_key TEXT;
-- CREATE UNIQUE INDEX jobs_unique_key ON jobs (unique_key);
-- To pause the queue (Queue.Pause, Table.ControlTable: "jobs_control", docs/operations.md):
-- one row per queue table (one control table may serve every queue of the database).
-- CREATE TABLE jobs_control (queue TEXT PRIMARY KEY, paused_at TEXT, paused_by TEXT);
