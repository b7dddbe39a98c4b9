package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// store is what the ranker needs of ClickHouse.
type store interface {
	Insert(ctx context.Context, recs []rank.Record) error
	Leaderboards(ctx context.Context, executionIDs []string, order events.ScoreOrder, b rank.Bound) (map[string]rank.Board, error)
	Leaderboard(ctx context.Context, executionID string, order events.ScoreOrder, b rank.Bound) (rank.Board, error)
	History(ctx context.Context, executionID, teamID string, b rank.Bound) ([]events.TeamRound, error)
	Ping(ctx context.Context) error
}

var _ store = (*rank.Store)(nil)

// ranker turns batches of evaluation.completed messages into ClickHouse rows, acks them only
// once the rows are committed, and announces the new leaderboards.
type ranker struct {
	log           *slog.Logger
	js            jetstream.JetStream
	settler       *settle.Settler
	store         store
	m             *metrics
	source        string
	maxBytes      int
	batchSize     int
	flushInterval time.Duration
	// announceInterval is the least time between two rounds of leaderboard.updated.
	announceInterval time.Duration
	now              func() time.Time

	insertFails atomic.Bool // set while a batch is waiting for ClickHouse to come back
}

// consume reads batches until stop is done, then drains what the client already holds and
// returns once every batch is committed and announced. Work in hand is finished under work, which
// outlives stop by the shutdown timeout.
//
// Three stages overlap: this loop fills and validates batch n+1 while the committer inserts and
// acks batch n, and the announcer publishes leaderboard.updated for what was committed, so the
// ClickHouse insert is the only step on the critical path.
func (r *ranker) consume(stop, work context.Context, cons jetstream.Consumer, consuming func(bool)) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(r.batchSize))
	if err != nil {
		return fmt.Errorf("ranker: consume: %w", err)
	}
	defer it.Stop()
	consuming(true)
	defer consuming(false)

	ann := newAnnouncer()
	announced := make(chan struct{})
	go func() { defer close(announced); r.announce(work, ann) }()
	batches := make(chan batch, 1)
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		for b := range batches {
			if r.commit(work, b) {
				ann.add(b.recs)
			}
		}
	}()
	defer func() {
		close(batches)
		<-committed
		ann.close()
		<-announced
	}()

	draining := false
	for {
		var first jetstream.Msg
		if draining {
			first, err = it.Next(jetstream.NextMaxWait(r.flushInterval))
		} else {
			first, err = it.Next(jetstream.NextContext(stop))
		}
		switch {
		case err == nil:
		case errors.Is(err, jetstream.ErrMsgIteratorClosed) || draining && errors.Is(err, nats.ErrTimeout):
			return nil
		case stop.Err() != nil:
			// Stop pulling; what the server already sent us is still ours to finish.
			it.Drain()
			draining = true
			continue
		case errors.Is(err, nats.ErrTimeout):
			continue
		default:
			r.log.Warn("fetch failed", "error", err)
			continue
		}
		batches <- r.parse(work, r.fill(stop, it, first, draining))
	}
}

// fill gathers a batch after its first message until it is full or the flush interval passed.
// A stop cuts the wait short, so shutdown flushes what is in hand at once.
func (r *ranker) fill(stop context.Context, it jetstream.MessagesContext, first jetstream.Msg, draining bool) []jetstream.Msg {
	batch := []jetstream.Msg{first}
	ctx, cancel := context.WithTimeout(stop, r.flushInterval)
	defer cancel()
	for len(batch) < r.batchSize {
		var msg jetstream.Msg
		var err error
		if draining {
			msg, err = it.Next(jetstream.NextMaxWait(10 * time.Millisecond))
		} else {
			msg, err = it.Next(jetstream.NextContext(ctx))
		}
		if err != nil {
			break
		}
		batch = append(batch, msg)
	}
	return batch
}

// batch is a parsed batch: the rows to write and the messages to ack once they are written.
type batch struct {
	recs []rank.Record
	keep []jetstream.Msg
}

// parse reads a batch; invalid events go to the settler as poison at once, and repeats of an
// id within the batch are acked with it but written once.
func (r *ranker) parse(ctx context.Context, msgs []jetstream.Msg) batch {
	b := batch{recs: make([]rank.Record, 0, len(msgs)), keep: make([]jetstream.Msg, 0, len(msgs))}
	seen := make(map[string]bool, len(msgs))
	for _, msg := range msgs {
		md, err := msg.Metadata()
		if err != nil {
			r.settler.Settle(ctx, msg, settle.Reject("message without JetStream metadata: "+err.Error()))
			continue
		}
		ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), r.maxBytes)
		if err != nil {
			r.m.events.WithLabelValues("dead_lettered").Inc()
			r.settler.Settle(ctx, msg, settle.Reject(err.Error()))
			continue
		}
		b.keep = append(b.keep, msg)
		if seen[ev.ID] {
			r.m.events.WithLabelValues("duplicate").Inc()
			continue
		}
		seen[ev.ID] = true
		b.recs = append(b.recs, rank.Record{EventID: ev.ID, Source: ev.Source, Seq: md.Sequence.Stream, EvaluationCompleted: ev.Data})
	}
	return b
}

