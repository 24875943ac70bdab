// Command bench measures inbox against hand-written SQL doing the same work,
// on every database and driver, and prints markdown tables.
//
//	go run ./bench                      # the throughput table, about 6 minutes
//	go run ./bench -run depth           # claim cost with depth, with and without indexes
//	go run ./bench -run depth,scale -engines pgx -scale 1x1,1x4,1x16,1x64 -svg docs/bench   # and their charts
//	go run ./bench -run prepared        # plain statements against prepared ones, per driver
//	go run ./bench -run latency         # enqueue→handler-start latency of idle workers, by wake-up
//	go run ./bench -run idle            # statements per second sent by idle workers
//	go run ./bench -run work            # worker.Run against the hand-written loop
//	go run ./bench -run peers           # inbox against River and graphile-worker (pgx), goqite (SQLite)
//	go run ./bench -run sustained -engines pgx -forms lease   # ten minutes at 80 % load, with vacuum; every engine and form
//	go run ./bench -run enqueue         # EnqueueMany against a loop of Enqueue in a tx, and River's InsertMany (pgx)
//	go run ./bench -run breakdown       # per job: driver calls, time per statement, CPU, allocations, server writes
//
// The throughput table has, for each claim form on each engine and driver,
// with 1, 4 and 16 workers and batches of 1 and 16: jobs per second of claim
// + no-op handler + ack through inbox, the same by minimal hand-written SQL
// on the same pool, and their ratio. Both sides of a line run back to back
// on a table refilled with the same number of 128-byte jobs. Databases come
// from INBOX_POSTGRES_DSN and INBOX_MYSQL_DSN (defaults: those of .ci/run);
// SQLite is a file in a temporary directory, in WAL mode with a busy
// timeout. Tables are named bench_<engine>_….
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/sqlinbox/inbox"
)

