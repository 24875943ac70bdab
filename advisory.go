package inbox

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// claimAdvisory claims up to max jobs whose keys no one holds: candidates are
// read without locks, then each is locked by one call from Go, re-read and its
// attempt counted. A lock function beside a LIMIT in one statement would take
// locks on rows the LIMIT then throws away.
func (q *Queue) claimAdvisory(ctx context.Context, max int) ([]*Delivery, error) {
	got := max
	if q.locker != nil {
		var err error
		if got, err = q.holds.reserve(max); err != nil {
			return nil, err
		}
	}
	ds := make([]*Delivery, 0, got)
	defer func() {
		if q.locker != nil {
			q.holds.unreserve(got - len(ds))
		}
	}()
	if got == 0 {
		return ds, nil
	}
	now, err := q.claimNow(ctx, q.st.Candidates, q.st.Claim, q.st.ClaimSelect)
	if err != nil {
		return ds, err
	}
	// Enough candidates to get past the keys this process holds and a few
	// taken by others.
	v := values{limit: 2*got + q.holdsKeys() + 8, now: now}
	rows, err := q.query(ctx, q.db, q.st.Candidates, &v)
	if err != nil {
		return nil, err
	}
	type candidate struct {
		id  any
		key string
	}
	var cands []candidate
	for rows.Next() {
		var id, key any
		if err := rows.Scan(&id, &key); err != nil {
			rows.Close()
			return nil, err
		}
		cands = append(cands, candidate{normID(id), keyString(key)})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, c := range cands {
		if len(ds) == got {
			break
		}
		d, err := q.lockOne(ctx, c.id, c.key, now)
		if err != nil {
			return ds, err
		}
		if d != nil {
			ds = append(ds, d)
		}
	}
	return ds, nil
}

func (q *Queue) holdsKeys() int {
	q.holds.mu.Lock()
	defer q.holds.mu.Unlock()
	return len(q.holds.keys)
}

// keyString turns a key value as a driver returned it into the text locks
// are named by.
func keyString(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// lockOne takes the key of candidate id and claims the row, or returns nil
// when the key is busy or the row was settled since the candidates were read.
func (q *Queue) lockOne(ctx context.Context, id any, key string, now time.Time) (*Delivery, error) {
	setKey := q.lockKey + "\x00" + key
	if !q.holds.takeKey(setKey) {
		return nil, nil
	}
	var conn *sql.Conn
	var ex Executor = q.db
	fail := func(err error) (*Delivery, error) {
		if conn != nil {
			if err2 := q.locker.Unlock(context.WithoutCancel(ctx), conn, q.names.Raw.Name, key); err2 != nil {
				discard(conn)
			} else {
				conn.Close()
			}
		}
		q.holds.dropKey(setKey)
		return nil, err
	}
	if q.locker != nil {
		var err error
		if conn, err = q.db.Conn(ctx); err != nil {
			q.holds.dropKey(setKey)
			return nil, err
		}
		ok, err := q.locker.TryLock(ctx, conn, q.names.Raw.Name, key)
		if err != nil || !ok {
			// A failed lock call leaves the session's state unknown.
			if err != nil {
				discard(conn)
			} else {
				conn.Close()
			}
			q.holds.dropKey(setKey)
			return nil, err
		}
		ex = conn
	}
	// Re-read under the lock: the row may have been settled meanwhile.
	d, err := q.claimOne(ctx, ex, &values{id: id, limit: 1, now: now})
	if err != nil || d == nil {
		return fail(err)
	}
	d.key, d.conn = key, conn
	q.track(d)
	return d, nil
}

// settleAdvisory runs the settlement fenced by the attempt (on the pinned
// connection, or in the caller's transaction), then lets the lock go.
func (d *Delivery) settleAdvisory(ctx context.Context, tx *sql.Tx, o outcome, after time.Duration) error {
	q := d.q
	var ex Executor = q.db
	if d.conn != nil {
		ex = d.conn
	}
	if tx != nil {
		ex = tx
	}
	v := values{id: d.id, attempt: d.attempt, micros: after.Microseconds()}
	var n int64 = 1
	var err error
	switch o {
	case outAck:
		n, err = q.exec(ctx, ex, q.st.Ack, &v)
	case outRelease:
		n, err = q.exec(ctx, ex, q.st.Release, &v)
	case outRetry:
		if after > 0 {
			if clockNeeded(q.st.Retry) {
				var now time.Time
				if now, err = q.readNow(ctx, ex); err != nil {
					return err
				}
				v.now, v.until = now, now.Add(after)
			}
			n, err = q.exec(ctx, ex, q.st.Retry, &v)
		}
	case outDead:
		// One statement (Postgres) is atomic alone: no transaction for it.
		if tx != nil || q.st.DeadDelete.SQL == "" {
			n, err = q.moveDead(ctx, ex, &v)
		} else if d.conn != nil {
			n, err = inTx(ctx, d.conn, func(tx *sql.Tx) (int64, error) { return q.moveDead(ctx, tx, &v) })
		} else {
			n, err = inTx(ctx, q.db, func(tx *sql.Tx) (int64, error) { return q.moveDead(ctx, tx, &v) })
		}
	}
	if err != nil {
		// The lock is let go all the same: a job whose settlement failed is
		// given back rather than held by a worker that has moved on.
		d.unlock(ctx)
		return err
	}
	if err := d.unlock(ctx); err != nil {
		return err
	}
	if n == 0 {
		d.lost = true
		return ErrLeaseLost
	}
	return nil
}

// unlock lets the delivery's key go and returns its connection to the pool,
// or discards the connection when the unlock failed.
func (d *Delivery) unlock(ctx context.Context) error {
	q := d.q
	d.settled = true
	defer q.untrack(d)
	defer q.holds.dropKey(q.lockKey + "\x00" + d.key)
	if d.conn == nil {
		return nil
	}
	conn := d.conn
	d.conn = nil
	defer q.holds.unreserve(1)
	if err := q.locker.Unlock(ctx, conn, q.names.Raw.Name, d.key); err != nil {
		discard(conn)
		return fmt.Errorf("unlocking key %q (connection discarded): %w", d.key, err)
	}
	return conn.Close()
}
