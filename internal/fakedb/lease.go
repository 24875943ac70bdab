package fakedb

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Lease answers the lease form's statements of the Postgres dialect from
// memory: a claim returns as many rows as its limit, with ids counting
// from 1, a batch Ack returns the ids of its array (every token matches), a
// plain settlement affects one row. When Block is set, a query (but an
// UPDATE: a lease extension) signals on it and waits for its context to
// end. Seen, when set, is called with each query before it is answered,
// and may hold it. Set the fields before the first statement.
type Lease struct {
	Payload []byte    // every claimed job's payload
	Expiry  time.Time // every claimed job's locked_until
	Block   chan struct{}
	Seen    func(query string, args []driver.NamedValue)

	nextID  atomic.Int64
	queries atomic.Int64
}

// NewLease returns a Lease whose jobs carry 128 bytes and a lease until
// 2030.
func NewLease() *Lease {
	return &Lease{Payload: make([]byte, 128), Expiry: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// DB returns a database answered by f, closed at the test's end, with room
// for 64 idle connections (a benchmark's goroutines do not reconnect).
func (f *Lease) DB(t testing.TB) *DB {
	m := NewAnswering(t, func() Answerer { return &leaseConn{f: f} })
	m.DB.SetMaxIdleConns(64)
	return m
}

// Queries returns how many statements reached f.
func (f *Lease) Queries() int64 { return f.queries.Load() }

// leaseConn answers one connection; its rows are reused, as database/sql
// closes rows before the connection serves another statement, so that a
// benchmark counts the package's allocations and not the fake's.
type leaseConn struct {
	f    *Lease
	rows leaseRows
}

var (
	leaseClaimCols = []string{"id", "attempt", "locked_until", "payload"}
	leaseIDCols    = []string{"id"}
)

func (c *leaseConn) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	c.f.queries.Add(1)
	return driver.RowsAffected(1), nil
}

func (c *leaseConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.f.queries.Add(1)
	if c.f.Seen != nil {
		c.f.Seen(query, args)
	}
	if c.f.Block != nil && !strings.HasPrefix(query, "UPDATE") {
		c.f.Block <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r := &c.rows
	r.f, r.i, r.vals = c.f, 0, r.vals[:0]
	switch {
	case strings.HasPrefix(query, "WITH picked"):
		// The limit is the first integer parameter under either clock
		// (the claim passes it once per branch and once for the union).
		n := 1
		for _, a := range args {
			if v, ok := a.Value.(int64); ok {
				n = int(v)
				break
			}
		}
		r.cols = leaseClaimCols
		for i := 0; i < n; i++ {
			r.vals = append(r.vals, c.f.nextID.Add(1))
		}
	case strings.HasPrefix(query, "DELETE"):
		r.cols = leaseIDCols
		ids, err := BatchIDs(args)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			r.vals = append(r.vals, id)
		}
	default:
		return nil, errors.New("fakedb: Lease cannot answer " + query)
	}
	return r, nil
}

// BatchIDs returns the ids a batch statement of the Postgres dialect
// settles: its first argument, an array literal of integers ("{1,2}").
func BatchIDs(args []driver.NamedValue) ([]int64, error) {
	text, _ := args[0].Value.(string)
	var ids []int64
	for _, id := range strings.Split(strings.Trim(text, "{}"), ",") {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return nil, errors.New("fakedb: not an array of integer ids: " + text)
		}
		ids = append(ids, n)
	}
	return ids, nil
}

type leaseRows struct {
	f    *Lease
	cols []string
	vals []driver.Value
	i    int
}

func (r *leaseRows) Columns() []string { return r.cols }
func (r *leaseRows) Close() error      { return nil }

func (r *leaseRows) Next(dest []driver.Value) error {
	if r.i == len(r.vals) {
		return io.EOF
	}
	dest[0] = r.vals[r.i]
	if len(dest) == 4 {
		dest[1], dest[2], dest[3] = int64(1), r.f.Expiry, r.f.Payload
	}
	r.i++
	return nil
}
