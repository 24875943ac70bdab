// Package patroni runs the queue on PostgreSQL under Patroni, the way
// teams run it for high availability: one etcd and three members started
// by the suite on loopback (cluster_test.go), synchronous_mode on, clients
// on a multi-host DSN with target_session_attrs=read-write, so that each
// connection finds the leader wherever it is, without a proxy in between.
//
// TestPatroni boots the cluster once and, in order:
//
//   - Kill: enqueuers on two pools and worker.Run (lease form, 8 loops) flat
//     out while the leader's node is killed (Patroni and every PostgreSQL
//     process, SIGKILL); Patroni promotes the synchronous standby. No
//     acknowledged enqueue is lost, no acknowledged Ack undone, each job's
//     effect committed once, and the same Run call goes on on the new
//     leader (load_test.go).
//   - Switchover: the same through a planned switchover (POST /switchover).
//   - Holders: a job of each form (row lock, lease, advisory) held at the
//     leader's kill, and what its holder, and the next claimer, meet
//     (forms_test.go).
//
// The killed member is started again after each kill and rejoins (pg_rewind)
// before the next subtest. It runs only when asked, INBOX_CLUSTER_SUITES=1
// (CI sets it; see internal/optin); without patroni, etcd or PostgreSQL's
// server programs it skips, saying what to install, and fails under
// INBOX_REQUIRE_DBS=1. From the repository root:
//
//	INBOX_CLUSTER_SUITES=1 INBOX_REQUIRE_DBS=1 go test -count=1 -v ./dbtest/patroni/
package patroni

import (
	"os"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"
)

// TestMain checks that a passing run leaves no goroutine behind, and says
// at the end of the package's run that the suite skipped, and why, when it
// did (cluster.Suite.Run).
func TestMain(m *testing.M) {
	os.Exit(suite.Run(m))
}

func TestPatroni(t *testing.T) {
	tl := requireTools(t)
	start := time.Now()
	c := startCluster(t, tl)
	t.Logf("FIGURE: patroni cluster: etcd and %d members (PostgreSQL in %s), ttl %d s, loop_wait %d s, retry_timeout %d s, up in %v",
		members, tl.pgBin, ttl, loopWait, retryTimeout, time.Since(start).Round(time.Millisecond))

	t.Run("Kill", func(t *testing.T) {
		old := runLoad(t, c, "pt_kill", "kill", func(old *member) error { return c.crash(old) })
		c.rejoin(t, old)
	})
	t.Run("Switchover", func(t *testing.T) {
		runLoad(t, c, "pt_switch", "switchover", func(old *member) error { return c.switchover(old) })
		c.waitHealthy(t)
	})
	t.Run("Holders", func(t *testing.T) {
		c.rejoin(t, runHolders(t, c))
	})
	t.Logf("FIGURE: patroni wall: %v", time.Since(start).Round(time.Millisecond))
}

// rejoin starts a killed member again and waits until it is back as a
// replica on the leader's timeline and the cluster is healthy.
func (c *patroniCluster) rejoin(t *testing.T, m *member) {
	t.Helper()
	start := time.Now()
	c.start(t, m)
	c.waitHealthy(t)
	t.Logf("FIGURE: patroni rejoin: %s, killed, back as a replica %v after its start", m.name, time.Since(start).Round(time.Millisecond))
}
