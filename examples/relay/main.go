// Command relay moves the jobs of an outbox table to a NATS JetStream
// stream, each exactly once: the application writes a job into the table in
// the same transaction as its business change, and the relay claims batches
// (the lease form), publishes each job with its table's prefix and its id as
// the message's de-duplication id (Nats-Msg-Id) and deletes the jobs only
// after the broker has acked every message. A relay killed between the
// publish and the delete leaves its jobs to the next relay, whose publishes
// the stream drops as duplicates. It is a module of its own: run it from
// examples/relay.
//
//	go run . [-driver pgx|sqlite] [-dsn DSN] [-table outbox]
//	    [-nats nats://127.0.0.1:4222] [-stream OUTBOX] [-create] [-batch 100]
//	    [-workers 2] [-lease 30s] [-poll 25ms] [-msgid-prefix P]
//	    [-nats-reconnects 60] [-nats-reconnect-wait 2s] [-publish-timeout 5s]
//	    [-proof-timeout 5s] [-ack-timeout 5s]
//	go run . bench [-driver pgx|sqlite] [-jobs 20000] [-rate 1000] ...
//
// The first form relays until interrupted; -create makes the table and the
// stream (subjects "<stream>.>") when they are missing. The second measures
// throughput and end-to-end latency on a table and a stream of its own,
// which it deletes afterwards. The DSN defaults to INBOX_POSTGRES_DSN, then
// to a local server's inbox_test database; with -driver sqlite, to
// outbox.db in the working directory.
//
// The relay exits with status 1 when the NATS connection closes for good
// (nats.go gave up after -nats-reconnects attempts -nats-reconnect-wait
// apart; -1 tries forever; the first connection is tried as often), so that
// its supervisor starts it again, and when
// another table's message holds one of its jobs' de-duplication ids (give
// each table its own -msgid-prefix, or leave the default, which the table's
// identity makes unique).
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite"

	"github.com/sqlinbox/inbox"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == "bench" {
		err = benchMain(os.Args[2:])
	} else {
		err = relayMain(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

// options are the flags both forms share.
type options struct {
	driver, dsn, table string
	natsURL, stream    string
	cfg                Config
	lease              time.Duration
	reconnects         int
	reconnectWait      time.Duration
}

func (o *options) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.driver, "driver", "pgx", "database/sql driver: pgx (PostgreSQL) or sqlite (modernc.org/sqlite)")
	fs.StringVar(&o.dsn, "dsn", "", "data source name (default: INBOX_POSTGRES_DSN, then a local server's inbox_test; sqlite: outbox.db)")
	fs.StringVar(&o.natsURL, "nats", defaultNATS(), "NATS server URL (default: INBOX_NATS_URL, then nats://127.0.0.1:4222)")
	fs.IntVar(&o.cfg.Batch, "batch", 100, "jobs per claim")
	fs.IntVar(&o.cfg.Workers, "workers", 2, "claim-publish-ack loops side by side")
	fs.DurationVar(&o.cfg.Poll, "poll", 25*time.Millisecond, "wait after an empty claim")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "lease of a claimed batch: how long a crashed relay's jobs wait")
	fs.StringVar(&o.cfg.MsgIDPrefix, "msgid-prefix", "", "put before each job id to make its de-duplication id (default: a digest of the table's identity)")
	fs.IntVar(&o.reconnects, "nats-reconnects", nats.DefaultMaxReconnect, "reconnect attempts after the NATS connection breaks, then exit 1 (-1: forever)")
	fs.DurationVar(&o.reconnectWait, "nats-reconnect-wait", nats.DefaultReconnectWait, "wait between reconnect attempts")
	fs.DurationVar(&o.cfg.PublishTimeout, "publish-timeout", 5*time.Second, "wait for the broker's ack of each message of a batch")
	fs.DurationVar(&o.cfg.ProofTimeout, "proof-timeout", 5*time.Second, "read the stored messages of a batch's duplicates (all at once) within this")
	fs.DurationVar(&o.cfg.AckTimeout, "ack-timeout", 5*time.Second, "settle a published batch in the table (acks, retries) within this")
}

