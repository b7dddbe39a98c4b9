package ranker

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// announcer collects the executions committed batches touched until the announcer goroutine
// takes them, so a burst of batches costs one leaderboard read per execution, not one per batch.
// Each execution remembers the span of the last batch that committed it: its leaderboard.updated
// continues that trace.
type announcer struct {
	mu      sync.Mutex
	pending map[string]trace.SpanContext
	wake    chan struct{}
	closing context.Context // ended by close, to cut the pause between rounds short
	end     context.CancelFunc
	closed  bool
}

func newAnnouncer() *announcer {
	closing, end := context.WithCancel(context.Background())
	return &announcer{pending: map[string]trace.SpanContext{}, wake: make(chan struct{}, 1), closing: closing, end: end}
}

// add marks the executions of recs, committed by the batch whose span is sc.
func (a *announcer) add(sc trace.SpanContext, recs []rank.Record) {
	ids := make(map[string]trace.SpanContext, len(recs))
	for _, rec := range recs {
		ids[rec.ExecutionID] = sc
	}
	a.addIDs(ids)
}

func (a *announcer) addIDs(ids map[string]trace.SpanContext) {
	if len(ids) == 0 {
		return
	}
	a.mu.Lock()
	for id, sc := range ids {
		a.pending[id] = sc
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *announcer) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.end()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// take returns the executions to announce with the span of the batch that committed each, and
// whether more may come.
func (a *announcer) take() (map[string]trace.SpanContext, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := a.pending
	a.pending = map[string]trace.SpanContext{}
	return ids, !a.closed
}

// announce publishes one leaderboard.updated per execution with newly committed evaluations,
// read after the commit, until the announcer is closed and emptied. Rounds are at least
// announceInterval apart: executions committed meanwhile wait and share the next round, so a
// burst of batches costs ClickHouse one leaderboard read per execution per interval rather than
// one per batch, and the inserts keep the server's CPU. An execution whose announcement failed
// goes back to the next round (at least a second later): it is retried until published, or
// superseded by a later board, which the next read returns anyway. While announcements fail the
// "leaderboards" condition fails naming why; LEADERBOARDS deleted is made again (MANAGE_STREAMS)
// once the deletion has settled, a second after the first failure.
func (r *ranker) announce(ctx context.Context, a *announcer) {
	var failingSince time.Time
	for {
		<-a.wake
		ids, open := a.take()
		failed := map[string]trace.SpanContext{}
		if len(ids) > 0 {
			var why error
			var tried bool
			failed, tried, why = r.publishBoards(ctx, ids)
			if tried { // a round that published nothing (a refill, a read that failed) says nothing of LEADERBOARDS
				failingSince = r.noteAnnounced(ctx, why, failingSince)
			}
		}
		if !open {
			if ids, _ := a.take(); len(ids) > 0 {
				more, _, _ := r.publishBoards(ctx, ids)
				maps.Copy(failed, more)
			}
			if len(failed) > 0 {
				r.log.Error("leaderboard.updated not published before stopping", "executions", slices.Sorted(maps.Keys(failed)))
			}
			return
		}
		pause := r.announceInterval
		if len(failed) > 0 {
			a.addIDs(failed)
			pause = max(pause, time.Second)
		}
		if len(ids) > 0 {
			_ = retry.Sleep(a.closing, pause)
		}
	}
}

// noteAnnounced sets the "leaderboards" condition after a round of announcements that failed with
// why (nil: none failed), and makes LEADERBOARDS again when it is missing and has been failing
// since before deletionSettles. It returns since when announcements fail (zero: they do not).
func (r *ranker) noteAnnounced(ctx context.Context, why error, since time.Time) time.Time {
	if why == nil {
		if r.boards.Holds() {
			r.log.Info("leaderboard.updated published again")
		}
		return time.Time{}
	}
	r.boards.Fail("leaderboard.updated cannot be published: %v", why)
	if since.IsZero() {
		return time.Now()
	}
	if r.remakeBoards != nil && time.Since(since) >= deletionSettles {
		made, err := r.remakeBoards(ctx)
		switch {
		case err != nil:
			r.log.Warn("LEADERBOARDS is missing and could not be made again", "error", err)
		case made:
			r.log.Warn("LEADERBOARDS was missing; made it again with its configuration")
		}
	}
	return since
}

// topThatFits is data with the most rows of its board that fit in one message (fits), marked
// truncated, and its body. The rows that fit are found by halving: a board too large is rare,
// and a few marshals of it cost less than a wrong guess.
func topThatFits(data events.LeaderboardUpdated, marshal func(events.LeaderboardUpdated) ([]byte, error), fits func([]byte) error) (events.LeaderboardUpdated, []byte, error) {
	rows := data.Leaderboard
	cut := func(n int) (events.LeaderboardUpdated, []byte, error) {
		c := data
		c.Leaderboard, c.Truncated = rows[:n], &events.BoardTruncation{Teams: len(rows), Shown: n}
		body, err := marshal(c)
		if err == nil {
			err = fits(body)
		}
		return c, body, err
	}
	lo, hi := 0, len(rows) // none of the rows fits (or nothing will); all of them do not
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		_, _, err := cut(mid)
		var tooLarge *events.TooLargeError
		switch {
		case err == nil:
			lo = mid
		case errors.As(err, &tooLarge):
			hi = mid
		default:
			return data, nil, err
		}
	}
	return cut(lo)
}

