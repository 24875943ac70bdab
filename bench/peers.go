package main

// -run peers: inbox next to other job queues on the same database, in the
// same run: River and graphile-worker (bench/graphile.go, a Node.js
// process) on PostgreSQL (through pgx), goqite on SQLite (mattn and
// modernc). Each line is claim + no-op handler + acknowledgement of
// 128-byte jobs by n workers, the two sides measured in alternating
// segments (inbox, peer, peer, inbox, …) so that a change of load on the
// shared machine falls on both; each side works on its own queue, topped up
// before its segment, and the figure is the median of the segments' rates.
//
//   - inbox: the lease form, Claim(16) and one Batcher.AckAll per claim, as
//     the table's inbox side does for a batch of 16, on a bench table with
//     the recommended lease indexes (docs/schema.md: the lease claim needs
//     them; the peers' schemas come with theirs).
//   - River: a Client with MaxWorkers = n and a no-op worker, its tables
//     made by its own migrations in a schema of their own (riverSchema),
//     reached through the pool's search_path. Jobs are inserted with
//     InsertMany while the queue is paused; a segment resumes the queue,
//     pauses it when its time is up, and counts the jobs its workers
//     handled until the client reported the pause. River records
//     completions from a goroutine of its own, in batches (as soon as 100
//     are waiting, else every 250 ms), so that its workers do not wait for
//     the database: the jobs a segment handled are recorded after it,
//     untimed, and the line checks that every one was recorded as
//     completed. Counting at the pause, rather than when the last batch is
//     recorded, leaves out of the rate up to 250 ms that River's workers
//     do not wait for.
//   - graphile-worker: bench/graphile.go, a node process with a runner per
//     segment; the line is left out, with a word on the log, without node.
//   - goqite: its documented Receive + Delete, one message per call (it has
//     no batch receive; its jobs runner receives one message at a time from
//     one goroutine and sleeps its poll interval whenever its limit is
//     reached), from n workers, on its schema in the same database file.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"maragu.dev/goqite"
)

// Names of the run's tables: the inbox side's table (plus the engine's
// name), and River's schema. Tests use others, so that they do not meet a
// run of the program on the same server.
var (
	peersTable  = "bench_peers_"
	riverSchema = "river_bench"
)

// riverFetchCooldown is River's FetchCooldown (-river-cooldown), by default
// its least: River fetches at most once a cooldown, and its default of
// 100 ms held this program's lines to 10 jobs/s a worker (10 with one, 40
// with four); River's documentation names it as the throughput knob.
var riverFetchCooldown = river.FetchCooldownMin

// peerSide is one side of a peers line, with a queue of its own.
type peerSide interface {
	// fill adds n pending jobs of the 128-byte payload.
	fill(ctx context.Context, n int) error
	// segment works through at most total jobs with workers workers for
	// duration, and returns the jobs done and the time they took, and how
	// many jobs it took from the queue in all (River: with those still in
	// work at the end of its time).
	segment(ctx context.Context, workers, total int, duration time.Duration) (r result, used int)
	// pending counts the jobs left, checking that none is in another state.
	pending(ctx context.Context) (int, error)
	close()
}

// peer is a peer of an engine: its name in the table, and its side for a
// line of workers workers.
type peer struct {
	name  string
	guess float64 // a first guess of its jobs/s, for peerPrefill
	side  func(ctx context.Context, e engine, db *sql.DB, dir string, workers int, log io.Writer) (peerSide, error)
}

// peerOf is the Go peer of an engine: River on pgx, goqite on SQLite; no
// name on others. (graphile-worker, which needs node, joins River in
// runPeers.)
func peerOf(e engine) peer {
	switch {
	case e.name == "pgx":
		return peer{"River " + moduleVersion("github.com/riverqueue/river") + " (riverpgxv5)", 10000,
			func(ctx context.Context, e engine, _ *sql.DB, dir string, workers int, log io.Writer) (peerSide, error) {
				return newRiverSide(ctx, e, dir, workers, log)
			}}
	case e.family == "sqlite":
		return peer{"goqite " + moduleVersion("maragu.dev/goqite"), 10000,
			func(ctx context.Context, _ engine, db *sql.DB, _ string, _ int, _ io.Writer) (peerSide, error) {
				return newGoqiteSide(ctx, db)
			}}
	}
	return peer{}
}

