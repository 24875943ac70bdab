package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqlinbox/inbox"
	"github.com/sqlinbox/inbox/worker"
)

// Config configures a [Relay]. Its zero value, but for Stream, means the
// defaults.
type Config struct {
	// Stream is the JetStream stream every message must land in: a subject
	// that no stream takes, or another stream's, is a publish error, not a
	// message lost to the wrong place.
	Stream string
	// Batch is the most jobs one claim takes. Zero means 100; at most
	// [inbox.MaxClaim].
	Batch int
	// Workers is how many claim–publish–ack loops run side by side, so that
	// one batch is claimed while another waits for its acks. Zero means 2.
	Workers int
	// Poll is how long an idle loop waits before it claims again. Zero
	// means 25 ms. The relay learns of new jobs only by claiming: this is
	// the latency it adds when idle, and an idle relay costs Workers/Poll
	// empty claims a second.
	Poll time.Duration
	// PublishTimeout bounds the wait for the broker's ack of each message.
	// A batch's messages are published together, so the batch waits about
	// one round trip to the broker. Zero means 5 s. A timed-out message may
	// still be stored: it is published again later with the same
	// de-duplication id.
	PublishTimeout time.Duration
	// ProofTimeout bounds the proof of a batch's duplicates: the relay
	// reads the stored message of every publish the stream called a
	// duplicate, all at once (up to 256 reads in flight), so a batch takes
	// about one round trip to the broker whatever its number of
	// duplicates. Zero means 5 s. A job whose proof did not end in time is
	// retried, not deleted.
	ProofTimeout time.Duration
	// AckTimeout bounds the table's statements that settle a batch once it
	// is published and proven: the acks (one statement), then the retries
	// and the moves to the dead table. Zero means 5 s. A database that
	// does not answer in time ends [Relay.Run] with its error.
	AckTimeout time.Duration
	// MaxRetryDelay caps the delay before a job whose publish failed is
	// claimed again (one second doubled each attempt). Zero means a minute.
	MaxRetryDelay time.Duration
	// DB is the outbox table's database, which the relay reads outside
	// its claims to find the jobs whose de-duplication ids the stream may
	// have forgotten (see [Relay]). PostgreSQL or SQLite. Required.
	DB *sql.DB
	// Source is the outbox table's identity: its database and its
	// schema-qualified name as the server resolves them, or its database
	// file and name ([TableSource] reads it). Each message carries it in
	// its SourceHeader, and the relay deletes a job whose publish the
	// stream called a duplicate only when the stored message carries the
	// same source, id, subject and payload. Required.
	Source string
	// MsgIDPrefix is put before each job id to make its de-duplication id
	// (the Nats-Msg-Id header). Empty means a digest of Source and a colon
	// ("3f2a9c1b7d4e:17"), so that the ids of two outbox tables never
	// collide. Two tables given one prefix collide: the second relay's
	// messages are refused as duplicates of the first's, and it stops with
	// an error rather than delete a job the stream does not hold.
	MsgIDPrefix string
}

// SourceHeader is the message header that names the outbox table a
// message came from ([Config.Source]).
const SourceHeader = "Inbox-Source"

// ErrCollision is returned by [Relay.Run] when the stream called a publish
// a duplicate of a message that is not the job's: another outbox table's
// message under the same de-duplication id ([Config.MsgIDPrefix]). The job
// is given back, not deleted.
var ErrCollision = errors.New("relay: the stream holds another message under the job's de-duplication id")

// ErrClosed is returned by [Relay.Run] when the NATS connection closed:
// nats.go gave up reconnecting (its MaxReconnects ran out) or it was
// closed. A relay cannot publish again on it; its supervisor starts a new
// one.
var ErrClosed = errors.New("relay: the NATS connection is closed")

