package main

// -run scale: many worker processes against one server (PostgreSQL or
// MySQL/MariaDB). Each
// line of its table is one claim form run by P processes of W workers each
// (the -scale plan, "1x1,1x16,1x64,4x16" by default; "4x16:9" gives each
// process a pool of 9 connections), all set off at once on one table and
// stopped together. The figures: every process's acknowledgements over the
// window, and, sampled on the server halfway through, the run's
// connections and its jobs in work (lease: rows under a lease in force;
// row lock: sessions inside a transaction; advisory: advisory locks held).
// -scale-hold gives the handler a duration, so that jobs in work show what
// a pool allows. The lease tables get the claim's recommended indexes.
//
// Each process is this program started again (scaleChildEnv), so that 64
// workers in four processes meet the server as four hosts would: four
// pools, four sets of connections, and no shared in-process state (the
// advisory form's keys in work, the Batcher).

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"github.com/sqlinbox/inbox/dialect"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sqlinbox/inbox"
)

// scaleChildEnv, when set, makes this program one worker process of -run
// scale, configured by its value (see scaleChild).
const scaleChildEnv = "INBOX_BENCH_SCALE_CHILD"

// scaleApp is the application_name of the run's connections, by which the
// parent counts them on the server.
const scaleApp = "inbox_bench_scale"

var (
	scalePlan string
	scaleReps int
	scaleHold time.Duration
	// scaleClaims is each process's Config.ClaimsAtOnce.
	scaleClaims int
)

func init() {
	if v := os.Getenv(scaleChildEnv); v != "" {
		// Before main parses the parent's flags: the child takes its
		// configuration from the environment alone.
		os.Exit(scaleChildMain(v))
	}
	flag.StringVar(&scalePlan, "scale", "1x1,1x16,1x64,4x16", "scale: processes x workers per process, one table line each; 4x16@2 gives each process Config.ClaimsAtOnce 2")
	flag.IntVar(&scaleReps, "scale-reps", 3, "scale: runs of each line; the table gives the median")
	flag.DurationVar(&scaleHold, "scale-hold", 0, "scale: how long each handler runs (0: a no-op handler)")
	flag.IntVar(&scaleClaims, "scale-claims", 0, "scale: each process's Config.ClaimsAtOnce (0: no bound)")
}

// scalePlanEntry is one entry of -scale: procs processes of workers
// workers, each process with a pool of pool connections (0: scaleConns)
// and inbox's Config.ClaimsAtOnce claims (0: -scale-claims).
type scalePlanEntry struct{ procs, workers, pool, claims int }

// claimsAtOnce is the line's Config.ClaimsAtOnce for each process.
func (e scalePlanEntry) claimsAtOnce() int {
	if e.claims > 0 {
		return e.claims
	}
	return scaleClaims
}

// scaleLine is one form (and batch) under one plan entry.
type scaleLine struct {
	form  string
	batch int
	scalePlanEntry
}

// scaleChild is a worker process's configuration, passed as
// "engine,table,form,batch,workers,pool,hold,duration,claims".
type scaleChild struct {
	engine, table, form  string
	batch, workers, pool int
	hold, duration       time.Duration
	claims               int // the queue's Config.ClaimsAtOnce
}

func (c scaleChild) encode() string {
	return strings.Join([]string{c.engine, c.table, c.form, strconv.Itoa(c.batch), strconv.Itoa(c.workers),
		strconv.Itoa(c.pool), c.hold.String(), c.duration.String(), strconv.Itoa(c.claims)}, ",")
}

func decodeScaleChild(s string) (scaleChild, error) {
	f := strings.Split(s, ",")
	if len(f) != 9 {
		return scaleChild{}, fmt.Errorf("%s=%q: want engine,table,form,batch,workers,pool,hold,duration,claims", scaleChildEnv, s)
	}
	c := scaleChild{engine: f[0], table: f[1], form: f[2]}
	var errs [6]error
	c.batch, errs[0] = strconv.Atoi(f[3])
	c.workers, errs[1] = strconv.Atoi(f[4])
	c.pool, errs[2] = strconv.Atoi(f[5])
	c.hold, errs[3] = time.ParseDuration(f[6])
	c.duration, errs[4] = time.ParseDuration(f[7])
	c.claims, errs[5] = strconv.Atoi(f[8])
	return c, errors.Join(errs[:]...)
}

