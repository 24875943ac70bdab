package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/sqlinbox/inbox"
)

// result is a command's output: marshalled as it is under -json, written by
// text otherwise.
type result interface {
	text(w io.Writer)
}

// action is a command ready to run: its arguments are parsed and checked,
// nothing is sent yet.
type action func(ctx context.Context, q *inbox.Queue) (result, error)

// dispatch parses the command's own flags and arguments, and only then opens
// the database and runs it.
func dispatch(ctx context.Context, g global, env func(string) string, stdout io.Writer) error {
	act, err := parseCommand(g, env)
	if err != nil {
		return err
	}
	db, q, err := g.open(env)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	res, err := act(ctx, q)
	if err != nil {
		return err
	}
	if g.json {
		writeJSON(stdout, res)
	} else {
		res.text(stdout)
	}
	return nil
}

// parseCommand turns the command and its words into the action to run.
func parseCommand(g global, env func(string) string) (action, error) {
	p := &cmdParser{g: g, env: env, name: g.commands[0], args: g.commands[1:]}
	p.fs = flag.NewFlagSet(p.name, flag.ContinueOnError)
	p.fs.SetOutput(io.Discard)
	if parse, ok := commandParsers[p.name]; ok {
		return parse(p)
	}
	if act, ok, err := parseBulk(p.name, p.oneID); ok {
		return act, err
	}
	return nil, usageErr("unknown command %q", p.name)
}

// cmdParser is one command's words and flags, as its parser reads them.
type cmdParser struct {
	g    global
	env  func(string) string
	name string
	args []string
	fs   *flag.FlagSet
}

// want parses the command's flags and checks that n arguments remain.
func (p *cmdParser) want(n int, what string) ([]string, error) {
	if err := p.fs.Parse(p.args); err != nil {
		return nil, usageErr("%s: %v", p.name, err)
	}
	if p.fs.NArg() != n {
		if n == 0 {
			return nil, usageErr("%s takes no arguments, got %q", p.name, p.fs.Args())
		}
		return nil, usageErr("%s takes %s", p.name, what)
	}
	return p.fs.Args(), nil
}

// oneID parses the single id argument.
func (p *cmdParser) oneID() (any, error) {
	a, err := p.want(1, "one id")
	if err != nil {
		return nil, err
	}
	return p.g.parseID(a[0])
}

// commandParsers parse each command but the bulk ones (parseBulk).
var commandParsers = map[string]func(*cmdParser) (action, error){
	"stats":   parseStats,
	"jobs":    parseJobs,
	"show":    parseShow,
	"requeue": func(p *cmdParser) (action, error) { return parseRequeue(p.g, p.fs, p.args) },
	"purge":   parsePurge,
	"cancel":  parseCancel,
	"pause":   parsePause,
	"resume":  parseResume,
	"check":   parseCheck,
}

// parseStats parses stats: counts per state.
func parseStats(p *cmdParser) (action, error) {
	if _, err := p.want(0, ""); err != nil {
		return nil, err
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		st, err := q.Stats(ctx)
		if err != nil {
			return nil, err
		}
		return newStats(st), nil
	}, nil
}

// parseJobs parses jobs: a page of jobs in one state.
func parseJobs(p *cmdParser) (action, error) {
	state := p.fs.String("state", "all", "ready, waiting, inwork, dead or all")
	limit := p.fs.Int("limit", inbox.DefaultListLimit, "page size")
	after := p.fs.String("after", "", "the older page: the jobs below this id")
	before := p.fs.String("before", "", "the newer page: the jobs above this id")
	if _, err := p.want(0, ""); err != nil {
		return nil, err
	}
	st, ok := states[*state]
	if !ok {
		return nil, usageErr("jobs -state %q: want ready, waiting, inwork, dead or all", *state)
	}
	if *limit < 1 || *limit > inbox.MaxList {
		return nil, usageErr("jobs -limit %d: want 1 to %d", *limit, inbox.MaxList)
	}
	if *after != "" && *before != "" {
		return nil, usageErr("jobs: -after and -before together")
	}
	f := inbox.JobFilter{State: st, Limit: *limit}
	var err error
	if *after != "" {
		if f.After, err = p.g.parseID(*after); err != nil {
			return nil, err
		}
	}
	if *before != "" {
		if st == inbox.StateDead {
			return nil, usageErr("jobs -state dead pages with -after only")
		}
		if f.Before, err = p.g.parseID(*before); err != nil {
			return nil, err
		}
	}
	if st == inbox.StateDead {
		return func(ctx context.Context, q *inbox.Queue) (result, error) {
			return listDead(ctx, q, f)
		}, nil
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		p, err := q.ListJobs(ctx, f)
		if err != nil {
			return nil, err
		}
		out := &jobsOut{State: *state, Jobs: []jobOut{}, Newer: p.Newer, Older: p.Older}
		for _, j := range p.Jobs {
			out.Jobs = append(out.Jobs, newJob(j))
		}
		return out, nil
	}, nil
}

