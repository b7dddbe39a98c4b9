package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/refill"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// The store is a view of the EVALUATIONS stream, and the ranker keeps it whole (internal/chstore/lineage.go
// says what a lineage is). At start, every checkEvery, and whenever an insert finds the table
// missing, it compares the store's lineage with the stream:
//   - no lineage (a new database, or a store of a Podium before lineages): an empty table while
//     the stream holds evaluations is refilled; a table with rows is adopted as it is;
//   - a refill that did not finish, or an anchor row the table no longer holds (dropped or
//     recreated): refilled;
//   - another stream than the lineage names (deleted and made again, its sequences starting
//     over): the rows are kept (the old stream is gone) and a new lineage is noted.
//
// A refill holds every commit (no ack moves the ack floor), turns /readyz 503 naming the reason,
// and publishes events.MetaStoreRefilling on the ranker's consumer before it touches the table,
// so composers' commit probes make requests wait as for a commit. It writes what the stream
// holds, then notes the new lineage whole and publishes its ID: snapshots of any other lineage
// are stale from then on. A fault during a refill (ClickHouse down, the table dropped again) is
// retried with the shared backoff for as long as it lasts, unready meanwhile.

// checkEvery is how often the ranker checks its store's lineage: the longest a table dropped
// while no evaluation arrives goes unnoticed.
const checkEvery = 5 * time.Second

// checkStore checks the store's lineage against the stream and refills the store when it is not
// whole. A store found as published (the usual case) costs commits nothing; any other is checked
// again with commits held.
func (r *ranker) checkStore(ctx context.Context) error {
	if r.loss.Load() == nil && r.asPublished(ctx) {
		return nil
	}
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	err := r.checkStoreLocked(ctx)
	if err == nil {
		r.lossResolved(ctx)
	}
	return err
}

// asPublished reports whether the store is whole, of the stream, and of the lineage the ranker
// published; false on any doubt (an error included).
func (r *ranker) asPublished(ctx context.Context) bool {
	pub := r.lineage.Load()
	if pub == nil || r.refilling.Load() != nil {
		return false
	}
	info, err := r.evaluationsInfo(ctx)
	if err != nil {
		return false
	}
	lin, found, err := r.store.Lineage(ctx)
	if err != nil || !found || !lin.Whole || lin.ID() != pub.ID() || lin.Stream != chstore.StreamID(info.Created) {
		return false
	}
	if lin.Anchor != (chstore.RowKey{}) {
		if held, err := r.store.Holds(ctx, lin.Anchor); err != nil || !held {
			return false
		}
	}
	if r.hooks.beforeRepublish != nil {
		r.hooks.beforeRepublish()
	}
	// Whole: the consumer's metadata says so too (a consumer made again may carry an older
	// state). Only while pub is still the lineage published: a refill or a check that published a
	// newer one meanwhile is not undone by this check's older view.
	r.publishMu.Lock()
	defer r.publishMu.Unlock()
	if r.lineage.Load() != pub {
		return false // published anew meanwhile: checked again, with commits held
	}
	return r.publishLocked(ctx, *pub, "") == nil
}