// moduleVersion is the version of a module built into the program.
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, m := range info.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "(unknown version)"
}

func runPeers(ctx context.Context, out, log io.Writer, es []engine, workers []int, duration time.Duration, segments int, dir string) error {
	var run []engine
	var versions []string
	for _, e := range es {
		if peerOf(e).name == "" {
			fmt.Fprintf(log, "peers: %s skipped: no peer on it (River runs on pgx, goqite on SQLite)\n", e.name)
			continue
		}
		db, err := e.open(dir, 1)
		if err != nil {
			return err
		}
		versions = append(versions, e.version(db)+" ("+e.label+")")
		db.Close()
		run = append(run, e)
	}
	if len(run) == 0 {
		return errors.New("-run peers: none of -engines has a peer (pgx, mattn, modernc)")
	}
	peers := map[string][]peer{}
	graphile := ""
	for _, e := range run {
		peers[e.name] = []peer{peerOf(e)}
		if e.name == "pgx" {
			if err := riverMigrate(ctx, e, dir, log); err != nil {
				return fmt.Errorf("River migrations: %w", err)
			}
			defer riverDropSchema(context.WithoutCancel(ctx), e, dir)
			if !graphileWanted() {
				continue
			}
			if p, ok := graphilePeer(ctx, log); ok {
				peers[e.name] = append(peers[e.name], p)
				defer graphileDropSchema(context.WithoutCancel(ctx), e, dir)
				graphile = " graphile-worker: a runner per segment, concurrentJobs = workers, local queue of 500, completions batched, jobs counted from its start to the end of its stop (all completed by then)."
			}
		}
	}
	header(out, versions)
	fmt.Fprintf(out, "Each side of a line measured for %v in %d alternating segments, each on its own queue; jobs/s is the median over the segments, ratio = inbox / peer. "+
		"inbox: "+peerInboxForm()+", "+peerInboxLoop()+". River: MaxWorkers = workers, FetchCooldown %v, jobs counted until the pause is reported (their completions recorded after, untimed). "+
		"goqite: Receive + Delete of one message.%s\n\n", duration, segments, riverFetchCooldown, graphile)
	fmt.Fprintln(out, "| engine | driver | peer | workers | inbox jobs/s | peer jobs/s | ratio inbox/peer |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|")
	seg := duration / time.Duration(segments)
	best := map[string]float64{}
	for _, e := range run {
		for _, p := range peers[e.name] {
			for _, w := range workers {
				want := [2]int{peerPrefill(best, e, "inbox", 40000, seg), peerPrefill(best, e, p.name, p.guess, seg)}
				rs, note, err := peerCell(ctx, log, e, p, w, dir, want, seg, segments)
				if err != nil {
					return fmt.Errorf("%s/peers/%s/w%d: %w", e.name, p.name, w, err)
				}
				var rates [2]float64
				for k := range rs {
					rates[k] = medianRate(rs[k])
					key := e.name + "/" + [2]string{"inbox", p.name}[k]
					best[key] = max(best[key], rates[k])
				}
				fmt.Fprintf(out, "| %s | %s | %s | %d | %.0f | %.0f | %.2f |\n", e.family, e.label, p.name, w, rates[0], rates[1], rates[0]/rates[1])
				fmt.Fprintf(log, "%s/peers/w%d: inbox %s; %s %s%s\n", e.name, w, segmentLog(rs[0]), p.name, segmentLog(rs[1]), note)
			}
		}
	}
	return nil
}

// peerPrefill guesses how many jobs a side works through in one segment, as
// prefill does for the table: twice the best median seen so far on the
// engine, at least a generous first guess (the peers speed up with workers
// more than inbox's batches do).
func peerPrefill(best map[string]float64, e engine, side string, guess float64, seg time.Duration) int {
	return int(max(best[e.name+"/"+side]*2, guess)*seg.Seconds()) + 500
}