// parseScalePlan reads "PxW[:pool][@claims],…".
func parseScalePlan(s string) ([]scalePlanEntry, error) {
	var plan []scalePlanEntry
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		rest, claims, hasClaims := strings.Cut(f, "@")
		pw, pool, hasPool := strings.Cut(rest, ":")
		p, w, ok := strings.Cut(pw, "x")
		var e scalePlanEntry
		var err1, err2, err3, err4 error
		e.procs, err1 = strconv.Atoi(p)
		e.workers, err2 = strconv.Atoi(w)
		if hasPool {
			e.pool, err3 = strconv.Atoi(pool)
			if err3 == nil && e.pool < 2 {
				err3 = errors.New("a pool under 2")
			}
		}
		if hasClaims {
			e.claims, err4 = strconv.Atoi(claims)
			if err4 == nil && e.claims < 1 {
				err4 = errors.New("a bound under 1")
			}
		}
		if !ok || err1 != nil || err2 != nil || err3 != nil || err4 != nil || e.procs <= 0 || e.workers <= 0 {
			return nil, fmt.Errorf("-scale %q: want processes x workers, optionally :pool and @claims at once, such as 4x16, 4x16:9 or 4x16@2", f)
		}
		plan = append(plan, e)
	}
	return plan, nil
}

// scaleConns is a worker process's pool when the plan names none: the
// lease form uses a connection per statement, so one per worker and two
// for the batcher suffice; the forms that hold a connection per job get
// one per job plus the one the queue never takes (the pool rule:
// SetMaxOpenConns(n) holds at most n-1 jobs).
func scaleConns(form string, workers, batch int) int {
	if form == "lease" {
		return workers + 2
	}
	return workers*batch + 1
}

// scaleDSN adds the run's application_name to a PostgreSQL DSN, URL or
// keyword form. MySQL's DSN stays as it is: the run's connections are
// counted by database there (scaleSampleNow).
func scaleDSN(e engine, dsn string) string {
	if e.family != "postgres" {
		return dsn
	}
	if !strings.Contains(dsn, "://") {
		return dsn + " application_name=" + scaleApp
	}
	if strings.Contains(dsn, "?") {
		return dsn + "&application_name=" + scaleApp
	}
	return dsn + "?application_name=" + scaleApp
}

// runScale prints the table of -run scale for the PostgreSQL and MySQL
// engines of es, and with -svg a chart per engine.
func runScale(ctx context.Context, out, log io.Writer, es []engine, forms []string, duration time.Duration, dir string) error {
	plan, err := parseScalePlan(scalePlan)
	if err != nil {
		return err
	}
	var lines []scaleLine
	for _, form := range forms {
		form = strings.TrimSpace(form)
		batches := []int{1}
		switch form {
		case "lease":
			batches = []int{1, 16}
		case "rowlock", "advisory", "advisory-walk", "advisory-minimal", "advisory-floor":
		default:
			continue // lease-async shares one Batcher inside a process; the lease lines stand for it
		}
		for _, b := range batches {
			for _, pe := range plan {
				lines = append(lines, scaleLine{form: form, batch: b, scalePlanEntry: pe})
			}
		}
	}
	pgs, err := scaleServers(out, log, es, dir)
	if err != nil {
		return err
	}
	handler := "a no-op handler"
	if scaleHold > 0 {
		handler = "a handler of " + scaleHold.String()
	}
	bound := "inbox's processes claiming freely"
	if scaleClaims > 0 {
		bound = fmt.Sprintf("each of inbox's processes with Config.ClaimsAtOnce %d", scaleClaims)
	}
	bound += ", or as the line says; the advisory-minimal and advisory-floor baselines unbounded"
	fmt.Fprintf(out, "Each line: P processes of W workers on one table (%s), claim + %s + ack for %v, median of %d runs. "+
		"Connections and jobs in work sampled on the server halfway through each run (the largest sample of the runs).\n\n", bound, handler, duration, scaleReps)
	fmt.Fprintln(out, "| driver | form | batch | processes × workers | pool per process | jobs/s (median) | runs | server connections | jobs in work |")
	fmt.Fprintln(out, "|---|---|---:|---|---:|---:|---|---:|---:|")
	for _, e := range pgs {
		medians := make([]float64, len(lines))
		for i, l := range lines {
			var err error
			if medians[i], err = scaleLineRuns(ctx, out, log, e, l, duration); err != nil {
				return err
			}
		}
		if err := writeScaleCharts(e, lines, medians); err != nil {
			return err
		}
	}
	return nil
}