// checkStoreLocked is checkStore with commits held.
func (r *ranker) checkStoreLocked(ctx context.Context) error {
	info, err := r.evaluationsInfo(ctx)
	if err != nil {
		return err
	}
	streamID := chstore.StreamID(info.Created)
	lin, found, err := r.store.Lineage(ctx)
	if chstore.FaultOf(err) == chstore.Missing {
		return r.refill(ctx, refillPlan{why: "the store's tables are missing", repair: true, lost: true})
	}
	if err != nil {
		return err
	}
	switch {
	case !found:
		newest, has, err := r.store.NewestRow(ctx)
		if chstore.FaultOf(err) == chstore.Missing {
			return r.refill(ctx, refillPlan{why: "the evaluations table is missing", repair: true, lost: true})
		}
		if err != nil {
			return err
		}
		// The store lost its lineage; the one this ranker or its consumer knew, if any, says
		// what the table was.
		last, known, err := r.lastLineage(ctx)
		if err != nil {
			return err
		}
		if !has && (known || info.State.Msgs > 0) {
			return r.refill(ctx, refillPlan{why: fmt.Sprintf("the store is empty while %s holds %d messages", events.StreamEvaluations, info.State.Msgs), lost: known})
		}
		if lin, err = r.adopt(ctx, newest, has, last, known, streamID); err != nil {
			return err
		}
		r.log.Info("store lineage noted: the table is taken as it is", "lineage", lin.ID(), "rows", has, "era", lin.Era, "floor", lin.Floor)
	case !lin.Whole:
		// Another ranker's refill, or one that stopped: whether its notes still move decides,
		// watched here (awaitRefill), never its notes' times against this host's clock.
		return r.refill(ctx, refillPlan{why: "a refill of the store is not finished", others: true, resume: lin})
	case lin.Anchor != chstore.RowKey{}:
		held, err := r.store.Holds(ctx, lin.Anchor)
		if chstore.FaultOf(err) == chstore.Missing {
			return r.refill(ctx, refillPlan{why: "the evaluations table is missing", repair: true, lost: true})
		}
		if err != nil {
			return err
		}
		if !held {
			return r.refill(ctx, refillPlan{why: "the evaluations table lost the rows it held (dropped or recreated)", lost: true})
		}
	}
	if lin.Stream != streamID {
		// Its sequences start over: a new era (rank.Pos), so that every row of the stream before
		// still counts in a prompt composed as of a sequence of the new one, and a snapshot
		// complete through an old sequence says nothing of the new stream. The rows stay (the old
		// stream is gone; they are all that is left of it).
		//
		// Not while a batch of the stream before may still come (the runtime's pass of it, or
		// what it held, not yet handled): published now, the new era would let a request compose
		// as of it without that batch, which then commits in the era before and the record no
		// longer verifies; nor while a batch waits to commit (it may be of the stream before:
		// the runtime hands a batch over before its pass ends). Requests wait meanwhile (the
		// lineage names the stream before); the runtime's next pass, on the new stream, has the
		// store checked at once (Remade), and so does its first batch (eraOf).
		if r.consumes != nil && !r.consumes(info.Created) || r.waiting.Load() > 0 {
			return errBeforeInHand
		}
		// Nor while another ranker replica may still commit one (passes.go).
		if err := r.replicasInTheWay(ctx, streamID); err != nil {
			return err
		}
		was := lin
		epoch, err := r.store.NextEpoch(ctx, r.now())
		if err != nil {
			return err
		}
		lin = chstore.Lineage{Epoch: epoch, Stream: streamID, Era: was.EraOf(streamID), Floor: was.Floor, Anchor: lin.Anchor, Whole: true}
		if lin.Anchor == (chstore.RowKey{}) {
			lin.Floor = lin.Era // the table held no row of the stream before
		}
		if err := r.store.NoteLineage(ctx, lin); err != nil {
			return err
		}
		r.before.Store(&was)
		r.log.Warn("the EVALUATIONS stream was made again since the store was derived: a new era begins, the evaluations of the stream before all count, and older snapshots are stale",
			"was", was.Stream, "now", streamID, "era", lin.Era)
	}
	return r.publishLineage(ctx, lin, "")
}