// deletionSettles is how long a stream must have been missing before it is made again: one made
// again while nats-server still moves the deleted one's files away loses its files.
const deletionSettles = time.Second

// publishBoards announces the executions' current leaderboards and returns those it could not,
// whether it tried to publish at all, and the last reason why one failed (not while the store is
// refilled or cannot be read). Each announcement is a span, child of the batch that committed the
// execution last, and the event carries its context.
func (r *ranker) publishBoards(ctx context.Context, batches map[string]trace.SpanContext) (failed map[string]trace.SpanContext, tried bool, why error) {
	ids := slices.Sorted(maps.Keys(batches))
	failed = map[string]trace.SpanContext{}
	// No board is read from a store being refilled (lineage.go): the executions wait for the
	// next round. The snapshots name the lineage their rows were read from.
	if !r.boardsMu.TryRLock() {
		return batches, false, nil
	}
	lin := r.keep.Published()
	// Read after the ack floor: every evaluation up to it is committed, so the rows read next
	// hold all of them, and the snapshots written of them are complete through it.
	d := rank.Derivation{Through: r.committedThrough(ctx)}
	if lin != nil {
		d.Lineage = lin.ID()
	}
	start := time.Now()
	read := r.store.Scores
	if lin != nil && lin.Anchor != (chstore.RowKey{}) {
		// In the same query as the anchor row: a table emptied under the ranker (TRUNCATE) is
		// found by the first read after it, not announced nor snapshotted short (chstore/anchored.go).
		read = r.store.Anchored(lin.Anchor).Scores
	}
	evs, err := read(ctx, ids)
	r.boardsMu.RUnlock()
	r.m.leaderboardQuery.Observe(time.Since(start).Seconds())
	if errors.Is(err, chstore.ErrAnchorLost) {
		if r.keep.Loss() != nil {
			return batches, false, nil // named, and waited on by the store's watch (loss.go)
		}
		r.log.Warn("the evaluations table lost the rows it held; checking the store, which refills it, before anything is announced", "error", err)
		if err := r.keep.Check(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, sink.ErrLossHeld) {
			r.log.Warn("store lineage not checked; the watch tries again", "error", err)
		}
		return batches, false, nil
	}
	if err != nil {
		r.m.clickhouseErrors.WithLabelValues("query").Inc()
		r.log.Warn("leaderboard read for leaderboard.updated failed; will retry", "executions", len(ids), "error", err)
		return batches, false, nil // ClickHouse's: the clickhouse conditions say it
	}
	for _, id := range ids {
		// The snapshot first: a request that the announcement prompts then finds it.
		r.putSnapshot(ctx, id, evs[id], d)
		b := evs[id].Reduce(rank.Everything()).Leaderboard(events.Desc)
		sctx, span := r.trace.Start(trace.ContextWithSpanContext(ctx, batches[id]), "ranker.announce", trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(attribute.String("podium.execution_id", id), attribute.Int64("podium.evaluations_seq", int64(b.Seq))))
		data := events.LeaderboardUpdated{ExecutionID: id, Leaderboard: b.Rows, EvaluationsSeq: b.Seq, EvaluationsEra: b.Era}
		evID := events.DerivedID("leaderboard", id, positionKey(b.Pos))
		tc := r.trace.Inject(sctx)
		subject := events.LeaderboardSubject(id)
		at := r.now()
		marshal := func(data events.LeaderboardUpdated) ([]byte, error) {
			return events.MarshalTraced(evID, r.source, events.TypeLeaderboardUpdated, at, data, tc)
		}
		body, err := marshal(data)
		var tooLarge *events.TooLargeError
		if err == nil {
			if err = events.Fits(r.js, subject, evID, body, tc); errors.As(err, &tooLarge) {
				// The whole board can never be published: its top rows are, saying what was
				// cut, so the last announcement of the execution is never a stale board that
				// looks whole. The API serves the whole board (docs/reliability.md#limits).
				r.m.announcements.WithLabelValues("too_large").Inc()
				data, body, err = topThatFits(data, marshal, func(b []byte) error { return events.Fits(r.js, subject, evID, b, tc) })
				r.log.ErrorContext(sctx, "leaderboard.updated of the whole board is over the server's max payload; its top rows are announced, marked truncated (GET /v1/executions/{id}/leaderboard serves it whole)",
					"execution_id", id, "teams", len(b.Rows), "shown", len(data.Leaderboard), "bytes", tooLarge.Size, "limit", tooLarge.Limit)
			}
		}
		if err == nil {
			_, err = events.PublishTraced(sctx, r.js, subject, evID, body, tc)
		}
		tracing.End(span, err)
		if err != nil {
			r.m.announcements.WithLabelValues("failed").Inc()
			r.log.WarnContext(sctx, "leaderboard.updated not published; will retry", "execution_id", id, "error", err)
			failed[id], why = batches[id], err
			continue
		}
		r.m.leaderboardsSent.Inc()
	}
	return failed, true, why
}

// positionKey names a board's position in its event id: the sequence alone in era 0 (as before
// eras), else era and sequence, so a board of a new era at a sequence an older one reached is
// another event, not a duplicate.
func positionKey(p rank.Pos) string {
	if p.Era == 0 {
		return strconv.FormatUint(p.Seq, 10)
	}
	return strconv.FormatUint(uint64(p.Era), 10) + "-" + strconv.FormatUint(p.Seq, 10)
}
