-- inbox: MySQL 8 or MariaDB 10.6 or later (InnoDB), lease form.
-- Described as inbox.Table{Name: "jobs", LockedUntil: "locked_until", DeadTable: "jobs_dead"}.
-- Every name here is yours to change: name the tables and columns in inbox.Table.
-- Times are UTC in DATETIME(6): without the microseconds the lease token cannot
-- be compared exactly, and CheckSchema refuses the column.

CREATE TABLE jobs (
    id           bigint AUTO_INCREMENT PRIMARY KEY,
    attempt      integer NOT NULL DEFAULT 1,
    locked_until DATETIME(6) NULL,
    payload      blob NOT NULL,
    -- Free rows (NULL) and expired leases in id order, so that the claim never
    -- walks rows under a live lease. Without it every claim scans the table.
    INDEX jobs_claimable (locked_until, id)
) ENGINE=InnoDB;

-- Where Delivery.Dead moves a job: the queue table's id, attempt and data columns.
CREATE TABLE jobs_dead (
    id      bigint PRIMARY KEY,
    attempt integer NOT NULL,
    payload blob NOT NULL
) ENGINE=InnoDB;
