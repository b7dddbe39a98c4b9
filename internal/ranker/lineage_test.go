package ranker

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// lineageFixture is a ranker over a real store and a real EVALUATIONS, its store's lineage noted
// and published whole on that stream (epoch 1, era 0).
type lineageFixture struct {
	r      *ranker
	js     jetstream.JetStream
	cfg    jetstream.StreamConfig
	stream jetstream.Stream
	was    chstore.Lineage
}

func newLineageFixture(t *testing.T) *lineageFixture {
	t.Helper()
	ctx := t.Context()
	st, _ := testenv.Store(t, true)
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	cfg, err := events.StreamConfig(events.StreamEvaluations, events.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &lineageFixture{js: js, cfg: cfg, stream: stream,
		was: chstore.Lineage{Epoch: 1, Stream: chstore.StreamID(stream.CachedInfo().Created), Whole: true},
		r:   &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, nc: nc, store: st, m: newMetrics(prometheus.NewRegistry()), now: time.Now}}
	if err := st.NoteLineage(ctx, f.was); err != nil {
		t.Fatal(err)
	}
	if err := f.r.publishLineage(ctx, f.was, ""); err != nil {
		t.Fatal(err)
	}
	return f
}

// remake deletes EVALUATIONS and makes it again: another stream, its sequences starting over.
func (f *lineageFixture) remake(t *testing.T) jetstream.Stream {
	t.Helper()
	if err := f.js.DeleteStream(t.Context(), events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	st, err := f.js.CreateStream(t.Context(), f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestABatchOfAnUnknownStreamIsGivenBack: a batch whose stream the runtime could not tell
// (consume.StreamOf is zero) gets no era. Before, it took the era of the stream as it is now: a
// batch of a stream deleted since was stored in the new stream's era, as of which it had never been
// acknowledged. A batch of the stream the published lineage names gets that lineage's era.
func TestABatchOfAnUnknownStreamIsGivenBack(t *testing.T) {
	ctx := t.Context()
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	cfg, err := events.StreamConfig(events.StreamEvaluations, events.StreamOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.EvaluationSubject("e", "t"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, nc: nc, m: newMetrics(prometheus.NewRegistry())}
	// The stream as it is now is the published lineage's, in era 3.
	r.lineage.Store(&chstore.Lineage{Epoch: 1, Stream: chstore.StreamID(st.CachedInfo().Created), Era: 3, Floor: 3, Whole: true})
	// A message read, not delivered through the runtime: its stream is not known.
	var read []jetstream.Msg
	if _, err := streamscan.Scan(ctx, js, events.StreamEvaluations, "", 0, func(m jetstream.Msg) error {
		read = append(read, m)
		return nil
	}); err != nil || len(read) != 1 {
		t.Fatalf("read %d messages: %v", len(read), err)
	}
	if era, err := r.eraOf(ctx, read); err == nil {
		t.Fatalf("a batch whose stream is not known was given era %d", era)
	}
}

// TestACheckNeverRepublishesAnOlderLineage forces the interleaving of the race: a check that found
// the store as published (asPublished) and, before it republished that lineage, a refill that
// published a newer one. Before, the check then republished the older lineage over the newer one
// (composers and snapshots went by a lineage the store no longer had); now it sees the lineage
// moved and leaves it, and the check is made again with commits held.
func TestACheckNeverRepublishesAnOlderLineage(t *testing.T) {
	ctx := t.Context()
	f := newLineageFixture(t)
	r, older := f.r, f.was
	newer := older
	newer.Epoch = 2
	r.hooks.beforeRepublish = func() {
		if err := r.publishLineage(ctx, newer, ""); err != nil { // a refill, finished meanwhile
			t.Error(err)
		}
	}
	if r.asPublished(ctx) {
		t.Error("the check found the store as published although the lineage moved under it")
	}
	if got := r.lineage.Load(); got.Epoch != newer.Epoch {
		t.Fatalf("the published lineage is epoch %d after the check; want the newer one, %d", got.Epoch, newer.Epoch)
	}
}

// TestTheEraWaitsForTheBatchesOfTheStreamBefore forces the interleaving of the race: EVALUATIONS
// deleted and made again while the runtime's pass of the stream before still runs (a batch of it
// in hand, waiting for the check to let commits go). Before, the check noted and published the
// new era at once: a request composed as of it lacked that batch, which then committed in the era
// before, and the record no longer verified. Now the check puts the era off (requests wait: the
// published lineage still names the stream before) until the runtime consumes the new stream.
func TestTheEraWaitsForTheBatchesOfTheStreamBefore(t *testing.T) {
	ctx := t.Context()
	f := newLineageFixture(t)
	r, was, before := f.r, f.was, f.stream
	now := f.remake(t)
	consumed := before.CachedInfo().Created // the pass of the stream before still runs
	r.consumes = func(created time.Time) bool { return created.Equal(consumed) }
	if err := r.checkStoreLocked(ctx); !errors.Is(err, errBeforeInHand) {
		t.Fatalf("the check while a batch of the stream before may come: %v, want errBeforeInHand", err)
	}
	if got := r.lineage.Load(); got.Stream != was.Stream || got.Era != 0 {
		t.Fatalf("the new era was published while a batch of the stream before may come: %+v", got)
	}
	consumed = now.CachedInfo().Created // the runtime consumes the new stream
	if err := r.checkStoreLocked(ctx); err != nil {
		t.Fatal(err)
	}
	// The table held no row of the stream before (no anchor): nothing of an older era to keep.
	if got := r.lineage.Load(); got.Stream != chstore.StreamID(now.CachedInfo().Created) || got.Era != 1 || got.Floor != 1 {
		t.Fatalf("once the runtime consumes the new stream: %+v, want its lineage in era 1, floor 1", got)
	}
}

// TestTheEraWaitsForABatchWaitingToCommit: the runtime consumes the new stream already, but a
// batch handed over by the pass before is still waiting for the commit lock (the runtime's
// overlap hands a batch over before its pass ends): the switch waits for it too.
func TestTheEraWaitsForABatchWaitingToCommit(t *testing.T) {
	ctx := t.Context()
	f := newLineageFixture(t)
	r := f.r
	r.consumes = func(time.Time) bool { return true } // the runtime consumes the new stream
	f.remake(t)
	r.waiting.Add(1) // a batch of the pass before, waiting for the lock the check holds
	if err := r.checkStoreLocked(ctx); !errors.Is(err, errBeforeInHand) {
		t.Fatalf("the check while a batch waits to commit: %v, want errBeforeInHand", err)
	}
	r.waiting.Add(-1) // it committed
	if err := r.checkStoreLocked(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.lineage.Load(); got.Era != 1 {
		t.Fatalf("after the batch committed: era %d, want 1", got.Era)
	}
}
