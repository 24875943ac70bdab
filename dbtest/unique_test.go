package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/internal/fakeclock"
)

// uniqueTable adds the unique key column, at most 64 characters, and its
// unique index to table, and describes it in form with Table.UniqueKey.
func uniqueTable(t *testing.T, e Engine, db *sql.DB, table, form string) inbox.Table {
	t.Helper()
	typ := "varchar(64)"
	if e.IsSQLite() {
		typ = "TEXT CHECK (length(unique_key) <= 64)"
	}
	mustExec(t, e, db, "ALTER TABLE "+table+" ADD COLUMN unique_key "+typ)
	mustExec(t, e, db, "CREATE UNIQUE INDEX "+table+"_uk ON "+table+" (unique_key)")
	tb := Table(table, form)
	tb.UniqueKey = "unique_key"
	return tb
}

// countKey counts the rows holding key.
func countKey(t testing.TB, e Engine, db *sql.DB, table, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(bind(e, "SELECT COUNT(*) FROM "+table+" WHERE unique_key = ?"), key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// heldBy returns the id err names as holding the key, failing unless err
// is a DuplicateError.
func heldBy(t testing.TB, err error) any {
	t.Helper()
	var dup *inbox.DuplicateError
	if !errors.Is(err, inbox.ErrDuplicate) || !errors.As(err, &dup) || len(dup.Held) != 1 {
		t.Fatalf("err = %v, want one DuplicateError", err)
	}
	return dup.Held[0]
}

// A job with a key is inserted while no job holds the key, in the
// caller's transaction too, without failing that transaction; otherwise
// the error names the holder. Acknowledged or dead, the job frees its key.
// Replace debounces a waiting job and leaves one in work alone.
func TestUnique(t *testing.T) {
	eachForm(t, formsOf, func(t *testing.T, e Engine, form string) {
		db := e.Open(t, 6)
		table := newTable(t, e, db, "unique_"+form)
		tb := uniqueTable(t, e, db, table, form)
		clock := fakeclock.New(clockStart)
		q := newQueue(t, db, queueConfig(e, tb, clock))
		ctx := context.Background()
		if err := q.CheckSchema(ctx); err != nil {
			t.Fatalf("CheckSchema: %v", err)
		}
		enq := func(ex inbox.Executor, key, payload string, replace bool, at time.Time) (any, error) {
			return q.Enqueue(ctx, ex, inbox.Job{Data: []any{[]byte(payload)}, UniqueKey: key, Replace: replace, NotBefore: at})
		}
		first, err := enq(db, "a", "a1", false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := enq(db, "a", "a2", false, time.Time{}); heldBy(t, err) != first {
			t.Fatalf("second enqueue of a: held by %v, want %v", heldBy(t, err), first)
		}

		// In the caller's transaction: refused, and the transaction goes on.
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := enq(tx, "a", "a3", false, time.Time{}); heldBy(t, err) != first {
			t.Fatalf("enqueue of a in a transaction: held by %v", heldBy(t, err))
		}
		if _, err := enq(tx, "b", "b1", false, time.Time{}); err != nil {
			t.Fatalf("enqueue of b after the refusal, same transaction: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if countKey(t, e, db, table, "a") != 1 || countKey(t, e, db, table, "b") != 1 {
			t.Fatalf("rows:\n%s", strings.Join(dumpRows(t, db, table), "\n"))
		}

		// Acknowledged, the key is free; dead, too.
		claimed := map[string]*inbox.Delivery{}
		claim := func() {
			t.Helper()
			ds, err := q.Claim(ctx, 10)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range ds {
				claimed[payloadOf(t, d)] = d
			}
		}
		claim()
		if err := claimed["a1"].Ack(ctx); err != nil {
			t.Fatal(err)
		}
		if err := claimed["b1"].Dead(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := enq(db, "a", "a4", false, time.Time{}); err != nil {
			t.Fatalf("enqueue of a after its job's Ack: %v", err)
		}
		if _, err := enq(db, "b", "b2", false, time.Time{}); err != nil {
			t.Fatalf("enqueue of b after its job's Dead: %v", err)
		}

		// Replace: a waiting job takes the new data and time.
		later := clock.Now().Add(time.Hour)
		r, err := enq(db, "r", "r1", false, later)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := enq(db, "r", "r2", true, time.Time{}); err != nil || got != r {
			t.Fatalf("replace of the waiting r: %v, %v; want %v", got, err, r)
		}
		claim()
		d := claimed["r2"]
		if d == nil || d.ID() != r {
			t.Fatalf("claimed %v, want job %v with payload r2, ready now", claimed, r)
		}
		// In work, it is left alone, and its holder settles it.
		if _, err := enq(db, "r", "r3", true, time.Time{}); heldBy(t, err) != r {
			t.Fatalf("replace of r in work: held by %v", heldBy(t, err))
		}
		var p []byte
		if err := db.QueryRow(bind(e, "SELECT payload FROM "+table+" WHERE id = ?"), r).Scan(&p); err != nil || string(p) != "r2" {
			t.Fatalf("r in work has payload %q, %v; want r2", p, err)
		}
		for _, d := range claimed {
			if err := d.Ack(ctx); err != nil && !errors.Is(err, inbox.ErrSettled) {
				t.Fatalf("ack %s: %v", payloadOf(t, d), err)
			}
		}

		// EnqueueMany skips the keys held (and one given twice) and
		// inserts the rest, naming the skipped by index.
		held, err := enq(db, "m", "m0", false, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		jobs := []inbox.Job{{UniqueKey: "x"}, {UniqueKey: "m"}, {}, {UniqueKey: "x"}, {UniqueKey: "y"}}
		for i := range jobs {
			jobs[i].Data = []any{[]byte(fmt.Sprint("many", i))}
		}
		ids, err := q.EnqueueMany(ctx, db, jobs)
		var dup *inbox.DuplicateError
		if !errors.As(err, &dup) || fmt.Sprint(dup.Index) != "[1 3]" || dup.Held[0] != held || dup.Held[1] != ids[0] {
			t.Fatalf("EnqueueMany: %v, %+v; want jobs 1 and 3 skipped, held by %v and %v", err, dup, held, ids)
		}
		if countKey(t, e, db, table, "x") != 1 || countKey(t, e, db, table, "y") != 1 {
			t.Fatalf("rows:\n%s", strings.Join(dumpRows(t, db, table), "\n"))
		}
	})
}

// Bad input is refused with an error naming it, and nothing is inserted.
func TestUniqueBadInput(t *testing.T) {
	eachEngine(t, nil, func(t *testing.T, e Engine) {
		db := e.Open(t, 4)
		table := newTable(t, e, db, "unique_bad")
		tb := uniqueTable(t, e, db, table, "lease")
		q := newQueue(t, db, queueConfig(e, tb, nil))
		plain := newQueue(t, db, queueConfig(e, Table(table, "lease"), nil))
		ctx := context.Background()
		data := []any{[]byte("p")}
		for _, c := range []struct {
			q    *inbox.Queue
			job  inbox.Job
			want string
		}{
			{plain, inbox.Job{Data: data, UniqueKey: "k"}, "Job.UniqueKey needs Table.UniqueKey"},
			{q, inbox.Job{Data: data, Replace: true}, "Job.Replace needs Job.UniqueKey"},
			{q, inbox.Job{Data: data, UniqueKey: strings.Repeat("k", 65)}, ""},
		} {
			_, err := c.q.Enqueue(ctx, db, c.job)
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, inbox.ErrDuplicate) {
				t.Errorf("Enqueue(%+v) = %v, want an error containing %q", c.job.UniqueKey, err, c.want)
			}
		}
		if rows := dumpRows(t, db, table); len(rows) != 0 {
			t.Errorf("bad input inserted:\n%s", strings.Join(rows, "\n"))
		}
		// Without the unique index, CheckSchema says so.
		mustExec(t, e, db, dropIndex(e, table, table+"_uk"))
		err := q.CheckSchema(ctx)
		if err == nil || !strings.Contains(err.Error(), "Table.UniqueKey \"unique_key\" has no unique index") {
			t.Errorf("CheckSchema without the unique index: %v", err)
		}
	})
}

func dropIndex(e Engine, table, index string) string {
	if e.IsMySQL() {
		return "DROP INDEX " + index + " ON " + table
	}
	return "DROP INDEX " + index
}

// Eight goroutines on two pools, one naming the table plainly and the
// other qualified, enqueue the same 100 keys at once, in their own
// orders, half of them inside transactions: 100 jobs result,
// and every refusal names one of them.
func TestUniqueRace(t *testing.T) {
	eachForm(t, func(e Engine) []string {
		if e.IsSQLite() {
			return []string{"lease"}
		}
		return []string{"lease", "rowlock"}
	}, func(t *testing.T, e Engine, form string) {
		db1, db2 := openTwo(t, e, 8)
		table := newTable(t, e, db1, "unique_race_"+form)
		tb := uniqueTable(t, e, db1, table, form)
		qualified := tb
		qualified.Name = concQualified(t, e, db1, table)
		qs := []*inbox.Queue{newQueue(t, db1, queueConfig(e, tb, nil)), newQueue(t, db2, queueConfig(e, qualified, nil))}
		dbs := []*sql.DB{db1, db2}
		ctx := context.Background()
		var mu sync.Mutex
		got := map[string]map[any]bool{} // key: ids returned or named
		var wg sync.WaitGroup
		errs := make(chan error, 8*100)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				q, db := qs[g%2], dbs[g%2]
				for _, k := range rand.New(rand.NewSource(int64(g))).Perm(100) {
					key := fmt.Sprint("key-", k)
					job := inbox.Job{Data: []any{[]byte(key)}, UniqueKey: key}
					var id any
					var err error
					if g%4 < 2 {
						id, err = q.Enqueue(ctx, db, job)
					} else {
						id, err = enqueueInTx(ctx, q, db, job)
					}
					var dup *inbox.DuplicateError
					switch {
					case errors.As(err, &dup):
						id = dup.Held[0]
					case err != nil:
						errs <- fmt.Errorf("goroutine %d, %s: %w", g, key, err)
						continue
					}
					mu.Lock()
					if got[key] == nil {
						got[key] = map[any]bool{}
					}
					got[key][id] = true
					mu.Unlock()
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		rows := dumpRows(t, db1, table)
		if len(rows) != 100 {
			t.Fatalf("%d rows, want 100", len(rows))
		}
		for key, ids := range got {
			if len(ids) != 1 || countKey(t, e, db1, table, key) != 1 {
				t.Errorf("key %s: ids %v returned or named, %d rows", key, ids, countKey(t, e, db1, table, key))
			}
		}
	})
}

// enqueueInTx enqueues job in a transaction of its own, committed.
func enqueueInTx(ctx context.Context, q *inbox.Queue, db *sql.DB, job inbox.Job) (any, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	id, err := q.Enqueue(ctx, tx, job)
	if cerr := tx.Commit(); err == nil {
		err = cerr
	}
	return id, err
}
