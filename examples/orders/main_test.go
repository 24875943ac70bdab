package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqlinbox/inbox/internal/optin"
)

// dsn returns the DSN in env, skipping the test when it is unset, or failing
// it under INBOX_REQUIRE_DBS=1.
func dsn(t *testing.T, env string) string {
	t.Helper()
	return optin.DSN(t, env, "the orders example on its database")
}

// TestOrders runs the example on PostgreSQL with both drivers and on
// MariaDB/MySQL, then checks the tables it leaves behind itself: every order
// shipped exactly once, the one that failed midway too, and the queue empty.
func TestOrders(t *testing.T) {
	for _, c := range []struct{ driver, env string }{
		{"pgx", "INBOX_POSTGRES_DSN"},
		{"postgres", "INBOX_POSTGRES_DSN"},
		{"mysql", "INBOX_MYSQL_DSN"},
	} {
		t.Run(c.driver, func(t *testing.T) {
			o := defaultOptions()
			o.driver, o.dsn = c.driver, dsn(t, c.env)
			o.prefix = "ex_t_" + c.driver + "_"
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			err := run(ctx, &out, o)
			t.Logf("output:\n%s", out.String())
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			text := out.String()
			for _, want := range []string{
				"Claim(ctx, 9) on a pool of 5 connections: 4 orders in work",
				"order 1 released: 0 shipment rows for it, its next attempt is still 1",
			} {
				if !strings.Contains(text, want) {
					t.Errorf("output lacks %q", want)
				}
			}

			db, err := sql.Open(o.driver, o.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			t.Cleanup(func() {
				for _, tb := range []string{o.prefix + "orders", o.prefix + "shipments"} {
					db.Exec("DROP TABLE IF EXISTS " + tb)
				}
			})
			var left int
			if err := db.QueryRow("SELECT COUNT(*) FROM " + o.prefix + "orders").Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Errorf("%d orders left in the queue", left)
			}
			// The tables were created fresh, so the orders are 1..n.
			rows, err := db.Query("SELECT order_id, attempt, worker FROM " + o.prefix + "shipments ORDER BY order_id")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var got []string
			for rows.Next() {
				var id, attempt, worker int64
				if err := rows.Scan(&id, &attempt, &worker); err != nil {
					t.Fatal(err)
				}
				got = append(got, fmt.Sprint(id))
				// Release spends no attempt, so every order ships on its
				// first, the released one too; worker 0 wrote the
				// released shipment, which must not have survived.
				if attempt != 1 || worker == 0 {
					t.Errorf("order %d shipped by worker %d on attempt %d, want a worker on attempt 1", id, worker, attempt)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			var want []string
			for i := 1; i <= o.orders; i++ {
				want = append(want, fmt.Sprint(i))
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("shipped orders %v, want each of %v once", got, want)
			}
		})
	}
}
