package ranker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/refill"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// store is what the ranker needs of ClickHouse.
type store interface {
	Insert(ctx context.Context, recs []rank.Record) error
	Leaderboards(ctx context.Context, executionIDs []string, order events.ScoreOrder, b rank.Bound) (map[string]rank.Board, error)
	Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
	Anchored(k chstore.RowKey) chstore.Anchored
	Begin(ctx context.Context) (*chstore.View, error)
	Ping(ctx context.Context) error
	CheckTable(ctx context.Context) error
	sink.Table // the store's lineage and anchor (its keeper's: lineage.go)
}

var _ store = (*chstore.Store)(nil)

// ranker turns batches of evaluation.completed messages into ClickHouse rows, acks them only
// once the rows are committed, and announces the new leaderboards.
type ranker struct {
	log           *slog.Logger
	js            jetstream.JetStream
	nc            *nats.Conn
	snapshots     jetstream.KeyValue // nil: no SCORES bucket (an operator's deployment without one)
	settler       *settle.Settler
	trace         *tracing.Tracing
	store         store
	m             *metrics
	source        string
	maxBytes      int
	batchSize     int
	batchBytes    int
	flushInterval time.Duration
	linger        time.Duration
	ackWait       time.Duration
	// announceInterval is the least time between two rounds of leaderboard.updated.
	announceInterval time.Duration
	now              func() time.Time
	// repair recreates the database and the tables the migrations own (an operator dropped
	// them); see write.go.
	repair func(ctx context.Context) error
	// fail stops the consumer with a fault the ranker cannot mend (stopWith), set by consume.
	fail func(err error)
	// runtime consumes; the ranker publishes its store's lineage on the consumer through it.
	runtime *consume.Runtime

	// boardsMu is read-held by an announcement's read of the store and held by a refill, so no
	// leaderboard is read from a store being refilled.
	boardsMu sync.RWMutex
	// passes notes this ranker's pass for the other replicas and reads theirs before an era
	// switch (passes.go; nil: no RANKER_PASSES bucket, as in an operator's deployment without
	// one, or some tests). passOf is the runtime's pass (consume.Runtime.Pass); the
	// batches handed to the stage and not yet settled are the keeper's (Keeper.InHand); stopped is
	// set once every batch is settled at a stop.
	passes *passes
	passOf func() (created time.Time)
	// delivering says whether a batch's consumer is still the one its pass saw
	// (consume.Runtime.Delivering; nil in some tests).
	delivering func(ctx context.Context, msgs []jetstream.Msg) bool
	stopped    atomic.Bool
	// keep keeps the store a whole view of EVALUATIONS (lineage.go): commits take turns with
	// its checks and refills (Serial).
	keep *sink.Keeper[rank.Record]

	// Readiness: writes ("clickhouse") is the writer's (write.go): inserts failing, waiting for a
	// quorum or for disk, or a fault that stopped the ranker; whole ("store") is the lineage's
	// (lineage.go): not checked against the stream yet, or being refilled.
	writes *health.Condition
	whole  *health.Condition
	// boards ("leaderboards") is the announcer's: it fails while leaderboard.updated cannot be
	// published (announce.go). remakeBoards makes LEADERBOARDS again (nil: the operator owns it).
	boards       *health.Condition
	remakeBoards func(ctx context.Context) (bool, error)
	// sink writes batches of evaluations (write.go).
	sink *sink.Writer[rank.Record]
}

// newConditions registers the ranker's readiness conditions.
func newConditions(h *health.Health) (writes, whole, boards *health.Condition) {
	return h.Condition("clickhouse", nil), h.Condition("store", errUnchecked), h.Condition("leaderboards", nil)
}

// errUnchecked is the store before its first check.
var errUnchecked = errors.New("the store is not yet checked against EVALUATIONS")

