package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A pooler between the pool and the server may hand each transaction of a
// client connection to another server session (PgBouncer's pool_mode =
// transaction, the most common PostgreSQL deployment), and every other
// check passes through it. The lease and the row lock hold nothing outside
// a transaction and work there. The advisory form does not: its session
// lock stays with a server session the connection's next statements may
// not reach, and that other clients' statements share. Nor does
// Config.Prepare before PgBouncer 1.21's max_prepared_statements: a
// statement is prepared in one server session and run in another.
//
// Nothing a client reads names the pooler or its mode, so the check looks
// at where statements run, each session told by pg_backend_pid() and its
// server's start (two servers' pids may be equal). A session per
// connection (direct, or session pooling) never shows one connection's
// statements in two sessions, nor two open connections' in one: the check
// never refuses it. Transaction pooling may, by others' transactions
// falling just so between the check's statements, imitate a session per
// connection for any finite sequence, so no sequence proves it under every
// schedule. This one shows it in its first round when no other client
// interleaves, whichever of PgBouncer's orders hands idle server
// connections out (most recently used first, its default; oldest first,
// server_round_robin), and runs sessionRounds rounds against others'
// traffic. On connection C (after its first statement, and preparing the
// check's statement with Config.Prepare), each round:
//
//  1. C reads its session: under oldest first, another idle one when any.
//  2. A transaction on connection D reads its own and stays open: under
//     most recently used first, C's last, which it then pins. With
//     Config.Prepare, C runs the prepared statement meanwhile, so in
//     another session than the one it was prepared in; PgBouncer before
//     1.21 answers that it does not exist (26000).
//  3. D rolls back; C runs the prepared statement twice (or reads its
//     session): most recently used first hands it D's.
//
// Where the pooler keeps prepared statements, they run in two sessions
// without an error, which lets Config.Prepare pass. D's transaction writes
// nothing, and the prepared statement is C's alone (its text the check's).
const (
	pgSessionFirst    = "SELECT pg_catalog.version(), pg_catalog.pg_backend_pid(), CAST(pg_catalog.pg_postmaster_start_time() AS text)"
	pgSession         = "SELECT pg_catalog.pg_backend_pid(), CAST(pg_catalog.pg_postmaster_start_time() AS text)"
	pgSessionPrepared = "SELECT pg_catalog.pg_backend_pid() AS prepared_pid, CAST(pg_catalog.pg_postmaster_start_time() AS text) AS prepared_start"
	// sessionRounds is how many times the sequence runs on a pool that
	// shows one session per connection: the first round tells a pooler
	// nobody else uses; the others stand against their traffic.
	sessionRounds = 3
)

// sessionProber is a dialect whose engine can tell where a pool's
// statements run (postgres).
type sessionProber interface {
	probeSessions(ctx context.Context, db *sql.DB, second, prepare bool) (sessionFindings, error)
}

var _ sessionProber = postgres{}

// session is one server session: its backend's pid and its server's start.
type session struct {
	pid    int64
	server string
}

// sessionFindings is what probeSessions saw.
type sessionFindings struct {
	probed bool             // the engine could be asked
	own    map[session]bool // the sessions connection C's statements ran in
	shares bool             // D's transaction ran in one of C's sessions: shared
	shared session
	moved  map[session]bool // the sessions the prepared statement ran in
	lost   error            // how the prepared statement failed (26000, 42P05)
}

// pooled reports whether the pool's connections did not each keep one
// session.
func (f sessionFindings) pooled() bool { return len(f.own) > 1 || f.shares }

// evidence says what showed that, for messages.
func (f sessionFindings) evidence() string {
	var parts []string
	if len(f.own) > 1 {
		var pids []string
		for s := range f.own {
			pids = append(pids, strconv.FormatInt(s.pid, 10))
		}
		slices.Sort(pids)
		parts = append(parts, fmt.Sprintf("one connection's statements ran in %d server sessions (backend pids %s)", len(f.own), strings.Join(pids, ", ")))
	}
	if f.shares {
		parts = append(parts, fmt.Sprintf("a transaction of a second connection, both open, ran in the first one's server session (backend pid %d)", f.shared.pid))
	}
	return strings.Join(parts, "; and ")
}

// checkSessions runs the session probe and returns its problems. The
// second connection is taken as a job in work would be ([Queue.MaxInWork]),
// so that a check run while jobs hold every connection but the last
// (worker.Run runs it after errors) waits for none of them; it then looks
// at one connection alone, which shows a pooler only under others' traffic.
func (q *Queue) checkSessions(ctx context.Context, p sessionProber) ([]string, error) {
	n, err := q.holds.reserve(1)
	if err != nil {
		n = 0 // a pool of one connection: C alone
	}
	defer q.holds.unreserve(n)
	f, err := p.probeSessions(ctx, q.db, n == 1, q.cfg.Prepare)
	if err != nil || !f.probed {
		return nil, err
	}
	var problems []string
	if q.names.Form == Advisory && f.pooled() {
		problems = append(problems, fmt.Sprintf("the pool's connections do not each keep one server session: %s, as behind a transaction pooler "+
			"(PgBouncer's pool_mode = transaction); the advisory form (Table.AdvisoryKey) holds each job by a session lock, which the "+
			"connection's next statements may not reach and other clients of that session share, so two workers could run one job: point "+
			"this queue's pool at PostgreSQL directly or at session pooling (pool_mode = session), or use the lease form (Table.LockedUntil) "+
			"or the row lock (neither AdvisoryKey nor LockedUntil), which work through transaction pooling", f.evidence()))
	}
	if !q.cfg.Prepare {
		return problems, nil
	}
	const fix = "set Config.Prepare to false, or point the pool at PostgreSQL directly or at session pooling (pool_mode = session)"
	switch {
	case f.lost != nil:
		after := ""
		if f.pooled() {
			after = " after " + f.evidence()
		}
		problems = append(problems, fmt.Sprintf("Config.Prepare: a statement prepared on a connection of the pool failed when it ran again (%v)%s: a pooler "+
			"in front of the server keeps no prepared statements across transactions (PgBouncer before 1.21, or max_prepared_statements = 0): "+
			"%s, or run PgBouncer 1.21 or later with max_prepared_statements above 0 (through such a pooler the drivers also need "+
			"pgx's default_query_exec_mode exec, cache_describe or simple_protocol, or lib/pq's binary_parameters=yes, whatever "+
			"Config.Prepare says)", f.lost, after, fix))
	case f.pooled() && len(f.moved) < 2:
		problems = append(problems, fmt.Sprintf("Config.Prepare: the pool's connections do not each keep one server session (%s), and in %d tries no "+
			"statement prepared on one of them ran in a second session, so the check cannot tell whether the pooler keeps prepared statements "+
			"across transactions (PgBouncer 1.21 or later with max_prepared_statements above 0 does, earlier ones do not): %s, or run the "+
			"check again while the pooler is less busy", f.evidence(), sessionRounds, fix))
	}
	return problems, nil
}

