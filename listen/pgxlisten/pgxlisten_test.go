package pgxlisten_test

// The suite of internal/listentest on a real PostgreSQL
// (INBOX_POSTGRES_DSN), with pgx for the listener and for the pools.

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"go.uber.org/goleak"

	"github.com/sqlinbox/inbox/internal/listentest"
	"github.com/sqlinbox/inbox/listen/pgxlisten"
	"github.com/sqlinbox/inbox/worker"
)

var _ worker.Listener = pgxlisten.Listener{}

var pgxDriver = listentest.Driver{
	Name: "pgx",
	Connector: func(dsn string) (driver.Connector, error) {
		return stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(dsn)
	},
	Listener: func(dsn string, health time.Duration, onError func(error)) worker.Listener {
		return pgxlisten.Listener{ConnString: dsn, MinReconnect: 10 * time.Millisecond, MaxReconnect: 200 * time.Millisecond,
			HealthCheck: health, OnError: onError}
	},
	NoLeaks: func(t *testing.T) func() {
		before := goleak.IgnoreCurrent()
		return func() { goleak.VerifyNone(t, before) }
	},
}

func TestMain(m *testing.M) { listentest.Main(m, pgxDriver) }

func TestNotifyFromAnotherProcess(t *testing.T) { listentest.NotifyFromAnotherProcess(t, pgxDriver) }

func TestReconnect(t *testing.T) { listentest.Reconnect(t, pgxDriver) }

func TestUnreachable(t *testing.T) { listentest.Unreachable(t, pgxDriver) }

func TestHalfOpen(t *testing.T) { listentest.HalfOpen(t, pgxDriver) }

// A ConnString that does not parse is an error at once, naming the package.
func TestBadConnString(t *testing.T) {
	err := pgxlisten.Listener{ConnString: "postgres://%zz"}.Listen(context.Background(), "jobs", func() {})
	if err == nil || !strings.HasPrefix(err.Error(), "pgxlisten: ") {
		t.Errorf("Listen: %v, want an error starting with pgxlisten:", err)
	}
}
