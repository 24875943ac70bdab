package pqlisten_test

// The suite of internal/listentest on a real PostgreSQL
// (INBOX_POSTGRES_DSN), with lib/pq for the listener and for the pools.

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
	"go.uber.org/goleak"

	"github.com/sqlinbox/inbox/internal/listentest"
	"github.com/sqlinbox/inbox/listen/pqlisten"
	"github.com/sqlinbox/inbox/worker"
)

var _ worker.Listener = pqlisten.Listener{}

var pqDriver = listentest.Driver{
	Name: "pq",
	Connector: func(dsn string) (driver.Connector, error) {
		return pq.NewConnector(dsn)
	},
	Listener: func(dsn string, health time.Duration, onError func(error)) worker.Listener {
		return pqlisten.Listener{DSN: dsn, MinReconnect: 10 * time.Millisecond, MaxReconnect: 200 * time.Millisecond,
			HealthCheck: health, OnError: onError}
	},
	NoLeaks: func(t *testing.T) func() {
		before := goleak.IgnoreCurrent()
		return func() { goleak.VerifyNone(t, before) }
	},
}

func TestMain(m *testing.M) { listentest.Main(m, pqDriver) }

func TestNotifyFromAnotherProcess(t *testing.T) { listentest.NotifyFromAnotherProcess(t, pqDriver) }

func TestReconnect(t *testing.T) { listentest.Reconnect(t, pqDriver) }

func TestUnreachable(t *testing.T) { listentest.Unreachable(t, pqDriver) }

func TestHalfOpen(t *testing.T) { listentest.HalfOpen(t, pqDriver) }

// A DSN that does not parse is an error at once, naming the package.
func TestBadDSN(t *testing.T) {
	err := pqlisten.Listener{DSN: "postgres://%zz"}.Listen(context.Background(), "jobs", func() {})
	if err == nil || !strings.HasPrefix(err.Error(), "pqlisten: ") {
		t.Errorf("Listen: %v, want an error starting with pqlisten:", err)
	}
}