// Stats counts what a relay did since it was made.
type Stats struct {
	Published  uint64 // messages the broker acked as new
	Duplicates uint64 // messages the broker acked as duplicates: stored before, by a relay that did not ack its job
	Acked      uint64 // jobs deleted from the table after the broker's ack
	LeaseLost  uint64 // jobs whose lease ran out before the ack: another relay had claimed them, and acks them
	Retried    uint64 // jobs whose publish failed, given back with a delay
	Dead       uint64 // jobs the broker can never take (payload over the server's limit), moved to the dead table
	Unproven   uint64 // duplicates whose stored message the stream no longer has (its retention removed it): given back, not deleted
	Recovered  uint64 // jobs whose lease ended too long ago for the stream's duplicate window, found stored by a scan of the stream and deleted without a publish
}

// Relay moves the jobs of a lease-form outbox table to a JetStream stream:
// each loop claims a batch, publishes every job with its id (after
// MsgIDPrefix) as the message's de-duplication id, waits for the broker's
// acks and only then acknowledges the acked jobs in the table, in one
// statement.
//
// A relay that stops between the publish and the ack (a crash, a lost
// lease) leaves its jobs in the table; they are claimed again when their
// leases run out and published again with the same ids, which the stream
// drops as duplicates. A duplicate ack says only that the stream has seen
// the id. The relay deletes such a job only after reading the stored
// message the ack names and finding it the job's own (same source, id,
// subject and payload): anything else is a collision, [ErrCollision], and
// the job stays. The stored messages of a batch's duplicates are read all
// at once, within ProofTimeout.
//
// The stream forgets an id after its duplicate window
// (StreamConfig.Duplicates). While relays run, a job is claimed again at
// most [Relay.Reach] after its earlier publish, plus a poll: [Relay.Check]
// (and Run) refuse a window that is not longer. A job whose lease ended
// longer ago, while no relay claimed (all down, or the broker away), may
// be stored and its id forgotten: publishing it again would store it
// twice. So the relay sweeps the table, at the start of Run and then
// every quarter of the window's slack (the window less Reach) while no
// claim runs: it reads the jobs whose lease or retry delay ended more than
// half the slack ago, scans the stream for their ids from the earliest
// time they can have been published (less a minute for the clocks of the
// database and the broker), and deletes those it finds stored as they
// are, without a publish (Recovered). The others are claimed and
// published as usual: the stream does not hold them.
//
// The relay publishes only while the NATS connection is up: a loop waits,
// claiming nothing, while nats.go reconnects, and [Relay.Run] returns
// [ErrClosed] once the connection has closed for good.
//
// The table's data columns are the subject (text) and the payload (bytes).
// Its methods are safe for concurrent use.
type Relay struct {
	q   *inbox.Queue
	b   *inbox.Batcher
	nc  *nats.Conn
	js  jetstream.JetStream
	cfg Config

	published, duplicates, acked, leaseLost, retried, dead, unproven, recovered atomic.Uint64

	// stream is the stream and its duplicate window as Check last read
	// them: proofs and scans read messages through it.
	stream atomic.Pointer[streamState]
	// gate keeps the sweep and the claims apart: a claim holds it shared,
	// a sweep alone. nextSweep is when the next sweep is due (Unix ns).
	gate      sync.RWMutex
	nextSweep atomic.Int64

	// hook, in tests, runs at the named points of every batch with the
	// batch's number (counted from 1 across the relay's loops) and its
	// jobs' ids: "sent" when half of the batch is published and the rest
	// not yet, "published" when the broker has acked the whole batch and
	// the table not yet.
	hook    func(point string, batch int64, ids []string)
	batches atomic.Int64
}

// streamState is what Check read of the stream.
type streamState struct {
	s      jetstream.Stream
	window time.Duration
}