// consume reads batches until stop is done, then drains what the client already holds and
// returns once every batch is committed and announced. Work in hand is finished under work, which
// outlives stop by the shutdown timeout. The runtime pulls, fills batches, keeps them in progress,
// settles what handle decides and makes the consumer again when it is lost; handle is what the
// ranker does with a batch.
//
// Three stages overlap: the runtime fills batch n+1 while batch n is inserted and acknowledged
// (consume.Batching.Overlap), and the announcer publishes leaderboard.updated for what was
// committed, so the ClickHouse insert is the only step on the critical path.
func (r *ranker) consume(stop, work context.Context, rt *consume.Runtime, cons jetstream.Consumer) (err error) {
	// A fault the ranker cannot mend (write.go) stops it as a signal would, then is its exit error.
	stop, fail := context.WithCancelCause(stop)
	defer fail(nil)
	r.fail = fail
	defer func() {
		if cause := context.Cause(stop); errors.Is(cause, errFatal) {
			err = cause
		}
	}()

	ann := newAnnouncer()
	announced := make(chan struct{})
	go func() { defer close(announced); r.announce(work, ann) }()
	defer func() {
		ann.close()
		<-announced
	}()

	// Seen by the other replicas before any batch is in hand (passes.go); noted as stopped once
	// every batch is settled.
	if r.passes != nil {
		if r.passes.noteUntil(stop) != nil {
			return nil
		}
		defer func() {
			r.stopped.Store(true)
			if _, err := r.passes.note(work); err != nil {
				r.log.Warn("the ranker's stop could not be noted in "+events.BucketRankerPasses+"; its note goes with the bucket's TTL", "error", err)
			}
		}()
	}
	// No commit before the store is known whole: a new database beside a stream that holds
	// evaluations is refilled first.
	if !r.keep.Start(stop, work) {
		return nil
	}
	stage := consume.Stage{
		Handler: consume.Chain(func(ctx context.Context, msgs []jetstream.Msg) consume.Result { return r.handle(ctx, msgs, ann) },
			consume.Recover(r.log, rt.Panics)),
		Settler: r.settler,
		Log:     r.log,
		InHand:  r.keep.InHand,
		// A batch of a stream deleted since is committed (in its era) but never settled: its acks
		// would reach the consumer made again on the new stream.
		Current:   rt.Delivering,
		KeepAlive: r.ackWait / 3,
		// The acks are confirmed (sent again when a NATS restart lost them), so that when
		// composers hear of the commit (After), the ranker's ack floor already shows it: they
		// check it, the notice only wakes them.
		ConfirmAcks: r.ackWait,
		// A commit and its acks take turns with a check or a refill of the store (lineage.go):
		// no ack moves the ack floor while the store is not whole.
		Serial: r.keep.Serial,
	}
	return rt.Run(stop, work, cons, consume.Batches(consume.Batching{Size: r.batchSize, Bytes: r.batchBytes, Flush: r.flushInterval,
		Linger: r.linger, Overlap: true}, stage, r.log.Warn))
}

// batch is a parsed batch: the rows to write, the messages to ack once they are written (their
// places in the batch, and their evaluations' places in the rows), and the trace context of each
// evaluation that carried one, which the batch's span links to.
type batch struct {
	recs  []rank.Record
	keep  []int
	recOf []int // the place in recs of each message of keep's evaluation
	links []trace.Link
}

// handle commits a batch: invalid events are dead-lettered, the others written, and done once
// ClickHouse has them; after their acks, composers hear of the commit and the announcer of the
// executions.
func (r *ranker) handle(ctx context.Context, msgs []jetstream.Msg, ann *announcer) consume.Result {
	res := consume.All(msgs, settle.Ack())
	// Nothing is stored beside a loss: the batch is given back (redelivered with the backoff;
	// the ranker's deliveries are unbounded) until an operator accepted the loss and the refill
	// ran, which stores these too. Not waited for here: handling holds commitMu, which the check
	// that finds the acceptance needs.
	if l := r.keep.Loss(); l != nil {
		return consume.All(msgs, settle.RetryLater(fmt.Errorf("%w: %s", sink.ErrLossHeld, l.Lineage)))
	}
	// A pass that has not yet seen its consumer lost may fetch from the one made again on the new
	// stream: those messages carry the stream the pass read (consume.StreamOf), whose era they
	// would take. Only a batch whose consumer still exists as the pass saw it is of that stream.
	if r.delivering != nil && !r.delivering(ctx, msgs) {
		return consume.All(msgs, settle.RetryLater(errors.New("the batch's consumer was made again since the pass began: its stream is not known")))
	}
	era, err := r.eraOf(ctx, msgs)
	if err != nil {
		r.log.WarnContext(ctx, "the era of a batch's stream is not known; the batch is given back", "error", err)
		return consume.All(msgs, settle.RetryLater(err))
	}
	b := r.parse(ctx, msgs, res.Outcomes)
	for i := range b.recs {
		b.recs[i].Era = era
	}
	b, sc, ok := r.commit(ctx, b, res.Outcomes)
	if ok {
		// Once per lineage, before the acks: a composer that sees them committed sees the anchor
		// its reads check too (chstore/anchored.go).
		if err := r.keep.AnchorAfter(ctx, b.recs); err != nil {
			r.log.WarnContext(ctx, "the store's first anchor not noted; the batch is given back", "error", err)
			for _, i := range b.keep {
				res.Outcomes[i] = settle.RetryLater(err)
			}
			return res
		}
		res.After = func(ctx context.Context) {
			r.m.events.WithLabelValues("stored").Add(float64(len(b.recs)))
			r.notifyCommitted(b)
			ann.add(sc, b.recs)
		}
	}
	return res
}