// medianRate is the median of the segments' rates: with an even number of
// segments, the mean of the middle two, so that neither side gets the
// higher of them.
func medianRate(rs []result) float64 {
	if len(rs) == 0 {
		return 0
	}
	rates := make([]float64, len(rs))
	for i, r := range rs {
		rates[i] = r.rate()
	}
	sort.Float64s(rates)
	n := len(rates)
	if n%2 == 0 {
		return (rates[n/2-1] + rates[n/2]) / 2
	}
	return rates[n/2]
}

// segmentLog lists a side's segments for the log: jobs in time each.
func segmentLog(rs []result) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%d/%v", r.jobs, r.elapsed.Round(time.Millisecond))
	}
	return strings.Join(parts, " ")
}

// peerCell measures one line: inbox and the peer p with workers workers,
// in segments of seg, each side topped up to want jobs before its segment.
// note tells more of the peer's segments, for the log.
func peerCell(ctx context.Context, log io.Writer, e engine, p peer, workers int, dir string, want [2]int, seg time.Duration, segments int) (rs [2][]result, note string, err error) {
	db, err := e.open(dir, workers+2) // the lease form's pool: cell.conns
	if err != nil {
		return rs, "", err
	}
	defer db.Close()
	in, err := newInboxPeer(ctx, e, db, peersTable+e.name)
	if err != nil {
		return rs, "", err
	}
	defer in.close()
	peer, err := p.side(ctx, e, db, dir, workers, log)
	if err != nil {
		return rs, "", err
	}
	defer peer.close()
	sides := [2]peerSide{in, peer}
	left := [2]int{}
	for i := 0; i < segments; i++ {
		for k := 0; k < 2; k++ {
			which := k
			if i%2 == 1 {
				which = 1 - k
			}
			s := sides[which]
			if left[which] < want[which] {
				if err := s.fill(ctx, want[which]-left[which]); err != nil {
					return rs, "", fmt.Errorf("fill: %w", err)
				}
				left[which] = want[which]
			}
			if e.family == "postgres" {
				// This server runs with autovacuum off: each segment would
				// otherwise start on the dead rows of every segment before
				// (two a job on each side), and graphile-worker's jobs table
				// would never be analyzed: without statistics its fetch of
				// 500 is planned for an empty table and, 100,000 jobs deep,
				// ran at 12k jobs/s against 36k analyzed (inbox's table is
				// analyzed once filled). Vacuumed and analyzed, as
				// autovacuum keeps a busy queue table, outside the time.
				if _, err := db.ExecContext(ctx, "VACUUM ANALYZE"); err != nil {
					return rs, "", fmt.Errorf("vacuum: %w", err)
				}
			}
			r, used := s.segment(ctx, workers, left[which], seg)
			if r.err != nil {
				return rs, "", fmt.Errorf("%s: %w", [2]string{"inbox", "peer"}[which], r.err)
			}
			left[which] -= used
			rs[which] = append(rs[which], r)
		}
	}
	// Every job counted was acknowledged once, and no other was.
	for k, s := range sides {
		n, err := s.pending(ctx)
		if err != nil {
			return rs, "", err
		}
		if n != left[k] {
			return rs, "", fmt.Errorf("%s: %d jobs pending, want %d", [2]string{"inbox", "peer"}[k], n, left[k])
		}
	}
	if r, ok := peer.(*riverSide); ok {
		note = fmt.Sprintf(" (the last completions of a segment recorded up to %v after its pause)", r.lastRecord.Round(time.Millisecond))
	}
	if g, ok := peer.(*graphileSide); ok {
		note = g.note()
	}
	return rs, note, nil
}

// The inbox side of -run peers: its claim size, and whether its table is
// shallow (no claim index, Table.Shallow).
var (
	peerBatch   = 16
	peerShallow bool
	peerWork    bool // worker.Run loops with Batch peerBatch, in place of Claim + AckAll
)

// inboxPeer is the table's inbox side for the lease form and a batch of
// peerBatch, on a table of its own with the recommended lease indexes
// (none with peerShallow).
type inboxPeer struct {
	*inboxSide
	e     engine
	db    *sql.DB
	table string
}

func newInboxPeer(ctx context.Context, e engine, db *sql.DB, table string) (*inboxPeer, error) {
	if err := e.createTable(ctx, db, table); err != nil {
		return nil, err
	}
	form := "lease-shallow"
	if !peerShallow {
		form = "lease"
		for _, s := range depthIndexes(e, table) {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return nil, err
			}
		}
	}
	s, err := newInboxSide(e, db, table, form, peerBatch)
	if err != nil {
		return nil, err
	}
	return &inboxPeer{inboxSide: s, e: e, db: db, table: table}, nil
}

