package main

// Two baselines for -run scale's advisory lines, to tell what the queue
// costs across processes from what the layout costs the machine:
//
//   - advisory-minimal: the hand-written advisory queue of the table line
//     (advisoryHand), each process on its own, as inbox's processes are.
//   - advisory-floor: the same statements a job as that queue, on rows no
//     other worker ever tries: each process takes every P-th id, its
//     workers the next of them in turn. No lock is lost, no candidate
//     read, no row found gone: what P processes of W workers sending a
//     job's round trips get from this machine and server, with no queue
//     to contend on.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
)

// scaleSlotEnv gives a worker process of -run scale its place among the
// run's processes, "index/processes"; the floor partitions the ids by it.
const scaleSlotEnv = "INBOX_BENCH_SCALE_SLOT"

// parseScaleSlot reads "index/processes".
func parseScaleSlot(s string) (index, procs int, err error) {
	i, n, ok := strings.Cut(s, "/")
	index, err1 := strconv.Atoi(i)
	procs, err2 := strconv.Atoi(n)
	if !ok || err1 != nil || err2 != nil || procs <= 0 || index < 0 || index >= procs {
		return 0, 0, fmt.Errorf("%s=%q: want index/processes, such as 0/4", scaleSlotEnv, s)
	}
	return index, procs, nil
}

// floorSide claims ids from its own partition, one job a round: lock the
// key on a connection of its own, count the attempt and read the payload,
// delete the row, unlock, as advisoryHand does once it has its candidate.
type floorSide struct {
	h      *advisoryHand // its lock and unlock
	next   atomic.Int64  // the partition's next id, less stride
	stride int64
}

func newFloorSide(e engine, db *sql.DB, table string, index, procs int) *floorSide {
	f := &floorSide{h: &advisoryHand{e: e, db: db, table: table}, stride: int64(procs)}
	f.next.Store(int64(index+1) - f.stride)
	return f
}

func (f *floorSide) round(ctx context.Context) (int, error) {
	id := f.next.Add(f.stride)
	conn, err := f.h.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ok, err := f.h.lock(ctx, conn, id)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("floor: the key of id %d, in this process's partition alone, was held", id)
	}
	done, err := f.work(ctx, conn, id)
	if uerr := f.h.unlock(ctx, conn, id); err == nil {
		err = uerr
	}
	return done, err
}

// work counts the attempt, reads the payload and deletes the row: 0 jobs
// when the id is not in the table (an id the server skipped).
func (f *floorSide) work(ctx context.Context, conn *sql.Conn, id int64) (int, error) {
	e, table := f.h.e, f.h.table
	var attempt int64
	var payload []byte
	var err error
	if e.family == "mysql" {
		err = conn.QueryRowContext(ctx, "SELECT attempt, payload FROM "+table+" WHERE id = ?", id).Scan(&attempt, &payload)
		if err == nil {
			_, err = conn.ExecContext(ctx, "UPDATE "+table+" SET attempt = attempt + 1 WHERE id = ? AND attempt = ?", id, attempt)
			attempt++
		}
	} else {
		err = conn.QueryRowContext(ctx, "UPDATE "+table+" SET attempt = attempt + 1 WHERE id = $1 RETURNING attempt, payload", id).Scan(&attempt, &payload)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	res, err := conn.ExecContext(ctx, "DELETE FROM "+table+" WHERE id = "+mark(e, 1)+" AND attempt = "+mark(e, 2), id, attempt)
	if err != nil {
		return 0, err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return 0, fmt.Errorf("floor: the ack of job %d deleted %d rows", id, n)
	}
	return 1, nil
}

func (f *floorSide) close() {}

// scaleBaseline reports whether form is one of -run scale's baselines,
// which take no Config.ClaimsAtOnce.
func scaleBaseline(form string) bool { return form == "advisory-minimal" || form == "advisory-floor" }

// newScaleBaseline returns the side of a baseline form of -run scale, or
// nil for inbox's forms.
func newScaleBaseline(e engine, db *sql.DB, table, form string, batch int) (side, error) {
	switch form {
	case "advisory-minimal":
		return newHandSide(e, db, table, "advisory", batch)
	case "advisory-floor":
		if batch != 1 {
			return nil, errors.New("advisory-floor: one job a claim")
		}
		index, procs, err := parseScaleSlot(os.Getenv(scaleSlotEnv))
		if err != nil {
			return nil, err
		}
		return newFloorSide(e, db, table, index, procs), nil
	}
	return nil, nil
}
