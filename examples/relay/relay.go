package main

import (
	"bytes"
	"context"
	"crypto/sha256"
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
	// PublishTimeout bounds the wait for the broker's ack of one message.
	// Zero means 5 s. A timed-out message may still be stored: it is
	// published again later with the same de-duplication id.
	PublishTimeout time.Duration
	// MaxRetryDelay caps the delay before a job whose publish failed is
	// claimed again (one second doubled each attempt). Zero means a minute.
	MaxRetryDelay time.Duration
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
// drops as duplicates. So every job reaches the stream exactly once if it
// is published again within the stream's duplicate window
// (StreamConfig.Duplicates): [Relay.Check] refuses a window that is not
// longer than the lease plus MaxRetryDelay. A job whose relay stays down
// for longer than the window may be stored twice.
//
// A duplicate ack says only that the stream has seen the id. The relay
// deletes such a job only after reading the stored message the ack names
// and finding it the job's own (same source, id, subject and payload):
// anything else is a collision, [ErrCollision], and the job stays.
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

	published, duplicates, acked, leaseLost, retried, dead, unproven atomic.Uint64

	// hook, in tests, runs at the named points of every batch with the
	// batch's number (counted from 1 across the relay's loops) and its
	// jobs' ids: "sent" when half of the batch is published and the rest
	// not yet, "published" when the broker has acked the whole batch and
	// the table not yet.
	hook    func(point string, batch int64, ids []string)
	batches atomic.Int64
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
	if cfg.MaxRetryDelay == 0 {
		cfg.MaxRetryDelay = time.Minute
	}
	switch {
	case cfg.Batch < 0 || cfg.Batch > inbox.MaxClaim:
		return nil, fmt.Errorf("relay: Config.Batch %d must be from 1 to %d", cfg.Batch, inbox.MaxClaim)
	case cfg.Workers < 0 || cfg.Poll < 0 || cfg.PublishTimeout < 0 || cfg.MaxRetryDelay < 0:
		return nil, errors.New("relay: Config.Workers, Poll, PublishTimeout and MaxRetryDelay must not be negative")
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

// Check reads the stream's configuration and returns an error when the
// stream is missing or its duplicate window is not longer than the lease
// plus MaxRetryDelay: a job published again after its window would be
// stored twice.
func (r *Relay) Check(ctx context.Context) error {
	s, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return fmt.Errorf("relay: stream %s: %w", r.cfg.Stream, err)
	}
	window := s.CachedInfo().Config.Duplicates
	if need := r.q.Lease() + r.cfg.MaxRetryDelay; window <= need {
		return fmt.Errorf("relay: stream %s keeps de-duplication ids for %v, not longer than the lease plus the longest retry delay (%v): raise its Duplicates window", r.cfg.Stream, window, need)
	}
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
	}
}

// Run relays until ctx ends, then returns nil, or returns the first error
// of a claim or of the table's acks (a database error), [ErrCollision], or
// [ErrClosed] once the NATS connection has closed; the other loops stop
// then too. When ctx ends, each loop finishes what it holds: a claim
// in flight runs to its end and its jobs are given back (see
// [Relay.claim]); a batch being published waits for the broker's acks
// (at most PublishTimeout) and is acked in the table.
func (r *Relay) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
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

// loop is one worker: claim, relay, and wait Poll when nothing was found.
func (r *Relay) loop(ctx context.Context) error {
	idle := time.NewTimer(0)
	defer idle.Stop()
	<-idle.C
	for {
		if err := r.waitConnected(ctx); err != nil || ctx.Err() != nil {
			return err
		}
		ds, err := r.claim(ctx)
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
// when ctx ends. While nats.go reconnects it waits, polling every Poll: a
// batch claimed now would only time out, and its jobs wait out a retry
// delay after the broker is back. It returns [ErrClosed] once the
// connection has closed: nats.go reconnects no more (MaxReconnects ran
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
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	for _, d := range ds {
		_ = r.b.Release(gctx, d)
	}
}

// relay publishes one claimed batch and settles it.
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
	dups := map[int]uint64{}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			if ack.Duplicate {
				dups[i] = ack.Sequence
			} else {
				r.published.Add(1)
			}
		case errs[i] = <-f.Err():
		}
	}
	// The broker has the messages: the table's acks run to the end even
	// when ctx ends, so that a stopping relay leaves no job behind to wait
	// out its lease (bounded, should the database not answer).
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.PublishTimeout)
	defer cancel()
	for i, seq := range dups {
		if errs[i] = r.prove(sctx, seq, ids[i], msgs[i]); errs[i] == nil {
			r.duplicates.Add(1)
		}
	}
	if r.hook != nil {
		r.hook("published", batch, ids)
	}
	acked := make([]*inbox.Delivery, 0, len(ds))
	for i, d := range ds {
		if errs[i] == nil {
			acked = append(acked, d)
		}
	}
	var first error
	for i, err := range r.b.AckAll(sctx, acked) {
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
		if err := r.fail(sctx, d, errs[i]); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// errUnproven is a duplicate whose stored message the stream no longer has.
var errUnproven = errors.New("the stream called the publish a duplicate, and no longer holds the stored message to compare")

// prove returns nil when the message the stream stored at seq, of which
// it called msg's publish a duplicate, is msg: same source, id, subject
// and payload, so that the job's message is in the stream. It returns an
// error wrapping [ErrCollision] when the stored message is another's, and
// errUnproven when the stream no longer has it (its retention removed it,
// but its id is still in the duplicate window): the job cannot be shown
// stored, so it is not deleted.
func (r *Relay) prove(ctx context.Context, seq uint64, id string, msg *nats.Msg) error {
	if seq == 0 {
		return errUnproven
	}
	s, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return err
	}
	m, err := s.GetMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return errUnproven
	}
	if err != nil {
		return err
	}
	if m.Header.Get(jetstream.MsgIDHeader) == id && m.Header.Get(SourceHeader) == r.cfg.Source &&
		m.Subject == msg.Subject && bytes.Equal(m.Data, msg.Data) {
		return nil
	}
	return fmt.Errorf("%w: id %q at stream sequence %d came from %q on %s, not from %q on %s: "+
		"two outbox tables share a message-id prefix (Config.MsgIDPrefix, -msgid-prefix)",
		ErrCollision, id, seq, m.Header.Get(SourceHeader), m.Subject, r.cfg.Source, msg.Subject)
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