// adopt notes a lineage for a table found without one (a store of a Podium before lineages, or
// one whose store_lineage was lost while its rows survived), taking the table as it is. Eras only
// grow: the rows that survive keep the era they were stored with, and the stream there is now
// takes an era after theirs unless it is theirs (last, the lineage the ranker or its consumer
// knew, names it; or the newest row is this stream's message at its sequence). The floor is the
// oldest era the rows hold.
func (r *ranker) adopt(ctx context.Context, newest chstore.RowKey, has bool, last chstore.Lineage, known bool, stream string) (chstore.Lineage, error) {
	epoch, err := r.store.NextEpoch(ctx, r.now())
	if err != nil {
		return chstore.Lineage{}, err
	}
	lin := chstore.Lineage{Epoch: epoch, Stream: stream, Anchor: newest, Whole: true}
	switch {
	case known && last.Stream == stream:
		lin.Era = max(last.Era, newest.Pos.Era)
	case known:
		lin.Era = max(last.Era, newest.Pos.Era) + 1
	case has:
		of, err := r.ofStream(ctx, newest)
		if err != nil {
			return chstore.Lineage{}, err // checked again: a doubt must not raise the era
		}
		lin.Era = newest.Pos.Era
		if !of {
			lin.Era++
		}
	}
	lin.Floor = lin.Era
	if has {
		oldest, err := r.store.OldestEra(ctx)
		if err != nil {
			return chstore.Lineage{}, err
		}
		lin.Floor = min(oldest, lin.Era)
		if known {
			lin.Floor = min(lin.Floor, last.Floor)
		}
	}
	if err := r.store.NoteLineage(ctx, lin); err != nil {
		return chstore.Lineage{}, err
	}
	return lin, nil
}

// ofStream reports whether EVALUATIONS holds, at the row's sequence, the evaluation the row was
// stored from: false when it holds another there, or nothing (trimmed, or never so long); an
// error when it could not be read.
func (r *ranker) ofStream(ctx context.Context, k chstore.RowKey) (bool, error) {
	if k.Pos.Seq == 0 {
		return false, nil
	}
	st, err := r.js.Stream(ctx, events.StreamEvaluations)
	if err != nil {
		return false, fmt.Errorf("stream %s: %w", events.StreamEvaluations, err)
	}
	msg, err := st.GetMsg(ctx, k.Pos.Seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s sequence %d: %w", events.StreamEvaluations, k.Pos.Seq, err)
	}
	var env events.Envelope
	return json.Unmarshal(msg.Data, &env) == nil && env.ID == k.EventID, nil
}

// errBeforeInHand is an era switch put off while batches of the stream before may still come.
var errBeforeInHand = errors.New("the EVALUATIONS stream was made again, and batches of the one before may still be committed: its era begins once the ranker consumes the new stream")

// eraOf is the era of the stream a batch was consumed from (consume.StreamOf; a batch whose
// stream is not known has none, and is given back), with commits held: the published lineage's when it names that stream. A batch of a stream made again since
// the lineage was noted has the store checked first, which notes the new stream's lineage with the
// next era; one of the stream before (consumed before the delete, committed after) keeps that
// stream's era.
func (r *ranker) eraOf(ctx context.Context, msgs []jetstream.Msg) (uint32, error) {
	created := consume.StreamOf(msgs[0])
	if created.IsZero() {
		// The runtime could not read which stream delivered it. Taking the stream as it is now
		// would give a batch of a stream deleted since the era of the new one: given back, read
		// again with its stream known.
		return 0, errors.New("the EVALUATIONS stream the batch was consumed from is not known")
	}
	stream := chstore.StreamID(created)
	for checked := false; ; checked = true {
		if lin := r.lineage.Load(); lin != nil && lin.Stream == stream {
			return lin.Era, nil
		}
		if was := r.before.Load(); was != nil && was.Stream == stream {
			return was.Era, nil
		}
		if checked {
			return 0, fmt.Errorf("the batch is of an EVALUATIONS stream (%s) that the store's lineage does not name", stream)
		}
		if err := r.checkStoreLocked(ctx); err != nil {
			return 0, err
		}
	}
}

// refillReason says why a refill runs; empty when none does.
func (r *ranker) refillReason() string {
	if why := r.refilling.Load(); why != nil {
		return *why
	}
	return ""
}

// evaluationsInfo reads the EVALUATIONS stream's identity and state.
func (r *ranker) evaluationsInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	st, err := r.js.Stream(ctx, events.StreamEvaluations)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", events.StreamEvaluations, err)
	}
	return st.CachedInfo(), nil
}

