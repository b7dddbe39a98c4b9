package ranker

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestSnapshotTooLargeRemovesTheStaleOne: an execution's snapshot is written while it fits the
// server's max payload; once its rows no longer fit, the old snapshot is deleted rather than left
// for composers to fetch, parse and find behind.
func TestSnapshotTooLargeRemovesTheStaleOne(t *testing.T) {
	ctx := t.Context()
	ns := testenv.NATS(t)
	nc, js := testenv.JetStream(t, ns)
	kv, err := js.CreateKeyValue(ctx, events.ScoresBucketConfig(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, nc: nc, snapshots: kv, m: newMetrics(prometheus.NewRegistry())}
	rows := func(n int) *rank.Evaluations {
		recs := make([]rank.Record, n)
		for i := range recs {
			recs[i] = rank.Record{EventID: fmt.Sprintf("ev-%06d", i), Seq: uint64(i + 1), EvaluationCompleted: events.EvaluationCompleted{
				ExecutionID: "big", TeamID: fmt.Sprintf("team-%04d", i%1000), TeamName: strings.Repeat("n", 40), RoundNumber: 1 + i/1000,
				Evaluation: events.Scores{OverallScore: float64(i % 97)}, EvaluatedAt: time.Unix(int64(i), 0).UTC()}}
		}
		ev, _ := rank.FromRecords(recs)
		return ev
	}

	r.putSnapshot(ctx, "big", rows(100), rank.Derivation{Through: 100, Lineage: "1@s"})
	if _, err := kv.Get(ctx, "big"); err != nil {
		t.Fatalf("the snapshot of 100 rows was not written: %v", err)
	}
	r.putSnapshot(ctx, "big", rows(20000), rank.Derivation{Through: 20000, Lineage: "1@s"}) // about 2 MiB encoded, over the 1 MiB max payload
	if n := testutil.ToFloat64(r.m.snapshots.WithLabelValues("too_large")); n != 1 {
		t.Fatalf("too_large snapshots = %v, want 1", n)
	}
	if _, err := kv.Get(ctx, "big"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the stale snapshot is still there (err %v)", err)
	}
}
