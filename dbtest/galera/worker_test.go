package galera

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/dbtest/internal/child"
	"github.com/sqlinbox/inbox/dbtest/internal/cluster"
	"github.com/sqlinbox/inbox/dbtest/internal/ledger"
)

// The workers are the test binary re-executed (TestMain's childEnv switch),
// one process per node and form, connected to that node only. Each writes a
// ledger (internal/ledger's format and Writer) with two more endings than
// the load tests know, as a delivery on a cluster can end in two more ways
// than by an acknowledgement or a killed process:
//
//   - "conflict": the settlement (or the handler's write before it) failed
//     with error 1213. Galera fails the later of two conflicting commits
//     with it (certification), and aborts a local transaction that holds a
//     row a replicated commit must write (a brute-force abort), so the job
//     was settled by a delivery on another node, or (lease) is still held
//     by this one and comes back when its lease runs out.
//   - "nodefail": the node went away under the delivery (the worker is on
//     the node the test kills): the statement failed on a broken or
//     refused connection. A commit in flight may have committed anyway.
//
// and, for the lease form, "lost": the settlement returned ErrLeaseLost.
//
// A worker on a live node that meets any other error ends with it, failing
// the test; one on the killed node counts and reports its errors and goes on
// claiming until the node is back.

// Ledger operations beyond internal/ledger's.
const (
	opConflict = "conflict"
	opNodeFail = "nodefail"
	opLost     = "lost"
)

// childEnv carries a worker's configuration, as JSON.
const childEnv = "INBOX_GALERA_CHILD"

// childConfig is what a worker process is told.
type childConfig struct {
	Role    string        // "worker" (drains until stdin closes) or "holder" (holds one job until told)
	Node    string        // the node's name, written with each effect row
	Form    string        // "lease" or "rowlock"
	DSN     string        // the node
	Table   string        // the queue table
	Effects string        // the effects table, written in each acknowledgement's transaction
	Ledger  string        // the ledger file
	Workers int           // goroutines
	Batch   int           // most jobs per claim
	Lease   time.Duration // lease form
	Victim  bool          // on the node the test kills: errors other than 1213 end a delivery, not the process
	AckRR   bool          // lease: acknowledge in a REPEATABLE READ transaction (see ackTx)
}

// queueConfig describes table in form.
func queueConfig(table, form string, lease time.Duration) inbox.Config {
	cfg := inbox.Config{Dialect: inbox.MySQL, Table: cluster.FormTable(table, form)}
	if form == "lease" {
		cfg.Lease = lease
	}
	return cfg
}

// isConflict reports Galera's (and InnoDB's) deadlock error, 1213.
func isConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1213
}

