-- inbox: PostgreSQL 12 or later, advisory-lock form.
-- Described as inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before",
--     DeadTable: "jobs_dead"}.
-- A key on another column (a customer, an account) needs that column, integer or text,
-- listed in Table.Data or with a default (docs/forms.md, "A key of your own").
-- Every name here is yours to change: name the tables and columns in inbox.Table.

CREATE TABLE jobs (
    id         bigserial PRIMARY KEY,
    attempt    integer NOT NULL DEFAULT 1,
    payload    bytea NOT NULL,
    not_before timestamptz
);

-- Where Delivery.Dead moves a job: the queue table's id, attempt and data columns.
CREATE TABLE jobs_dead (
    id      bigint PRIMARY KEY,
    attempt integer NOT NULL,
    payload bytea NOT NULL
);

-- Recommended with not_before: ready rows in id order.
CREATE INDEX jobs_ready ON jobs (not_before, id);

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
-- With a priority, the rows in claim order:
-- CREATE INDEX jobs_priority ON jobs (priority DESC, id);
-- For Queue.Stats (with EnqueuedAt): the oldest ready job; jobs_ready serves the counts.
-- CREATE INDEX jobs_ready_age ON jobs (enqueued_at) WHERE not_before IS NULL;
-- For unique jobs (Table.UniqueKey, docs/unique.md): a job's key, unique while it is in the queue.
-- ALTER TABLE jobs ADD COLUMN unique_key text;
-- CREATE UNIQUE INDEX jobs_unique_key ON jobs (unique_key);
-- To pause the queue (Queue.Pause, Table.ControlTable: "jobs_control", docs/operations.md):
-- one row per queue table (one control table may serve every queue of the database).
-- CREATE TABLE jobs_control (queue text PRIMARY KEY, paused_at timestamptz, paused_by text);
