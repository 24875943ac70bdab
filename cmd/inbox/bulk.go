package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sqlinbox/inbox"
)

// defaultBatch is how many dead jobs one transaction of requeue -all takes.
const defaultBatch = 200

// parseRequeue parses requeue: one dead job by id, or with -all every dead
// job (or those older than -older) in batches, which runs only with -yes,
// and without it prints the count and how to confirm it.
func parseRequeue(g global, fs *flag.FlagSet, args []string) (action, error) {
	all := fs.Bool("all", false, "requeue every dead job (with -older, those older than it)")
	older := fs.Duration("older", 0, "with -all: only the dead jobs older than this")
	batch := fs.Int("batch", defaultBatch, "with -all: jobs per transaction, 1 to 1000")
	most := fs.Int64("max", 0, "with -all: requeue no more than this many (the count you confirmed)")
	yes := fs.Bool("yes", false, "with -all: really requeue")
	as := fs.String("as", "", "the new id, for a table whose ids the caller gives")
	if err := fs.Parse(args); err != nil {
		return nil, usageErr("requeue: %v", err)
	}
	if !*all {
		return parseRequeueOne(g, fs.Args(), *as)
	}
	switch {
	case *as != "":
		return nil, usageErr("requeue -as gives one job its new id: not with -all")
	case fs.NArg() != 0:
		return nil, usageErr("requeue -all takes no id, got %q", fs.Args())
	case *older < 0:
		return nil, usageErr("requeue -older %v: want a positive age", *older)
	case *batch < 1 || *batch > inbox.MaxList:
		return nil, usageErr("requeue -batch %d: want 1 to %d", *batch, inbox.MaxList)
	case *most < 0:
		return nil, usageErr("requeue -max %d: want a positive count", *most)
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		f, what := inbox.DeadFilter{Max: *most}, "of any age"
		if *older > 0 {
			f.DiedBefore, what = time.Now().Add(-*older), "older than "+older.String()
		}
		if !*yes {
			n, err := q.CountDead(ctx, f)
			if err != nil {
				return nil, err
			}
			return nil, &cliError{code: exitRefused, extra: map[string]any{"count": n},
				err: fmt.Errorf("requeue -all: %d dead jobs %s would be requeued: add -yes to requeue them, and -max %d to requeue no more than these", n, what, n)}
		}
		n, err := q.RequeueDeadAll(ctx, f, *batch)
		if err != nil {
			return nil, fmt.Errorf("requeue -all: requeued %d before: %w", n, err)
		}
		return &requeueAllOut{Requeued: n}, nil
	}, nil
}

// parseRequeueOne parses requeue ID [-as NEWID]: the dead job under an id
// the table assigns, or under NEWID.
func parseRequeueOne(g global, args []string, as string) (action, error) {
	if len(args) != 1 {
		return nil, usageErr("requeue takes one id, or -all")
	}
	id, err := g.parseID(args[0])
	if err != nil {
		return nil, err
	}
	if as == "" {
		return byID(id, func(ctx context.Context, q *inbox.Queue) (result, error) {
			newID, err := q.RequeueDead(ctx, id)
			if errors.Is(err, inbox.ErrRequeueNeedsID) {
				err = fmt.Errorf("%w; with this command: requeue -as NEWID %s", err, args[0])
			}
			if err != nil {
				return nil, err
			}
			return &requeueOut{ID: id, NewID: newID}, nil
		}), nil
	}
	newID, err := g.parseID(as)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, q *inbox.Queue) (result, error) {
		if err := q.RequeueDeadAs(ctx, id, newID); err != nil {
			return nil, err
		}
		return &requeueOut{ID: id, NewID: newID}, nil
	}, nil
}

// parseBulk parses delete-dead and run-now; ok is false for another
// command.
func parseBulk(name string, oneID func() (any, error)) (act action, ok bool, err error) {
	switch name {
	case "delete-dead":
		id, err := oneID()
		if err != nil {
			return nil, true, err
		}
		return byID(id, func(ctx context.Context, q *inbox.Queue) (result, error) {
			if err := q.DeleteDead(ctx, id); err != nil {
				return nil, err
			}
			return &deleteOut{Deleted: id}, nil
		}), true, nil
	case "run-now":
		id, err := oneID()
		if err != nil {
			return nil, true, err
		}
		return byID(id, func(ctx context.Context, q *inbox.Queue) (result, error) {
			if err := q.RunNow(ctx, id); err != nil {
				return nil, err
			}
			return &runNowOut{Ready: id}, nil
		}), true, nil
	}
	return nil, false, nil
}

// isRefusal reports the bulk commands' refusals: a job that is not
// waiting (run-now).
func isRefusal(err error) bool { return errors.Is(err, inbox.ErrNotWaiting) }

type requeueAllOut struct {
	Requeued int64 `json:"requeued"`
}

func (r *requeueAllOut) text(w io.Writer) { fmt.Fprintf(w, "requeued %d dead jobs\n", r.Requeued) }

type deleteOut struct {
	Deleted any `json:"deleted"`
}

func (d *deleteOut) text(w io.Writer) { fmt.Fprintf(w, "deleted dead job %v\n", d.Deleted) }

type runNowOut struct {
	Ready any `json:"ready"`
}

func (r *runNowOut) text(w io.Writer) { fmt.Fprintf(w, "job %v is ready to run now\n", r.Ready) }