// undefinedFunction reports PostgreSQL's undefined_function (42883).
func undefinedFunction(err error) bool {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState() == "42883"
	}
	return strings.Contains(err.Error(), "42883")
}

// preparedLost reports a prepared statement the server does not have
// (26000), or one of the same name another client left in the session
// (42P05): a pooler moved the connection to another session.
func preparedLost(err error) bool {
	var st interface{ SQLState() string }
	if errors.As(err, &st) {
		return st.SQLState() == "26000" || st.SQLState() == "42P05"
	}
	m := err.Error()
	return strings.Contains(m, "prepared statement") && (strings.Contains(m, "does not exist") || strings.Contains(m, "already exists"))
}

// probeSessions runs the sequence above on connection C and, with second,
// a transaction D. An engine without pg_backend_pid (undefined_function,
// a look-alike) is not probed, nor one whose version names neither
// PostgreSQL nor YugabyteDB (CockroachDB, whose sessions are its own).
func (postgres) probeSessions(ctx context.Context, db *sql.DB, second, prepare bool) (sessionFindings, error) {
	c, err := db.Conn(ctx)
	if err != nil {
		return sessionFindings{}, err
	}
	defer c.Close()
	var version string
	var first session
	if err := c.QueryRowContext(ctx, pgSessionFirst).Scan(&version, &first.pid, &first.server); err != nil {
		if undefinedFunction(err) {
			return sessionFindings{}, nil // a look-alike without pg_backend_pid: not probed
		}
		return sessionFindings{}, err
	}
	if e := classifyPostgres(version).engine; e != enginePostgres && e != engineYugabyte {
		return sessionFindings{}, nil
	}
	p := &sessionProbe{ctx: ctx, db: db, c: c,
		f: sessionFindings{probed: true, own: map[session]bool{first: true}, moved: map[session]bool{}}}
	if prepare {
		p.stmt, err = c.PrepareContext(ctx, pgSessionPrepared)
		switch {
		case err != nil && preparedLost(err):
			p.f.lost, p.stmt = err, nil
		case err != nil:
			return p.f, err
		default:
			defer p.stmt.Close()
		}
	}
	for round := 0; round < sessionRounds; round++ {
		if err := p.round(second); err != nil {
			return p.f, err
		}
		if p.f.pooled() && (!prepare || p.f.lost != nil || len(p.f.moved) > 1) {
			break
		}
	}
	return p.f, nil
}

// sessionProbe is one run of probeSessions: connection C, its prepared
// statement (nil without Config.Prepare, or once lost), what it found.
type sessionProbe struct {
	ctx  context.Context
	db   *sql.DB
	c    *sql.Conn
	stmt *sql.Stmt
	f    sessionFindings
}

// round runs steps 1 to 3 once.
func (p *sessionProbe) round(second bool) error {
	s, err := p.at(p.c)
	if err != nil {
		return err
	}
	p.f.own[s] = true
	if second {
		if err := p.other(); err != nil {
			return err
		}
	}
	if p.stmt != nil && p.f.lost == nil {
		for i := 0; i < 2; i++ {
			if err := p.runPrepared(); err != nil {
				return err
			}
		}
		return nil
	}
	if s, err = p.at(p.c); err != nil {
		return err
	}
	p.f.own[s] = true
	return nil
}

// other opens transaction D, reads its session and, while it is open, runs
// C's prepared statement; then D rolls back.
func (p *sessionProbe) other() error {
	tx, err := p.db.BeginTx(p.ctx, nil)
	if err != nil {
		return err
	}
	d, err := p.at(tx)
	if err == nil && p.f.own[d] {
		p.f.shared, p.f.shares = d, true
	}
	if err == nil {
		err = p.runPrepared()
	}
	if rerr := tx.Rollback(); err == nil && rerr != nil {
		err = rerr
	}
	return err
}

// at reads the session q's statement runs in.
func (p *sessionProbe) at(q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (session, error) {
	var s session
	err := q.QueryRowContext(p.ctx, pgSession).Scan(&s.pid, &s.server)
	return s, err
}

// runPrepared runs the prepared statement on C, unless it was lost.
func (p *sessionProbe) runPrepared() error {
	if p.stmt == nil || p.f.lost != nil {
		return nil
	}
	var s session
	if err := p.stmt.QueryRowContext(p.ctx).Scan(&s.pid, &s.server); err != nil {
		if preparedLost(err) {
			p.f.lost = err
			return nil
		}
		return err
	}
	p.f.own[s], p.f.moved[s] = true, true
	return nil
}
