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
