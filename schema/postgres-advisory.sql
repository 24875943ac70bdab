-- inbox: PostgreSQL 12 or later, advisory-lock form.
-- Described as inbox.Table{Name: "jobs", AdvisoryKey: "id", NotBefore: "not_before",
--     DeadTable: "jobs_dead"}.
-- A key on another column (a customer, an account) needs that column, integer or text.
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
-- For Queue.ListDead and Queue.PurgeDead (Table.DeadAt): when each job died,
-- written by Dead; listed newest first from this index.
-- ALTER TABLE jobs ADD COLUMN dead_at timestamptz;
-- CREATE INDEX jobs_at ON jobs (dead_at, id);
-- ALTER TABLE jobs_dead ADD COLUMN last_error text;
-- With a priority, the rows in claim order:
-- CREATE INDEX jobs_priority ON jobs (priority DESC, id);
-- For Queue.Stats (with EnqueuedAt): the oldest ready job; jobs_ready serves the counts.
-- CREATE INDEX jobs_ready_age ON jobs (enqueued_at) WHERE not_before IS NULL;
