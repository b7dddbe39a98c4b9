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

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// store is what the ranker needs of ClickHouse.
type store interface {
	Insert(ctx context.Context, recs []rank.Record) error
	Leaderboards(ctx context.Context, executionIDs []string, order events.ScoreOrder, beforeRound int) (map[string]rank.Board, error)
	Leaderboard(ctx context.Context, executionID string, order events.ScoreOrder, beforeRound int) (rank.Board, error)
	History(ctx context.Context, executionID, teamID string, beforeRound int) ([]events.TeamRound, error)
	Ping(ctx context.Context) error
}

var _ store = (*rank.Store)(nil)

// ranker turns batches of evaluation.completed messages into ClickHouse rows, acks them only
// once the rows are committed, and announces the new leaderboards.
type ranker struct {
	log           *slog.Logger
	js            jetstream.JetStream
	store         store
	m             *metrics
	source        string
	maxBytes      int
	batchSize     int
	flushInterval time.Duration
	// announceInterval is the least time between two rounds of leaderboard.updated.
	announceInterval time.Duration
	now              func() time.Time

	consuming   atomic.Bool
	insertFails atomic.Bool // set while a batch is waiting for ClickHouse to come back
}

// consume reads batches until stop is done, then drains what the client already holds and
// returns once every batch is committed and announced. Work in hand is finished under work, which
// outlives stop by the shutdown timeout.
//
// Three stages overlap: this loop fills and validates batch n+1 while the committer inserts and
// acks batch n, and the announcer publishes leaderboard.updated for what was committed, so the
// ClickHouse insert is the only step on the critical path.
func (r *ranker) consume(stop, work context.Context, cons jetstream.Consumer) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(r.batchSize))
	if err != nil {
		return fmt.Errorf("ranker: consume: %w", err)
	}
	defer it.Stop()
	r.consuming.Store(true)
	defer r.consuming.Store(false)

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
		batches <- r.validate(work, r.fill(stop, it, first, draining))
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

// batch is a validated batch: the rows to write and the messages to ack once they are written.
type batch struct {
	recs []rank.Record
	keep []jetstream.Msg
}

// validate parses a batch; invalid events are dead-lettered and terminated at once, and repeats
// of an id within the batch are acked with it but written once.
func (r *ranker) validate(ctx context.Context, msgs []jetstream.Msg) batch {
	b := batch{recs: make([]rank.Record, 0, len(msgs)), keep: make([]jetstream.Msg, 0, len(msgs))}
	seen := make(map[string]bool, len(msgs))
	for _, msg := range msgs {
		md, err := msg.Metadata()
		if err != nil {
			r.log.Error("message without metadata", "subject", msg.Subject(), "error", err)
			_ = msg.Term()
			continue
		}
		ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), r.maxBytes)
		if err != nil {
			r.deadLetter(ctx, msg, md, err)
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
	if len(b.recs) > 0 && !r.insert(ctx, b.recs, b.keep) {
		return false
	}
	for _, msg := range b.keep {
		if err := msg.Ack(); err != nil {
			// The rows are stored; a redelivery is harmless because writes are idempotent.
			r.log.Warn("ack failed", "subject", msg.Subject(), "error", err)
		}
	}
	r.m.events.WithLabelValues("stored").Add(float64(len(b.recs)))
	return true
}

// insert writes recs, retrying with capped exponential backoff while ClickHouse is unavailable.
// The messages are kept in progress meanwhile so the broker does not hand them to another
// replica. It returns false when ctx ends first; the messages are then nak'ed for redelivery.
func (r *ranker) insert(ctx context.Context, recs []rank.Record, msgs []jetstream.Msg) bool {
	delay := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		start := time.Now()
		err := r.store.Insert(ctx, recs)
		if err == nil {
			r.m.insertDuration.Observe(time.Since(start).Seconds())
			r.m.batchSize.Observe(float64(len(recs)))
			if r.insertFails.Swap(false) {
				r.log.Info("clickhouse insert recovered", "attempts", attempt)
			}
			return true
		}
		r.insertFails.Store(true)
		r.m.clickhouseErrors.WithLabelValues("insert").Inc()
		r.log.Warn("clickhouse insert failed, will retry", "rows", len(recs), "attempt", attempt, "retry_in", delay.String(), "error", err)
		for _, msg := range msgs {
			_ = msg.InProgress()
		}
		select {
		case <-ctx.Done():
			for _, msg := range msgs {
				_ = msg.Nak()
			}
			r.log.Warn("gave up a batch at shutdown; it will be redelivered", "rows", len(recs))
			return false
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
}

// deadLetter copies an invalid event to deadletter.<subject> and terminates it. If the copy
// cannot be published the message is nak'ed, so nothing is dropped silently.
func (r *ranker) deadLetter(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, cause error) {
	reason := cause.Error()
	if err := events.DeadLetter(ctx, r.js, msg, reason); err != nil {
		r.log.Error("dead letter failed; will retry", "subject", msg.Subject(), "error", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.TermWithReason("invalid event")
	r.m.events.WithLabelValues("dead_lettered").Inc()
	r.log.Warn("dead-lettered invalid event", "subject", msg.Subject(), "stream_seq", md.Sequence.Stream, "reason", reason)
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
	if len(recs) == 0 {
		return
	}
	a.mu.Lock()
	for _, rec := range recs {
		a.pending[rec.ExecutionID] = true
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
// one per batch, and the inserts keep the server's CPU.
func (r *ranker) announce(ctx context.Context, a *announcer) {
	for {
		<-a.wake
		ids, open := a.take()
		if len(ids) > 0 {
			r.publishBoards(ctx, ids)
		}
		if !open {
			if ids, _ := a.take(); len(ids) > 0 {
				r.publishBoards(ctx, ids)
			}
			return
		}
		if len(ids) > 0 {
			select {
			case <-a.done:
			case <-time.After(r.announceInterval):
			}
		}
	}
}

func (r *ranker) publishBoards(ctx context.Context, ids []string) {
	start := time.Now()
	boards, err := r.store.Leaderboards(ctx, ids, events.Desc, 0)
	r.m.leaderboardQuery.Observe(time.Since(start).Seconds())
	if err != nil {
		r.m.clickhouseErrors.WithLabelValues("query").Inc()
		r.log.Warn("leaderboard read for leaderboard.updated failed", "executions", len(ids), "error", err)
		return
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
			r.log.Warn("leaderboard.updated not published", "execution_id", id, "error", err)
			continue
		}
		r.m.leaderboardsSent.Inc()
	}
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
