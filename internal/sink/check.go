package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/pkg/events"
)

// The check compares the table's lineage with its stream, at start, every checkEvery, and whenever
// a write or a read finds the table missing or its anchor gone:
//   - no lineage (a new database, or a store of a Podium before lineages): an empty table while
//     the stream holds messages is refilled; a table with rows is adopted as it is (adopt); the
//     lineage's own table gone (or its database) is made again first, then checked so;
//   - a refill that did not finish, or an anchor row the table no longer holds (dropped or
//     recreated): refilled (refill.go), unless what was lost is kept nowhere else (loss.go);
//   - another stream than the lineage names (deleted and made again, its sequences starting
//     over): the rows are kept (the old stream is gone) and a new lineage is noted in the next
//     era, once no batch of the stream before can still come.

// checkEvery is how often a keeper checks its table: the longest a table dropped while nothing is
// written goes unnoticed.
const checkEvery = 5 * time.Second

// beforeEvery is how often a check put off for batches of the stream before is made again: what
// it waits for (a runtime's pass, the replicas' notes) moves about that often.
const beforeEvery = time.Second

// Check checks the table's lineage against the stream and refills the table when it is not whole.
// A table found as published (the usual case) costs commits nothing; any other is checked again
// with commits held. A table found whole is ready, however it became so (a refill of this
// replica's that was put off and another's that finished, a restore).
func (k *Keeper[R]) Check(ctx context.Context) error {
	if k.loss.Load() == nil && k.asPublished(ctx) {
		k.cfg.View.Whole.Holds()
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	err := k.CheckLocked(ctx)
	if err == nil {
		k.lossResolved(ctx)
		k.cfg.View.Whole.Holds()
	}
	return err
}

// asPublished reports whether the table is whole, of the stream, and of the lineage published;
// false on any doubt (an error included).
func (k *Keeper[R]) asPublished(ctx context.Context) bool {
	pub := k.published.Load()
	if pub == nil || k.refilling.Load() != nil {
		return false
	}
	info, err := k.streamInfo(ctx)
	if err != nil {
		return false
	}
	lin, found, err := k.cfg.Table.Lineage(ctx)
	if err != nil || !found || !lin.Whole || lin.ID() != pub.ID() || lin.Stream != chstore.StreamID(info.Created) {
		return false
	}
	if lin.Anchor != (chstore.RowKey{}) {
		if held, err := k.cfg.Table.Holds(ctx, lin.Anchor); err != nil || !held {
			return false
		}
	}
	if k.cfg.BeforeRepublish != nil {
		k.cfg.BeforeRepublish()
	}
	// Whole: the consumer's metadata says so too (a consumer made again may carry an older
	// state). Only while pub is still the lineage published: a refill or a check that published a
	// newer one meanwhile is not undone by this check's older view.
	k.publishMu.Lock()
	defer k.publishMu.Unlock()
	if k.published.Load() != pub {
		return false // published anew meanwhile: checked again, with commits held
	}
	return k.publishLocked(ctx, *pub, "") == nil
}

// CheckLocked is Check with commits held (from Serial, or EraOf).
func (k *Keeper[R]) CheckLocked(ctx context.Context) error {
	info, err := k.streamInfo(ctx)
	if err != nil {
		return err
	}
	what := k.cfg.View.What
	streamID := chstore.StreamID(info.Created)
	lin, found, err := k.cfg.Table.Lineage(ctx)
	if chstore.FaultOf(err) == chstore.Missing {
		// The lineage's table (or the database) is gone; the rows' table may not be. Made again
		// first, so that a table that survived is checked as one without a lineage (adopted,
		// its eras and floor read from its rows) instead of refilled over as if it held nothing.
		if err := k.cfg.Repair(ctx); err != nil {
			return fmt.Errorf("recreate the tables of %s: %w", what, err)
		}
		if k.cfg.View.Metrics.Repairs != nil {
			k.cfg.View.Metrics.Repairs.Inc()
		}
		lin, found, err = k.cfg.Table.Lineage(ctx)
	}
	if err != nil {
		return err
	}
	switch {
	case !found:
		newest, has, err := k.cfg.Table.NewestRow(ctx)
		if chstore.FaultOf(err) == chstore.Missing {
			return k.refill(ctx, refillPlan{why: "the table of " + what + " is missing", repair: true, lost: true})
		}
		if err != nil {
			return err
		}
		// The table lost its lineage; the one this keeper or its consumer knew, if any, says what
		// the table was.
		last, known, err := k.lastLineage(ctx)
		if err != nil {
			return err
		}
		if !has && (known || info.State.Msgs > 0) {
			return k.refill(ctx, refillPlan{why: fmt.Sprintf("%s is empty while %s holds %d messages", what, k.cfg.View.Stream, info.State.Msgs), lost: known})
		}
		if lin, err = k.adopt(ctx, newest, has, last, known, streamID); err != nil {
			return err
		}
		k.cfg.Log.Info("lineage noted: the table is taken as it is", "table", what, "lineage", lin.ID(), "rows", has, "era", lin.Era, "floor", lin.Floor)
	case !lin.Whole:
		// Another replica's refill, or one that stopped: whether its notes still move decides,
		// watched here (awaitRefill), never its notes' times against this host's clock.
		return k.refill(ctx, refillPlan{why: "a refill of " + what + " is not finished", others: true, resume: lin})
	case lin.Anchor != chstore.RowKey{}:
		held, err := k.cfg.Table.Holds(ctx, lin.Anchor)
		if chstore.FaultOf(err) == chstore.Missing {
			return k.refill(ctx, refillPlan{why: "the table of " + what + " is missing", repair: true, lost: true})
		}
		if err != nil {
			return err
		}
		if !held {
			return k.refill(ctx, refillPlan{why: "the table of " + what + " lost the rows it held (dropped or recreated)", lost: true})
		}
	}
	if lin.Stream != streamID {
		// Its sequences start over: a new era (rank.Pos), so that every row of the stream before
		// still counts in a read as of a sequence of the new one, and anything complete through an
		// old sequence says nothing of the new stream. The rows stay (the old stream is gone;
		// they are all that is left of it).
		if err := k.mayBeginEra(ctx, info.Created, streamID); err != nil {
			return err
		}
		was := lin
		epoch, err := k.cfg.Table.NextEpoch(ctx, k.cfg.Now())
		if err != nil {
			return err
		}
		lin = chstore.Lineage{Epoch: epoch, Stream: streamID, Era: was.EraOf(streamID), Floor: was.Floor, Anchor: lin.Anchor, Whole: true}
		if lin.Anchor == (chstore.RowKey{}) {
			lin.Floor = lin.Era // the table held no row of the stream before
		}
		if err := k.cfg.Table.NoteLineage(ctx, lin); err != nil {
			return err
		}
		k.before.Store(&was)
		k.cfg.Log.Warn("the stream was made again since the table was derived: a new era begins, the rows of the stream before all count, and what was derived before is stale",
			"table", what, "stream", k.cfg.View.Stream, "was", was.Stream, "now", streamID, "era", lin.Era)
	}
	return k.Publish(ctx, lin, "")
}

// mayBeginEra is nil once the era of the stream created then may begin: no batch of the stream
// before may still come (a runtime's pass of it, or what it held, not yet handled), no batch
// waits to commit (it may be of the stream before: a runtime hands a batch over before its pass
// ends), none of another stream is in hand (handed over, not yet waiting for the lock: InHand),
// and no other replica may still commit one. Published earlier, the new era would let a
// read as of it miss that batch, which then commits in the era before. Readers wait meanwhile
// (the lineage names the stream before); the runtime's next pass, on the new stream, has the table
// checked at once (CheckSoon), and so does its first batch (EraOf).
func (k *Keeper[R]) mayBeginEra(ctx context.Context, created time.Time, stream string) error {
	if k.cfg.Consumes != nil && !k.cfg.Consumes(created) || k.waiting.Load() > 0 || k.inHand.besides(created) > 0 {
		return ErrBeforeInHand
	}
	if k.cfg.Replicas != nil {
		return k.cfg.Replicas(ctx, stream)
	}
	return nil
}

// adopt notes a lineage for a table found without one (a store of a Podium before lineages, or
// one whose lineage was lost while its rows survived), taking the table as it is. Eras only grow:
// the rows that survive keep the era they were stored with, and the stream there is now takes an
// era after theirs unless it is theirs (last, the lineage the keeper or its consumer knew, names
// it; or the newest row is this stream's message at its sequence). The floor is the oldest era
// the rows hold.
func (k *Keeper[R]) adopt(ctx context.Context, newest chstore.RowKey, has bool, last chstore.Lineage, known bool, stream string) (chstore.Lineage, error) {
	epoch, err := k.cfg.Table.NextEpoch(ctx, k.cfg.Now())
	if err != nil {
		return chstore.Lineage{}, err
	}
	lin := chstore.Lineage{Epoch: epoch, Stream: stream, Anchor: newest, Whole: true}
	var rs chstore.RowStreams
	if has {
		if rs, err = k.cfg.Table.RowStreams(ctx, newest, stream); err != nil {
			return chstore.Lineage{}, err
		}
	}
	switch {
	case known && last.Stream == stream:
		lin.Era = max(last.Era, newest.Pos.Era)
	case known:
		lin.Era = max(last.Era, newest.Pos.Era) + 1
	case has:
		// Where the rows name their stream, the newest says; else the stream at its sequence.
		of := rs.RowOf
		if !rs.Named {
			if of, err = k.ofStream(ctx, newest); err != nil {
				return chstore.Lineage{}, err // checked again: a doubt must not raise the era
			}
		}
		lin.Era = newest.Pos.Era
		if !of {
			lin.Era++
		}
	}
	if !known {
		least, err := k.eraFloor(ctx)
		if err != nil {
			return chstore.Lineage{}, err
		}
		lin.Era = max(lin.Era, least)
	}
	lin.Floor = lin.Era
	if has {
		oldest, err := k.cfg.Table.OldestEra(ctx)
		if err != nil {
			return chstore.Lineage{}, err
		}
		// Rows that name another stream than this one (a table written before eras were
		// counted: every row era 0, whatever its stream) are of a stream deleted since: this one
		// takes an era after theirs, so that losing them is named (loss.go).
		if rs.Others {
			lin.Era = max(lin.Era, oldest+1)
		}
		lin.Floor = min(oldest, lin.Era)
		if known {
			lin.Floor = min(lin.Floor, last.Floor)
		}
	}
	if err := k.cfg.Table.NoteLineage(ctx, lin); err != nil {
		return chstore.Lineage{}, err
	}
	return lin, nil
}

// ofStream reports whether the stream holds, at the row's sequence, the event the row was stored
// from: false when it holds another there, or nothing (trimmed, or never so long); an error when
// it could not be read.
func (k *Keeper[R]) ofStream(ctx context.Context, row chstore.RowKey) (bool, error) {
	if row.Pos.Seq == 0 {
		return false, nil
	}
	st, err := k.cfg.JS.Stream(ctx, k.cfg.View.Stream)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", k.cfg.View.Stream, err)
	}
	msg, err := st.GetMsg(ctx, row.Pos.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s sequence %d: %w", k.cfg.View.Stream, row.Pos.Seq, err)
	}
	var env events.Envelope
	return json.Unmarshal(msg.Data, &env) == nil && env.ID == row.EventID, nil
}

