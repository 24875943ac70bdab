package inbox

import (
	"context"
	"fmt"
	"time"
)

// The lease form writes an expiry read from the engine's clock and a claim
// compares it with the engine's clock: on one server one clock decides. On
// a cluster whose nodes all take writes (MariaDB Galera) every node reads
// its own, and a claim on a node whose clock is ahead of the holder's by S
// sees the lease run out S early. The holder's keeper stops its handler
// [Config.KeepMargin] before the expiry it knows of, so the promise that
// the holder stops before anyone else may start holds while S is under the
// margin; a keeper that keeps extending, every half lease, keeps its job
// while S is under half the lease, less the extension's round trip (both
// measured in dbtest/galera's TestGaleraSkew, docs/scaling.md). The
// process's own clock plays no part (keepers measure with the monotonic
// clock), so CheckSchema can only compare each server's clock with it: a
// server far from this process is far from a server near it, and two
// connections landing on servers far from each other are seen directly.
//
// Rejected: reading the nodes' clocks through wsrep status, which Galera
// does not publish, and refusing at New, which does no I/O.

// clockSamples is how many connections of the pool CheckSchema reads the
// engine's clock on, held at once so that each is a different connection
// (through a load balancer, perhaps a different node).
const clockSamples = 4

// clockReading is one reading of the engine's clock: its offset from this
// process's clock, the server's time less the midpoint of the statement's
// send and answer, and that round trip, which bounds the offset's error by
// half.
type clockReading struct {
	offset, rtt time.Duration
}

// clockConnWait bounds the wait for each connection after the first: a
// pool whose other connections are in use is read on fewer.
const clockConnWait = time.Second

// readClocks reads the engine's clock on up to clockSamples connections of
// the pool at once, no more than its MaxOpenConns, and on those it gets
// within clockConnWait after the first.
func (q *Queue) readClocks(ctx context.Context) ([]clockReading, error) {
	n := clockSamples
	if m := q.db.Stats().MaxOpenConnections; m > 0 && m < n {
		n = m
	}
	rs := make([]clockReading, 0, n)
	for i := 0; i < n; i++ {
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if i > 0 {
			cctx, cancel = context.WithTimeout(ctx, clockConnWait)
		}
		c, err := q.db.Conn(cctx)
		cancel()
		if err != nil && i > 0 && ctx.Err() == nil {
			break
		}
		if err != nil {
			return nil, err
		}
		defer c.Close()
		sent := time.Now()
		at, err := q.readNow(ctx, c)
		got := time.Now()
		if err != nil {
			return nil, err
		}
		rtt := got.Sub(sent)
		rs = append(rs, clockReading{offset: at.Sub(sent.Add(rtt / 2)), rtt: rtt})
	}
	return rs, nil
}

// clockProblem judges readings against the skew the lease tolerates, the
// keeper's margin: a problem when one reading's offset is beyond it by
// more than the reading's error, or two readings differ by more than it
// beyond their errors; "" otherwise.
func clockProblem(rs []clockReading, margin, lease time.Duration) string {
	worst, spread := -1, [2]int{-1, -1}
	var worstBy, spreadBy time.Duration
	for i, r := range rs {
		if by := abs(r.offset) - r.rtt/2 - margin; by > 0 && by > worstBy {
			worst, worstBy = i, by
		}
		for j, o := range rs[:i] {
			if by := abs(r.offset-o.offset) - (r.rtt+o.rtt)/2 - margin; by > 0 && by > spreadBy {
				spread, spreadBy = [2]int{j, i}, by
			}
		}
	}
	tolerates := fmt.Sprintf("the lease form tolerates a skew between the clocks of the servers its workers use under "+
		"Config.KeepMargin (%v) and keeps no job held beyond half the lease (%v): a claim on a server ahead sees a lease run out early",
		margin, lease/2)
	switch {
	case worst >= 0:
		r := rs[worst]
		return fmt.Sprintf("the engine's clock is %v %s of this process's (±%v, half the reading's round trip) on connection %d of %d read; %s",
			round(abs(r.offset)), aheadOrBehind(r.offset), round(r.rtt/2), worst+1, len(rs), tolerates)
	case spread[0] >= 0:
		a, b := rs[spread[0]], rs[spread[1]]
		return fmt.Sprintf("the engine's clocks on connections %d and %d of %d read differ by %v (±%v): the pool reaches servers whose clocks disagree; %s",
			spread[0]+1, spread[1]+1, len(rs), round(abs(a.offset-b.offset)), round((a.rtt+b.rtt)/2), tolerates)
	}
	return ""
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// round keeps a millisecond's precision, or a microsecond's under one.
func round(d time.Duration) time.Duration {
	if d < time.Millisecond {
		return d.Round(time.Microsecond)
	}
	return d.Round(time.Millisecond)
}

func aheadOrBehind(d time.Duration) string {
	if d < 0 {
		return "behind"
	}
	return "ahead"
}