// Rankers share the store. One refills it at a time: a refill notes its lineage again every
// refillBeat; a ranker that finds the newest lineage unfinished waits for it (holding its own
// commits, unready) instead of refilling too, and takes the refill over once it has seen its
// notes stand still for refillStale, on its own clock: no decision compares two hosts' clocks.
// Two that start together both note a lineage; the one whose epoch is not the newest (epochs
// are ordered by the store: chstore.NextEpoch) yields at its next note.
const (
	refillBeat = 2 * time.Second
	// refillStale covers the RefillGrace a refill waits before its first note, and a slow
	// insert between two notes; taking a live refill over is harmless (rows are idempotent, and
	// the later epoch wins), just work done twice.
	refillStale = 15 * time.Second
)

// refillStale is how long another ranker's refill may go without a note before it is taken over
// (staleAfter, where a test set one).
func (r *ranker) refillStale() time.Duration {
	if r.staleAfter > 0 {
		return r.staleAfter
	}
	return refillStale
}

// refillGrace is how long a refill waits between publishing that it runs and touching the table
// (chstore.RefillGrace; grace, where a test set one).
func (r *ranker) refillGrace() time.Duration {
	if r.grace > 0 {
		return r.grace
	}
	return chstore.RefillGrace
}

// errYielded is a refill that found another ranker's newer one running.
var errYielded = errors.New("another ranker refills the store")

// refillPlan is how a refill starts.
type refillPlan struct {
	why string
	// repair recreates the tables first; others waits for another ranker's refill first; lost is
	// a table found lost, which may have held rows no stream holds any more (loss.go).
	repair, others, lost bool
	// resume is a refill that stopped and may go on after its Through (zero: from the start).
	resume chstore.Lineage
}

// newView is how the ranker refills its store (internal/sink: the condition, the backoff, the
// metrics).
func newView(m *metrics, whole *health.Condition, log *slog.Logger) *sink.View {
	return &sink.View{What: "the store", Stream: events.StreamEvaluations, Whole: whole, Log: log,
		Begin:   "refilling the store from EVALUATIONS; unready until it is whole",
		Done:    "store refilled from EVALUATIONS; ready",
		Metrics: sink.ViewMetrics{Refills: m.refills, Refilling: m.refilling, Errors: m.clickhouseErrors}}
}

// refill makes the store whole from the stream (see the top of this file), tried with r.view
// (internal/sink: the condition, the backoff, the metrics). Commits are held by the caller. It
// returns only once the store is whole, or with ctx's error.
func (r *ranker) refill(ctx context.Context, plan refillPlan) error {
	// A lost table is refilled only when nothing was lost with it, or an operator accepted what
	// was: from then on the store holds its own stream's rows only (its floor is its era).
	fresh := false
	if plan.lost {
		info, err := r.evaluationsInfo(ctx)
		if err != nil {
			return err
		}
		accepted, err := r.checkLoss(ctx, chstore.StreamID(info.Created))
		if err != nil {
			return err
		}
		// Only an accepted loss starts the floor anew: a table that lost nothing (its anchor
		// held, or no era before its stream's) keeps whatever older rows it holds.
		if fresh = accepted; fresh {
			plan.why = "an operator accepted the loss; " + plan.why
		}
	}
	r.boardsMu.Lock()
	defer r.boardsMu.Unlock()
	r.refilling.Store(&plan.why)
	defer r.refilling.Store(nil)
	repair, others := plan.repair, plan.others
	return r.view.Refill(ctx, plan.why, func(ctx context.Context, _ uint64) (sink.Tried, error) {
		if others {
			if err := r.awaitRefill(ctx); err == nil || ctx.Err() != nil {
				return sink.Tried{Adopted: true}, ctx.Err()
			}
			r.log.Warn("the other ranker's refill stopped; taking it over")
			if l, found, err := r.store.Lineage(ctx); err == nil && found && !l.Whole {
				plan.resume = l // its progress as it last noted it
			}
		}
		res, lin, err := r.refillSteps(ctx, plan.why, repair, fresh, plan.resume)
		if err == nil {
			return sink.Tried{Attrs: []any{"lineage", lin.ID(), "messages", res.Read, "written", res.Written, "refused", res.Refused, "invalid", res.Invalid}}, nil
		}
		if others = errors.Is(err, errYielded); others {
			return sink.Tried{}, fmt.Errorf("%w: %v", sink.ErrAgain, err)
		}
		// The table may be gone again (start over, repairing), or ClickHouse or the stream away
		// (go on from what was noted).
		repair = repair || errors.Is(err, sink.ErrTableLost)
		if plan.resume = lin; repair {
			plan.resume = chstore.Lineage{}
		}
		return sink.Tried{}, err
	})
}

