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
-- claim scans the table.
CREATE INDEX jobs_free ON jobs (id) WHERE locked_until IS NULL;
CREATE INDEX jobs_lu ON jobs (locked_until);
