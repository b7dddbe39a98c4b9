package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/retry"
)

// A refill holds every commit (no ack moves the ack floor), turns the service unready naming the
// reason, and publishes that it runs on the service's consumer before it touches the table, so
// readers wait as for a commit. It writes what the stream holds, then notes the new lineage whole
// and publishes it: whatever was derived from any other lineage is stale from then on. A fault
// during a refill (ClickHouse down, the table dropped again) is retried with the shared backoff
// for as long as it lasts, unready meanwhile.
//
// Replicas share the table. One refills it at a time: a refill notes its lineage again every
// refillBeat; a replica that finds the newest lineage unfinished waits for it (holding its own
// commits, unready) instead of refilling too, and takes the refill over once it has seen its notes
// stand still for RefillStale, on its own clock: no decision compares two hosts' clocks. Two that
// start together both note a lineage; the one whose epoch is not the newest (epochs are ordered by
// the store: chstore.NextEpoch) yields at its next note.
const (
	refillBeat = 2 * time.Second
	// refillStale covers the RefillGrace a refill waits before its first note, and a slow insert
	// between two notes; taking a live refill over is harmless (rows are idempotent, and the
	// later epoch wins), just work done twice.
	refillStale = 15 * time.Second
)

// RefillStale is how long another replica's refill may go without a note before it is taken over.
func (k *Keeper[R]) RefillStale() time.Duration {
	if k.cfg.StaleAfter > 0 {
		return k.cfg.StaleAfter
	}
	return refillStale
}

// refillGrace is how long a refill waits between publishing that it runs and touching the table
// (chstore.RefillGrace).
func (k *Keeper[R]) refillGrace() time.Duration {
	if k.cfg.Grace > 0 {
		return k.cfg.Grace
	}
	return chstore.RefillGrace
}

// errYielded is a refill that found another replica's newer one running.
var errYielded = errors.New("another replica refills the table")

// refillPlan is how a refill starts.
type refillPlan struct {
	why string
	// repair recreates the tables first; others waits for another replica's refill first; lost
	// is a table found lost, which may have held rows no stream holds any more (loss.go).
	repair, others, lost bool
	// resume is a refill that stopped and may go on after its Through (zero: from the start).
	resume chstore.Lineage
}

// RefillLost refills a table a write found missing: made again from the migrations and filled
// from the stream, unless what it lost is kept nowhere else (loss.go). Commits held.
func (k *Keeper[R]) RefillLost(ctx context.Context) error {
	return k.refill(ctx, refillPlan{why: "the table of " + k.cfg.View.What + " is missing", repair: true, lost: true})
}

