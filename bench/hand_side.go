package main

// The hand-written baselines: for each form, the minimal SQL a careful
// programmer would write with database/sql for the same work as inbox
// does (claim up to batch jobs, read the payload, acknowledge with the same
// checks), with the same pool. Statements for a given batch size are built
// once, like inbox's. Time parameters are what the engine compares with its
// column: time.Time on Postgres, text elsewhere.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
)

// newHandSide returns the hand-written side of a form on an engine.
func newHandSide(e engine, db *sql.DB, table, form string, batch int) (side, error) {
	switch form {
	case "lease", "lease-async", "lease-shallow":
		if baseline == "minimal" {
			return newMinimalLease(e, db, table, batch), nil
		}
		return newLeaseHand(e, db, table, batch), nil
	case "rowlock":
		if e.family == "sqlite" {
			return nil, errors.New("SQLite has no row locks")
		}
		return &rowLockHand{e: e, db: db, table: table, batch: batch, pool: newPool(db)}, nil
	case "advisory":
		return &advisoryHand{e: e, db: db, table: table, batch: batch, pool: newPool(db), keys: map[int64]bool{}}, nil
	}
	return nil, fmt.Errorf("unknown form %q", form)
}

// mark returns the n-th placeholder of the engine.
func mark(e engine, n int) string {
	if e.family == "postgres" {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// tokens writes the token test of k jobs from placeholder first on:
// (id, attempt, locked_until) IN ((…), …) on Postgres and MySQL, which both
// plan as primary-key probes; SQLite gets an OR of conditions, as its
// planner scans the table for a row-value IN.
func tokens(e engine, k, first int) string {
	var b strings.Builder
	n := first
	if e.family == "sqlite" {
		for i := 0; i < k; i++ {
			if i > 0 {
				b.WriteString(" OR ")
			}
			fmt.Fprintf(&b, "(id = %s AND attempt = %s AND locked_until = %s)", mark(e, n), mark(e, n+1), mark(e, n+2))
			n += 3
		}
		return b.String()
	}
	b.WriteString("(id, attempt, locked_until) IN (")
	for i := 0; i < k; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%s, %s, %s)", mark(e, n), mark(e, n+1), mark(e, n+2))
		n += 3
	}
	b.WriteString(")")
	return b.String()
}

// leaseHand: one claim statement per round (MySQL: a locking SELECT and
// one UPDATE in a READ COMMITTED transaction), one ack statement per round.
type leaseHand struct {
	e     engine
	db    *sql.DB
	batch int
	claim string
	mark  []string // MySQL: the UPDATE of k claimed ids, by k
	ack   []string // by number of jobs
}

func newLeaseHand(e engine, db *sql.DB, table string, batch int) *leaseHand {
	h := &leaseHand{e: e, db: db, batch: batch}
	switch e.family {
	case "postgres":
		h.claim = "WITH picked AS MATERIALIZED (SELECT id FROM " + table +
			" WHERE locked_until IS NULL OR locked_until <= now() ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)" +
			" UPDATE " + table + " AS j SET attempt = j.attempt + 1, locked_until = now() + interval '30 seconds'" +
			" FROM picked WHERE j.id = picked.id RETURNING j.id, j.attempt, j.locked_until, j.payload"
	case "mysql":
		// The expiry comes back with the rows, as text, read from the
		// engine's clock in the same round trip.
		h.claim = "SELECT id, attempt, payload, DATE_FORMAT(UTC_TIMESTAMP(6) + INTERVAL 30 SECOND, '%Y-%m-%d %H:%i:%s.%f') FROM " + table +
			" WHERE locked_until IS NULL OR locked_until <= UTC_TIMESTAMP(6) ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
		h.mark = make([]string, batch+1)
		for k := 1; k <= batch; k++ {
			h.mark[k] = "UPDATE " + table + " SET attempt = attempt + 1, locked_until = ? WHERE id IN (" +
				strings.TrimSuffix(strings.Repeat("?, ", k), ", ") + ")"
		}
	default:
		h.claim = "UPDATE " + table + " SET attempt = attempt + 1, locked_until = ? WHERE id IN (SELECT id FROM " + table +
			" WHERE locked_until IS NULL OR locked_until <= ? ORDER BY id LIMIT ?) RETURNING id, attempt, locked_until, payload"
	}
	h.ack = make([]string, batch+1)
	for k := 1; k <= batch; k++ {
		if k == 1 {
			h.ack[k] = "DELETE FROM " + table + " WHERE id = " + mark(e, 1) + " AND attempt = " + mark(e, 2) + " AND locked_until = " + mark(e, 3)
		} else {
			h.ack[k] = "DELETE FROM " + table + " WHERE " + tokens(e, k, 1)
		}
	}
	return h
}