// parseShow parses show: one job, whole.
func parseShow(p *cmdParser) (action, error) {
	id, err := p.oneID()
	if err != nil {
		return nil, err
	}
	return byID(id, func(ctx context.Context, q *inbox.Queue) (result, error) {
		j, err := q.Job(ctx, id)
		if err != nil {
			return nil, err
		}
		out := newJob(j)
		return &out, nil
	}), nil
}

// parsePurge parses purge: dead jobs deleted (-older than an age), only with -yes.
func parsePurge(p *cmdParser) (action, error) {
	older := p.fs.Duration("older", 0, "delete only the dead jobs older than this")
	yes := p.fs.Bool("yes", false, "really delete")
	if _, err := p.want(0, ""); err != nil {
		return nil, err
	}
	if *older < 0 {
		return nil, usageErr("purge -older %v: want a positive age", *older)
	}
	if !*yes {
		return nil, &cliError{code: exitRefused, err: errors.New("purge deletes dead jobs for good: add -yes")}
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		var cutoff time.Time
		if *older > 0 {
			cutoff = time.Now().Add(-*older)
		}
		n, err := q.PurgeDead(ctx, cutoff)
		if err != nil {
			return nil, err
		}
		return &purgeOut{Purged: n}, nil
	}, nil
}

// parseCancel parses cancel: a job not in work removed.
func parseCancel(p *cmdParser) (action, error) {
	id, err := p.oneID()
	if err != nil {
		return nil, err
	}
	return byID(id, func(ctx context.Context, q *inbox.Queue) (result, error) {
		if err := q.Cancel(ctx, id); err != nil {
			return nil, err
		}
		return &cancelOut{Cancelled: id}, nil
	}), nil
}

// byID wraps the action of a command on the job id: an id the database
// cannot read as one of its ids (PostgreSQL's 22P02, "not a uuid", and
// 22021, a NUL byte or invalid UTF-8) names no job, exit 3 as any id not
// found, rather than the database's error.
func byID(id any, act action) action {
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		out, err := act(ctx, q)
		var st interface{ SQLState() string }
		if err != nil && errors.As(err, &st) && (st.SQLState() == "22P02" || st.SQLState() == "22021") {
			err = &cliError{code: exitNotFound, err: fmt.Errorf("no job has the id %q: the database cannot read it as an id (%w)", fmt.Sprint(id), err)}
		}
		return out, err
	}
}

// parsePause parses pause: the queue paused in every process.
func parsePause(p *cmdParser) (action, error) {
	by := p.fs.String("by", "", "who pauses (default $USER)")
	if _, err := p.want(0, ""); err != nil {
		return nil, err
	}
	if *by == "" {
		*by = p.env("USER")
	}
	if *by == "" {
		*by = "inbox"
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		if err := q.Pause(ctx, *by); err != nil {
			return nil, err
		}
		ps, err := q.Paused(ctx)
		if err != nil {
			return nil, err
		}
		return &pauseOut{Paused: ps.Paused, Since: timePtr(ps.Since), By: ps.By}, nil
	}, nil
}

// parseResume parses resume: the pause ended.
func parseResume(p *cmdParser) (action, error) {
	if _, err := p.want(0, ""); err != nil {
		return nil, err
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		if err := q.Resume(ctx); err != nil {
			return nil, err
		}
		return &pauseOut{Paused: false}, nil
	}, nil
}

// parseCheck parses check: the table compared with the description.
func parseCheck(p *cmdParser) (action, error) {
	if _, err := p.want(0, ""); err != nil {
		return nil, err
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		err := q.CheckSchema(ctx)
		var se *inbox.SchemaError
		if errors.As(err, &se) {
			return nil, &cliError{code: exitFailed, err: fmt.Errorf("check: table %s does not fit the description", se.Table), problems: se.Problems}
		}
		if err != nil {
			return nil, err
		}
		return &checkOut{OK: true}, nil
	}, nil
}

