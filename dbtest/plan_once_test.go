package dbtest

import (
	"context"
	"fmt"
	"testing"
)

// TestClaimPlannedOnce: on PostgreSQL a lease claim run prepared (pgx's
// statement cache; lib/pq with Config.Prepare) is planned in its first five
// runs only, then runs the generic plan: its locking reads are bounded by a
// number in the text (Statements.Claim.TakeBounded), which the plan can see. With
// the limit a parameter alone the server planned every claim again, its
// generic plan expecting a tenth of the table. The table has its claim
// indexes and is named plainly and by its schema; claims of 1, 3 and 16.
func TestClaimPlannedOnce(t *testing.T) {
	eachEngine(t, Engine.IsPostgres, func(t *testing.T, e Engine) {
		for _, form := range []string{"lease", "lease-shallow"} {
			for _, spelled := range []string{"plain", "qualified"} {
				t.Run(form+"/"+spelled, func(t *testing.T) {
					ctx := context.Background()
					// One connection: pg_prepared_statements shows the
					// session's own statements.
					db := e.Open(t, 1)
					table := newTable(t, e, db, "plan_once_"+form)
					if form == "lease" {
						for _, s := range explainIndexes(e, table) {
							mustExec(t, e, db, s)
						}
					}
					const runs = 12
					mustExec(t, e, db, fmt.Sprintf("INSERT INTO %s (payload) SELECT '\\x00'::bytea FROM generate_series(1, %d)", table, runs*20))
					name := table
					if spelled == "qualified" {
						name = "public." + table
					}
					cfg := queueConfig(e, Table(name, form), nil)
					cfg.Prepare = e.Driver == "postgres" // pgx prepares by itself
					q := newQueue(t, db, cfg)
					defer q.Close()
					for _, batch := range []int{1, 3, 16} {
						for i := 0; i < runs; i++ {
							ds, err := q.Claim(ctx, batch)
							if err != nil {
								t.Fatal(err)
							}
							if len(ds) != batch {
								t.Fatalf("claim %d of %d: %d jobs", i, batch, len(ds))
							}
							for _, d := range ds {
								if err := d.Ack(ctx); err != nil {
									t.Fatal(err)
								}
							}
						}
						var generic, custom int64
						sent := q.Statements().Claim.For(batch).SQL
						err := db.QueryRowContext(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", sent).Scan(&generic, &custom)
						if err != nil {
							t.Fatalf("claim of %d: the session's prepared claim: %v", batch, err)
						}
						if custom > 5 || generic != runs-custom {
							t.Errorf("claim of %d, %d runs: %d generic plans, %d custom, want the custom plans of the first five runs at most", batch, runs, generic, custom)
						}
					}
				})
			}
		}
	})
}
