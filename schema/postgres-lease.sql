-- inbox: PostgreSQL 12 or later, lease form.
-- Described as inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}.
-- Every name here is yours to change: name the tables and columns in inbox.Table.

CREATE TABLE jobs (
    id           bigserial PRIMARY KEY,
    attempt      integer NOT NULL DEFAULT 1,
    locked_until timestamptz,
    payload      bytea NOT NULL
);

-- Where Delivery.Dead moves a job: the queue table's id, attempt and data columns.
CREATE TABLE jobs_dead (
    id      bigint PRIMARY KEY,
    attempt integer NOT NULL,
    payload bytea NOT NULL
);

-- The claim reads free rows (no lease) and expired leases apart, each from its own
-- index, so rows under a live lease are never walked. Without these indexes every
-- claim scans the table. A queue kept short can leave both out and be described
-- with Shallow: true (docs/schema.md, "A shallow queue").
CREATE INDEX jobs_free ON jobs (id) WHERE locked_until IS NULL;
CREATE INDEX jobs_lu ON jobs (locked_until);

-- Optional columns (docs/schema.md), each named in inbox.Table: LastError,
-- Priority, EnqueuedAt. To add them, run these lines without their "-- ".
-- ALTER TABLE jobs ADD COLUMN last_error text, ADD COLUMN priority integer NOT NULL DEFAULT 0, ADD COLUMN enqueued_at timestamptz;
-- With LastError, the dead table keeps the error each job died with:
-- ALTER TABLE jobs_dead ADD COLUMN last_error text;
-- For Queue.ListDead and Queue.PurgeDead (Table.DeadAt): when each job died, a column
-- of the dead table that Dead writes; ListDead pages newest first by this index. Jobs
-- already dead when it is added keep it NULL: ListDead lists them last, as the oldest.
-- ALTER TABLE jobs_dead ADD COLUMN dead_at timestamptz;
-- CREATE INDEX jobs_dead_at ON jobs_dead (dead_at, id);
-- With a priority, the free rows in claim order, in place of jobs_free above:
-- DROP INDEX jobs_free;
-- CREATE INDEX jobs_free ON jobs (priority DESC, id) WHERE locked_until IS NULL;
-- For Queue.Stats (with EnqueuedAt): the oldest free job.
-- CREATE INDEX jobs_free_age ON jobs (enqueued_at) WHERE locked_until IS NULL;
-- For unique jobs (Table.UniqueKey, docs/unique.md): a job's key, unique while it is in the queue.
-- ALTER TABLE jobs ADD COLUMN unique_key text;
-- CREATE UNIQUE INDEX jobs_unique_key ON jobs (unique_key);
-- To pause the queue (Queue.Pause, Table.ControlTable: "jobs_control", docs/operations.md):
-- one row per queue table (one control table may serve every queue of the database).
-- CREATE TABLE jobs_control (queue text PRIMARY KEY, paused_at timestamptz, paused_by text);
