package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/sqlinbox/inbox/internal/connhook"
)

// callLog records each driver call of the measured pool of a wake-up line:
// what it was, when it began and how long the driver took. A wake-up's time
// from the commit splits into the calls the worker's claim made in it and
// what lay outside them (the wake-up reaching the loop, Go between calls,
// the handler's start), which tells a slow server from a slow library.
type callLog struct {
	mu    sync.Mutex
	calls []timedCall
}

type timedCall struct {
	kind connhook.Kind
	at   time.Time
	took time.Duration
}

// open opens e's pool with maxConns connections, every call recorded.
func (l *callLog) open(e engine, dir string, maxConns int) (*sql.DB, error) {
	inner, err := connhook.Connector(e.driver, e.dsn(dir))
	if err != nil {
		return nil, err
	}
	return e.ready(sql.OpenDB(connhook.Wrap(inner, connhook.Hooks{After: l.after})), maxConns)
}

func (l *callLog) after(_ context.Context, c connhook.Call, _ error, took time.Duration) {
	end := time.Now()
	l.mu.Lock()
	l.calls = append(l.calls, timedCall{kind: c.Kind, at: end.Add(-took), took: took})
	l.mu.Unlock()
}

// wakeParts is where one wake-up's time went, from the commit to the
// handler's first line.
type wakeParts struct {
	total, outside, begin, statements, commit time.Duration
}

// partsOf splits each sample's time among the calls that began between its
// commit and its handler's start. The worker is the pool's only user then
// (the previous job's acknowledgement came before the pause that preceded
// the enqueue), so those calls are its claim's.
func (l *callLog) partsOf(samples []latencySample) []wakeParts {
	l.mu.Lock()
	defer l.mu.Unlock()
	calls := slices.Clone(l.calls)
	slices.SortFunc(calls, func(a, b timedCall) int { return a.at.Compare(b.at) })
	out := make([]wakeParts, len(samples))
	for i, s := range samples {
		p := wakeParts{total: s.start.Sub(s.commit)}
		first, _ := slices.BinarySearchFunc(calls, s.commit, func(c timedCall, t time.Time) int { return c.at.Compare(t) })
		for _, c := range calls[first:] {
			if c.at.After(s.start) {
				break
			}
			switch c.kind {
			case connhook.Begin:
				p.begin += c.took
			case connhook.Commit:
				p.commit += c.took
			default:
				p.statements += c.took
			}
		}
		p.outside = p.total - p.begin - p.statements - p.commit
		out[i] = p
	}
	return out
}

// meanParts averages ps.
func meanParts(ps []wakeParts) wakeParts {
	var m wakeParts
	if len(ps) == 0 {
		return m
	}
	for _, p := range ps {
		m.total += p.total
		m.outside += p.outside
		m.begin += p.begin
		m.statements += p.statements
		m.commit += p.commit
	}
	n := time.Duration(len(ps))
	return wakeParts{m.total / n, m.outside / n, m.begin / n, m.statements / n, m.commit / n}
}

// writeWakeParts prints, for each wake-up line, the mean split of all its
// samples and of its slowest 5 % (at least one), from the commit.
func writeWakeParts(out io.Writer, runs []latencyRun) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintln(out, "\nWhere the wake-ups' time went, from the commit, mean ms: the claim's calls to the driver (BEGIN, its statements, COMMIT; the server's work and the round trips) and the rest (the wake-up reaching the loop, Go between the calls).")
	fmt.Fprintln(out)
	fmt.Fprintln(out, "| engine | how the worker learns of the job | samples | total | outside the driver | BEGIN | statements | COMMIT |")
	fmt.Fprintln(out, "|---|---|---|---:|---:|---:|---:|---:|")
	for _, r := range runs {
		ps := r.calls.partsOf(r.samples)
		slices.SortFunc(ps, func(a, b wakeParts) int { return int(a.total - b.total) })
		slowest := ps[len(ps)-max(1, len(ps)/20):]
		for _, row := range []struct {
			which string
			m     wakeParts
		}{{fmt.Sprintf("all %d", len(ps)), meanParts(ps)}, {fmt.Sprintf("slowest %d", len(slowest)), meanParts(slowest)}} {
			fmt.Fprintf(out, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.e.family, r.mode, row.which,
				msFine(row.m.total), msFine(row.m.outside), msFine(row.m.begin), msFine(row.m.statements), msFine(row.m.commit))
		}
	}
}

// msFine prints d in milliseconds to the hundredth.
func msFine(d time.Duration) string {
	return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond))
}