// New returns a relay of q's jobs over nc. q must be of the lease form. It
// does no I/O.
func New(q *inbox.Queue, nc *nats.Conn, cfg Config) (*Relay, error) {
	if q.Form() != inbox.Lease {
		return nil, fmt.Errorf("relay: the outbox table must be of the lease form, not %s", q.Form())
	}
	if cfg.Stream == "" {
		return nil, errors.New("relay: Config.Stream is empty")
	}
	if cfg.Source == "" {
		return nil, errors.New("relay: Config.Source is empty: name the outbox table's identity (TableSource)")
	}
	if strings.ContainsAny(cfg.Source, "\r\n\x00") {
		return nil, fmt.Errorf("relay: Config.Source %q holds a line break or NUL, which no message header may", cfg.Source)
	}
	if cfg.MsgIDPrefix == "" {
		cfg.MsgIDPrefix = defaultMsgIDPrefix(cfg.Source)
	}
	if cfg.Batch == 0 {
		cfg.Batch = 100
	}
	if cfg.Workers == 0 {
		cfg.Workers = 2
	}
	if cfg.Poll == 0 {
		cfg.Poll = 25 * time.Millisecond
	}
	if cfg.PublishTimeout == 0 {
		cfg.PublishTimeout = 5 * time.Second
	}
	if cfg.ProofTimeout == 0 {
		cfg.ProofTimeout = 5 * time.Second
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	if cfg.MaxRetryDelay == 0 {
		cfg.MaxRetryDelay = time.Minute
	}
	switch {
	case cfg.Batch < 0 || cfg.Batch > inbox.MaxClaim:
		return nil, fmt.Errorf("relay: Config.Batch %d must be from 1 to %d", cfg.Batch, inbox.MaxClaim)
	case cfg.Workers < 0 || cfg.Poll < 0 || cfg.PublishTimeout < 0 || cfg.ProofTimeout < 0 || cfg.AckTimeout < 0 || cfg.MaxRetryDelay < 0:
		return nil, errors.New("relay: Config.Workers, Poll, PublishTimeout, ProofTimeout, AckTimeout and MaxRetryDelay must not be negative")
	}
	if cfg.DB == nil {
		return nil, errors.New("relay: Config.DB is nil: the relay reads the outbox table's leases from it")
	}
	if name := q.Config().Dialect.Name(); name != "postgres" && name != "sqlite" {
		return nil, fmt.Errorf("relay: the outbox table is on %s: the relay reads its leases on PostgreSQL and SQLite only", name)
	}
	if nc == nil {
		return nil, errors.New("relay: the NATS connection is nil")
	}
	// Every loop may have a whole batch in flight: the client must not
	// stall a publish for want of room.
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.Workers*cfg.Batch),
		jetstream.WithPublishAsyncTimeout(cfg.PublishTimeout))
	if err != nil {
		return nil, err
	}
	// One statement acks a whole claim (up to 256 jobs; larger claims take
	// several), and the loops' acks share statements when they meet.
	b, err := q.NewBatcher(inbox.BatchConfig{MaxBatch: min(cfg.Batch, 256)})
	if err != nil {
		return nil, err
	}
	return &Relay{q: q, b: b, nc: nc, js: js, cfg: cfg}, nil
}

// defaultMsgIDPrefix is the message-id prefix of the table whose identity
// is source: 12 hex digits of its SHA-256, short enough to cost the
// stream's duplicate window little memory per id, long enough that two
// tables' prefixes do not meet (and should they, the relay refuses to
// delete on a duplicate that is not the job's own).
func defaultMsgIDPrefix(source string) string {
	sum := sha256.Sum256([]byte(source))
	return hex.EncodeToString(sum[:6]) + ":"
}

// Reach is the longest time, while relays run, from a job's publish to
// the end of the lease or retry delay that the table then holds for it:
// the lease, or the publish, proof and ack deadlines together if longer,
// plus MaxRetryDelay. The job is claimed again when that ends, and must be
// published again before the stream's duplicate window has passed since
// the first publish.
func (r *Relay) Reach() time.Duration {
	return max(r.q.Lease(), r.cfg.PublishTimeout+r.cfg.ProofTimeout+r.cfg.AckTimeout) + r.cfg.MaxRetryDelay
}