func (p *inboxPeer) fill(ctx context.Context, n int) error {
	if err := p.e.fill(ctx, p.db, p.table, n, payload); err != nil {
		return err
	}
	if p.e.family == "postgres" {
		// Fresh statistics, as for the table: the plan should not change
		// mid-run when autovacuum gets to the table.
		_, err := p.db.ExecContext(ctx, "ANALYZE "+p.table)
		return err
	}
	return nil
}

func (p *inboxPeer) segment(ctx context.Context, workers, total int, duration time.Duration) (result, int) {
	if peerWork {
		r := measureWork(ctx, p.q, cell{e: p.e, form: "lease", workers: workers, batch: peerBatch}, total, duration)
		return r, r.jobs
	}
	r := measure(ctx, p.inboxSide, workers, total, duration, 10*time.Second)
	return r, r.jobs
}

func (p *inboxPeer) pending(ctx context.Context) (int, error) {
	return count(ctx, p.db, p.table)
}

func (p *inboxPeer) close() {
	p.inboxSide.close()
	p.e.drop(context.Background(), p.db, p.table)
}

// goqiteSchemaSQLite is goqite v0.4.0's schema_sqlite.sql, which its README
// has users run before New (the module ships it as a file, which a program
// of another module cannot embed).
const goqiteSchemaSQLite = `create table goqite (
  id text primary key default ('m_' || lower(hex(randomblob(16)))),
  created text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  updated text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  queue text not null,
  body blob not null,
  timeout text not null default (strftime('%Y-%m-%dT%H:%M:%fZ')),
  received integer not null default 0,
  priority integer not null default 0
) strict;

create trigger goqite_updated_timestamp after update on goqite begin
  update goqite set updated = strftime('%Y-%m-%dT%H:%M:%fZ') where id = old.id;
end;

create index goqite_queue_priority_created_idx on goqite (queue, priority desc, created);
`

// goqiteSide: each round receives one message, reads it and deletes it.
type goqiteSide struct {
	db *sql.DB
	q  *goqite.Queue
}

func newGoqiteSide(ctx context.Context, db *sql.DB) (*goqiteSide, error) {
	for _, s := range []string{"DROP TABLE IF EXISTS goqite", goqiteSchemaSQLite} {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return nil, fmt.Errorf("goqite schema: %w", err)
		}
	}
	return &goqiteSide{db: db, q: goqite.New(goqite.NewOpts{DB: db, Name: "bench"})}, nil
}