// awaitRefill waits until another ranker's refill is done (nil), or its notes have stood still
// for refillStale as this ranker watches them (an error). Only whether a note changed is read,
// never when it was noted: the noter's clock may be anything.
func (r *ranker) awaitRefill(ctx context.Context) error {
	var seen chstore.Lineage
	still := time.Now() // when the note seen last was first seen (this host's monotonic clock)
	for {
		lin, found, err := r.store.Lineage(ctx)
		switch {
		case err != nil:
			r.log.Warn("store lineage not read while another ranker refills the store", "error", err)
		case found && lin.Whole:
			r.lineage.Store(&lin)
			return nil
		case !found:
			return errors.New("the refill's lineage is gone")
		case lin != seen:
			seen, still = lin, time.Now()
		case time.Since(still) > r.refillStale():
			return errors.New("the refill stopped noting its progress")
		}
		if retry.Sleep(ctx, min(refillBeat/2, r.refillStale())) != nil {
			return ctx.Err()
		}
	}
}

// refillSteps is one try of refill: what it wrote, and the lineage it noted last. It goes on from
// resume where that is of the same stream and the table holds its anchor; else from the start.
// fresh is the refill of a table whose loss an operator accepted: its lineage holds its own era's
// rows only.
func (r *ranker) refillSteps(ctx context.Context, why string, repair, fresh bool, resume chstore.Lineage) (res refill.Result, lin chstore.Lineage, err error) {
	info, err := r.evaluationsInfo(ctx)
	if err != nil {
		return res, lin, err
	}
	epoch, err := r.store.NextEpoch(ctx, r.now())
	if err != nil {
		return res, lin, errorOf(err)
	}
	lin = chstore.Lineage{Epoch: epoch, Stream: chstore.StreamID(info.Created)}
	// Eras only grow: the newest lineage known (the store's, or, when the store lost it, the one
	// published) names the era this stream's rows take.
	prev, known, err := r.lastLineage(ctx)
	if err != nil {
		return res, lin, err
	}
	if known {
		lin.Era, lin.Floor = prev.EraOf(lin.Stream), min(prev.Floor, prev.EraOf(lin.Stream))
		if prev.Stream != lin.Stream {
			r.before.Store(&prev) // a batch of the stream before, committed after, keeps its era
		}
	}
	if fresh || !known {
		lin.Floor = lin.Era
	}
	after := info.State.FirstSeq
	if after > 0 {
		after-- // a stream that never held a message says 0
	}
	if !repair && r.resumable(ctx, resume, lin.Stream) {
		lin, after = resume, resume.Through
		r.log.Info("the store refill goes on from where it stopped", "lineage", lin.ID(), "after", after)
	}
	lin.Whole, lin.Noted = false, time.Time{}
	// Composers hear of it before the table changes: from now on they wait, and a read that one
	// started on an older probe has started before the table changes (chstore.RefillGrace).
	if err := r.publishLineage(ctx, lin, why); err != nil {
		return res, lin, err
	}
	if retry.Sleep(ctx, r.refillGrace()) != nil {
		return res, lin, ctx.Err()
	}
	if repair {
		if err := r.repair(ctx); err != nil {
			return res, lin, fmt.Errorf("recreate the tables: %w", err)
		}
		r.m.clickhouseRepairs.Inc()
	}
	beat := func(ctx context.Context) error {
		if err := r.store.NoteLineage(ctx, lin); err != nil {
			return errorOf(err)
		}
		if newest, found, err := r.store.Lineage(ctx); err == nil && found && newest.Epoch > lin.Epoch {
			return errYielded
		}
		// Again: a consumer made again meanwhile may carry an older state.
		return r.publishLineage(ctx, lin, why)
	}
	if err := beat(ctx); err != nil {
		return res, lin, err
	}
	last := time.Now()
	res, err = refill.Run(ctx, refill.Options{JS: r.js, MaxEventBytes: r.maxBytes, Era: lin.Era, Batch: max(r.batchSize, 1000), BatchBytes: r.batchBytes,
		Written: func(ctx context.Context, seq uint64, stored chstore.RowKey) error {
			if stored != (chstore.RowKey{}) {
				lin.Anchor, lin.Through = stored, seq // the progress the next note records
			}
			if time.Since(last) < refillBeat {
				return nil
			}
			last = time.Now()
			return beat(ctx)
		}}, after, r.writeRows)
	if err != nil {
		return res, lin, err
	}
	if res.Refused > 0 {
		r.log.Warn("the refill skipped evaluations the table refuses (they were dead-lettered when they came)", "count", res.Refused)
	}
	r.warnTrimmed(ctx)
	lin.Whole = true
	if res.Last != (chstore.RowKey{}) {
		lin.Anchor = res.Last
	}
	if lin.Anchor == (chstore.RowKey{}) {
		// Nothing was stored (the stream held only invalid events): any row the table holds.
		if lin.Anchor, _, err = r.store.NewestRow(ctx); err != nil {
			return res, lin, errorOf(err)
		}
	}
	if err := r.store.NoteLineage(ctx, lin); err != nil {
		return res, lin, errorOf(err)
	}
	return res, lin, r.publishLineage(ctx, lin, "")
}