// leaseJob is a claimed job's token.
type leaseJob struct {
	id, attempt int64 // attempt as stored
	until       any   // the expiry as the engine compares it
	payload     []byte
}

func (h *leaseHand) round(ctx context.Context) (int, error) {
	jobs := make([]leaseJob, 0, h.batch)
	var err error
	switch h.e.family {
	case "postgres":
		jobs, err = h.claimReturning(ctx, jobs, h.batch)
	case "mysql":
		// InnoDB picks deadlock victims now and then under many workers, as
		// inbox's claim sends its victims again, so does this one.
		for try := 0; ; try++ {
			jobs, err = h.claimMySQL(ctx, jobs[:0])
			if err == nil || try == 10 || !strings.Contains(err.Error(), "Error 1213") {
				break
			}
		}
	default:
		now := time.Now().UTC()
		jobs, err = h.claimReturning(ctx, jobs, now.Add(30*time.Second).Format(inbox.SQLiteTimeFormat), now.Format(inbox.SQLiteTimeFormat), h.batch)
	}
	if err != nil || len(jobs) == 0 {
		return 0, err
	}
	args := make([]any, 0, 3*len(jobs))
	for _, j := range jobs {
		args = append(args, j.id, j.attempt, j.until)
	}
	res, err := h.db.ExecContext(ctx, h.ack[len(jobs)], args...)
	if err != nil {
		return 0, err
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(jobs)) {
		return 0, fmt.Errorf("acked %d of %d jobs (%v)", n, len(jobs), err)
	}
	return len(jobs), nil
}

func (h *leaseHand) claimReturning(ctx context.Context, jobs []leaseJob, args ...any) ([]leaseJob, error) {
	rows, err := h.db.QueryContext(ctx, h.claim, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var j leaseJob
		if h.e.family == "postgres" {
			var t time.Time
			err = rows.Scan(&j.id, &j.attempt, &t, &j.payload)
			j.until = t
		} else {
			var s string
			err = rows.Scan(&j.id, &j.attempt, &s, &j.payload)
			j.until = s
		}
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, j)
	}
	return jobs, rows.Err()
}

func (h *leaseHand) claimMySQL(ctx context.Context, jobs []leaseJob) ([]leaseJob, error) {
	tx, err := h.db.BeginTx(ctx, handTx())
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, h.claim, h.batch)
	if err != nil {
		return nil, err
	}
	var until string
	for rows.Next() {
		var j leaseJob
		if err := rows.Scan(&j.id, &j.attempt, &j.payload, &until); err != nil {
			rows.Close()
			return nil, err
		}
		j.attempt++
		j.until = until
		jobs = append(jobs, j)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(jobs) == 0 {
		return nil, err
	}
	args := make([]any, 0, len(jobs)+1)
	args = append(args, until)
	for _, j := range jobs {
		args = append(args, j.id)
	}
	if _, err := tx.ExecContext(ctx, h.mark[len(jobs)], args...); err != nil {
		return nil, err
	}
	return jobs, tx.Commit()
}

func (h *leaseHand) close() {}

// pool counts the connections held by jobs in work, leaving the pool's last
// one free, as inbox does: a round takes fewer jobs rather than wait.
type pool struct {
	max int
	mu  sync.Mutex
	n   int
}

func newPool(db *sql.DB) *pool { return &pool{max: db.Stats().MaxOpenConnections} }