// Start checks the table before the first commit, trying again with the shared backoff while
// ClickHouse or the stream do not answer; false when stop ended first. work bounds the check.
func (k *Keeper[R]) Start(stop, work context.Context) bool {
	err := retry.Do(stop, retry.Redelivery(), func(try uint64, err error, pause time.Duration) {
		level := slog.LevelWarn
		if errors.Is(err, ErrLossHeld) {
			level = slog.LevelDebug // named when it began; said again on every try would drown the log
		}
		k.cfg.Log.Log(context.Background(), level, "the table is not checked against its stream yet; nothing is committed until it is",
			"table", k.cfg.View.What, "stream", k.cfg.View.Stream, "attempt", try, "retry_in", pause.String(), "error", err)
	}, func(context.Context, uint64) error { return k.Check(work) })
	if err != nil {
		return false
	}
	k.cfg.View.Whole.Holds()
	return true
}

// Watch checks the table every checkEvery, and at once when CheckSoon asks.
func (k *Keeper[R]) Watch(ctx context.Context) {
	if retry.Sleep(ctx, checkEvery) != nil {
		return // the start checked it just now
	}
	retry.EveryOr(ctx, checkEvery, k.recheck, func(ctx context.Context) {
		switch err := k.Check(ctx); {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, ErrBeforeInHand):
			k.cfg.Log.Debug("lineage checked: still waiting", "table", k.cfg.View.What, "error", err)
			time.AfterFunc(beforeEvery, k.CheckSoon)
		case errors.Is(err, ErrLossHeld):
			k.cfg.Log.Debug("lineage checked: still waiting", "table", k.cfg.View.What, "error", err) // named when it began
		default:
			k.cfg.Log.Warn("lineage not checked; trying again", "table", k.cfg.View.What, "error", err)
		}
	})
}
