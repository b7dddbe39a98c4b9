package ranker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestAnnounceRetriesUntilPublished: the leaderboard of a committed execution cannot be
// announced while the LEADERBOARDS stream is missing; the announcer keeps it and publishes it
// once the stream exists, with the board read after the commit.
func TestAnnounceRetriesUntilPublished(t *testing.T) {
	ctx := t.Context()
	st, _ := testenv.Store(t, true)
	recs := []rank.Record{{EventID: "e1", Source: "test", Seq: 1, EvaluationCompleted: events.EvaluationCompleted{
		ExecutionID: "ann", TeamID: "t1", TeamName: "One", RoundNumber: 1,
		Submission: events.Submission{Content: "x"}, Evaluation: events.Scores{OverallScore: 42}, EvaluatedAt: time.Unix(0, 0).UTC()}}}
	if err := st.Insert(ctx, recs); err != nil {
		t.Fatal(err)
	}

	ns := testenv.NATS(t)
	_, js := testenv.JetStream(t, ns)
	tr, err := tracing.Setup(ctx, "ranker", prometheus.NewRegistry(), nil) // no OTEL_ endpoint: a no-op tracer
	if err != nil {
		t.Fatal(err)
	}
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, store: st, m: newMetrics(prometheus.NewRegistry()),
		trace: tr, source: "ranker/test", announceInterval: 10 * time.Millisecond, now: time.Now}
	_, r.whole, r.boards = newConditions(health.New(prometheus.NewRegistry(), "ranker"))
	r.keep = r.newKeeper()
	ann := newAnnouncer()
	done := make(chan struct{})
	go func() { defer close(done); r.announce(context.Background(), ann) }()
	ann.add(trace.SpanContext{}, recs)

	time.Sleep(1500 * time.Millisecond) // at least one failed round
	if err := r.boards.Err(); err == nil || !strings.Contains(err.Error(), "leaderboard.updated cannot be published") {
		t.Errorf("leaderboards = %v while LEADERBOARDS is missing, want it failing", err)
	}
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamLeaderboards); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, events.StreamLeaderboards)
	if err != nil {
		t.Fatal(err)
	}
	var got events.LeaderboardUpdated
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		msg, err := stream.GetLastMsgForSubject(ctx, events.LeaderboardSubject("ann"))
		if err == nil {
			var env events.Envelope
			if err := json.Unmarshal(msg.Data, &env); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(env.Data, &got); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaderboard.updated not published within 10s of the stream's creation: %v", err)
		}
	}
	if len(got.Leaderboard) != 1 || got.Leaderboard[0].BestScore != 42 || got.EvaluationsSeq != 1 {
		t.Errorf("leaderboard.updated = %+v, want t1 with 42 at sequence 1", got)
	}
	testenv.WaitFor(t, 5*time.Second, "leaderboards to hold once published", func() (bool, string) {
		return r.boards.Err() == nil, fmt.Sprint(r.boards.Err())
	})
	ann.close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("announcer did not stop after close")
	}
}

// TestAnnouncerCoalesces: executions added between two takes are announced once, sorted.
func TestAnnouncerCoalesces(t *testing.T) {
	a := newAnnouncer()
	a.addIDs(map[string]trace.SpanContext{"b": {}, "a": {}})
	a.addIDs(map[string]trace.SpanContext{"a": {}, "c": {}})
	ids, open := a.take()
	if got, want := slices.Sorted(maps.Keys(ids)), []string{"a", "b", "c"}; !open || !slices.Equal(got, want) {
		t.Errorf("take = %v, %v; want %v, open", got, open, want)
	}
	a.close()
	if ids, open := a.take(); open || len(ids) != 0 {
		t.Errorf("after close: take = %v, %v; want none, closed", ids, open)
	}
}

// countingStore counts the Scores reads of each execution.
type countingStore struct {
	*chstore.Store
	mu    sync.Mutex
	reads map[string]int
}

func (c *countingStore) Scores(ctx context.Context, ids []string) (map[string]*rank.Evaluations, error) {
	c.mu.Lock()
	for _, id := range ids {
		c.reads[id]++
	}
	c.mu.Unlock()
	return c.Store.Scores(ctx, ids)
}

// TestAnnouncementTooLargeIsNotRetried: an execution whose leaderboard.updated is over the
// server's max payload (12,000 teams) is reported once and not read again round after round,
// while an execution committed beside it is announced.
func TestAnnouncementTooLargeIsNotRetried(t *testing.T) {
	ctx := t.Context()
	st, _ := testenv.Store(t, true)
	var recs []rank.Record
	for i := range 12000 {
		recs = append(recs, rank.Record{EventID: fmt.Sprintf("e%05d", i), Source: "test", Seq: uint64(i + 1), EvaluationCompleted: events.EvaluationCompleted{
			ExecutionID: "huge", TeamID: fmt.Sprintf("team-%05d", i), TeamName: fmt.Sprintf("Team number %05d of the huge execution", i), RoundNumber: 1,
			Submission: events.Submission{Content: "x"}, Evaluation: events.Scores{OverallScore: float64(i % 100)}, EvaluatedAt: time.Unix(0, 0).UTC()}})
	}
	small := rank.Record{EventID: "s1", Source: "test", Seq: 12001, EvaluationCompleted: events.EvaluationCompleted{
		ExecutionID: "small", TeamID: "t1", TeamName: "One", RoundNumber: 1,
		Submission: events.Submission{Content: "x"}, Evaluation: events.Scores{OverallScore: 1}, EvaluatedAt: time.Unix(0, 0).UTC()}}
	recs = append(recs, small)
	if err := st.Insert(ctx, recs); err != nil {
		t.Fatal(err)
	}
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamLeaderboards); err != nil {
		t.Fatal(err)
	}
	tr, err := tracing.Setup(ctx, "ranker", prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cs := &countingStore{Store: st, reads: map[string]int{}}
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: js, store: cs, m: newMetrics(prometheus.NewRegistry()),
		trace: tr, source: "ranker/test", announceInterval: 10 * time.Millisecond, now: time.Now}
	_, r.whole, r.boards = newConditions(health.New(prometheus.NewRegistry(), "ranker"))
	r.keep = r.newKeeper()
	ann := newAnnouncer()
	done := make(chan struct{})
	go func() { defer close(done); r.announce(context.Background(), ann) }()
	ann.add(trace.SpanContext{}, recs)
	time.Sleep(2500 * time.Millisecond) // a retried execution would be read again at least twice meanwhile
	ann.close()
	<-done
	if n := testutil.ToFloat64(r.m.announcements.WithLabelValues("too_large")); n != 1 {
		t.Errorf("too_large announcements = %v, want 1", n)
	}
	if cs.reads["huge"] != 1 || cs.reads["small"] != 1 {
		t.Errorf("executions read %v times, want each once", cs.reads)
	}
	stream, err := js.Stream(ctx, events.StreamLeaderboards)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.GetLastMsgForSubject(ctx, events.LeaderboardSubject("small")); err != nil {
		t.Errorf("the small execution was not announced: %v", err)
	}
}
