package inbox

import (
	"context"
	"github.com/sqlinbox/inbox/dialect"
	"testing"

	"github.com/DATA-DOG/go-sqlmock"
)

// wrapped is a dialect wrapping another, as one that logs its statements
// would: it implements none of the optional interfaces itself.
type wrapped struct{ Dialect }

func (w wrapped) Unwrap() Dialect { return w.Dialect }

// Wrapping a dialect keeps every optional interface it has, the ones the
// core looks up unexported included.
func TestWrappedDialectKeepsCapabilities(t *testing.T) {
	has := func(d Dialect) []bool {
		_, l := capability[dialect.Locker](d)
		_, ti := capability[dialect.TableIdentifier](d)
		_, dd := capability[dialect.DeadlockDetector](d)
		_, bd := capability[dialect.BatchDialect](d)
		_, sc := capability[dialect.SchemaChecker](d)
		_, be := capability[dialect.BulkEnqueuer](d)
		_, lw := capability[dialect.LockWaiter](d)
		return []bool{l, ti, dd, bd, sc, be, lw}
	}
	for _, d := range []Dialect{Postgres, MySQL, MariaDB, SQLite} {
		want, got := has(d), has(wrapped{wrapped{d}})
		for i := range want {
			if want[i] != got[i] {
				t.Errorf("%s: optional interface %d is %v unwrapped, %v wrapped twice", d.Name(), i, want[i], got[i])
			}
		}
	}
}

// A Batcher on a wrapped dialect sends the batched statements of the
// dialect it wraps (it was refused: "dialect postgres has no batched
// statements").
func TestWrappedDialectBatcher(t *testing.T) {
	db, sm := btMock(t)
	q := btNew(t, db, wrapped{Postgres}, false)
	b := btBatcher(t, q, BatchConfig{MaxBatch: 4})
	d1, d2 := btDel(q, int64(1), 1, btExp), btDel(q, int64(2), 1, btExp)
	sm.ExpectQuery(`DELETE FROM "jobs" WHERE ` + pgBatchWhere(1) + ` RETURNING "id"`).
		WithArgs(pgBatchArgs("{1,2}", "{2,2}", btExps(2))...).
		WillReturnRows(sqlmock.NewRows([]string{"id"}).AddRow(int64(1)).AddRow(int64(2)))
	for i, err := range b.AckAll(context.Background(), []*Delivery{d1, d2}) {
		btWant(t, "ack "+string(rune('1'+i)), err, nil)
	}
	btMet(t, sm)
}