// writeScaleCharts writes an engine's charts under -svg: single jobs, and
// batches apart, whose rates would flatten the single jobs' lines.
func writeScaleCharts(e engine, lines []scaleLine, medians []float64) error {
	for _, batched := range []bool{false, true} {
		c, name := scaleChart(e, lines, medians, batched), "scale-"+e.name+".svg"
		if batched {
			name = "scale-" + e.name + "-batch.svg"
		}
		if len(c.series) == 0 {
			continue
		}
		if err := writeChart(svgDir, name, c); err != nil {
			return err
		}
	}
	return nil
}

// scaleLineRuns runs one line -scale-reps times, prints its table line and
// returns the median rate.
func scaleLineRuns(ctx context.Context, out, log io.Writer, e engine, l scaleLine, duration time.Duration) (float64, error) {
	var rates []float64
	sample := scaleSample{inWork: -1}
	for r := 0; r < scaleReps; r++ {
		rate, got, err := scaleRun(ctx, log, e, l, duration)
		if err != nil {
			return 0, fmt.Errorf("scale %s %s b%d %dx%d: %w", e.name, l.form, l.batch, l.procs, l.workers, err)
		}
		rates = append(rates, rate)
		sample.conns, sample.inWork = max(sample.conns, got.conns), max(sample.inWork, got.inWork)
	}
	runs := make([]string, len(rates))
	for i, r := range rates {
		runs[i] = strconv.FormatFloat(r, 'f', 0, 64)
	}
	sorted := slices.Clone(rates)
	slices.Sort(sorted)
	inWork := strconv.Itoa(sample.inWork)
	if sample.inWork < 0 {
		inWork = "–" // not counted on this engine
	}
	fmt.Fprintf(out, "| %s | %s | %d | %s | %d | %.0f | %s | %d | %s |\n", e.label, l.form, l.batch, l.layout(),
		l.poolSize(), sorted[len(sorted)/2], strings.Join(runs, " / "), sample.conns, inWork)
	return sorted[len(sorted)/2], nil
}

// scaleChart is jobs/s against workers (log scale) of the run's lines of
// one job per claim, or of batches (batched): a series per form and batch,
// and one more for each number of processes past one, whose workers are
// counted together.
func scaleChart(e engine, lines []scaleLine, medians []float64, batched bool) chart {
	c := chart{
		title:  "Workers on one table, no-op handler: " + e.family + " (" + e.label + ")",
		xLabel: "workers, all processes (log scale)", yLabel: "jobs/s", logX: true,
	}
	index := map[string]int{}
	ticks := map[int]bool{}
	for i, l := range lines {
		if (l.batch > 1) != batched {
			continue
		}
		name := l.form
		if l.batch > 1 {
			name += fmt.Sprintf(", %d per claim", l.batch)
		}
		if l.procs > 1 {
			name += fmt.Sprintf(", %d processes", l.procs)
		}
		if l.claims > 0 && !scaleBaseline(l.form) {
			name += fmt.Sprintf(", %d claims at once", l.claims)
		}
		k, ok := index[name]
		if !ok {
			k, index[name] = len(c.series), len(c.series)
			c.series = append(c.series, series{name: name})
		}
		w := l.procs * l.workers
		c.series[k].points = append(c.series[k].points, point{x: float64(w), y: medians[i]})
		if !ticks[w] {
			ticks[w] = true
			c.xTicks = append(c.xTicks, tick{float64(w), strconv.Itoa(w)})
		}
	}
	return c
}