// childMain runs a worker and returns its exit code.
func childMain() int {
	var cfg childConfig
	if err := json.Unmarshal([]byte(os.Getenv(childEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "child:", childEnv+":", err)
		return 2
	}
	w := &worker{cfg: cfg}
	var err error
	switch cfg.Role {
	case "worker":
		err = w.drain()
	case "holder":
		err = w.hold()
	default:
		err = fmt.Errorf("unknown role %q", cfg.Role)
	}
	fmt.Fprintf(os.Stderr, "STATS %s\n", w.stats())
	if err != nil {
		fmt.Fprintf(os.Stderr, "child %s %s %s (pid %d): %v\n", cfg.Role, cfg.Node, cfg.Form, os.Getpid(), err)
		return 2
	}
	return 0
}

// worker is one process's queue, ledger and counters.
type worker struct {
	cfg    childConfig
	db     *sql.DB
	q      *inbox.Queue
	ledger *ledger.Writer
	insert string

	claims, claimConflicts, claimOther atomic.Int64
	conflicts, nodeFails, losts        atomic.Int64
	errMu                              sync.Mutex
	errShown                           int
}

func (w *worker) stats() string {
	return fmt.Sprintf("claims=%d claim_conflicts=%d claim_other_errors=%d conflicts=%d nodefails=%d lost=%d",
		w.claims.Load(), w.claimConflicts.Load(), w.claimOther.Load(), w.conflicts.Load(), w.nodeFails.Load(), w.losts.Load())
}

// note prints the first few errors of a kind to stderr, for the report.
func (w *worker) note(kind string, err error) {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	if w.errShown < 8 {
		w.errShown++
		fmt.Fprintf(os.Stderr, "%s %s: %v\n", time.Now().UTC().Format("15:04:05.000"), kind, err)
	}
}

func (w *worker) open(conns int) error {
	db, err := sql.Open("mysql", w.cfg.DSN)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	q, err := inbox.New(db, queueConfig(w.cfg.Table, w.cfg.Form, w.cfg.Lease))
	if err != nil {
		db.Close()
		return err
	}
	lw, err := ledger.Create(w.cfg.Ledger)
	if err != nil {
		db.Close()
		return err
	}
	w.db, w.q, w.ledger = db, q, lw
	w.insert = "INSERT INTO " + w.cfg.Effects + " (job_id, attempt, node, claimed_until) VALUES (?, ?, ?, ?)"
	return nil
}

func (w *worker) close() {
	w.ledger.Close()
	w.db.Close()
}

// end writes how a delivery that failed ended and returns that ending, or
// returns the error when no ending explains it (a live node's worker met
// something unexpected).
func (w *worker) end(id int64, attempt int, err error) (string, error) {
	op := ""
	switch {
	// A row-lock Ack that found its row gone lost to another node's
	// commit applied here first: a conflict by another name.
	case isConflict(err), w.cfg.Form == "rowlock" && !w.cfg.Victim && errors.Is(err, inbox.ErrLeaseLost):
		op = opConflict
		w.conflicts.Add(1)
	case w.cfg.Victim && !errors.Is(err, inbox.ErrLeaseLost):
		op = opNodeFail
		w.nodeFails.Add(1)
		w.note("nodefail", err)
	case errors.Is(err, inbox.ErrLeaseLost):
		op = opLost
		w.losts.Add(1)
		w.note("lost", err)
	default:
		return "", fmt.Errorf("job %d attempt %d: %w", id, attempt, err)
	}
	return op, w.ledger.Write(op, id, attempt)
}

// handle runs one delivery: ledger "claim", beforeWork (when not nil), the
// effect row, "ack", the acknowledgement in one transaction with the effect
// row, "acked" (or another ending, which it returns). The effect row of a
// lease delivery carries the expiry its claim wrote (claimed, read before
// any extension), from which the test tells when the job was claimed. Row lock: the effect
// goes through the claim's transaction and Ack commits it. Lease: a
// transaction of the worker's own holds the effect and AckTx. A commit that
// fails with 1213 is not tried again: the delivery stays unsettled (AckTx
// counts only once its transaction commits), and the job comes back when
// its lease runs out, as for any rolled back transaction.
func (w *worker) handle(d *inbox.Delivery, claimed time.Time, beforeWork func()) (string, error) {
	ctx := context.Background()
	var until any // NULL for the row lock
	if !claimed.IsZero() {
		until = claimed.UTC()
	}
	id, ok := d.ID().(int64)
	if !ok {
		return "", fmt.Errorf("job id %v is a %T, want int64", d.ID(), d.ID())
	}
	att := d.Attempt()
	if err := w.ledger.Write(ledger.OpClaim, id, att); err != nil {
		return "", err
	}
	if beforeWork != nil {
		beforeWork()
	}
	if tx := d.Tx(); tx != nil {
		if _, err := tx.ExecContext(ctx, w.insert, id, att, w.cfg.Node, until); err != nil {
			if errors.Is(err, sql.ErrTxDone) {
				// Tx ended the transaction when its savepoint failed (a
				// brute-force abort, the node gone); Ack, sending nothing,
				// returns why.
				return w.end(id, att, d.Ack(ctx))
			}
			_ = d.Release(ctx)
			return w.end(id, att, err)
		}
		if err := w.ledger.Write(ledger.OpAck, id, att); err != nil {
			return "", err
		}
		if err := d.Ack(ctx); err != nil {
			return w.end(id, att, err)
		}
		return ledger.OpAcked, w.ledger.Write(ledger.OpAcked, id, att)
	}
	if err := w.ledger.Write(ledger.OpAck, id, att); err != nil {
		return "", err
	}
	if err := w.ackTx(ctx, d, id, att, until); err != nil {
		return w.end(id, att, err)
	}
	return ledger.OpAcked, w.ledger.Write(ledger.OpAcked, id, att)
}

// ackTx writes the effect row and acknowledges d in one transaction, READ
// COMMITTED unless cfg.AckRR. Under REPEATABLE READ, what db.BeginTx(ctx,
// nil) gives, the token's DELETE, which MariaDB runs as a range scan of
// the (locked_until, id) index, takes gap locks that a replicated claim's
// index insert must wait for, and the applier aborts the transaction
// (1213, a brute-force abort) though no other node claimed the job; the
// worker does not acknowledge it again, and its job comes back only when
// the lease runs out. Measured here: 12 such in 20,000 acknowledgements under
// REPEATABLE READ (INBOX_GALERA_ACK_RR=1), none in 30,000 under READ
// COMMITTED.
func (w *worker) ackTx(ctx context.Context, d *inbox.Delivery, id int64, att int, until any) error {
	opts := &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	if w.cfg.AckRR {
		opts = nil
	}
	tx, err := w.db.BeginTx(ctx, opts)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, w.insert, id, att, w.cfg.Node, until); err != nil {
		return err
	}
	if err := d.AckTx(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}

// drain claims and handles jobs with cfg.Workers goroutines until stdin
// closes.
func (w *worker) drain() error {
	conns := w.cfg.Workers + 1
	if w.cfg.Form == "lease" {
		conns = w.cfg.Workers*2 + 1 // handlers' transactions and keepers' extensions
	}
	if err := w.open(conns); err != nil {
		return err
	}
	defer w.close()
	ctx, cancel := child.StopContext()
	defer cancel()
	var (
		wg      sync.WaitGroup
		fatalMu sync.Mutex
		fatal   error
	)
	fail := func(err error) {
		fatalMu.Lock()
		if fatal == nil {
			fatal = err
		}
		fatalMu.Unlock()
		cancel()
	}
	for range w.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			const minIdle, maxIdle = 5 * time.Millisecond, 100 * time.Millisecond
			idle := minIdle
			for ctx.Err() == nil {
				ds, err := w.q.Claim(ctx, w.cfg.Batch)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					// A failed claim took nothing: count it and go on.
					if isConflict(err) {
						w.claimConflicts.Add(1)
					} else {
						w.claimOther.Add(1)
						w.note("claim", err)
						if !w.cfg.Victim {
							fail(fmt.Errorf("claim on a live node: %w", err))
							return
						}
					}
					time.Sleep(idle)
					idle = min(2*idle, maxIdle)
					continue
				}
				if len(ds) == 0 {
					time.Sleep(idle)
					idle = min(2*idle, maxIdle)
					continue
				}
				idle = minIdle
				w.claims.Add(int64(len(ds)))
				// Every job of the batch is kept from the claim on, not
				// from its turn.
				stops := make([]func(), len(ds))
				claimed := make([]time.Time, len(ds))
				for i, d := range ds {
					claimed[i] = d.Expiry()
					_, stops[i] = d.Keep(context.Background())
				}
				for i, d := range ds {
					_, err := w.handle(d, claimed[i], nil)
					stops[i]()
					if err != nil {
						fail(err)
						for _, s := range stops[i+1:] {
							s()
						}
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	return fatal
}

// hold claims one job, says "HOLDING id attempt" on stdout, keeps it (lease:
// with a keeper) until a line arrives on stdin, then handles it as a worker
// would and says "DONE op", op being the ledger's last word on it.
func (w *worker) hold() error {
	if err := w.open(3); err != nil {
		return err
	}
	defer w.close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var d *inbox.Delivery
	for d == nil {
		ds, err := w.q.Claim(ctx, 1)
		switch {
		case err != nil && isConflict(err):
		case err != nil:
			return err
		case len(ds) == 1:
			d = ds[0]
		case ctx.Err() != nil:
			return errors.New("no job to hold")
		}
		if d == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
	claimed := d.Expiry()
	_, stop := d.Keep(context.Background())
	defer stop()
	in := bufio.NewReader(os.Stdin)
	op, err := w.handle(d, claimed, func() {
		fmt.Printf("HOLDING %v %d\n", d.ID(), d.Attempt())
		_, _ = in.ReadString('\n')
	})
	if err != nil {
		return err
	}
	fmt.Printf("DONE %s\n", op)
	return nil
}

// proc is a running worker process and what it was told.
type proc struct {
	*child.Proc
	cfg childConfig
}

// startProc starts the test binary as a worker. It is killed, if still
// running, when the test ends, and when this process dies (Pdeathsig); it
// also stops by itself when its stdin closes.
func startProc(t testing.TB, name string, cfg childConfig) *proc {
	t.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return &proc{Proc: child.Start(t, name, attr, childEnv+"="+string(js)), cfg: cfg}
}

// stats parses the worker's STATS line.
func (p *proc) stats() map[string]int {
	m := map[string]int{}
	for _, l := range strings.Split(p.Stderr(), "\n") {
		rest, ok := strings.CutPrefix(l, "STATS ")
		if !ok {
			continue
		}
		for _, kv := range strings.Fields(rest) {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			m[k] = n
		}
	}
	return m
}