// connect connects to NATS with the reconnect budget of the flags, the
// first connection included: a broker away at the start is tried as often
// as one lost later (nats.RetryOnFailedConnect), and connect returns once
// the connection is up, or with an error once the budget has run out (or
// when ctx ends).
func (o *options) connect(ctx context.Context) (*nats.Conn, error) {
	nc, err := nats.Connect(o.natsURL, nats.Name("inbox relay"), nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(o.reconnects), nats.ReconnectWait(o.reconnectWait))
	if err != nil {
		return nil, err
	}
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		switch nc.Status() {
		case nats.CONNECTED:
			return nc, nil
		case nats.CLOSED:
			err := nc.LastError()
			nc.Close()
			return nil, fmt.Errorf("no connection to NATS at %s after %d attempts %v apart: %v (%w)",
				o.natsURL, o.reconnects+1, o.reconnectWait, err, ErrClosed)
		}
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, ctx.Err()
		case <-poll.C:
		}
	}
}

func (o *options) fill() {
	if o.dsn == "" {
		o.dsn = defaultDSN(o.driver)
	}
}

func defaultNATS() string {
	if v := os.Getenv("INBOX_NATS_URL"); v != "" {
		return v
	}
	return nats.DefaultURL
}

func defaultDSN(driver string) string {
	if driver == "sqlite" {
		return sqliteDSN("outbox.db")
	}
	if v := os.Getenv("INBOX_POSTGRES_DSN"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/inbox_test?sslmode=disable"
}

// sqliteDSN opens path with WAL, so that readers pass the writer, and a busy
// timeout, so that relays and writers in other processes wait for the
// write lock instead of failing.
func sqliteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
}