// refill makes the table whole from the stream, tried with the view (the condition, the backoff,
// the metrics). Commits are held by the caller. It returns once the table is whole, with ctx's
// error, or put off: ErrBeforeInHand (a batch of the stream before may still commit) or
// ErrLossHeld (a loss waits for an operator).
func (k *Keeper[R]) refill(ctx context.Context, plan refillPlan) error {
	info, err := k.streamInfo(ctx)
	if err != nil {
		return err
	}
	// A refill onto a stream made again begins its era: put off, before it touches anything,
	// while a batch of the stream before may still commit (refillSteps checks it again).
	if prev, known, err := k.lastLineage(ctx); err != nil {
		return err
	} else if known && prev.Stream != chstore.StreamID(info.Created) {
		if err := k.mayBeginEra(ctx, info.Created, chstore.StreamID(info.Created)); err != nil {
			k.cfg.View.Whole.Fail("filling %s again from %s is put off (%s): %v", k.cfg.View.What, k.cfg.View.Stream, plan.why, err)
			return err
		}
	}
	// A lost table is refilled only when nothing was lost with it, or an operator accepted what
	// was (loss.go). Checked here first, so that a loss waited on logs no refill; and again in a
	// try whose table was lost since (a takeover of a refill whose rows are gone, a try that found
	// the table dropped): a loss found then ends the refill (View.Refill), for the watch to wait on.
	stream := chstore.StreamID(info.Created)
	accepted := false
	if plan.lost {
		if accepted, err = k.checkLoss(ctx, stream); err != nil {
			return err
		}
	}
	if k.cfg.Refilling != nil {
		defer k.cfg.Refilling()()
	}
	k.refilling.Store(&plan.why)
	defer k.refilling.Store(nil)
	repair, others, lost := plan.repair, plan.others, false
	return k.cfg.View.Refill(ctx, plan.why, func(ctx context.Context, _ uint64) (Tried, error) {
		if others {
			if err := k.awaitRefill(ctx); err == nil || ctx.Err() != nil {
				return Tried{Adopted: true}, ctx.Err()
			}
			k.cfg.Log.Warn("the other replica's refill stopped; taking it over", "table", k.cfg.View.What)
			if l, found, err := k.cfg.Table.Lineage(ctx); err == nil && found && !l.Whole {
				plan.resume = l // its progress as it last noted it
				// Its rows gone meanwhile (the table emptied), what it held before may be too.
				lost = lost || !k.resumable(ctx, l, stream) && l.Anchor != (chstore.RowKey{})
			}
		}
		if lost {
			acc, err := k.checkLoss(ctx, stream)
			if err != nil {
				return Tried{}, err
			}
			accepted, lost = accepted || acc, false
		}
		res, lin, err := k.refillSteps(ctx, plan.why, repair, accepted, plan.resume)
		if err == nil {
			return Tried{Attrs: []any{"lineage", lin.ID(), "messages", res.Read, "written", res.Written, "refused", res.Refused, "invalid", res.Skipped}}, nil
		}
		if others = errors.Is(err, errYielded); others {
			return Tried{}, fmt.Errorf("%w: %v", ErrAgain, err)
		}
		// The table may be gone again (start over, repairing, once a loss is checked: what it
		// held before this refill may be gone with it), or ClickHouse or the stream away (go on
		// from what was noted).
		if errors.Is(err, ErrTableLost) {
			repair, lost = true, true
		}
		if plan.resume = lin; repair {
			plan.resume = chstore.Lineage{}
		}
		return Tried{}, err
	})
}

// awaitRefill waits until another replica's refill is done (nil), or its notes have stood still
// for RefillStale as this replica watches them (an error). Only whether a note changed is read,
// never when it was noted: the noter's clock may be anything.
func (k *Keeper[R]) awaitRefill(ctx context.Context) error {
	var seen chstore.Lineage
	still := time.Now() // when the note seen last was first seen (this host's monotonic clock)
	for {
		lin, found, err := k.cfg.Table.Lineage(ctx)
		switch {
		case err != nil:
			k.cfg.Log.Warn("lineage not read while another replica refills the table", "table", k.cfg.View.What, "error", err)
		case found && lin.Whole:
			k.published.Store(&lin)
			return nil
		case !found:
			return errors.New("the refill's lineage is gone")
		case lin != seen:
			seen, still = lin, time.Now()
		case time.Since(still) > k.RefillStale():
			return errors.New("the refill stopped noting its progress")
		}
		if retry.Sleep(ctx, min(refillBeat/2, k.RefillStale())) != nil {
			return ctx.Err()
		}
	}
}