// Check reads the stream's configuration and returns an error when the
// stream is missing or its duplicate window is not longer than
// [Relay.Reach]: a job published again after its window would be stored
// twice. Run checks too.
func (r *Relay) Check(ctx context.Context) error {
	s, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return fmt.Errorf("relay: stream %s: %w", r.cfg.Stream, err)
	}
	window := s.CachedInfo().Config.Duplicates
	if need := r.Reach(); window <= need {
		return fmt.Errorf("relay: stream %s keeps de-duplication ids for %v, not longer than the lease (or the publish, proof and ack timeouts together, if longer) plus the longest retry delay (%v): raise its Duplicates window", r.cfg.Stream, window, need)
	}
	r.stream.Store(&streamState{s: s, window: window})
	return nil
}

// Stats returns the relay's counts so far.
func (r *Relay) Stats() Stats {
	return Stats{
		Published:  r.published.Load(),
		Duplicates: r.duplicates.Load(),
		Acked:      r.acked.Load(),
		LeaseLost:  r.leaseLost.Load(),
		Retried:    r.retried.Load(),
		Dead:       r.dead.Load(),
		Unproven:   r.unproven.Load(),
		Recovered:  r.recovered.Load(),
	}
}

// Run relays until ctx ends, then returns nil, or returns the first error
// of a claim, of the table's acks or of a sweep (a database error),
// [ErrCollision], [ErrClosed] once the NATS connection has closed, or
// Check's error; the other loops stop then too. It waits for the NATS
// connection first, checks the stream and sweeps the table before the
// first claim. When ctx ends, each loop finishes what it holds: a claim
// in flight runs to its end and its jobs are given back (see
// [Relay.claim]); a batch being published waits for the broker's acks (at
// most PublishTimeout), its proof (ProofTimeout) and is acked in the table
// (AckTimeout).
func (r *Relay) Run(ctx context.Context) error {
	if err := r.waitConnected(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.ProofTimeout)
	err := r.Check(cctx)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	r.nextSweep.Store(0)
	ctx, cancel = context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for range r.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.loop(ctx); err != nil {
				once.Do(func() { first = err })
				cancel()
			}
		}()
	}
	wg.Wait()
	return first
}