// resumable reports whether a refill that stopped may go on after its Through: of this stream,
// with progress noted, and its last stored row still in the table.
func (r *ranker) resumable(ctx context.Context, l chstore.Lineage, stream string) bool {
	if l.Epoch == 0 || l.Through == 0 || l.Stream != stream || l.Anchor == (chstore.RowKey{}) {
		return false
	}
	held, err := r.store.Holds(ctx, l.Anchor)
	return err == nil && held
}

// errorOf marks a missing table as sink.ErrTableLost.
func errorOf(err error) error {
	if chstore.FaultOf(err) == chstore.Missing {
		return fmt.Errorf("%w: %v", sink.ErrTableLost, err)
	}
	return err
}

// publishLineage tells composers, through the ranker consumer's metadata, the store's lineage and
// whether a refill runs (why, or empty). The consumer's metadata is compared first: an unchanged
// state costs one lookup.
func (r *ranker) publishLineage(ctx context.Context, lin chstore.Lineage, refilling string) error {
	r.publishMu.Lock()
	defer r.publishMu.Unlock()
	return r.publishLocked(ctx, lin, refilling)
}

// publishLocked is publishLineage with publishMu held.
func (r *ranker) publishLocked(ctx context.Context, lin chstore.Lineage, refilling string) error {
	md := map[string]string{events.MetaStoreLineage: lin.ID(), events.MetaStoreEra: strconv.FormatUint(uint64(lin.Era), 10),
		events.MetaStoreFloor: strconv.FormatUint(uint64(lin.Floor), 10)}
	if lin.Anchor != (chstore.RowKey{}) {
		md[events.MetaStoreAnchor] = lin.Anchor.String()
	}
	if refilling != "" {
		md[events.MetaStoreRefilling] = refilling
	}
	if l := r.loss.Load(); l != nil {
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		md[events.MetaStoreLoss] = string(b)
	}
	if r.runtime != nil {
		if err := r.runtime.SetMetadata(ctx, md); err != nil {
			return fmt.Errorf("publish the store lineage on the ranker consumer: %w", err)
		}
	}
	r.lineage.Store(&lin)
	return nil
}

