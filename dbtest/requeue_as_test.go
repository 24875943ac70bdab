package dbtest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sqlinbox/inbox"
)

// TestRequeueDeadAs: on a table whose ids the caller gives (no default),
// RequeueDead cannot give the job a new id: ErrRequeueNeedsID, nothing
// changed. RequeueDeadAs requeues it under the caller's new id, refusing
// (and changing nothing) a dead job's id, the job's own included, and an
// id in the queue table. Before, RequeueDead failed with the driver's
// error alone (MariaDB's 1364), naming no way out.
func TestRequeueDeadAs(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		decls := []string{"text PRIMARY KEY"}
		switch {
		case e.IsMySQL():
			decls = []string{"varchar(36) PRIMARY KEY"}
		case e.IsSQLite():
			// A TEXT key may be NULL in SQLite unless declared NOT NULL:
			// the insert then succeeds with no id (ErrIDNotReturned too).
			decls = []string{"TEXT PRIMARY KEY NOT NULL", "TEXT PRIMARY KEY"}
		}
		for i, decl := range decls {
			requeueAs(t, e, decl, i)
		}
	})
}

func requeueAs(t *testing.T, e Engine, idDecl string, n int) {
	ctx := context.Background()
	db := e.Open(t, 4)
	table := serverIDTable(t, e, db, "givenid"+strings.Repeat("x", n), idDecl, strings.Fields(idDecl)[0])
	q := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
	enqueue := func(id string) {
		t.Helper()
		if got, err := q.Enqueue(ctx, db, inbox.Job{ID: id, Data: []any{[]byte("payload of " + id)}}); err != nil || got != id {
			t.Fatalf("Enqueue(%s) = %v, %v", id, got, err)
		}
	}
	enqueue("job-1")
	d := claimOne(t, q)
	if err := d.Dead(ctx); err != nil {
		t.Fatal(err)
	}
	enqueue("job-2")
	// refused runs call, which must fail (with want, where not nil: a
	// duplicate key is the driver's error) and change neither table.
	refused := func(what string, want error, call func() error) {
		t.Helper()
		jobs, dead := dumpRows(t, db, table), dumpRows(t, db, table+"_dead")
		err := call()
		if err == nil || want != nil && !errors.Is(err, want) {
			t.Errorf("%s: %s = %v, want %v", idDecl, what, err, want)
		}
		if after := dumpRows(t, db, table); strings.Join(after, "\n") != strings.Join(jobs, "\n") {
			t.Errorf("%s: %s changed the queue table: %q, was %q", idDecl, what, after, jobs)
		}
		if after := dumpRows(t, db, table+"_dead"); strings.Join(after, "\n") != strings.Join(dead, "\n") {
			t.Errorf("%s: %s changed the dead table: %q, was %q", idDecl, what, after, dead)
		}
	}
	refused("RequeueDead", inbox.ErrRequeueNeedsID, func() error { _, err := q.RequeueDead(ctx, "job-1"); return err })
	refused("RequeueDeadAs its own id", inbox.ErrDeadID, func() error { return q.RequeueDeadAs(ctx, "job-1", "job-1") })
	refused("RequeueDeadAs a queued job's id", nil, func() error { return q.RequeueDeadAs(ctx, "job-1", "job-2") })
	refused("RequeueDeadAs no id", nil, func() error { return q.RequeueDeadAs(ctx, "job-1", nil) })
	if n := countRows(t, db, table+"_dead"); n != 1 {
		t.Fatalf("%s: %d dead rows, want job-1's", idDecl, n)
	}
	if err := q.RequeueDeadAs(ctx, "job-1", "job-1-again"); err != nil {
		t.Fatalf("%s: RequeueDeadAs: %v", idDecl, err)
	}
	if err := q.RequeueDeadAs(ctx, "job-1", "job-1-twice"); !errors.Is(err, inbox.ErrNotDead) {
		t.Errorf("%s: a second RequeueDeadAs = %v, want ErrNotDead", idDecl, err)
	}
	ds, err := q.Claim(ctx, 10)
	if err != nil || len(ds) != 2 {
		t.Fatalf("%s: claimed %d jobs, %v; want 2", idDecl, len(ds), err)
	}
	got := map[any]string{}
	for _, d := range ds {
		got[d.ID()] = payloadOf(t, d)
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got["job-1-again"] != "payload of job-1" || got["job-2"] != "payload of job-2" {
		t.Errorf("%s: claimed %v, want job-1's payload under job-1-again and job-2", idDecl, got)
	}
	mustBeIdle(t, db, q)
}