// states are the names of -state, which are also the states JSON output
// writes ("inwork" where the dashboard writes "in work").
var states = map[string]inbox.JobState{
	"all":     inbox.StateAll,
	"ready":   inbox.StateReady,
	"waiting": inbox.StateWaiting,
	"inwork":  inbox.StateInWork,
	"dead":    inbox.StateDead,
}

func stateName(s inbox.JobState) string {
	for name, st := range states {
		if st == s {
			return name
		}
	}
	return s.String()
}

// listDead pages the dead table. ListDead continues past a job given whole
// (its time of death, too), so -after reads that job first; one job more
// than the page tells whether older ones follow.
func listDead(ctx context.Context, q *inbox.Queue, f inbox.JobFilter) (result, error) {
	var after *inbox.DeadJob
	if f.After != nil {
		j, err := q.Job(ctx, f.After)
		if err == nil && j.State != inbox.StateDead {
			err = inbox.ErrNotDead
		}
		if err != nil {
			return nil, fmt.Errorf("jobs -after %v: %w", f.After, err)
		}
		after = &inbox.DeadJob{ID: j.ID, DeadAt: j.DeadAt}
	}
	n := f.Limit
	if n < inbox.MaxList {
		n++
	}
	dead, err := q.ListDead(ctx, n, after)
	if err != nil {
		return nil, err
	}
	out := &jobsOut{State: "dead", Jobs: []jobOut{}, Newer: after != nil}
	if len(dead) > f.Limit {
		dead, out.Older = dead[:f.Limit], true
	}
	for _, d := range dead {
		out.Jobs = append(out.Jobs, jobOut{
			ID: d.ID, State: "dead", Attempt: d.Attempt, LastError: d.LastError,
			DeadAt: timePtr(d.DeadAt), Data: data(d.Data),
		})
	}
	return out, nil
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(w, "{\"error\": %q, \"code\": %d}\n", err.Error(), exitFailed)
	}
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// data makes the data columns printable: bytes become text when they are
// UTF-8, else {"base64": "..."}.
func data(vs []any) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		if b, ok := v.([]byte); ok {
			if utf8.Valid(b) {
				v = string(b)
			} else {
				v = map[string]string{"base64": base64.StdEncoding.EncodeToString(b)}
			}
		}
		out[i] = v
	}
	return out
}

type statsOut struct {
	Ready       int64      `json:"ready"`
	Waiting     int64      `json:"waiting"`
	InWork      int64      `json:"in_work"`
	InWorkError string     `json:"in_work_error,omitempty"`
	Dead        int64      `json:"dead"`
	OldestReady float64    `json:"oldest_ready_seconds"`
	Paused      bool       `json:"paused"`
	PausedSince *time.Time `json:"paused_since,omitempty"`
}

func newStats(st inbox.Stats) *statsOut {
	out := &statsOut{
		Ready: st.Ready, Waiting: st.Waiting, InWork: st.InWork, Dead: st.Dead,
		OldestReady: st.OldestReady.Seconds(), Paused: st.Paused, PausedSince: timePtr(st.PausedSince),
	}
	if st.InWorkErr != nil {
		out.InWorkError = st.InWorkErr.Error()
	}
	return out
}

func (s *statsOut) text(w io.Writer) {
	count := func(n int64) string {
		if n < 0 {
			return "-"
		}
		return fmt.Sprint(n)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "ready\t%s\n", count(s.Ready))
	fmt.Fprintf(tw, "waiting\t%s\n", count(s.Waiting))
	fmt.Fprintf(tw, "in work\t%s\n", count(s.InWork))
	if s.InWorkError != "" {
		fmt.Fprintf(tw, "in work error\t%s\n", s.InWorkError)
	}
	fmt.Fprintf(tw, "dead\t%s\n", count(s.Dead))
	fmt.Fprintf(tw, "oldest ready\t%v\n", time.Duration(s.OldestReady*float64(time.Second)).Round(time.Millisecond))
	if s.Paused {
		fmt.Fprintf(tw, "paused\tsince %s\n", s.PausedSince.Format(time.RFC3339))
	} else {
		fmt.Fprintf(tw, "paused\tno\n")
	}
	tw.Flush()
}