// fill sends n messages, a thousand to a transaction: one transaction per
// message would make the fill, which is not measured, take longer than the
// segments.
func (g *goqiteSide) fill(ctx context.Context, n int) error {
	for n > 0 {
		k := min(n, 1000)
		tx, err := g.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		for range k {
			if err := g.q.SendTx(ctx, tx, goqite.Message{Body: payload}); err != nil {
				tx.Rollback()
				return err
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (g *goqiteSide) round(ctx context.Context) (int, error) {
	m, err := g.q.Receive(ctx)
	if err != nil || m == nil {
		return 0, err
	}
	if len(m.Body) != len(payload) { // the no-op handler reads the body
		return 0, fmt.Errorf("goqite message %s: %d bytes", m.ID, len(m.Body))
	}
	if err := g.q.Delete(ctx, m.ID); err != nil {
		return 0, err
	}
	return 1, nil
}

func (g *goqiteSide) segment(ctx context.Context, workers, total int, duration time.Duration) (result, int) {
	r := measure(ctx, g, workers, total, duration, 10*time.Second)
	return r, r.jobs
}

// pending counts the messages left; none may have been received without
// being deleted.
func (g *goqiteSide) pending(ctx context.Context) (int, error) {
	var n, received int
	err := g.db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(*) FILTER (WHERE received > 0) FROM goqite").Scan(&n, &received)
	if err == nil && received > 0 {
		err = fmt.Errorf("goqite: %d messages received and not deleted", received)
	}
	return n, err
}

func (g *goqiteSide) close() {
	g.db.ExecContext(context.Background(), "DROP TABLE IF EXISTS goqite")
}

// riverArgs is a River job: the payload, which River stores in the job's
// JSON arguments (base64).
type riverArgs struct {
	Payload []byte `json:"payload"`
}

func (riverArgs) Kind() string { return "bench_noop" }

// riverWorker is the no-op worker: it checks the payload River decoded and
// counts the job.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	side *riverSide
}

func (w *riverWorker) Work(ctx context.Context, job *river.Job[riverArgs]) error {
	if len(job.Args.Payload) != len(payload) {
		return fmt.Errorf("River job %d: %d bytes", job.ID, len(job.Args.Payload))
	}
	n := w.side.handled.Add(1)
	if g := w.side.goal.Load(); g != nil && n == g.n {
		close(g.reached)
	}
	return nil
}

// riverGoal is the handled count at which a segment has worked through all
// the jobs it was given.
type riverGoal struct {
	n       int64
	reached chan struct{}
}

// riverSide runs one River client for a line, on a queue of its own that
// stays paused outside its segments.
type riverSide struct {
	pool    *pgxpool.Pool
	client  *river.Client[pgx.Tx]
	queue   string
	paused  <-chan *river.Event
	handled atomic.Int64
	goal    atomic.Pointer[riverGoal]
	// lastRecord is the longest wait, after a pause, for River to record
	// the last completions of a segment.
	lastRecord time.Duration
}

// riverQueues numbers the lines' queues: a fresh queue starts unpaused, so
// that the first pause of a line is certain to be reported.
var riverQueues atomic.Int64

// riverPool opens a pgx pool on River's schema.
func riverPool(ctx context.Context, e engine, dir string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.dsn(dir))
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["search_path"] = riverSchema
	return pgxpool.NewWithConfig(ctx, cfg)
}

// riverLogger sends River's warnings and errors to the log, off the
// table's output.
func riverLogger(log io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// riverMigrate makes River's schema afresh and runs its migrations into it.
func riverMigrate(ctx context.Context, e engine, dir string, log io.Writer) error {
	pool, err := riverPool(ctx, e, dir, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, s := range []string{"DROP SCHEMA IF EXISTS " + riverSchema + " CASCADE", "CREATE SCHEMA " + riverSchema} {
		if _, err := pool.Exec(ctx, s); err != nil {
			return err
		}
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: riverLogger(log)})
	if err != nil {
		return err
	}
	_, err = m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	return err
}

func riverDropSchema(ctx context.Context, e engine, dir string) {
	pool, err := riverPool(ctx, e, dir, 1)
	if err != nil {
		return
	}
	defer pool.Close()
	pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+riverSchema+" CASCADE")
}

// newRiverSide starts a client with workers workers on an empty job table
// and pauses its queue. Its pool has a connection per worker and four for
// River's own: the listener, the fetches, the completer, the leader's
// services.
func newRiverSide(ctx context.Context, e engine, dir string, workers int, log io.Writer) (s *riverSide, err error) {
	s = &riverSide{queue: fmt.Sprintf("peers_%d", riverQueues.Add(1))}
	if s.pool, err = riverPool(ctx, e, dir, workers+4); err != nil {
		return nil, err
	}
	if _, err = s.pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		s.pool.Close()
		return nil, err
	}
	ws := river.NewWorkers()
	river.AddWorker(ws, &riverWorker{side: s})
	s.client, err = river.NewClient(riverpgxv5.New(s.pool), &river.Config{
		Queues:        map[string]river.QueueConfig{s.queue: {MaxWorkers: workers}},
		Workers:       ws,
		FetchCooldown: riverFetchCooldown,
		Logger:        riverLogger(log),
	})
	if err != nil {
		s.pool.Close()
		return nil, err
	}
	s.paused, _ = s.client.SubscribeConfig(&river.SubscribeConfig{ChanSize: 16, Kinds: []river.EventKind{river.EventKindQueuePaused}})
	if err = s.client.Start(ctx); err != nil {
		s.pool.Close()
		return nil, err
	}
	if err = s.pause(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// pause pauses the queue and waits for the client's producer to report it:
// from then on it fetches nothing. River delivers the pause by
// LISTEN/NOTIFY within milliseconds, and recovers a lost notification by
// polling once a minute, hence the deadline.
func (s *riverSide) pause(ctx context.Context) error {
	if err := s.client.QueuePause(ctx, s.queue, nil); err != nil {
		return err
	}
	deadline := time.NewTimer(65 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case ev := <-s.paused:
			if ev.Queue != nil && ev.Queue.Name == s.queue {
				return nil
			}
		case <-deadline.C:
			return fmt.Errorf("River: queue %s not reported paused after 65s", s.queue)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// fill inserts n jobs with InsertMany, two thousand to a call, while the
// queue is paused.
func (s *riverSide) fill(ctx context.Context, n int) error {
	batch := make([]river.InsertManyParams, 0, min(n, 2000))
	for n > 0 {
		batch = batch[:0]
		for range min(n, 2000) {
			batch = append(batch, river.InsertManyParams{Args: riverArgs{Payload: payload}, InsertOpts: &river.InsertOpts{Queue: s.queue}})
		}
		if _, err := s.client.InsertMany(ctx, batch); err != nil {
			return err
		}
		n -= len(batch)
	}
	return nil
}

// segment resumes the queue, pauses it when duration has passed or total
// jobs were handled, and counts the jobs handled until the client reported
// the pause. Then, untimed, it waits for River to record as completed every
// job it fetched.
func (s *riverSide) segment(ctx context.Context, workers, total int, duration time.Duration) (result, int) {
	before := s.handled.Load()
	g := &riverGoal{n: before + int64(total), reached: make(chan struct{})}
	s.goal.Store(g)
	defer s.goal.Store(nil)
	start := time.Now()
	if err := s.client.QueueResume(ctx, s.queue, nil); err != nil {
		return result{err: err}, 0
	}
	timer := time.NewTimer(duration)
	select {
	case <-timer.C:
	case <-g.reached:
	case <-ctx.Done():
	}
	timer.Stop()
	if err := s.pause(ctx); err != nil {
		return result{err: err}, 0
	}
	r := result{jobs: int(s.handled.Load() - before), elapsed: time.Since(start)}
	paused := time.Now()
	r.err = s.settle(ctx)
	s.lastRecord = max(s.lastRecord, time.Since(paused))
	return r, int(s.handled.Load() - before)
}

// settle polls until no job of the queue is running: River's completer
// records completions in batches, as soon as 100 are waiting, else every
// 250 ms.
func (s *riverSide) settle(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var running int
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE queue = $1 AND state = 'running'", s.queue).Scan(&running); err != nil {
			return err
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("River: %d jobs still running 10s after the pause", running)
		}
		time.Sleep(time.Millisecond)
	}
}

// pending counts the available jobs, and checks that every handled job was
// recorded as completed and no job is in another state.
func (s *riverSide) pending(ctx context.Context) (int, error) {
	var available, completed, other int
	err := s.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE state = 'available'), count(*) FILTER (WHERE state = 'completed'),"+
		" count(*) FILTER (WHERE state NOT IN ('available', 'completed')) FROM river_job WHERE queue = $1", s.queue).Scan(&available, &completed, &other)
	if err != nil {
		return 0, err
	}
	if h := s.handled.Load(); int64(completed) != h || other != 0 {
		return 0, fmt.Errorf("River: %d jobs handled, %d completed, %d in other states", h, completed, other)
	}
	return available, nil
}

func (s *riverSide) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.client.Stop(ctx)
	s.pool.Close()
}

// peerInboxForm names the inbox side's table for the header.
func peerInboxForm() string {
	if peerShallow {
		return "lease on a shallow table (no claim index, Table.Shallow)"
	}
	return "lease"
}

// peerInboxLoop says how the inbox side claims and settles, for the header.
func peerInboxLoop() string {
	settings := ""
	if p := preparedWhere(); p != "" {
		settings = " (" + p + ")"
	}
	settings += boundNote()
	if peerWork {
		return fmt.Sprintf("one worker.Run call, Workers loops with Batch %d (taking turns to claim, their acknowledgements grouped by its Batcher), jobs counted as handled%s", peerBatch, settings)
	}
	return fmt.Sprintf("Claim(%d) + Batcher.AckAll%s", peerBatch, settings)
}
