package main

// The minimal lease of issue 25: what a user writes in twenty lines on a
// table with its primary key only, with the client's clock and one token per
// claim (the expiry the claim wrote, shared by its rows):
//
//	UPDATE jobs SET locked_until = $1, attempt = attempt + 1
//	WHERE id = (SELECT id FROM jobs WHERE locked_until IS NULL OR locked_until < $2
//	            ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)    -- "IN (… LIMIT 16 …)" for batches
//	RETURNING id, attempt, payload;
//	DELETE FROM jobs WHERE id = $1 AND locked_until = $2;       -- batches: id = ANY($1)
//
// MariaDB locks with SELECT … FOR UPDATE SKIP LOCKED, then one UPDATE … WHERE
// id IN (…), in a short READ COMMITTED transaction; SQLite stores the lease as
// an integer (microseconds since 1970). It is the lease baseline of the
// table (-baseline minimal, the default); -baseline tokens keeps the earlier
// hand-written lease, which checks each row's (id, attempt, expiry).

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/lib/pq"
)

// baseline is the lease baseline of the table: "minimal" or "tokens".
var baseline = "minimal"

// minimalLease is the minimal lease on one engine, for one batch size.
type minimalLease struct {
	e     engine
	db    *sql.DB
	batch int
	claim string
	mark  []string // MariaDB: the UPDATE of k locked ids, by k
	ack   []string // by number of jobs (PostgreSQL: one, with an array)
}

func newMinimalLease(e engine, db *sql.DB, table string, batch int) *minimalLease {
	m := &minimalLease{e: e, db: db, batch: batch, mark: make([]string, batch+1), ack: make([]string, batch+1)}
	// pick is the claim's condition on id, comparing with the clock now.
	pick := func(now, lock string) string {
		if batch == 1 {
			return "= (SELECT id FROM " + table + " WHERE locked_until IS NULL OR locked_until < " + now + " ORDER BY id LIMIT 1" + lock + ")"
		}
		return "IN (SELECT id FROM " + table + " WHERE locked_until IS NULL OR locked_until < " + now + " ORDER BY id LIMIT " + fmt.Sprint(batch) + lock + ")"
	}
	in := func(k int) string { return strings.TrimSuffix(strings.Repeat("?, ", k), ", ") }
	switch e.family {
	case "postgres":
		m.claim = "UPDATE " + table + " SET locked_until = $1, attempt = attempt + 1 WHERE id " + pick("$2", " FOR UPDATE SKIP LOCKED") +
			" RETURNING id, attempt, payload"
		m.ack[1] = "DELETE FROM " + table + " WHERE id = $1 AND locked_until = $2"
		if batch > 1 {
			m.ack[1] = "DELETE FROM " + table + " WHERE id = ANY($1) AND locked_until = $2"
		}
	case "mysql":
		m.claim = "SELECT id, attempt, payload FROM " + table + " WHERE locked_until IS NULL OR locked_until < ? ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
		for k := 1; k <= batch; k++ {
			m.mark[k] = "UPDATE " + table + " SET locked_until = ?, attempt = attempt + 1 WHERE id IN (" + in(k) + ")"
			m.ack[k] = "DELETE FROM " + table + " WHERE id IN (" + in(k) + ") AND locked_until = ?"
		}
	default:
		// No SKIP LOCKED: the write lock serializes claims.
		m.claim = "UPDATE " + table + " SET locked_until = ?, attempt = attempt + 1 WHERE id " + pick("?", "") + " RETURNING id, attempt, payload"
		for k := 1; k <= batch; k++ {
			m.ack[k] = "DELETE FROM " + table + " WHERE id IN (" + in(k) + ") AND locked_until = ?"
		}
	}
	return m
}

// minimalTable (re)creates the table of the SQLite minimal lease, whose
// lease is an integer; the other engines use createTable's.
func minimalTable(ctx context.Context, db *sql.DB, table string) error {
	for _, s := range []string{"DROP TABLE IF EXISTS " + table,
		"CREATE TABLE " + table + " (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1, locked_until INTEGER, payload BLOB NOT NULL)"} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func (m *minimalLease) round(ctx context.Context) (int, error) {
	now := time.Now().UTC().Truncate(time.Microsecond)
	until := now.Add(30 * time.Second)
	// The token and the clock as the engine compares them.
	var tok, cmp any = until, now
	switch m.e.family {
	case "mysql":
		tok, cmp = until.Format("2006-01-02 15:04:05.000000"), now.Format("2006-01-02 15:04:05.000000")
	case "sqlite":
		tok, cmp = until.UnixMicro(), now.UnixMicro()
	}
	var ids []int64
	var err error
	if m.e.family == "mysql" {
		for try := 0; ; try++ {
			ids, err = m.claimMySQL(ctx, tok, cmp)
			if err == nil || try == 10 || !strings.Contains(err.Error(), "Error 1213") {
				break
			}
		}
	} else {
		ids, err = m.claimReturning(ctx, tok, cmp)
	}
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	var res sql.Result
	switch {
	case m.e.family == "postgres" && m.batch > 1:
		var arr any = ids // pgx takes a slice
		if m.e.driver == "postgres" {
			arr = pq.Array(ids)
		}
		res, err = m.db.ExecContext(ctx, m.ack[1], arr, tok)
	case m.e.family == "postgres":
		res, err = m.db.ExecContext(ctx, m.ack[1], ids[0], tok)
	default:
		args := make([]any, 0, len(ids)+1)
		for _, id := range ids {
			args = append(args, id)
		}
		args = append(args, tok)
		// InnoDB picks deadlock victims among acks too: sent again.
		for try := 0; ; try++ {
			res, err = m.db.ExecContext(ctx, m.ack[len(ids)], args...)
			if err == nil || try == 10 || !strings.Contains(err.Error(), "Error 1213") {
				break
			}
		}
	}
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(ids)) {
		return 0, fmt.Errorf("acked %d of %d jobs (%v)", n, len(ids), err)
	}
	return len(ids), nil
}

func (m *minimalLease) claimReturning(ctx context.Context, tok, cmp any) ([]int64, error) {
	rows, err := m.db.QueryContext(ctx, m.claim, tok, cmp)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ids := make([]int64, 0, m.batch)
	for rows.Next() {
		var id, attempt int64
		var p []byte
		if err := rows.Scan(&id, &attempt, &p); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

func (m *minimalLease) claimMySQL(ctx context.Context, tok, cmp any) ([]int64, error) {
	tx, err := m.db.BeginTx(ctx, handTx())
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, m.claim, cmp, m.batch)
	if err != nil {
		return nil, err
	}
	ids := make([]int64, 0, m.batch)
	for rows.Next() {
		var id, attempt int64
		var p []byte
		if err := rows.Scan(&id, &attempt, &p); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(ids) == 0 {
		return nil, err
	}
	args := make([]any, 0, len(ids)+1)
	args = append(args, tok)
	for _, id := range ids {
		args = append(args, id)
	}
	if _, err := tx.ExecContext(ctx, m.mark[len(ids)], args...); err != nil {
		return nil, err
	}
	return ids, tx.Commit()
}

func (m *minimalLease) close() {}