// scaleServers picks the server engines of es (SQLite has no sessions
// of its own to scale) and prints the run's header with their versions.
func scaleServers(out, log io.Writer, es []engine, dir string) ([]engine, error) {
	var versions []string
	var servers []engine
	for _, e := range es {
		if e.family == "sqlite" {
			fmt.Fprintf(log, "scale: %s skipped, the scale table is for servers\n", e.name)
			continue
		}
		servers = append(servers, e)
		db, err := e.open(dir, 1)
		if err != nil {
			return nil, err
		}
		versions = append(versions, e.version(db)+" ("+e.label+")")
		db.Close()
	}
	if len(servers) == 0 {
		return nil, errors.New("-run scale needs a server engine: -engines pq, pgx or mysql")
	}
	header(out, versions)
	return servers, nil
}

// layout names the line's processes and workers, and the claims bound it
// gives inbox's processes.
func (l scaleLine) layout() string {
	s := fmt.Sprintf("%d × %d", l.procs, l.workers)
	if n := l.claimsAtOnce(); n > 0 && !scaleBaseline(l.form) {
		s += fmt.Sprintf(", %d claims at once", n)
	}
	return s
}

// poolSize is the line's pool per process.
func (l scaleLine) poolSize() int {
	if l.pool > 0 {
		return l.pool
	}
	return scaleConns(l.form, l.workers, l.batch)
}

// scaleSample is what the server showed halfway through a run.
type scaleSample struct{ conns, inWork int }

// scaleRun runs one line once: a fresh table filled with more jobs than
// the line can take in duration, procs worker processes started, set off
// together, and their acknowledgements summed. It returns jobs per second
// over the longest process's window and the server's sample.
func scaleRun(ctx context.Context, log io.Writer, e engine, l scaleLine, duration time.Duration) (rate float64, sample scaleSample, err error) {
	db, err := e.openDSN(e.dsn(""), 2)
	if err != nil {
		return 0, sample, err
	}
	defer db.Close()
	table := "bench_scale_" + e.name
	if err := e.createTable(ctx, db, table); err != nil {
		return 0, sample, err
	}
	defer e.drop(context.WithoutCancel(ctx), db, table)
	// Generous: more than the fastest line seen here could take.
	perSec := 8000
	if l.form == "lease" && l.batch > 1 {
		perSec = 40000
	}
	fill := int(float64(perSec)*duration.Seconds()) + 1000
	if l.form == "lease" {
		// The lease claim's indexes, as schema/ recommends: without the
		// one on the lease column every claim scans the table.
		for _, s := range depthIndexes(e, table) {
			if _, err := db.ExecContext(ctx, s); err != nil {
				return 0, sample, err
			}
		}
	}
	if err := e.fill(ctx, db, table, fill, payload); err != nil {
		return 0, sample, err
	}
	analyze(ctx, e, db, table)
	self, err := os.Executable()
	if err != nil {
		return 0, sample, err
	}
	cfg := scaleChild{engine: e.name, table: table, form: l.form, batch: l.batch, workers: l.workers,
		pool: l.poolSize(), hold: scaleHold, duration: duration, claims: l.claimsAtOnce()}.encode()
	type proc struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		lines chan string
	}
	procs := make([]proc, l.procs)
	defer func() {
		for _, p := range procs {
			if p.cmd == nil {
				continue
			}
			p.stdin.Close() // a worker process ends when its standard input does
			if werr := p.cmd.Wait(); werr != nil && err == nil {
				err = fmt.Errorf("worker process: %w", werr)
			}
		}
	}()
	for i := range procs {
		cmd := exec.CommandContext(ctx, self)
		cmd.Env = append(os.Environ(), scaleChildEnv+"="+cfg, fmt.Sprintf("%s=%d/%d", scaleSlotEnv, i, l.procs))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return 0, sample, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return 0, sample, err
		}
		if err := cmd.Start(); err != nil {
			return 0, sample, err
		}
		lines := make(chan string, 4)
		go func() {
			defer close(lines)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines <- sc.Text()
			}
		}()
		procs[i] = proc{cmd: cmd, stdin: stdin, lines: lines}
	}
	next := func(p proc) (string, error) {
		select {
		case s, ok := <-p.lines:
			if !ok {
				return "", errors.New("a worker process ended early")
			}
			return s, nil
		case <-time.After(duration + time.Minute):
			return "", errors.New("a worker process did not answer within a minute")
		}
	}
	for _, p := range procs {
		if s, err := next(p); err != nil || s != "ready" {
			return 0, sample, fmt.Errorf("waiting for ready: %q %v", s, err)
		}
	}
	for _, p := range procs {
		if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
			return 0, sample, err
		}
	}
	var sampled sync.WaitGroup
	var sampleErr error
	sampled.Add(1)
	go func() {
		defer sampled.Done()
		time.Sleep(duration / 2)
		sample, sampleErr = scaleSampleNow(ctx, e, db, l.form, table)
	}()
	var jobs int
	var window time.Duration
	for _, p := range procs {
		s, err := next(p)
		if err != nil {
			return 0, sample, err
		}
		var n int
		var ns int64
		if _, err := fmt.Sscanf(s, "done %d %d", &n, &ns); err != nil {
			return 0, sample, fmt.Errorf("worker process said %q", s)
		}
		jobs += n
		window = max(window, time.Duration(ns))
	}
	sampled.Wait()
	if sampleErr != nil {
		return 0, sample, sampleErr
	}
	left, err := count(ctx, db, table)
	if err != nil {
		return 0, sample, err
	}
	if left == 0 {
		fmt.Fprintf(log, "scale %s %s b%d %dx%d: the table ran dry; the rate is a lower bound\n", e.name, l.form, l.batch, l.procs, l.workers)
	}
	fmt.Fprintf(log, "scale %s %s b%d %dx%d pool %d: %d jobs in %v, %d connections, %d jobs in work\n",
		e.name, l.form, l.batch, l.procs, l.workers, l.poolSize(), jobs, window.Round(time.Millisecond), sample.conns, sample.inWork)
	return float64(jobs) / window.Seconds(), sample, nil
}

