// Command orders ships each order exactly once with the row-lock form: the
// handler writes the order's shipment through the claim's transaction
// ([inbox.Delivery.Tx]), so the shipment and the acknowledgement commit
// together, and a handler that fails midway releases the order and its
// shipment row rolls back with it.
//
//	go run ./examples/orders [-driver pgx|postgres|mysql] [-dsn DSN] [-prefix ex_]
//
// It runs on PostgreSQL (pgx/v5/stdlib or lib/pq) or, with -driver mysql, on
// MariaDB 10.6+ or MySQL 8. The DSN defaults to INBOX_POSTGRES_DSN or
// INBOX_MYSQL_DSN, then to a local server's inbox_test database. The example
// drops and recreates its two tables, <prefix>orders and <prefix>shipments.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
	"github.com/sqlinbox/inbox"
)

// options are the example's flags.
type options struct {
	driver  string // pgx, postgres (lib/pq) or mysql
	dsn     string
	prefix  string // of the table names
	orders  int
	workers int
}

func defaultOptions() options {
	return options{driver: "pgx", prefix: "ex_", orders: 12, workers: 4}
}

// defaultDSN is the DSN for driver when -dsn is not given.
func defaultDSN(driver string) string {
	if driver == "mysql" {
		if v := os.Getenv("INBOX_MYSQL_DSN"); v != "" {
			return v
		}
		return "root@tcp(127.0.0.1:3306)/inbox_test"
	}
	if v := os.Getenv("INBOX_POSTGRES_DSN"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432/inbox_test?sslmode=disable"
}

func main() {
	o := defaultOptions()
	flag.StringVar(&o.driver, "driver", o.driver, "database/sql driver: pgx or postgres (PostgreSQL), mysql (MariaDB, MySQL)")
	flag.StringVar(&o.dsn, "dsn", "", "data source name (default: INBOX_POSTGRES_DSN or INBOX_MYSQL_DSN, then a local server's inbox_test)")
	flag.StringVar(&o.prefix, "prefix", o.prefix, "prefix of the example's tables, which it drops and recreates")
	flag.IntVar(&o.orders, "orders", o.orders, "orders to ship")
	flag.IntVar(&o.workers, "workers", o.workers, "workers; the pool gets one connection more")
	flag.Parse()
	if o.dsn == "" {
		o.dsn = defaultDSN(o.driver)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := run(ctx, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

// engine holds what differs between PostgreSQL and MySQL: the dialect, the
// tables and the shipment insert's placeholders.
type engine struct {
	dialect inbox.Dialect
	schema  func(orders, shipments string) []string
	ship    string // INSERT INTO %s (order_id, item, qty, attempt, worker)
	param   string // the first placeholder
}

var postgres = engine{
	dialect: inbox.Postgres,
	schema: func(orders, shipments string) []string {
		return []string{
			"DROP TABLE IF EXISTS " + orders + ", " + shipments,
			"CREATE TABLE " + orders + " (id bigserial PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, item text NOT NULL, qty integer NOT NULL)",
			// The primary key would refuse a second shipment of an order.
			"CREATE TABLE " + shipments + " (order_id bigint PRIMARY KEY, item text NOT NULL, qty integer NOT NULL, attempt integer NOT NULL, worker integer NOT NULL)",
		}
	},
	ship:  "INSERT INTO %s (order_id, item, qty, attempt, worker) VALUES ($1, $2, $3, $4, $5)",
	param: "$1",
}

var mysql = engine{
	dialect: inbox.MySQL,
	schema: func(orders, shipments string) []string {
		return []string{
			"DROP TABLE IF EXISTS " + orders + ", " + shipments,
			"CREATE TABLE " + orders + " (id bigint AUTO_INCREMENT PRIMARY KEY, attempt integer NOT NULL DEFAULT 1, item varchar(200) NOT NULL, qty integer NOT NULL) ENGINE=InnoDB",
			"CREATE TABLE " + shipments + " (order_id bigint PRIMARY KEY, item varchar(200) NOT NULL, qty integer NOT NULL, attempt integer NOT NULL, worker integer NOT NULL) ENGINE=InnoDB",
		}
	},
	ship:  "INSERT INTO %s (order_id, item, qty, attempt, worker) VALUES (?, ?, ?, ?, ?)",
	param: "?",
}

var items = []string{"widget", "gear", "sprocket", "flange"}

// run is the example. It returns an error unless every order has exactly one
// shipment and none is left in the queue.
func run(ctx context.Context, w io.Writer, o options) error {
	var e engine
	switch o.driver {
	case "pgx", "postgres":
		e = postgres
	case "mysql":
		e = mysql
	default:
		return fmt.Errorf("unknown driver %q: pgx, postgres or mysql", o.driver)
	}
	ordersTable, shipmentsTable := o.prefix+"orders", o.prefix+"shipments"
	db, err := sql.Open(o.driver, o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	// A job in work holds a connection; the queue leaves the last one free
	// for everything else, so the workers get one each and one spare.
	db.SetMaxOpenConns(o.workers + 1)
	for _, s := range e.schema(ordersTable, shipmentsTable) {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
	}
	// Naming neither a lease column nor an advisory key selects the row
	// lock. The data columns are delivered with each job.
	q, err := inbox.New(db, inbox.Config{
		Dialect: e.dialect,
		Table:   inbox.Table{Name: ordersTable, Data: []string{"item", "qty"}},
	})
	if err != nil {
		return err
	}
	if err := q.CheckSchema(ctx); err != nil {
		return err
	}
	fmt.Fprintf(w, "%s on %s: row-lock queue %s, shipments into %s, %d workers, pool of %d connections\n",
		o.driver, e.dialect.Name(), ordersTable, shipmentsTable, o.workers, o.workers+1)

	// Enqueue through a transaction: the orders commit with whatever else
	// the caller writes in it.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	for i := 0; i < o.orders; i++ {
		if _, err := q.Enqueue(ctx, tx, inbox.Job{Data: []any{items[i%len(items)], i%5 + 1}}); err != nil {
			tx.Rollback()
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	fmt.Fprintf(w, "enqueued %d orders\n", o.orders)

	insert := fmt.Sprintf(e.ship, shipmentsTable)
	if err := poolRule(ctx, w, q, o); err != nil {
		return err
	}
	if err := failOnce(ctx, w, db, q, e, insert, ordersTable, shipmentsTable); err != nil {
		return err
	}

	var mu sync.Mutex
	errs := make(chan error, o.workers)
	for i := 1; i <= o.workers; i++ {
		go func(worker int) {
			errs <- work(ctx, q, insert, worker, func(id any, item string, qty int64, attempt int) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(w, "worker %d: order %v (%d × %s), attempt %d: shipment committed with the ack\n", worker, id, qty, item, attempt)
			})
		}(i)
	}
	var first error
	for i := 0; i < o.workers; i++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	return verify(ctx, w, db, o.orders, ordersTable, shipmentsTable)
}

// poolRule shows that the queue never takes the pool's last connection: it
// asks for more orders than there are workers, gets one fewer than the pool
// size, and gives them back at once.
func poolRule(ctx context.Context, w io.Writer, q *inbox.Queue, o options) error {
	ds, err := q.Claim(ctx, o.workers+5)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Claim(ctx, %d) on a pool of %d connections: %d orders in work, one connection left free\n", o.workers+5, o.workers+1, len(ds))
	for _, d := range ds {
		if err := d.Release(ctx); err != nil {
			return err
		}
	}
	if len(ds) != o.workers {
		return fmt.Errorf("claimed %d orders on a pool of %d, want %d", len(ds), o.workers+1, o.workers)
	}
	return nil
}

// failOnce claims one order, writes its shipment through the claim's
// transaction, then fails as a handler would midway and releases the order:
// the shipment row rolls back with the release, and no attempt is spent.
func failOnce(ctx context.Context, w io.Writer, db *sql.DB, q *inbox.Queue, e engine, insert, ordersTable, shipmentsTable string) error {
	ds, err := q.Claim(ctx, 1)
	if err != nil {
		return err
	}
	if len(ds) != 1 {
		return errors.New("no order to claim")
	}
	d := ds[0]
	var item string
	var qty int64
	if err := d.Scan(&item, &qty); err != nil {
		return err
	}
	if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), item, qty, d.Attempt(), 0); err != nil {
		return err
	}
	fmt.Fprintf(w, "order %v, attempt %d: shipment row written through Delivery.Tx(), then the carrier call fails: Release\n", d.ID(), d.Attempt())
	if err := d.Release(ctx); err != nil {
		return err
	}
	var shipped, attempt int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+shipmentsTable+" WHERE order_id = "+e.param, d.ID()).Scan(&shipped); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, "SELECT attempt FROM "+ordersTable+" WHERE id = "+e.param, d.ID()).Scan(&attempt); err != nil {
		return err
	}
	fmt.Fprintf(w, "order %v released: %d shipment rows for it, its next attempt is still %d\n", d.ID(), shipped, attempt)
	if shipped != 0 || attempt != 1 {
		return fmt.Errorf("after Release: %d shipments of order %v (want 0), next attempt %d (want 1)", shipped, d.ID(), attempt)
	}
	return nil
}

// work ships orders until none is left to claim.
func work(ctx context.Context, q *inbox.Queue, insert string, worker int, shipped func(id any, item string, qty int64, attempt int)) error {
	for {
		ds, err := q.Claim(ctx, 1)
		if err != nil {
			return err
		}
		if len(ds) == 0 {
			return nil
		}
		d := ds[0]
		var item string
		var qty int64
		if err := d.Scan(&item, &qty); err != nil {
			return errors.Join(err, d.Release(ctx))
		}
		// The shipment is written in the claim's transaction: Ack commits
		// it with the order's deletion, Release rolls both back.
		if _, err := d.Tx().ExecContext(ctx, insert, d.ID(), item, qty, d.Attempt(), worker); err != nil {
			return errors.Join(err, d.Release(ctx))
		}
		if err := d.Ack(ctx); err != nil {
			return err
		}
		shipped(d.ID(), item, qty, d.Attempt())
	}
}

// verify checks every order has exactly one shipment and none is left in the
// queue.
func verify(ctx context.Context, w io.Writer, db *sql.DB, orders int, ordersTable, shipmentsTable string) error {
	var left, shipments, distinct int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ordersTable).Scan(&left); err != nil {
		return err
	}
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(DISTINCT order_id) FROM "+shipmentsTable).Scan(&shipments, &distinct); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d orders, %d shipments for %d distinct orders, %d orders left in the queue\n", orders, shipments, distinct, left)
	if left != 0 || shipments != orders || distinct != orders {
		return fmt.Errorf("want %d shipments, one per order, and an empty queue", orders)
	}
	return nil
}
