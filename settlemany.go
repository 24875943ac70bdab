package inbox

import (
	"context"
	"database/sql"
	"github.com/sqlinbox/inbox/dialect"
	"time"
)

// settleMany settles the lease tokens toks, which share outcome o and delay
// after, in one statement of set (built for at least len(toks) tokens, the
// last token filling the places past them), and returns each token's
// verdict: nil, ErrLeaseLost, or the error that failed the whole batch. A
// batch chosen as a deadlock's victim changed nothing and is sent again.
func (q *Queue) settleMany(ctx context.Context, set *dialect.BatchStatements, o outcome, after time.Duration, toks []token) []error {
	errs := make([]error, len(toks))
	_ = q.retryDeadlock(func() error {
		q.settleManyOnce(ctx, set, o, after, toks, errs)
		for _, err := range errs {
			if err == nil || !q.deadlock(err) {
				return nil
			}
		}
		return errs[0]
	})
	return errs
}

func (q *Queue) settleManyOnce(ctx context.Context, set *dialect.BatchStatements, o outcome, after time.Duration, toks []token, errs []error) {
	s := set.Ack
	switch o {
	case outRetry:
		s = set.Retry
	case outRelease:
		s = set.Release
	}
	v := values{tokens: toks, micros: after.Microseconds()}
	if err := q.fillTimes(ctx, q.db, s, &v, after); err != nil {
		fill(errs, err)
		return
	}
	if s.Rows {
		// RETURNING names the rows settled: the others lost their lease.
		fill(errs, ErrLeaseLost)
		rows, err := q.query(ctx, q.db, s, &v)
		if err == nil {
			err = markReturned(rows, toks, errs)
		}
		if err != nil {
			fill(errs, err)
		}
		return
	}
	// The statement cannot say which rows it changed. A lone Ack or Release
	// needs no more than its rows affected, as these writes always change
	// the row they match (a Retry may write the expiry the row holds, which
	// MySQL counts as no change).
	if len(toks) == 1 && o != outRetry {
		n, err := q.exec(ctx, q.db, s, &v)
		if err == nil && n == 0 {
			err = ErrLeaseLost
		}
		fill(errs, err)
		return
	}
	q.settleManyLocked(ctx, set, s, &v, toks, errs)
}

// settleManyLocked runs s in a transaction; when it changed fewer rows than
// there are tokens, it rolls back, and in a new transaction locks the rows
// still carrying their tokens (set.Lock), which names them, then runs s
// again under those locks.
func (q *Queue) settleManyLocked(ctx context.Context, set *dialect.BatchStatements, s dialect.Stmt, v *values, toks []token, errs []error) {
	var n int64
	q.warm(ctx, s, set.Lock)
	err := q.inTx(ctx, func(tx Executor) (bool, error) {
		var err error
		n, err = q.exec(ctx, tx, s, v)
		return err == nil && n == int64(len(toks)), err
	})
	if err != nil || n == int64(len(toks)) {
		fill(errs, err)
		return
	}
	fill(errs, ErrLeaseLost)
	err = q.inTx(ctx, func(tx Executor) (bool, error) {
		rows, err := q.query(ctx, tx, set.Lock, v)
		if err == nil {
			err = markReturned(rows, toks, errs)
		}
		if err == nil {
			_, err = q.exec(ctx, tx, s, v)
		}
		return err == nil, err
	})
	if err != nil {
		fill(errs, err)
	}
}

// inTx runs f in a transaction on q's pool, committing when f says so and
// rolling back otherwise.
func (q *Queue) inTx(ctx context.Context, f func(tx Executor) (commit bool, err error)) error {
	tx, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	commit, err := f(q.own(tx))
	if err != nil || !commit {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// markReturned reads the ids rows returns and clears the errors of the
// tokens they name.
func markReturned(rows *sql.Rows, toks []token, errs []error) error {
	defer rows.Close()
	// A claim's hundreds of tokens are found through a map: a scan of all
	// of them per row returned was the Batcher's largest cost at 256.
	var at map[any]int // id -> its first token's index + 1
	var next []int     // token index -> the next token of its id's index + 1
	if len(toks) > smallSet {
		at, next = make(map[any]int, len(toks)), make([]int, len(toks))
		for i := len(toks) - 1; i >= 0; i-- {
			next[i] = at[toks[i].id]
			at[toks[i].id] = i + 1
		}
	}
	for rows.Next() {
		var id any
		if err := rows.Scan(&id); err != nil {
			return err
		}
		id = normID(id)
		if at == nil {
			for i, t := range toks {
				if t.id == id {
					errs[i] = nil
				}
			}
			continue
		}
		for i := at[id]; i != 0; i = next[i-1] {
			errs[i-1] = nil
		}
	}
	return rows.Err()
}

func fill(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}