// refillSteps is one try of refill: what it wrote, and the lineage it noted last. It goes on from
// resume where that is of the same stream and the table holds its anchor; else from the start.
// accepted is the refill of a table whose loss an operator accepted: its lineage holds its own
// era's rows only.
func (k *Keeper[R]) refillSteps(ctx context.Context, why string, repair, accepted bool, resume chstore.Lineage) (res Filled[R], lin chstore.Lineage, err error) {
	info, err := k.streamInfo(ctx)
	if err != nil {
		return res, lin, err
	}
	epoch, err := k.cfg.Table.NextEpoch(ctx, k.cfg.Now())
	if err != nil {
		return res, lin, errorOf(err)
	}
	lin = chstore.Lineage{Epoch: epoch, Stream: chstore.StreamID(info.Created)}
	// Eras only grow: the newest lineage known (the table's, or, when the table lost it, the one
	// published) names the era this stream's rows take; when none is known, what was derived from
	// the table may still say which eras were used (EraFloor).
	prev, known, err := k.lastLineage(ctx)
	if err != nil {
		return res, lin, err
	}
	if !known {
		if lin.Era, err = k.eraFloor(ctx); err != nil {
			return res, lin, err
		}
	}
	// The floor never rises over eras the table may still hold, or may have lost unnamed: the
	// lineage before's, unless the table held no row under it (no anchor, no era before its own),
	// or an operator accepted what it lost, or none is known (the table is new, or empty).
	lin.Floor = lin.Era
	if known {
		lin.Era = prev.EraOf(lin.Stream)
		lin.Floor = lin.Era
		if !accepted && (prev.Anchor != (chstore.RowKey{}) || prev.Floor < prev.Era) {
			lin.Floor = min(prev.Floor, lin.Era)
		}
		if prev.Stream != lin.Stream {
			// The refill begins the era of a stream made again: not while a batch of the stream
			// before may still commit (check.go, mayBeginEra), as a check's switch.
			if err := k.mayBeginEra(ctx, info.Created, lin.Stream); err != nil {
				return res, lin, err
			}
			k.before.Store(&prev) // a batch of the stream before, committed after, keeps its era
		}
	}
	after := info.State.FirstSeq
	if after > 0 {
		after-- // a stream that never held a message says 0
	}
	// resumed and first are rows this try relies on the table still holding: the anchor of the
	// refill it goes on from, and the first row it stores. A table emptied or made again while it
	// writes (an operator, another replica's repair) lost them: the try does not count.
	var resumed, first chstore.RowKey
	if !repair && k.resumable(ctx, resume, lin.Stream) {
		lin, after = resume, resume.Through
		resumed = resume.Anchor
		k.cfg.Log.Info("the refill goes on from where it stopped", "table", k.cfg.View.What, "lineage", lin.ID(), "after", after)
	}
	lin.Whole, lin.Noted = false, time.Time{}
	// Readers hear of it before the table changes: from now on they wait, and a read that one
	// started on an older probe has started before the table changes (chstore.RefillGrace).
	if err := k.Publish(ctx, lin, why); err != nil {
		return res, lin, err
	}
	if retry.Sleep(ctx, k.refillGrace()) != nil {
		return res, lin, ctx.Err()
	}
	if repair {
		if err := k.cfg.Repair(ctx); err != nil {
			return res, lin, fmt.Errorf("recreate the tables: %w", err)
		}
		if k.cfg.View.Metrics.Repairs != nil {
			k.cfg.View.Metrics.Repairs.Inc()
		}
	}

	beat := func(ctx context.Context) error {
		if err := k.stillHolds(ctx, resumed, first); err != nil {
			return err
		}
		if err := k.cfg.Table.NoteLineage(ctx, lin); err != nil {
			return errorOf(err)
		}
		if newest, found, err := k.cfg.Table.Lineage(ctx); err == nil && found && newest.Epoch > lin.Epoch {
			return errYielded
		}
		// Again: a consumer made again meanwhile may carry an older state.
		return k.Publish(ctx, lin, why)
	}
	if err := beat(ctx); err != nil {
		return res, lin, err
	}
	last := time.Now()
	at := Origin{Created: info.Created, Era: lin.Era}
	src := Source[R]{JS: k.cfg.JS, Stream: k.cfg.View.Stream, Filter: k.cfg.Rows.Filter, Batch: max(k.cfg.Batch, 1000), BatchBytes: k.cfg.BatchBytes,
		Row: func(msg jetstream.Msg) (R, bool) {
			row, err := k.cfg.Rows.Of(msg, at)
			return row, err == nil
		}}
	res, err = FillFrom(ctx, src, after, k.cfg.Write, func(ctx context.Context, f Filled[R]) error {
		if f.HasLast {
			lin.Anchor, lin.Through = k.cfg.Rows.Key(f.Last), f.LastSeq // the progress the next note records
			if first == (chstore.RowKey{}) {
				first = lin.Anchor
			}
		}
		if time.Since(last) < refillBeat {
			return nil
		}
		last = time.Now()
		return beat(ctx)
	})
	if err != nil {
		return res, lin, err
	}
	if res.Refused > 0 {
		k.cfg.Log.Warn("the refill skipped rows the table refuses (they were dead-lettered when they came)", "table", k.cfg.View.What, "count", res.Refused)
	}
	k.warnTrimmed(ctx)
	if err := k.stillHolds(ctx, resumed, first); err != nil {
		return res, lin, err
	}
	lin.Whole = true
	if res.HasLast {
		lin.Anchor = k.cfg.Rows.Key(res.Last)
	}
	if lin.Anchor == (chstore.RowKey{}) {
		// Nothing was stored (the stream held only invalid events): any row the table holds.
		if lin.Anchor, _, err = k.cfg.Table.NewestRow(ctx); err != nil {
			return res, lin, errorOf(err)
		}
	}
	if err := k.cfg.Table.NoteLineage(ctx, lin); err != nil {
		return res, lin, errorOf(err)
	}
	return res, lin, k.Publish(ctx, lin, "")
}

