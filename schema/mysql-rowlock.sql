-- inbox: MySQL 8 or MariaDB 10.6 or later (InnoDB), row-lock form (the default).
-- Described as inbox.Table{Name: "jobs", NotBefore: "not_before",
--     ClaimsTable: "jobs_claims", MaxClaims: 5, DeadTable: "jobs_dead"}.
-- not_before (Retry delays) and jobs_claims (the poison-pill guard) are optional.
-- Every name here is yours to change: name the tables and columns in inbox.Table.

CREATE TABLE jobs (
    id         bigint AUTO_INCREMENT PRIMARY KEY,
    attempt    integer NOT NULL DEFAULT 1,
    payload    blob NOT NULL,
    not_before DATETIME(6) NULL,
    INDEX jobs_ready (not_before, id)  -- recommended with not_before
) ENGINE=InnoDB;

-- Where Delivery.Dead moves a job, and where a job goes past MaxClaims.
CREATE TABLE jobs_dead (
    id      bigint PRIMARY KEY,
    attempt integer NOT NULL,
    payload blob NOT NULL
) ENGINE=InnoDB;

-- Per job, the deliveries whose holder ended without settling (a crash rolls the
-- attempt back, so the attempt cannot count them). The column must be named claims.
CREATE TABLE jobs_claims (
    id     bigint PRIMARY KEY,
    claims integer NOT NULL
) ENGINE=InnoDB;

-- Optional columns (docs/schema.md), each named in inbox.Table: LastError,
-- Priority, EnqueuedAt. To add them, run these lines without their "-- ".
-- ALTER TABLE jobs ADD COLUMN last_error text NULL, ADD COLUMN priority integer NOT NULL DEFAULT 0, ADD COLUMN enqueued_at DATETIME(6) NULL;
-- With LastError, the dead table keeps the error each job died with:
-- ALTER TABLE jobs_dead ADD COLUMN last_error text NULL;
-- For Queue.ListDead and Queue.PurgeDead (Table.DeadAt): when each job died, a column
-- of the dead table that Dead writes; ListDead pages newest first by this index. Jobs
-- already dead when it is added keep it NULL: ListDead lists them last, as the oldest.
-- ALTER TABLE jobs_dead ADD COLUMN dead_at DATETIME(6) NULL;
-- CREATE INDEX jobs_dead_at ON jobs_dead (dead_at, id);
-- With a priority (MySQL 8, MariaDB 10.8 or later), required: without it SKIP LOCKED
-- returns no job while the first in order is held.
-- CREATE INDEX jobs_priority ON jobs (priority DESC, id);
-- For Queue.Stats (with EnqueuedAt): the counts and the oldest ready job.
-- CREATE INDEX jobs_age ON jobs (not_before, enqueued_at);
-- For unique jobs (Table.UniqueKey, docs/unique.md): a job's key, unique while it is in the queue.
-- ALTER TABLE jobs ADD COLUMN unique_key varchar(191) NULL, ADD UNIQUE INDEX jobs_unique_key (unique_key);
-- To pause the queue (Queue.Pause, Table.ControlTable: "jobs_control", docs/operations.md):
-- one row per queue table (one control table may serve every queue of the database).
-- CREATE TABLE jobs_control (queue varchar(191) PRIMARY KEY, paused_at DATETIME(6) NULL, paused_by text NULL);