// parse reads a batch; an invalid event's outcome is poison, and repeats of an evaluation within
// the batch are acked with it but written once. An evaluation is its event id within its team of
// its execution, as the store's rows and every read count it (rank.Latest): one id sent for two
// teams is two evaluations.
func (r *ranker) parse(ctx context.Context, msgs []jetstream.Msg, outcomes []settle.Outcome) batch {
	b := batch{recs: make([]rank.Record, 0, len(msgs)), keep: make([]int, 0, len(msgs))}
	seen := make(map[[3]string]int, len(msgs)) // an evaluation's place in b.recs
	for i, msg := range msgs {
		rec, ev, err := refill.RowOf(msg, 0, r.maxBytes) // its era: at commit (eraOf)
		if err != nil {
			r.m.events.WithLabelValues("dead_lettered").Inc()
			outcomes[i] = settle.Reject(err.Error())
			continue
		}
		if sc := trace.SpanContextFromContext(r.trace.Extract(ctx, ev.Trace, msg.Headers())); sc.IsValid() {
			b.links = append(b.links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("podium.evaluation_id", ev.ID)}})
		}
		key := [3]string{ev.Data.ExecutionID, ev.Data.TeamID, ev.ID}
		j, repeat := seen[key]
		if repeat {
			r.m.events.WithLabelValues("duplicate").Inc()
		} else {
			j = len(b.recs)
			seen[key] = j
			b.recs = append(b.recs, rec)
		}
		b.keep, b.recOf = append(b.keep, i), append(b.recOf, j)
	}
	return b
}

// commit writes a batch and returns what it committed. It returns false when the batch is given
// back for redelivery instead (its outcomes retry); the evaluations ClickHouse refuses are
// dead-lettered. The batch is one span (a root: it serves many traces), linked to every
// evaluation's context, the insert its child.
func (r *ranker) commit(ctx context.Context, b batch, outcomes []settle.Outcome) (batch, trace.SpanContext, bool) {
	ctx, span := r.trace.Start(ctx, "ranker.commit", trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(b.links...),
		trace.WithAttributes(attribute.Int("podium.batch_size", len(b.recs)), attribute.Int("podium.messages", len(b.keep))))
	defer span.End()
	if len(b.recs) == 0 {
		return b, span.SpanContext(), true
	}
	refused, err := r.insertSpan(ctx, b.recs)
	if err != nil {
		span.SetStatus(codes.Error, "given back for redelivery")
		r.log.WarnContext(ctx, "gave up a batch; it will be redelivered", "rows", len(b.recs), "error", err)
		for _, i := range b.keep {
			outcomes[i] = settle.RetryLater(err)
		}
		return b, span.SpanContext(), false
	}
	if len(refused) > 0 {
		b = r.deadLetterRefused(b, refused, outcomes)
	}
	// The rows are stored; a redelivery of an ack that is lost is harmless: writes are idempotent.
	return b, span.SpanContext(), true
}

// insertSpan writes recs as the span clickhouse.insert, ended however the write ends (a panic
// included: the runtime's recovery goes on after it).
func (r *ranker) insertSpan(ctx context.Context, recs []rank.Record) (refused map[int]error, err error) {
	ictx, span := r.trace.Start(ctx, "clickhouse.insert", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.Int("db.rows", len(recs))))
	defer func() { tracing.End(span, err) }()
	return r.write(ictx, recs)
}

// watchConsumer keeps the pending gauges current.
func (r *ranker) watchConsumer(ctx context.Context, cons jetstream.Consumer, every time.Duration) {
	retry.Every(ctx, every, func(ctx context.Context) {
		if info, err := cons.Info(ctx); err == nil {
			r.m.pending.Set(float64(info.NumPending))
			r.m.ackPending.Set(float64(info.NumAckPending))
		}
	})
}