// scaleSampleNow counts the run's connections on the server, and its jobs
// in work as the form holds them: rows under a lease in force, sessions
// inside a transaction (row lock), advisory locks granted.
func scaleSampleNow(ctx context.Context, e engine, db *sql.DB, form, table string) (scaleSample, error) {
	if e.family == "mysql" {
		return scaleSampleMySQL(ctx, db, form, table)
	}
	var s scaleSample
	err := db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", scaleApp).Scan(&s.conns)
	if err != nil {
		return s, err
	}
	var row *sql.Row
	switch form {
	case "lease":
		row = db.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" WHERE locked_until > statement_timestamp()")
	case "rowlock":
		row = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND xact_start IS NOT NULL", scaleApp)
	default:
		row = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "+
			"WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1", scaleApp)
	}
	err = row.Scan(&s.inWork)
	return s, err
}

// scaleSide is one worker process's round: claim up to batch jobs, run the
// handler on each (read the payload, then hold for the -scale-hold time),
// acknowledge them (a lease batch through one Batcher.AckAll).
type scaleSide struct {
	q     *inbox.Queue
	b     *inbox.Batcher
	batch int
	hold  time.Duration
}

func (s *scaleSide) round(ctx context.Context) (int, error) {
	ds, err := s.q.Claim(ctx, s.batch)
	if err != nil || len(ds) == 0 {
		return 0, err
	}
	for _, d := range ds {
		var p []byte
		if err := d.Scan(&p); err != nil {
			return 0, err
		}
	}
	if s.hold > 0 {
		time.Sleep(s.hold) // the handlers of a batch run side by side
	}
	if s.b != nil {
		for i, err := range s.b.AckAll(ctx, ds) {
			if err != nil {
				return 0, fmt.Errorf("ack %v: %w", ds[i].ID(), err)
			}
		}
		return len(ds), nil
	}
	for i, d := range ds {
		if err := d.Ack(ctx); err != nil {
			return i, fmt.Errorf("ack %v: %w", d.ID(), err)
		}
	}
	return len(ds), nil
}