func relayMain(args []string) error {
	var o options
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	o.flags(fs)
	fs.StringVar(&o.table, "table", "outbox", "the outbox table")
	fs.StringVar(&o.stream, "stream", "OUTBOX", "the JetStream stream")
	create := fs.Bool("create", false, "create the table and the stream (subjects <stream>.>) when missing")
	fs.Parse(args)
	o.fill()
	o.cfg.Stream = o.stream

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	db, q, src, err := openOutbox(ctx, o.driver, o.dsn, o.table, o.lease, *create)
	if err != nil {
		return err
	}
	defer db.Close()
	o.cfg.Source = src
	o.cfg.DB = db
	nc, err := o.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil // interrupted before the broker answered
		}
		return err
	}
	defer nc.Close()
	if *create {
		if _, err := createStream(ctx, nc, o.stream, 0); err != nil {
			return err
		}
	}
	r, err := New(q, nc, o.cfg)
	if err != nil {
		return err
	}
	if err := r.Check(ctx); err != nil {
		return err
	}
	fmt.Printf("relaying %s (%s) to stream %s\n", o.table, src, o.stream)
	err = r.Run(ctx)
	s := r.Stats()
	fmt.Printf("published %d, duplicates %d, acked %d, lease lost %d, retried %d, dead %d, unproven %d, recovered %d\n",
		s.Published, s.Duplicates, s.Acked, s.LeaseLost, s.Retried, s.Dead, s.Unproven, s.Recovered)
	return err
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,50}$`)

// engines are the dialects and the outbox tables: a lease column, and the
// subject and the payload as data columns. The dead table holds the jobs
// the broker can never take.
var engines = map[string]struct {
	dialect inbox.Dialect
	schema  func(t string) []string
}{
	"pgx": {inbox.Postgres, func(t string) []string {
		return []string{
			"CREATE TABLE IF NOT EXISTS " + t + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, locked_until timestamptz, subject text NOT NULL, payload bytea NOT NULL)",
			"CREATE TABLE IF NOT EXISTS " + t + "_dead (id bigint PRIMARY KEY, attempt integer NOT NULL, subject text NOT NULL, payload bytea NOT NULL)",
			// The claim reads free rows and expired leases from an index
			// each (schema/postgres-lease.sql).
			"CREATE INDEX IF NOT EXISTS " + t + "_free ON " + t + " (id) WHERE locked_until IS NULL",
			"CREATE INDEX IF NOT EXISTS " + t + "_lu ON " + t + " (locked_until)",
		}
	}},
	"sqlite": {inbox.SQLite, func(t string) []string {
		return []string{
			// AUTOINCREMENT: an id is never reused, so neither is a
			// de-duplication id (schema/sqlite-lease.sql).
			"CREATE TABLE IF NOT EXISTS " + t + " (id INTEGER PRIMARY KEY AUTOINCREMENT, attempt INTEGER NOT NULL DEFAULT 1, locked_until TEXT, subject TEXT NOT NULL, payload BLOB NOT NULL)",
			"CREATE TABLE IF NOT EXISTS " + t + "_dead (id INTEGER PRIMARY KEY, attempt INTEGER NOT NULL, subject TEXT NOT NULL, payload BLOB NOT NULL)",
			"CREATE INDEX IF NOT EXISTS " + t + "_claimable ON " + t + " (locked_until, id)",
		}
	}},
}

// openOutbox opens the database and the outbox queue on table, creating the
// table first when create is set, checks its schema and returns the
// table's identity ([TableSource]).
func openOutbox(ctx context.Context, driver, dsn, table string, lease time.Duration, create bool) (*sql.DB, *inbox.Queue, string, error) {
	e, ok := engines[driver]
	if !ok {
		return nil, nil, "", fmt.Errorf("unknown driver %q: pgx or sqlite", driver)
	}
	if !identifier.MatchString(table) {
		return nil, nil, "", fmt.Errorf("table %q: lower-case letters, digits and underscores, at most 51", table)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, nil, "", err
	}
	fail := func(err error) (*sql.DB, *inbox.Queue, string, error) {
		db.Close()
		return nil, nil, "", err
	}
	if create {
		for _, s := range e.schema(table) {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return fail(fmt.Errorf("%s: %w", s, err))
			}
		}
	}
	q, err := inbox.New(db, inbox.Config{
		Dialect: e.dialect,
		Table: inbox.Table{
			Name:        table,
			LockedUntil: "locked_until",
			Data:        []string{"subject", "payload"},
			DeadTable:   table + "_dead",
		},
		Lease: lease,
	})
	if err != nil {
		return fail(err)
	}
	if err := q.CheckSchema(ctx); err != nil {
		return fail(err)
	}
	src, err := TableSource(ctx, db, e.dialect, table)
	if err != nil {
		return fail(err)
	}
	return db, q, src, nil
}

// TableSource returns the identity of the outbox table named table on db,
// for [Config.Source]: on PostgreSQL its database and its schema-qualified
// name as the server resolves it ("postgres:app/public.outbox"), on SQLite
// its database file and its name ("sqlite:/srv/app.db#outbox"), as the
// package names the keys of the advisory form ([inbox.TableIdentifier]).
// Two servers may hold databases and tables of the same names: a stream fed
// from both needs a -msgid-prefix per table.
func TableSource(ctx context.Context, db *sql.DB, d inbox.Dialect, table string) (string, error) {
	ti, ok := d.(dialect.TableIdentifier)
	if !ok {
		return "", fmt.Errorf("dialect %s cannot tell a table's identity", d.Name())
	}
	quoted, err := d.QuoteIdent(table)
	if err != nil {
		return "", err
	}
	ident, err := ti.TableIdentity(ctx, db, &dialect.Names{Table: quoted, TableName: table})
	if err != nil {
		return "", fmt.Errorf("the identity of table %s: %w", table, err)
	}
	if d.Name() == "sqlite" {
		return "sqlite:" + strings.Replace(ident, "\x00", "#", 1), nil
	}
	var dbName string
	if err := db.QueryRowContext(ctx, "SELECT current_database()").Scan(&dbName); err != nil {
		return "", fmt.Errorf("the identity of table %s: %w", table, err)
	}
	return d.Name() + ":" + dbName + "/" + ident, nil
}

// createStream creates the stream name on subjects "<name>.>", file
// storage, keeping de-duplication ids for window (zero: ten minutes), or
// returns the one there is.
func createStream(ctx context.Context, nc *nats.Conn, name string, window time.Duration) (jetstream.Stream, error) {
	if window == 0 {
		window = 10 * time.Minute
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{name + ".>"},
		Storage:    jetstream.FileStorage,
		Duplicates: window,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, name)
	}
	return s, err
}