// commit writes a batch and acks its messages only after ClickHouse has the rows. It returns
// false when the batch was given back for redelivery instead.
func (r *ranker) commit(ctx context.Context, b batch) bool {
	if len(b.recs) > 0 {
		if err := r.insert(ctx, b.recs, b.keep); err != nil {
			r.log.Warn("gave up a batch at shutdown; it will be redelivered", "rows", len(b.recs))
			for _, msg := range b.keep {
				r.settler.Settle(ctx, msg, settle.RetryLater(err))
			}
			return false
		}
	}
	// The rows are stored; a redelivery of an ack that is lost is harmless: writes are idempotent.
	for _, msg := range b.keep {
		r.settler.Settle(ctx, msg, settle.Ack())
	}
	r.m.events.WithLabelValues("stored").Add(float64(len(b.recs)))
	return true
}

// insert writes recs, retrying with the shared backoff while ClickHouse is unavailable. The
// messages are kept in progress meanwhile so the broker does not hand them to another replica.
// It returns ctx's error when ctx ends first.
func (r *ranker) insert(ctx context.Context, recs []rank.Record, msgs []jetstream.Msg) error {
	for attempt := uint64(1); ; attempt++ {
		start := time.Now()
		err := r.store.Insert(ctx, recs)
		if err == nil {
			r.m.insertDuration.Observe(time.Since(start).Seconds())
			r.m.batchSize.Observe(float64(len(recs)))
			if r.insertFails.Swap(false) {
				r.log.Info("clickhouse insert recovered", "attempts", attempt)
			}
			return nil
		}
		r.insertFails.Store(true)
		r.m.clickhouseErrors.WithLabelValues("insert").Inc()
		delay := settle.Backoff(attempt)
		r.log.Warn("clickhouse insert failed, will retry", "rows", len(recs), "attempt", attempt, "retry_in", delay.String(), "error", err)
		for _, msg := range msgs {
			_ = msg.InProgress()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// announcer collects the executions committed batches touched until the announcer goroutine
// takes them, so a burst of batches costs one leaderboard read per execution, not one per batch.
type announcer struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
	done    chan struct{} // closed by close, to cut the pause between rounds short
	closed  bool
}

func newAnnouncer() *announcer {
	return &announcer{pending: map[string]bool{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (a *announcer) add(recs []rank.Record) {
	ids := make([]string, len(recs))
	for i, rec := range recs {
		ids[i] = rec.ExecutionID
	}
	a.addIDs(ids)
}

func (a *announcer) addIDs(ids []string) {
	if len(ids) == 0 {
		return
	}
	a.mu.Lock()
	for _, id := range ids {
		a.pending[id] = true
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
	close(a.done)
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// take returns the executions to announce, sorted, and whether more may come.
func (a *announcer) take() ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.pending))
	for id := range a.pending {
		ids = append(ids, id)
	}
	clear(a.pending)
	slices.Sort(ids)
	return ids, !a.closed
}

// announce publishes one leaderboard.updated per execution with newly committed evaluations,
// read after the commit, until the announcer is closed and emptied. Rounds are at least
// announceInterval apart: executions committed meanwhile wait and share the next round, so a
// burst of batches costs ClickHouse one leaderboard read per execution per interval rather than
// one per batch, and the inserts keep the server's CPU. An execution whose announcement failed
// goes back to the next round (at least a second later): it is retried until published, or
// superseded by a later board, which the next read returns anyway.
func (r *ranker) announce(ctx context.Context, a *announcer) {
	for {
		<-a.wake
		ids, open := a.take()
		var failed []string
		if len(ids) > 0 {
			failed = r.publishBoards(ctx, ids)
		}
		if !open {
			if ids, _ := a.take(); len(ids) > 0 {
				failed = append(failed, r.publishBoards(ctx, ids)...)
			}
			if len(failed) > 0 {
				r.log.Error("leaderboard.updated not published before stopping", "executions", failed)
			}
			return
		}
		pause := r.announceInterval
		if len(failed) > 0 {
			a.addIDs(failed)
			pause = max(pause, time.Second)
		}
		if len(ids) > 0 {
			select {
			case <-a.done:
			case <-time.After(pause):
			}
		}
	}
}

// publishBoards announces the executions' current leaderboards and returns those it could not.
func (r *ranker) publishBoards(ctx context.Context, ids []string) (failed []string) {
	start := time.Now()
	boards, err := r.store.Leaderboards(ctx, ids, events.Desc, rank.Everything())
	r.m.leaderboardQuery.Observe(time.Since(start).Seconds())
	if err != nil {
		r.m.clickhouseErrors.WithLabelValues("query").Inc()
		r.log.Warn("leaderboard read for leaderboard.updated failed; will retry", "executions", len(ids), "error", err)
		return ids
	}
	for _, id := range ids {
		b := boards[id]
		data := events.LeaderboardUpdated{ExecutionID: id, Leaderboard: b.Rows, EvaluationsSeq: b.Seq}
		evID := events.DerivedID("leaderboard", id, fmt.Sprint(b.Seq))
		body, err := events.Marshal(evID, r.source, events.TypeLeaderboardUpdated, r.now(), data)
		if err == nil {
			_, err = events.Publish(ctx, r.js, events.LeaderboardSubject(id), evID, body)
		}
		if err != nil {
			r.log.Warn("leaderboard.updated not published; will retry", "execution_id", id, "error", err)
			failed = append(failed, id)
			continue
		}
		r.m.leaderboardsSent.Inc()
	}
	return failed
}

// watchConsumer keeps the pending gauges current.
func (r *ranker) watchConsumer(ctx context.Context, cons jetstream.Consumer, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if info, err := cons.Info(ctx); err == nil {
			r.m.pending.Set(float64(info.NumPending))
			r.m.ackPending.Set(float64(info.NumAckPending))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