// loop is one worker: sweep when due, claim, relay, and wait Poll when
// nothing was found.
func (r *Relay) loop(ctx context.Context) error {
	idle := time.NewTimer(0)
	defer idle.Stop()
	<-idle.C
	for {
		if err := r.waitConnected(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		if err := r.sweep(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		r.gate.RLock()
		ds, err := r.claim(ctx)
		r.gate.RUnlock()
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			r.giveBack(ctx, ds)
			return nil
		}
		if len(ds) == 0 {
			idle.Reset(r.cfg.Poll)
			select {
			case <-ctx.Done():
				return nil
			case <-idle.C:
			}
			continue
		}
		if err := r.relay(ctx, ds); err != nil {
			return err
		}
	}
}

// waitConnected returns nil at once while the NATS connection is up, or
// when ctx ends. While nats.go connects or reconnects it waits, polling
// every Poll: a batch claimed now would only time out, and its jobs wait
// out a retry delay after the broker is back. It returns [ErrClosed] once
// the connection has closed: nats.go reconnects no more (MaxReconnects ran
// out), and a relay that went on claiming would publish nothing, ever.
func (r *Relay) waitConnected(ctx context.Context) error {
	for {
		switch r.nc.Status() {
		case nats.CONNECTED:
			return nil
		case nats.CLOSED:
			if err := r.nc.LastError(); err != nil {
				return fmt.Errorf("%w (last error: %v)", ErrClosed, err)
			}
			return ErrClosed
		}
		t := time.NewTimer(r.cfg.Poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// claim claims a batch under a context that ctx's end does not cancel,
// bounded by the lease instead. A lease claim interrupted midway can still
// commit at the server after the client has given up, and its jobs then
// wait out their leases: seen in the bench under load, where the first jobs
// enqueued after a relay stopped reached the stream a lease (30 s) late.
// So Run lets the claims in flight finish, and gives their jobs back.
func (r *Relay) claim(ctx context.Context) ([]*inbox.Delivery, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.q.Lease())
	defer cancel()
	return r.q.Claim(cctx, r.cfg.Batch)
}

// giveBack releases ds, their attempts not spent, so that another relay
// takes them at once instead of when their leases run out.
func (r *Relay) giveBack(ctx context.Context, ds []*inbox.Delivery) {
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
	defer cancel()
	for _, d := range ds {
		_ = r.b.Release(gctx, d)
	}
}

// relay publishes one claimed batch and settles it, each step under a
// deadline of its own: the broker's acks (PublishTimeout, from each
// publish), the proof of the duplicates (ProofTimeout) and the table's
// statements (AckTimeout).
func (r *Relay) relay(ctx context.Context, ds []*inbox.Delivery) error {
	batch := r.batches.Add(1)
	ids := make([]string, len(ds))
	msgs := make([]*nats.Msg, len(ds))
	futures := make([]jetstream.PubAckFuture, len(ds))
	errs := make([]error, len(ds))
	for i, d := range ds {
		ids[i] = r.cfg.MsgIDPrefix + idText(d.ID())
		if r.hook != nil && i == len(ds)/2 {
			r.hook("sent", batch, ids[:i])
		}
		var subject string
		var payload []byte
		if errs[i] = d.Scan(&subject, &payload); errs[i] != nil {
			continue
		}
		msgs[i] = nats.NewMsg(subject)
		msgs[i].Data = payload
		msgs[i].Header.Set(SourceHeader, r.cfg.Source)
		futures[i], errs[i] = r.js.PublishMsgAsync(msgs[i],
			jetstream.WithMsgID(ids[i]), jetstream.WithExpectStream(r.cfg.Stream))
	}
	// Every future ends: with the broker's ack, or with an error at the
	// latest after PublishTimeout. A relay told to stop waits for them too:
	// a batch given back now would be published again, as duplicates.
	var dups []int
	seqs := make([]uint64, len(ds))
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				dups = append(dups, i)
				seqs[i] = ack.Sequence
			} else {
				r.published.Add(1)
			}
		case errs[i] = <-f.Err():
		}
	}
	// The broker has the messages: the proof and the table's acks run to
	// the end even when ctx ends, so that a stopping relay leaves no job
	// behind to wait out its lease; each is bounded, should the broker or
	// the database not answer.
	if len(dups) > 0 {
		r.prove(ctx, dups, seqs, ids, msgs, errs)
	}
	if r.hook != nil {
		r.hook("published", batch, ids)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AckTimeout)
	defer cancel()
	acked := make([]*inbox.Delivery, 0, len(ds))
	for i, d := range ds {
		if errs[i] == nil {
			acked = append(acked, d)
		}
	}
	var first error
	for i, err := range r.b.AckAll(actx, acked) {
		switch {
		case err == nil:
			r.acked.Add(1)
		case errors.Is(err, inbox.ErrLeaseLost):
			// Another relay holds the job now; its publish is a
			// duplicate and its ack deletes the row.
			r.leaseLost.Add(1)
		case first == nil:
			first = fmt.Errorf("relay: ack of job %v: %w", acked[i].ID(), err)
		}
	}
	for i, d := range ds {
		if errs[i] == nil {
			continue
		}
		if err := r.fail(actx, d, errs[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// errUnproven is a duplicate whose stored message the stream no longer has.
var errUnproven = errors.New("the stream called the publish a duplicate, and no longer holds the stored message to compare")

// maxReads is the most stored messages the relay reads at once.
const maxReads = 256

// prove sets errs[i], for each job i of dups whose publish the stream
// called a duplicate of its message at seqs[i], to nil when that stored
// message is msgs[i] (same source, id, subject and payload), so that the
// job's message is in the stream; to an error wrapping [ErrCollision] when
// it is another's; to errUnproven when the stream no longer has it (its
// retention removed it, but its id is still in the duplicate window); or
// to the read's error (ProofTimeout passed, the broker away). Only a nil
// error deletes the job. The messages are read all at once.
func (r *Relay) prove(ctx context.Context, dups []int, seqs []uint64, ids []string, msgs []*nats.Msg, errs []error) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ProofTimeout)
	defer cancel()
	want := make([]uint64, len(dups))
	for k, i := range dups {
		want[k] = seqs[i]
	}
	got, gerrs := r.readMsgs(pctx, want)
	for k, i := range dups {
		if errs[i] = r.same(got[k], gerrs[k], seqs[i], ids[i], msgs[i].Subject, msgs[i].Data); errs[i] == nil {
			r.duplicates.Add(1)
		}
	}
}

// readMsgs reads the stored messages at seqs, up to maxReads requests in
// flight: each is a request to the broker, and together they take about
// one round trip. Sequence 0 (none given) reads as ErrMsgNotFound.
func (r *Relay) readMsgs(ctx context.Context, seqs []uint64) ([]*jetstream.RawStreamMsg, []error) {
	got := make([]*jetstream.RawStreamMsg, len(seqs))
	errs := make([]error, len(seqs))
	st := r.stream.Load()
	var wg sync.WaitGroup
	slots := make(chan struct{}, maxReads)
	for k, seq := range seqs {
		if seq == 0 {
			errs[k] = jetstream.ErrMsgNotFound
			continue
		}
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			got[k], errs[k] = st.s.GetMsg(ctx, seq)
		}()
	}
	wg.Wait()
	return got, errs
}

// same returns nil when m, read at seq with error err, is the message of
// id from this table on subject with payload; see prove.
func (r *Relay) same(m *jetstream.RawStreamMsg, err error, seq uint64, id, subject string, payload []byte) error {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return errUnproven
	}
	if err != nil {
		return fmt.Errorf("relay: reading the stored message %d of id %q: %w", seq, id, err)
	}
	if m.Header.Get(jetstream.MsgIDHeader) == id && m.Header.Get(SourceHeader) == r.cfg.Source &&
		m.Subject == subject && bytes.Equal(m.Data, payload) {
		return nil
	}
	return fmt.Errorf("%w: id %q at stream sequence %d came from %q on %s, not from %q on %s: "+
		"two outbox tables share a message-id prefix (Config.MsgIDPrefix, -msgid-prefix)",
		ErrCollision, id, seq, m.Header.Get(SourceHeader), m.Subject, r.cfg.Source, subject)
}