func main() {
	if os.Getenv(latencyChildEnv) == "latency-worker" {
		os.Exit(latencyChildMain()) // the worker process of -run latency
	}
	var o options
	flag.StringVar(&o.run, "run", "table,peers,enqueue", "what to run: table, depth, prepared, latency, idle, work, scale, peers, sustained, enqueue, breakdown (comma-separated)")
	flag.StringVar(&o.engines, "engines", "pq,pgx,mysql,mattn,modernc", "engines and drivers")
	flag.StringVar(&o.forms, "forms", "lease,lease-async,rowlock,advisory", "claim forms (lease-async: lease, each job acknowledged from a goroutine of its own through the Batcher; lease-shallow: lease on a table without claim indexes, Table.Shallow)")
	flag.StringVar(&o.workers, "workers", "1,4,16", "worker counts")
	flag.StringVar(&o.batches, "batch", "1,16", "batch sizes (claim n, ack n)")
	flag.DurationVar(&o.duration, "duration", 1500*time.Millisecond, "measuring time of each side of a line")
	flag.IntVar(&o.segments, "segments", 6, "alternating segments per side of a line")
	flag.IntVar(&o.depthRows, "depth-rows", 1000000, "pending rows of the deep depth case")
	flag.IntVar(&o.rounds, "rounds", 300, "claim + ack rounds per depth or prepared measurement")
	flag.IntVar(&batchFlushers, "flushers", 0, "BatchConfig.Flushers of the inbox side (0: the default)")
	flag.IntVar(&batchMax, "maxbatch", 0, "BatchConfig.MaxBatch of the inbox side (0: the line's batch)")
	flag.DurationVar(&sustainFor, "sustain", sustainFor, "sustained: how long jobs are enqueued at a fixed rate")
	flag.Float64Var(&sustainLoad, "sustain-load", sustainLoad, "sustained: the enqueue rate as a fraction of the workers' measured throughput")
	flag.IntVar(&sustainWorkers, "sustain-workers", sustainWorkers, "sustained: workers, each claiming one job at a time")
	flag.DurationVar(&sustainVacuum, "sustain-vacuum", sustainVacuum, "sustained: on PostgreSQL, VACUUM the table this often (0: never; this machine runs autovacuum off); MariaDB purges and SQLite reuses pages on their own")
	flag.BoolVar(&sustainHold, "sustain-hold", false, "sustained: hold a transaction with a snapshot open for the whole run")
	flag.DurationVar(&riverFetchCooldown, "river-cooldown", riverFetchCooldown, "peers: River's Config.FetchCooldown (River's default, 100ms, allows about 10 jobs/s a worker)")
	flag.IntVar(&claimsAtOnce, "claims-at-once", 0, "table, breakdown, work, peers: inbox's side's Config.ClaimsAtOnce, how many of its claims send statements at once (0: no bound; -run scale has -scale-claims)")
	flag.StringVar(&prepareInbox, "prepare", prepareInbox, "table, work, peers, latency: inbox's side runs with Config.Prepare (its statements prepared once per connection): auto (where docs/operations.md recommends it: lib/pq, both SQLite drivers, inbox.MariaDB, go-sql-driver/mysql without interpolateParams), on or off; the hand-written side always sends text")
	flag.IntVar(&peerBatch, "peer-batch", peerBatch, "peers: inbox's claim size (Claim(n) + Batcher.AckAll)")
	flag.BoolVar(&peerWork, "peer-work", false, "peers: inbox's side runs worker.Run loops (Batch -peer-batch) in place of Claim + Batcher.AckAll")
	flag.BoolVar(&peerShallow, "peer-shallow", false, "peers: inbox's table without claim indexes, described with Table.Shallow")
	flag.IntVar(&enqueueJobs, "enqueue-jobs", enqueueJobs, "enqueue: jobs of one call")
	flag.StringVar(&baseline, "baseline", baseline, "table, breakdown, work: the lease baseline: minimal (issue 25's: client's clock, one token per claim, primary key only; SQLite's lease an integer) or tokens (each row's id, attempt and expiry checked, the engine's clock)")
	flag.BoolVar(&handIndexes, "hand-indexes", false, "table, work: give the hand-written side's lease table inbox's recommended lease indexes too (by default it has its primary key only, as a minimal queue would)")
	flag.DurationVar(&workHold, "work-hold", 0, "work: the handler of one job in -work-hold-every of the Work side holds this long (uneven handlers; the other sides run none)")
	flag.IntVar(&workHoldEvery, "work-hold-every", workHoldEvery, "work: see -work-hold")
	flag.StringVar(&svgDir, "svg", "", "depth, scale: write SVG charts into this directory (depth-<engine>.svg: jobs/s against jobs waiting; scale-<engine>.svg: jobs/s against workers, per form)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if workHoldEvery < 1 {
		fmt.Fprintf(os.Stderr, "bench: -work-hold-every %d: want 1 or more\n", workHoldEvery)
		os.Exit(2)
	}
	if prepareInbox != "auto" && prepareInbox != "on" && prepareInbox != "off" {
		fmt.Fprintf(os.Stderr, "bench: -prepare %q: want auto, on or off\n", prepareInbox)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(context.Background(), os.Stdout, os.Stderr, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// runBreakdownMode is -run breakdown, set by bench/breakdown.go where it
// builds (unix: getrusage).
var runBreakdownMode func(ctx context.Context, out, log io.Writer, es []engine, o options, dir string) error

type options struct {
	run, engines, forms, workers, batches string
	duration                              time.Duration
	segments, depthRows, rounds           int
}

func run(ctx context.Context, out, log io.Writer, o options) error {
	es, err := parseEngines(o.engines)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "inbox-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, what := range strings.Split(o.run, ",") {
		switch strings.TrimSpace(what) {
		case "table":
			workers, err := parseInts(o.workers)
			if err != nil {
				return err
			}
			batches, err := parseInts(o.batches)
			if err != nil {
				return err
			}
			if err := runTable(ctx, out, log, es, strings.Split(o.forms, ","), workers, batches, o.duration, o.segments, dir); err != nil {
				return err
			}
		case "depth":
			if err := runDepth(ctx, out, log, es, o.depthRows, o.rounds, dir); err != nil {
				return err
			}
		case "prepared":
			if err := runPrepared(ctx, out, log, es, o.rounds, dir); err != nil {
				return err
			}
		case "latency":
			if err := runLatency(ctx, out, log, es, dir); err != nil {
				return err
			}
		case "idle":
			if err := runIdle(ctx, out, log, es, dir); err != nil {
				return err
			}
		case "work":
			workers, err := parseInts(o.workers)
			if err != nil {
				return err
			}
			batches, err := parseInts(o.batches)
			if err != nil {
				return err
			}
			if err := runLoop(ctx, out, log, es, strings.Split(o.forms, ","), workers, batches, o.duration, o.segments, dir); err != nil {
				return err
			}
		case "scale": // bench/scale.go: worker processes against one PostgreSQL server
			if err := runScale(ctx, out, log, es, strings.Split(o.forms, ","), o.duration, dir); err != nil {
				return err
			}
		case "peers": // bench/peers.go: River and graphile-worker on pgx, goqite on SQLite
			workers, err := parseInts(o.workers)
			if err != nil {
				return err
			}
			if err := runPeers(ctx, out, log, es, workers, o.duration, o.segments, dir); err != nil {
				return err
			}
		case "sustained": // bench/sustained.go: each form on each engine under a fixed enqueue rate
			if err := runSustained(ctx, out, log, es, dir); err != nil {
				return err
			}
		case "enqueue": // bench/enqueue.go: EnqueueMany against a loop of Enqueue and River's InsertMany
			if err := runEnqueue(ctx, out, log, es, o.duration, o.segments, dir); err != nil {
				return err
			}
		case "unique": // bench/unique.go: Enqueue with a unique key against a plain one
			if err := runUnique(ctx, out, es, o.duration, o.segments, dir); err != nil {
				return err
			}
		case "breakdown": // bench/breakdown.go: where the time of a job goes, both sides
			if runBreakdownMode == nil {
				return fmt.Errorf("-run breakdown reads getrusage: not built on %s", runtime.GOOS)
			}
			if err := runBreakdownMode(ctx, out, log, es, o, dir); err != nil {
				return err
			}
		default:
			return fmt.Errorf("-run %q: want table, depth, prepared, latency, idle, work, scale, peers, sustained, enqueue, unique or breakdown", what)
		}
	}
	return nil
}

func parseEngines(s string) ([]engine, error) {
	var es []engine
	for _, n := range strings.Split(s, ",") {
		e, err := engineNamed(strings.TrimSpace(n))
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// header prints the machine and the servers.
// headerOf writes the header of a run on es: it opens each engine family
// once (each SQLite driver, whose libraries differ), reads the server's
// version and, when visit is not nil, hands it the pool before closing it.
// It returns the families it saw.
func headerOf(out io.Writer, es []engine, dir string, visit func(engine, *sql.DB)) (map[string]bool, error) {
	var versions []string
	seen := map[string]bool{}
	for _, e := range es {
		if seen[e.family] && e.family != "sqlite" {
			continue
		}
		seen[e.family] = true
		db, err := e.open(dir, 1)
		if err != nil {
			return seen, err
		}
		versions = append(versions, e.version(db)+" ("+e.label+")")
		if visit != nil {
			visit(e, db)
		}
		db.Close()
	}
	header(out, versions)
	return seen, nil
}

func header(out io.Writer, versions []string) {
	fmt.Fprintf(out, "Machine: %d CPUs (runtime.NumCPU), %s/%s, %s. Servers: %s.\n\n",
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), strings.Join(versions, ", "))
}

// prefill guesses how many jobs a segment works through in duration: twice
// the best rate seen so far for the same engine, form and batch (more
// workers may go faster), or a generous first guess; a side that runs out
// early is measured over the time it took.
func prefill(best map[string]float64, c cell, duration time.Duration) int {
	rate := best[fmt.Sprintf("%s/%s/%d", c.e.name, c.form, c.batch)] * 2
	if rate == 0 {
		rate = 4000
		if c.batch > 1 && strings.HasPrefix(c.form, "lease") {
			rate = 40000
		}
		if c.e.family == "mysql" {
			rate /= 3
		}
	}
	return int(rate*duration.Seconds()) + 500
}

// baselineName names the other side of the table: the minimal queue of
// issue 25 (its lease; the other forms' hand-written sides are minimal as
// they are), or the hand-written lease with per-row tokens.
func baselineName() string {
	if baseline == "minimal" {
		return "minimal"
	}
	return "hand-written"
}

// handIndexes gives the hand-written side's lease table the recommended
// lease indexes too (-hand-indexes), to compare like with like. inbox's
// lease table always has them: its documented schema does.
var handIndexes bool

func handTableKind() string {
	kind := "primary key only"
	if handIndexes {
		kind = "the same lease indexes"
	}
	if p := preparedWhere(); p != "" {
		kind += "; inbox with " + p + ", the other side's statements as text"
	}
	if b := boundWhere(); b != "" {
		kind += "; inbox with " + b + ", the other side unbounded"
	}
	return kind
}

// claimsAtOnce is inbox's Config.ClaimsAtOnce (-claims-at-once) in the lines
// that set it beside another queue; 0 sets no bound, as the default does.
var claimsAtOnce int

// boundWhere says, for a header, how many claims inbox's side sends at
// once ("" for no bound).
func boundWhere() string {
	if claimsAtOnce == 0 {
		return ""
	}
	return fmt.Sprintf("Config.ClaimsAtOnce %d", claimsAtOnce)
}

// boundNote is boundWhere set off by a comma, or "".
func boundNote() string {
	if b := boundWhere(); b != "" {
		return ", " + b
	}
	return ""
}

// preparedOrText is preparedWhere, or "statements as text" for nowhere.
func preparedOrText() string {
	if p := preparedWhere(); p != "" {
		return p
	}
	return "statements as text"
}

// preparedWhere says, for a header, where inbox's side runs with
// Config.Prepare under -prepare ("" for nowhere).
func preparedWhere() string {
	switch prepareInbox {
	case "auto":
		return "Config.Prepare on lib/pq, SQLite, inbox.MariaDB and MySQL without interpolateParams, as docs/operations.md recommends"
	case "on":
		return "Config.Prepare"
	}
	return ""
}

// prepareInbox tells when inbox's side runs with Config.Prepare (-prepare):
// auto, on or off.
var prepareInbox = "auto"

// prepareFor tells whether inbox's side on e runs with Config.Prepare. auto
// follows docs/operations.md: prepared where the driver would otherwise
// plan every statement anew (lib/pq, mattn and modernc's SQLite, and
// go-sql-driver/mysql without interpolateParams, which prepares and closes
// each), and on inbox.MariaDB, whose claim of one is a compound statement
// the server parses at every call as text; pgx keeps a statement cache of
// its own.
func prepareFor(e engine) bool {
	switch prepareInbox {
	case "on":
		return true
	case "off":
		return false
	}
	switch e.family {
	case "sqlite":
		return true
	case "mysql":
		return e.dialect == inbox.MariaDB || !strings.Contains(e.dsn(""), "interpolateParams=true")
	}
	return e.driver == "postgres" // lib/pq
}

// createTables creates the two tables of a cell: inbox's, with the
// recommended lease indexes under the lease form, and the hand-written
// side's, minimal unless -hand-indexes. PostgreSQL's are analyzed once
// filled (see fillTables).
func createTables(ctx context.Context, c cell, db *sql.DB) (tables [2]string, drop func(), err error) {
	tables = [2]string{"bench_" + c.e.name, "bench_" + c.e.name + "_hand"}
	var made []string
	drop = func() {
		for _, t := range made {
			c.e.drop(context.WithoutCancel(ctx), db, t)
		}
	}
	for k, table := range tables {
		if k == 1 && baseline == "minimal" && strings.HasPrefix(c.form, "lease") && c.e.family == "sqlite" {
			err = minimalTable(ctx, db, table)
		} else {
			err = c.e.createTable(ctx, db, table)
		}
		if err != nil {
			return tables, drop, err
		}
		made = append(made, table)
		// A shallow lease table has its primary key only, as schema/ says.
		if !strings.HasPrefix(c.form, "lease") || (k == 1 && !handIndexes) || (k == 0 && c.form == "lease-shallow") {
			continue
		}
		for _, s := range depthIndexes(c.e, table) {
			if _, err = db.ExecContext(ctx, s); err != nil {
				return tables, drop, err
			}
		}
	}
	return tables, drop, nil
}

// fillTables fills each table with want jobs and, on PostgreSQL, analyzes
// it, so that the plan does not change mid-run when autovacuum gets to it.
func fillTables(ctx context.Context, c cell, db *sql.DB, tables [2]string, want int) error {
	for _, table := range tables {
		if err := c.e.fill(ctx, db, table, want, payload); err != nil {
			return err
		}
		if c.e.family == "postgres" {
			if _, err := db.ExecContext(ctx, "ANALYZE "+table); err != nil {
				return err
			}
		}
	}
	return nil
}

func runTable(ctx context.Context, out, log io.Writer, es []engine, forms []string, workers, batches []int, duration time.Duration, segments int, dir string) error {
	var versions []string
	seen := map[string]bool{}
	for _, e := range es {
		db, err := e.open(dir, 1)
		if err != nil {
			return err
		}
		v := e.version(db) + " (" + e.label + ")"
		if e.family != "sqlite" && seen[e.family] {
			v = ""
		}
		seen[e.family] = true
		db.Close()
		if v != "" {
			versions = append(versions, v)
		}
	}
	header(out, versions)
	fmt.Fprintf(out, "Each side of a line measured for %v in %d alternating segments; jobs/s is the median of the segments' rates. inbox on its table (lease: its recommended indexes; lease-shallow: its primary key only, Table.Shallow), %s on its own (%s); ratio = inbox / %s.\n\n", duration, segments, baselineName(), handTableKind(), baselineName())
	fmt.Fprintf(out, "| engine | driver | form | workers | batch | inbox jobs/s | %s jobs/s | ratio |\n", baselineName())
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|")
	best := map[string]float64{}
	sum := newRatioSummary()
	for _, e := range es {
		for _, form := range forms {
			form = strings.TrimSpace(form)
			if !contains(e.forms(), form) {
				continue
			}
			for _, w := range workers {
				for _, b := range batches {
					c := cell{e: e, form: form, workers: w, batch: b}
					inboxR, handR, err := runCell(ctx, c, dir, prefill(best, c, duration/time.Duration(segments)), duration, segments)
					if err != nil {
						return fmt.Errorf("%v: %w", c, err)
					}
					key := fmt.Sprintf("%s/%s/%d", e.name, form, b)
					best[key] = max(best[key], inboxR.rate(), handR.rate())
					sum.add(fmt.Sprintf("%s, %d per claim", form, b), e.family+" ("+e.label+")", inboxR.median()/handR.median())
					fmt.Fprintf(out, "| %s | %s | %s | %d | %d | %.0f | %.0f | %.2f |\n",
						e.family, e.label, form, w, b, inboxR.median(), handR.median(), inboxR.median()/handR.median())
					fmt.Fprintf(log, "%v: inbox %d jobs in %v, hand %d jobs in %v", c, inboxR.jobs, inboxR.elapsed.Round(time.Millisecond), handR.jobs, handR.elapsed.Round(time.Millisecond))
					if e.family == "postgres" {
						fmt.Fprintf(log, "; WAL per job: inbox %.0f B, hand %.0f B", inboxR.walPerJob(), handR.walPerJob())
					}
					fmt.Fprintln(log)
				}
			}
		}
	}
	sum.print(out, "inbox / "+baselineName(), workers)
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// runCell measures both sides of a cell, interleaved, on a fresh table
// (bench_<engine>).
func runCell(ctx context.Context, c cell, dir string, want int, duration time.Duration, segments int) (inboxR, handR result, err error) {
	db, err := c.e.open(dir, c.conns())
	if err != nil {
		return
	}
	defer db.Close()
	tables, drop, err := createTables(ctx, c, db)
	defer drop()
	if err != nil {
		return
	}
	var sides [2]side
	for k, hand := range []bool{false, true} {
		if sides[k], err = newSide(c, db, tables[k], hand); err != nil {
			return
		}
		defer sides[k].close()
	}
	if err = fillTables(ctx, c, db, tables, want); err != nil {
		return
	}
	rs, err := interleave(ctx, c, db, tables, sides, segments, duration/time.Duration(segments), want, 0)
	return rs[0], rs[1], err
}

// ratioSummary gathers a run's ratios into the shape of issue 25's table:
// a row per form and batch, a column per engine and driver, the ratios of
// each worker count in one cell.
type ratioSummary struct {
	rows, cols []string
	cells      map[[2]string][]string
}

func newRatioSummary() *ratioSummary { return &ratioSummary{cells: map[[2]string][]string{}} }

func (s *ratioSummary) add(row, col string, ratio float64) {
	if !contains(s.rows, row) {
		s.rows = append(s.rows, row)
	}
	if !contains(s.cols, col) {
		s.cols = append(s.cols, col)
	}
	k := [2]string{row, col}
	s.cells[k] = append(s.cells[k], fmt.Sprintf("%.2f", ratio))
}

func (s *ratioSummary) print(out io.Writer, what string, workers []int) {
	if len(s.rows) == 0 {
		return
	}
	ws := make([]string, len(workers))
	for i, w := range workers {
		ws[i] = strconv.Itoa(w)
	}
	fmt.Fprintf(out, "\n%s, %s workers:\n\n| %s | %s |\n|---|%s\n", what, strings.Join(ws, " / "), what, strings.Join(s.cols, " | "), strings.Repeat("--:|", len(s.cols)))
	for _, r := range s.rows {
		line := "| " + r + " |"
		for _, c := range s.cols {
			line += " " + strings.Join(s.cells[[2]string{r, c}], " / ") + " |"
		}
		fmt.Fprintln(out, line)
	}
	fmt.Fprintln(out)
}