func (s *scaleSide) close() {
	if s.b != nil {
		s.b.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.q.Shutdown(ctx)
}

// scaleChildMain is one worker process: it opens its own pool, warms its
// connections, prints "ready", waits for "go" on its standard input, runs
// its workers for the duration, prints "done <jobs> <nanoseconds>", and
// ends when its standard input does.
func scaleChildMain(config string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "bench scale worker:", err)
		return 1
	}
	c, err := decodeScaleChild(config)
	if err != nil {
		return fail(err)
	}
	e, err := engineNamed(c.engine)
	if err != nil {
		return fail(err)
	}
	db, err := e.openDSN(scaleDSN(e, e.dsn("")), c.pool)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := warm(ctx, db, c.pool); err != nil {
		return fail(err)
	}
	baseline, err := newScaleBaseline(e, db, c.table, c.form, c.batch)
	if err != nil {
		return fail(err)
	}
	if baseline != nil {
		return scaleChildRun(ctx, baseline, c)
	}
	cfg := inbox.Config{Dialect: e.dialect, Table: benchTable(c.table, c.form), ClaimsAtOnce: c.claims}
	if c.form == "advisory-walk" {
		cfg.Dialect, cfg.Table = walkDialect{e.dialect}, benchTable(c.table, "advisory")
	}
	q, err := inbox.New(db, cfg)
	if err != nil {
		return fail(err)
	}
	s := &scaleSide{q: q, batch: c.batch, hold: c.hold}
	if c.form == "lease" && c.batch > 1 {
		if s.b, err = q.NewBatcher(inbox.BatchConfig{MaxBatch: c.batch}); err != nil {
			return fail(err)
		}
	}
	defer s.close()
	return scaleChildRun(ctx, s, c)
}

// scaleChildRun prints "ready", waits for "go", runs s's workers for the
// duration, prints "done <jobs> <nanoseconds>", and waits for the end of
// standard input.
func scaleChildRun(ctx context.Context, s side, c scaleChild) int {
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		fmt.Fprintln(os.Stderr, "bench scale worker: no go on standard input")
		return 1
	}
	r := measure(ctx, s, c.workers, 1<<40, c.duration, 10*time.Second)
	if r.err != nil {
		fmt.Fprintln(os.Stderr, "bench scale worker:", r.err)
		return 1
	}
	fmt.Printf("done %d %d\n", r.jobs, r.elapsed.Nanoseconds())
	for in.Scan() {
	}
	return 0
}

// warm opens n connections of db at once and gives them back to the pool,
// so that no worker pays for a connection inside the measured window.
func warm(ctx context.Context, db *sql.DB, n int) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		if err := c.PingContext(ctx); err != nil {
			c.Close()
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// walkDialect is a dialect without Statements.Advisory.LockFirst: its advisory claim
// takes each candidate's lock from Go, one round trip a key, as every
// engine did before LockFirst. "-forms advisory,advisory-walk" measures the
// two in one run.
type walkDialect struct{ inbox.Dialect }

func (w walkDialect) Unwrap() inbox.Dialect { return w.Dialect }

func (w walkDialect) Statements(n *dialect.Names) (*inbox.Statements, error) {
	st, err := w.Dialect.Statements(n)
	if err == nil {
		st.Advisory.LockFirst, st.Advisory.LockFirstAfter = dialect.Stmt{}, dialect.Stmt{}
	}
	return st, err
}

// scaleSampleMySQL is scaleSampleNow on MySQL and MariaDB: the connections
// to the run's database (the parent's two among them), and the rows under a
// lease in force. The other forms' jobs in work are not counted (-1): the
// server lists GET_LOCK names only through a plugin, and a row lock's
// transaction is not told apart from a short statement's.
func scaleSampleMySQL(ctx context.Context, db *sql.DB, form, table string) (scaleSample, error) {
	s := scaleSample{inWork: -1}
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()").Scan(&s.conns)
	if err == nil && form == "lease" {
		err = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+" WHERE locked_until > UTC_TIMESTAMP(6)").Scan(&s.inWork)
	}
	return s, err
}
