package ranker

import (
	"io"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

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
	older := chstore.Lineage{Epoch: 1, Stream: chstore.StreamID(stream.CachedInfo().Created), Whole: true}
	if err := st.NoteLineage(ctx, older); err != nil {
		t.Fatal(err)
	}
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, nc: nc, store: st, m: newMetrics(prometheus.NewRegistry())}
	if err := r.publishLineage(ctx, older, ""); err != nil {
		t.Fatal(err)
	}
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
