package dbtest

// Worker processes of the crash and load tests: the test binary runs
// again as a child in a role (INBOX_CHILD), which the tests kill.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/child"
)

// realLease is the real lease of the crash and load tests' lease form:
// short, so that a killed holder's jobs come back soon.
const realLease = 2 * time.Second

// childConfig is what a worker process is told, as JSON in
// INBOX_CHILD_CONFIG.
type childConfig struct {
	Engine  string        // Engine.Name
	DSN     string        // the data source, the SQLite file's included
	Table   string        // the queue table, made by Engine.CreateTable
	Form    string        // as for Table()
	Lease   time.Duration // lease form
	Effects string        // row lock: a table the handler writes through Delivery.Tx
	Ledger  string        // load: the ledger file
	Workers int           // load: goroutines
	Batch   int           // load: most jobs per claim
	Conns   int           // pool size
	Keep    bool          // lease: run a keeper per delivery
	Hold    int           // load: > 0 blocks the Hold-th delivery and every later one until killed
}

// childMain runs a worker role and returns the process's exit code.
func childMain(role string) int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv("INBOX_CHILD_CONFIG")), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child: INBOX_CHILD_CONFIG:", err)
		return 2
	}
	var err error
	switch role {
	case "crash":
		err = childHold(cfg)
	case "load":
		err = childLoad(cfg)
	default:
		err = fmt.Errorf("unknown INBOX_CHILD role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "child %s (pid %d): %v\n", role, os.Getpid(), err)
		return 2
	}
	return 0
}

// childQueue opens the child's database and queue.
func childQueue(cfg childConfig) (*sql.DB, *inbox.Queue, Engine, error) {
	e, err := engineNamed(cfg.Engine)
	if err != nil {
		return nil, nil, e, err
	}
	db, err := sql.Open(e.Driver, cfg.DSN)
	if err != nil {
		return nil, nil, e, err
	}
	db.SetMaxOpenConns(cfg.Conns)
	db.SetMaxIdleConns(cfg.Conns)
	q, err := inbox.New(db, formConfig(e, cfg.Table, cfg.Form, cfg.Lease))
	if err != nil {
		db.Close()
		return nil, nil, e, err
	}
	return db, q, e, nil
}

// childHold claims one job, writes through its transaction when the form
// has one, runs a keeper under the lease, tells the parent on stdout and
// blocks until killed. It returns only if stdin closes first (the parent
// went away), so that no orphan lingers.
func childHold(cfg childConfig) error {
	db, q, e, err := childQueue(cfg)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var d *inbox.Delivery
	for d == nil {
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			return err
		}
		if len(ds) == 1 {
			d = ds[0]
		} else if ctx.Err() != nil {
			return errors.New("no job to claim")
		} else {
			time.Sleep(10 * time.Millisecond)
		}
	}
	session := "-"
	if tx := d.Tx(); tx != nil {
		if _, err := tx.ExecContext(ctx, bind(e, "INSERT INTO "+cfg.Effects+" (job_id, note) VALUES (?, 'child')"), d.ID()); err != nil {
			return err
		}
		if session, err = sessionID(ctx, e, tx); err != nil {
			return err
		}
	}
	_, stop := d.Keep(context.Background())
	defer stop()
	fmt.Printf("CLAIMED %v %d %s\n", d.ID(), d.Attempt(), session)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return errors.New("stdin closed before the parent killed this process")
}

// childProc is a running worker process.
type childProc = child.Proc

// startChild starts the test binary as a worker in role. The process is
// killed, if still running, when the test ends.
func startChild(t testing.TB, name, role string, cfg childConfig) *childProc {
	t.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return child.Start(t, name, nil, "INBOX_CHILD="+role, "INBOX_CHILD_CONFIG="+string(js))
}