func (p *pool) reserve(want int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.max > 0 && p.n+want > p.max-1 {
		want = max(p.max-1-p.n, 0)
	}
	p.n += want
	return want
}

func (p *pool) unreserve(n int) {
	p.mu.Lock()
	p.n -= n
	p.mu.Unlock()
}

// rowLockHand: one READ COMMITTED transaction per job, holding the row by
// FOR UPDATE SKIP LOCKED, the attempt counted inside it, committed by the
// acknowledgement.
type rowLockHand struct {
	e     engine
	db    *sql.DB
	table string
	batch int
	pool  *pool
}

type heldJob struct {
	tx      *sql.Tx
	conn    *sql.Conn
	id      int64
	attempt int64 // as stored
	payload []byte
}

func (h *rowLockHand) round(ctx context.Context) (int, error) {
	got := h.pool.reserve(h.batch)
	defer func() { h.pool.unreserve(got) }()
	jobs := make([]heldJob, 0, got)
	defer func() {
		for _, j := range jobs {
			if j.tx != nil {
				j.tx.Rollback()
			}
		}
	}()
	for len(jobs) < got {
		tx, err := h.db.BeginTx(ctx, handTx())
		if err != nil {
			return 0, err
		}
		j := heldJob{tx: tx}
		if h.e.family == "postgres" {
			err = tx.QueryRowContext(ctx, "UPDATE "+h.table+" SET attempt = attempt + 1 WHERE id = (SELECT id FROM "+h.table+
				" ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id, attempt, payload").Scan(&j.id, &j.attempt, &j.payload)
		} else {
			err = tx.QueryRowContext(ctx, "SELECT id, attempt, payload FROM "+h.table+" ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED").Scan(&j.id, &j.attempt, &j.payload)
			if err == nil {
				_, err = tx.ExecContext(ctx, "UPDATE "+h.table+" SET attempt = attempt + 1 WHERE id = ?", j.id)
			}
		}
		if err != nil {
			tx.Rollback()
			if errors.Is(err, sql.ErrNoRows) {
				break
			}
			return 0, err
		}
		jobs = append(jobs, j)
	}
	done := 0
	for i := range jobs {
		j := &jobs[i]
		if _, err := j.tx.ExecContext(ctx, "DELETE FROM "+h.table+" WHERE id = "+mark(h.e, 1), j.id); err != nil {
			return done, err
		}
		err := j.tx.Commit()
		j.tx = nil
		if err != nil {
			return done, err
		}
		done++
	}
	return done, nil
}

func (h *rowLockHand) close() {}

// advisoryHand: candidates read without locks, each locked by one call
// from Go on a pinned connection (Postgres pg_try_advisory_lock, MySQL
// GET_LOCK; SQLite: the process's own set alone), re-read and its attempt
// counted; the acknowledgement deletes where the attempt still matches,
// then unlocks. Keys in work are kept in the process, as inbox keeps them,
// so that workers do not try each other's.
type advisoryHand struct {
	e     engine
	db    *sql.DB
	table string
	batch int
	pool  *pool
	mu    sync.Mutex
	keys  map[int64]bool
}

func (h *advisoryHand) take(id int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys[id] {
		return false
	}
	h.keys[id] = true
	return true
}

func (h *advisoryHand) drop(id int64) {
	h.mu.Lock()
	delete(h.keys, id)
	h.mu.Unlock()
}

func (h *advisoryHand) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.keys)
}

func (h *advisoryHand) lock(ctx context.Context, conn *sql.Conn, id int64) (bool, error) {
	key := strconv.FormatInt(id, 10)
	switch h.e.family {
	case "postgres":
		var ok bool
		err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1)", inbox.PostgresLockKey(h.table, key)).Scan(&ok)
		return ok, err
	default:
		var ok int64
		err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", inbox.MySQLLockName(h.table, key)).Scan(&ok)
		return ok == 1, err
	}
}