// fail settles a job whose publish failed: a payload over the server's
// limit can never be published and goes to the dead table; anything else
// (a timeout, no stream for the subject, the broker away, a duplicate
// that is not the job's) is retried after a delay. A collision is
// returned once the job is settled: it ends the relay.
func (r *Relay) fail(ctx context.Context, d *inbox.Delivery, cause error) error {
	var err error
	if errors.Is(cause, nats.ErrMaxPayload) {
		if err = d.Dead(ctx); err == nil {
			r.dead.Add(1)
		}
	} else {
		after := min(worker.DefaultBackoff(d.Attempt()), r.cfg.MaxRetryDelay)
		if err = r.b.Retry(ctx, d, after); err == nil {
			r.retried.Add(1)
		}
	}
	if errors.Is(cause, errUnproven) {
		r.unproven.Add(1)
	}
	if err != nil && !errors.Is(err, inbox.ErrLeaseLost) {
		return fmt.Errorf("relay: job %v: publish: %v; settling it: %w", d.ID(), cause, err)
	}
	if errors.Is(cause, ErrCollision) {
		return fmt.Errorf("relay: job %v, given back: %w", d.ID(), cause)
	}
	return nil
}

// idText is a job id as text: the table's ids are integers or text.
func idText(id any) string {
	switch v := id.(type) {
	case int64:
		return strconv.FormatInt(v, 10)
	case string:
		return v
	}
	return fmt.Sprint(id)
}
