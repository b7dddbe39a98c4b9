package ranker

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
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

func newLineageFixture(t *testing.T, tune ...func(*sink.Config[rank.Record])) *lineageFixture {
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
	f.r.keep = f.r.newKeeper(tune...)
	if err := f.r.keep.Publish(ctx, f.was, ""); err != nil {
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
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, nc: nc, m: newMetrics(prometheus.NewRegistry()), now: time.Now}
	r.keep = r.newKeeper()
	// The stream as it is now is the published lineage's, in era 3.
	if err := r.keep.Publish(ctx, chstore.Lineage{Epoch: 1, Stream: chstore.StreamID(st.CachedInfo().Created), Era: 3, Floor: 3, Whole: true}, ""); err != nil {
		t.Fatal(err)
	}
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