// anchorAfter gives a lineage without an anchor (noted while the table was empty) the first row
// a commit stored, so that losing the table from then on is seen.
func (r *ranker) anchorAfter(ctx context.Context, recs []rank.Record) {
	lin := r.lineage.Load()
	if lin == nil || lin.Anchor != (chstore.RowKey{}) || len(recs) == 0 {
		return
	}
	next := *lin
	next.Anchor = chstore.KeyOf(recs[0])
	if err := r.store.NoteLineage(ctx, next); err != nil {
		r.log.Warn("store lineage anchor not noted; the next commit tries again", "error", err)
		return
	}
	// Composers anchor their reads on it (chstore/anchored.go).
	if err := r.publishLineage(ctx, next, ""); err != nil {
		r.log.Warn("store lineage anchor not published; the next check publishes it", "error", err)
	}
}

// startCheck checks the store before the first commit, trying again with the shared backoff
// while ClickHouse or the stream do not answer; false when stop ended first.
func (r *ranker) startCheck(stop, work context.Context) bool {
	err := retry.Do(stop, retry.Redelivery(), func(try uint64, err error, pause time.Duration) {
		level := slog.LevelWarn
		if errors.Is(err, errLossHeld) {
			level = slog.LevelDebug // named when it began; said again on every try would drown the log
		}
		r.log.Log(context.Background(), level, "store not checked against EVALUATIONS yet; nothing is committed until it is", "attempt", try, "retry_in", pause.String(), "error", err)
	}, func(context.Context, uint64) error { return r.checkStore(work) })
	if err != nil {
		return false
	}
	r.whole.Holds()
	return true
}

// watchStore checks the store every checkEvery (see the top of this file).
func (r *ranker) watchStore(ctx context.Context) {
	if retry.Sleep(ctx, checkEvery) != nil {
		return // the start checked it just now
	}
	retry.EveryOr(ctx, checkEvery, r.recheck, func(ctx context.Context) {
		switch err := r.checkStore(ctx); {
		case err == nil || ctx.Err() != nil:
		case errors.Is(err, errBeforeInHand):
			r.log.Debug("store lineage checked: still waiting", "error", err)
			time.AfterFunc(passEvery, r.checkSoon) // what it waits for is noted every passEvery
		case errors.Is(err, errLossHeld):
			r.log.Debug("store lineage checked: still waiting", "error", err) // named when it began
		default:
			r.log.Warn("store lineage not checked; trying again", "error", err)
		}
	})
}

// checkSoon has the store checked now rather than at the next checkEvery: the consumer was made
// again, perhaps on a stream made again (a new era, which requests wait for).
func (r *ranker) checkSoon() {
	select {
	case r.recheck <- struct{}{}:
	default: // one is due already
	}
}

// warnTrimmed says, after a refill, when EVALUATIONS no longer holds its first evaluations
// (EVALUATIONS_MAX_AGE or _MAX_BYTES trimmed it): the refilled store has what the stream kept, so
// the leaderboards of the executions trimmed away are short of them.
func (r *ranker) warnTrimmed(ctx context.Context) {
	st, err := r.js.Stream(ctx, events.StreamEvaluations)
	if err != nil {
		return
	}
	if first := st.CachedInfo().State.FirstSeq; first > 1 {
		r.log.Warn("EVALUATIONS was trimmed by its retention: the refilled store lacks the evaluations before the stream's first sequence; restore the table from a backup to have them back",
			"first_seq", first, "max_age", st.CachedInfo().Config.MaxAge.String(), "max_bytes", st.CachedInfo().Config.MaxBytes)
	}
}