func (h *advisoryHand) unlock(ctx context.Context, conn *sql.Conn, id int64) error {
	key := strconv.FormatInt(id, 10)
	var err error
	switch h.e.family {
	case "postgres":
		_, err = conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", inbox.PostgresLockKey(h.table, key))
	default:
		_, err = conn.ExecContext(ctx, "SELECT RELEASE_LOCK(?)", inbox.MySQLLockName(h.table, key))
	}
	return err
}

// release lets a job go: unlock (or discard the session), drop the key.
func (h *advisoryHand) release(ctx context.Context, j *heldJob) {
	if j.conn != nil {
		if err := h.unlock(ctx, j.conn, j.id); err != nil {
			_ = j.conn.Raw(func(any) error { return errors.New("discard") })
		}
		j.conn.Close()
		j.conn = nil
	}
	h.drop(j.id)
}

func (h *advisoryHand) round(ctx context.Context) (int, error) {
	sqlite := h.e.family == "sqlite"
	got := h.batch
	if !sqlite {
		got = h.pool.reserve(h.batch)
		defer func() { h.pool.unreserve(got) }()
	}
	if got == 0 {
		return 0, nil
	}
	rows, err := h.db.QueryContext(ctx, "SELECT id FROM "+h.table+" ORDER BY id LIMIT "+mark(h.e, 1), 2*got+h.held()+8)
	if err != nil {
		return 0, err
	}
	var cands []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return 0, err
		}
		cands = append(cands, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	jobs := make([]heldJob, 0, got)
	defer func() {
		for i := range jobs {
			if jobs[i].id != 0 {
				h.release(ctx, &jobs[i])
			}
		}
	}()
	for _, id := range cands {
		if len(jobs) == got {
			break
		}
		if !h.take(id) {
			continue
		}
		j := heldJob{id: id}
		var ex interface {
			QueryRowContext(context.Context, string, ...any) *sql.Row
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		} = h.db
		if !sqlite {
			if j.conn, err = h.db.Conn(ctx); err != nil {
				h.drop(id)
				return 0, err
			}
			ok, err := h.lock(ctx, j.conn, id)
			if err != nil || !ok {
				j.conn.Close()
				h.drop(id)
				if err != nil {
					return 0, err
				}
				continue
			}
			ex = j.conn
		}
		// Re-read under the lock: the job may have been settled since.
		if h.e.family == "mysql" {
			err = ex.QueryRowContext(ctx, "SELECT attempt, payload FROM "+h.table+" WHERE id = ?", id).Scan(&j.attempt, &j.payload)
			if err == nil {
				var res sql.Result
				if res, err = ex.ExecContext(ctx, "UPDATE "+h.table+" SET attempt = attempt + 1 WHERE id = ? AND attempt = ?", id, j.attempt); err == nil {
					if n, _ := res.RowsAffected(); n == 0 {
						err = sql.ErrNoRows
					}
				}
				j.attempt++
			}
		} else {
			err = ex.QueryRowContext(ctx, "UPDATE "+h.table+" SET attempt = attempt + 1 WHERE id = "+mark(h.e, 1)+" RETURNING attempt, payload", id).Scan(&j.attempt, &j.payload)
		}
		if err != nil {
			h.release(ctx, &j)
			if errors.Is(err, sql.ErrNoRows) {
				continue
			}
			return 0, err
		}
		jobs = append(jobs, j)
	}
	done := 0
	for i := range jobs {
		j := &jobs[i]
		var ex interface {
			ExecContext(context.Context, string, ...any) (sql.Result, error)
		} = h.db
		if j.conn != nil {
			ex = j.conn
		}
		res, err := ex.ExecContext(ctx, "DELETE FROM "+h.table+" WHERE id = "+mark(h.e, 1)+" AND attempt = "+mark(h.e, 2), j.id, j.attempt)
		if err == nil {
			if n, _ := res.RowsAffected(); n != 1 {
				err = fmt.Errorf("ack of job %d deleted %d rows", j.id, n)
			}
		}
		h.release(ctx, j)
		j.id = 0
		if err != nil {
			return done, err
		}
		done++
	}
	return done, nil
}

func (h *advisoryHand) close() {}