// eraFloor is the least era of a lineage noted when none is known (Config.EraFloor; 0 without).
func (k *Keeper[R]) eraFloor(ctx context.Context) (uint32, error) {
	if k.cfg.EraFloor == nil {
		return 0, nil
	}
	return k.cfg.EraFloor(ctx)
}

// stillHolds is nil while the table holds every one of rows (a zero key: none to hold); else an
// ErrTableLost naming the row gone, so that the refill starts over, repairing.
func (k *Keeper[R]) stillHolds(ctx context.Context, rows ...chstore.RowKey) error {
	for _, row := range rows {
		if row == (chstore.RowKey{}) {
			continue
		}
		held, err := k.cfg.Table.Holds(ctx, row)
		if err != nil {
			return errorOf(err)
		}
		if !held {
			return fmt.Errorf("%w: the table lost a row this refill stored (%s at %d:%d): emptied or made again while it was filled", ErrTableLost, row.EventID, row.Pos.Era, row.Pos.Seq)
		}
	}
	return nil
}

// resumable reports whether a refill that stopped may go on after its Through: of this stream,
// with progress noted, and its last stored row still in the table.
func (k *Keeper[R]) resumable(ctx context.Context, l chstore.Lineage, stream string) bool {
	if l.Epoch == 0 || l.Through == 0 || l.Stream != stream || l.Anchor == (chstore.RowKey{}) {
		return false
	}
	held, err := k.cfg.Table.Holds(ctx, l.Anchor)
	return err == nil && held
}

// warnTrimmed says, after a refill, when the stream no longer holds its first messages (its
// max_age or max_bytes trimmed it): the refilled table has what the stream kept, so whatever is
// read of the messages trimmed away is short of them.
func (k *Keeper[R]) warnTrimmed(ctx context.Context) {
	info, err := k.streamInfo(ctx)
	if err != nil {
		return
	}
	if first := info.State.FirstSeq; first > 1 {
		k.cfg.Log.Warn("the stream was trimmed by its retention: the refilled table lacks the messages before the stream's first sequence; restore the table from a backup to have them back",
			"table", k.cfg.View.What, "stream", k.cfg.View.Stream, "first_seq", first, "max_age", info.Config.MaxAge.String(), "max_bytes", info.Config.MaxBytes)
	}
}