type jobOut struct {
	ID         any        `json:"id"`
	State      string     `json:"state"`
	Attempt    int        `json:"attempt"`
	Due        *time.Time `json:"due,omitempty"`
	LastError  string     `json:"last_error,omitempty"`
	Priority   int64      `json:"priority"`
	EnqueuedAt *time.Time `json:"enqueued_at,omitempty"`
	DeadAt     *time.Time `json:"dead_at,omitempty"`
	Data       []any      `json:"data"`
}

func newJob(j inbox.JobView) jobOut {
	return jobOut{
		ID: j.ID, State: stateName(j.State), Attempt: j.Attempt, Due: timePtr(j.Due),
		LastError: j.LastError, Priority: j.Priority, EnqueuedAt: timePtr(j.EnqueuedAt),
		DeadAt: timePtr(j.DeadAt), Data: data(j.Data),
	}
}

func (j *jobOut) text(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%v\n", j.ID)
	fmt.Fprintf(tw, "state\t%s\n", j.State)
	fmt.Fprintf(tw, "attempt\t%d\n", j.Attempt)
	fmt.Fprintf(tw, "priority\t%d\n", j.Priority)
	for _, t := range []struct {
		name string
		t    *time.Time
	}{{"due", j.Due}, {"enqueued at", j.EnqueuedAt}, {"dead at", j.DeadAt}} {
		if t.t != nil {
			fmt.Fprintf(tw, "%s\t%s\n", t.name, t.t.Format(time.RFC3339Nano))
		}
	}
	if j.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", j.LastError)
	}
	for i, d := range j.Data {
		fmt.Fprintf(tw, "data[%d]\t%v\n", i, d)
	}
	tw.Flush()
}

type jobsOut struct {
	State string   `json:"state"`
	Jobs  []jobOut `json:"jobs"`
	Newer bool     `json:"newer"`
	Older bool     `json:"older"`
}

func (p *jobsOut) text(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tATTEMPT\tDUE\tLAST ERROR\tDATA")
	for _, j := range p.Jobs {
		due := ""
		if j.Due != nil {
			due = j.Due.Format(time.RFC3339)
		} else if j.DeadAt != nil {
			due = j.DeadAt.Format(time.RFC3339)
		}
		d := fmt.Sprint(j.Data...)
		if len(d) > 40 {
			d = d[:37] + "..."
		}
		fmt.Fprintf(tw, "%v\t%s\t%d\t%s\t%s\t%s\n", j.ID, j.State, j.Attempt, due, oneLine(j.LastError, 40), oneLine(d, 40))
	}
	tw.Flush()
	if n := len(p.Jobs); n > 0 && p.Older {
		fmt.Fprintf(w, "older jobs follow: -after %v\n", p.Jobs[n-1].ID)
	}
	if n := len(p.Jobs); n > 0 && p.Newer && p.State != "dead" {
		fmt.Fprintf(w, "newer jobs precede: -before %v\n", p.Jobs[0].ID)
	}
}

// oneLine cuts s to one line of at most n bytes, at a character boundary.
func oneLine(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

type requeueOut struct {
	ID    any `json:"id"`
	NewID any `json:"new_id"`
}

func (r *requeueOut) text(w io.Writer) { fmt.Fprintf(w, "requeued %v as %v\n", r.ID, r.NewID) }

type purgeOut struct {
	Purged int64 `json:"purged"`
}

func (p *purgeOut) text(w io.Writer) { fmt.Fprintf(w, "purged %d dead jobs\n", p.Purged) }

type cancelOut struct {
	Cancelled any `json:"cancelled"`
}

func (c *cancelOut) text(w io.Writer) { fmt.Fprintf(w, "cancelled %v\n", c.Cancelled) }

type pauseOut struct {
	Paused bool       `json:"paused"`
	Since  *time.Time `json:"since,omitempty"`
	By     string     `json:"by,omitempty"`
}

func (p *pauseOut) text(w io.Writer) {
	if !p.Paused {
		fmt.Fprintln(w, "running")
		return
	}
	fmt.Fprintf(w, "paused")
	if p.By != "" {
		fmt.Fprintf(w, " by %s", p.By)
	}
	if p.Since != nil {
		fmt.Fprintf(w, " since %s", p.Since.Format(time.RFC3339))
	}
	fmt.Fprintln(w)
}

type checkOut struct {
	OK bool `json:"ok"`
}

func (c *checkOut) text(w io.Writer) { fmt.Fprintln(w, "ok") }
