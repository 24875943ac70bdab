package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"time"
)

// ErrNoControlTable is returned by [Queue.Pause] and [Queue.Resume] when
// the description names no Table.ControlTable, where the state is kept.
var ErrNoControlTable = errors.New("inbox: pausing a queue needs Table.ControlTable")

// PauseState is whether a queue is paused, as [Queue.Paused] read it.
type PauseState struct {
	// Paused is true from a [Queue.Pause] to the next [Queue.Resume].
	Paused bool
	// Since is when the queue was paused, by the queue's clock
	// ([Config.Now], or the database's); zero when it runs.
	Since time.Time
	// By is who paused it, as given to Pause; empty when it runs.
	By string
}

// Pause pauses the queue for the loops of package worker in every
// process: they claim nothing from then on until [Queue.Resume], those of
// other processes once they have read the state again (at their next
// fallback interval, Config.Poll), those of this process at once. Jobs in
// work run on and settle as usual. Claim itself does not read the state,
// which would cost a statement per claim: a loop of your own reads
// [Queue.Paused] at its own interval. by names who paused (an operator, a
// deploy), kept with the time; pausing a paused queue keeps the first
// pause's. The state is the row of Table.Name in Table.ControlTable
// ([ErrNoControlTable] without one), written at once, outside any
// transaction.
func (q *Queue) Pause(ctx context.Context, by string) error {
	return q.control(ctx, "pause", q.st.Control.Pause, by)
}

// Resume ends a pause ([Queue.Pause]); resuming a queue that runs does
// nothing. It returns [ErrNoControlTable] without Table.ControlTable.
func (q *Queue) Resume(ctx context.Context) error {
	return q.control(ctx, "resume", q.st.Control.Resume, "")
}

// control sends Pause or Resume, then tells this process's loops.
func (q *Queue) control(ctx context.Context, op string, s dialect.Stmt, by string) error {
	if q.names.ControlTable == "" {
		return opErr(op, ErrNoControlTable)
	}
	v := values{}
	if by != "" {
		v.by = by
	}
	if err := q.fillTimes(ctx, q.db, s, &v, 0); err != nil {
		return opErr(op, err)
	}
	if _, err := q.exec(ctx, q.db, s, &v); err != nil {
		return opErr(op, err)
	}
	q.pauseBell.ring()
	q.bell.ring()
	return nil
}

// Paused reads whether the queue is paused ([Queue.Pause]), in one
// statement. Without Table.ControlTable a queue cannot be paused: it
// reports a queue that runs, and sends nothing.
func (q *Queue) Paused(ctx context.Context) (PauseState, error) {
	var ps PauseState
	if q.names.ControlTable == "" {
		return ps, nil
	}
	var (
		at any
		by sql.NullString
	)
	err := q.queryRow(ctx, q.db, q.st.Control.Read, &values{}).Scan(&at, &by)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return ps, nil
	case err != nil:
		return ps, opErr("paused", err)
	case at == nil:
		return ps, nil
	}
	if ps.Since, err = q.dialect.ScanTime(at); err != nil {
		return PauseState{}, opErr("paused", err)
	}
	ps.Paused, ps.By = true, by.String
	return ps, nil
}

// PauseChanged returns a channel that the next [Queue.Pause] or
// [Queue.Resume] of q's table in this process closes (by any queue on a
// table of the same name), so that a loop holding a state it read need
// not read it again before then, but for other processes' pauses. Pause
// and Resume wake the idle loops too ([Queue.NextWake]).
func (q *Queue) PauseChanged() <-chan struct{} { return q.pauseBell.next() }

// checkControl refuses a control table to a dialect without the
// statements that serve it.
func checkControl(n *dialect.Names, st *Statements) error {
	c := st.Control
	if n.ControlTable != "" && (c.Pause.SQL == "" || c.Resume.SQL == "" || c.Read.SQL == "") {
		return fmt.Errorf("Table.ControlTable %q needs Statements.Control (Pause, Resume and Read), which the dialect leaves empty", n.Raw.ControlTable)
	}
	return nil
}
