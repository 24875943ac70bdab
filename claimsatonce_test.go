package inbox_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakedb"
)

// TestClaimsAtOnce: with Config.ClaimsAtOnce 2, a third Claim sends nothing
// while two are held at the database, waiting its turn in Go, and claims
// once one of them ends; a Claim whose context ends while it waits returns
// the context's error, having sent nothing.
func TestClaimsAtOnce(t *testing.T) {
	f := fakedb.NewLease()
	proceed := make(chan struct{})
	var atDB, sent atomic.Int32
	f.Seen = func(query string, _ []driver.NamedValue) {
		if !strings.HasPrefix(query, "WITH picked") {
			return
		}
		sent.Add(1)
		atDB.Add(1)
		<-proceed
		atDB.Add(-1)
	}
	q, err := inbox.New(f.DB(t).DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}, ClaimsAtOnce: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	done := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			_, err := q.Claim(ctx, 1)
			done <- err
		}()
	}
	within(t, "two claims at the database and one waiting its turn", func() bool {
		return atDB.Load() == 2 && waitingForTurn() == 1
	})
	cctx, cancel := context.WithCancel(ctx)
	late := make(chan error, 1)
	go func() {
		_, err := q.Claim(cctx, 1)
		late <- err
	}()
	within(t, "a fourth claim waiting its turn", func() bool { return waitingForTurn() == 2 })
	cancel()
	if err := <-late; !errors.Is(err, context.Canceled) {
		t.Errorf("Claim whose context ended while it waited = %v, want context.Canceled", err)
	}
	if n := sent.Load(); n != 2 {
		t.Errorf("%d claims sent while two were held, want 2", n)
	}
	proceed <- struct{}{}
	within(t, "the waiting claim at the database", func() bool { return sent.Load() == 3 })
	close(proceed)
	for i := 0; i < 3; i++ {
		if err := <-done; err != nil {
			t.Errorf("Claim: %v", err)
		}
	}
	if _, err := inbox.New(f.DB(t).DB, inbox.Config{Dialect: inbox.Postgres, Table: inbox.Table{Name: "jobs", LockedUntil: "locked_until"}, ClaimsAtOnce: -1}); err == nil || !strings.Contains(err.Error(), "Config.ClaimsAtOnce -1") {
		t.Errorf("New with ClaimsAtOnce -1 = %v, want an error naming it", err)
	}
}

// waitingForTurn counts the goroutines waiting for a place to claim.
func waitingForTurn() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "(*Queue).waitClaimTurn")
}

// within polls cond until it holds, failing the test after a minute.
func within(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
