package ranker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// faulty is the real store with faults of ClickHouse put in front of its inserts: the rows that
// get through are stored in a real ClickHouse, and the ones refused are refused with the errors
// ClickHouse gives.
type faulty struct {
	*chstore.Store
	refuse    func(rank.Record) bool // rows ClickHouse refuses (a code-53 exception for the insert holding one)
	transient atomic.Int32           // inserts still to fail as if the server went away
	inserts   atomic.Int32
}

func (f *faulty) Insert(ctx context.Context, recs []rank.Record) error {
	f.inserts.Add(1)
	if f.transient.Add(-1) >= 0 {
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	for _, r := range recs {
		if f.refuse != nil && f.refuse(r) {
			return fmt.Errorf("rank: insert: %w", &clickhouse.Exception{Code: 53, Name: "DB::Exception", Message: "Type mismatch in VALUES section: " + r.EventID})
		}
	}
	return f.Store.Insert(ctx, recs)
}

func records(exec string, ids ...string) []rank.Record {
	var out []rank.Record
	for i, id := range ids {
		out = append(out, rank.Record{EventID: id, Source: "test", Seq: uint64(i + 1), EvaluationCompleted: events.EvaluationCompleted{
			ExecutionID: exec, TeamID: "team-" + id, TeamName: id, RoundNumber: 1, Submission: events.Submission{Content: id},
			Evaluation: events.Scores{OverallScore: float64(i)}, EvaluatedAt: time.Unix(int64(i), 0).UTC()}})
	}
	return out
}

func newTestRanker(t *testing.T, st store, repair func(context.Context) error) (*ranker, *atomic.Value) {
	var stopped atomic.Value
	r := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), store: st, m: newMetrics(prometheus.NewRegistry()),
		now: time.Now, repair: repair, fail: func(err error) { stopped.Store(err) }}
	r.writes, r.whole, r.boards = newConditions(health.New(prometheus.NewRegistry(), "ranker"))
	r.sink = newSink(st, r.m, r.writes, r.log)
	r.keep = r.newKeeper()
	return r, &stopped
}

func stored(t *testing.T, st *chstore.Store, exec string) map[string]bool {
	t.Helper()
	board, err := st.Leaderboard(t.Context(), exec, events.Desc, rank.Everything())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, r := range board.Rows {
		out[r.TeamName] = true
	}
	return out
}

// TestWriteDeadLettersOnlyWhatIsRefused: ClickHouse refuses three rows of a batch of 40; the
// batch is split until each is found, they are returned to be dead-lettered with ClickHouse's
// error, and the 37 others are stored.
func TestWriteDeadLettersOnlyWhatIsRefused(t *testing.T) {
	st, _ := testenv.Store(t, true)
	var ids []string
	for i := range 40 {
		ids = append(ids, fmt.Sprintf("e%02d", i))
	}
	bad := map[string]bool{"e03": true, "e17": true, "e39": true}
	f := &faulty{Store: st, refuse: func(r rank.Record) bool { return bad[r.EventID] }}
	r, stopped := newTestRanker(t, f, nil)
	recs := records("split", ids...)
	refused, err := r.write(t.Context(), recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(refused) != len(bad) {
		t.Fatalf("refused %v, want %v", refused, bad)
	}
	for i, e := range refused {
		if id := recs[i].EventID; !bad[id] || !strings.Contains(e.Error(), "Type mismatch") {
			t.Errorf("refused %s: %v", id, e)
		}
	}
	got := stored(t, st, "split")
	for _, id := range ids {
		if got[id] == bad[id] {
			t.Errorf("%s stored %v", id, got[id])
		}
	}
	if stopped.Load() != nil {
		t.Errorf("the ranker stopped: %v", stopped.Load())
	}
	// The whole batch, then at most two halves per level (log2 40 < 6) for each refused row:
	// not one insert per row.
	if n := f.inserts.Load(); n > int32(1+2*6*len(bad)) {
		t.Errorf("%d inserts to find 3 refused rows of 40", n)
	}
}

// TestWriteRecreatesADroppedTable: an operator dropped the table; the insert finds it missing,
// the migrations make it again, what the EVALUATIONS stream holds is written back, and the
// batch is stored.
func TestWriteRecreatesADroppedTable(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(t.Context(), js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	for _, rec := range records("dropped", "x", "y") {
		body, err := events.Marshal(rec.EventID, "test", events.TypeEvaluationCompleted, rec.EvaluatedAt, rec.EvaluationCompleted)
		if err == nil {
			_, err = js.Publish(t.Context(), events.EvaluationSubject(rec.ExecutionID, rec.TeamID), body)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	exec(t, cfg, "DROP TABLE evaluations")
	repairs := 0
	r, stopped := newTestRanker(t, st, func(ctx context.Context) error {
		repairs++
		_, err := st.Repair(ctx)
		return err
	})
	r.js, r.maxBytes, r.batchSize = js, 1<<20, 10
	r.keep = r.newKeeper()
	refused, err := r.write(t.Context(), records("dropped", "a", "b"))
	if err != nil || len(refused) > 0 {
		t.Fatalf("write: %v, refused %v", err, refused)
	}
	if got := stored(t, st, "dropped"); !got["a"] || !got["b"] || !got["x"] || !got["y"] || repairs != 1 {
		t.Errorf("stored %v after %d repairs, want the batch (a, b) and the stream's evaluations (x, y)", got, repairs)
	}
	if lin, ok, err := st.Lineage(t.Context()); err != nil || !ok || !lin.Whole || lin.Anchor == (chstore.RowKey{}) {
		t.Errorf("lineage after the refill: %+v (found %v, err %v), want a whole one with an anchor", lin, ok, err)
	}
	if stopped.Load() != nil {
		t.Errorf("the ranker stopped: %v", stopped.Load())
	}
}

// TestWriteStopsOnATableThatRefusesEverything: a column was dropped by hand, so every row is
// refused; the ranker does not dead-letter them one by one but stops with an error naming the
// column.
func TestWriteStopsOnATableThatRefusesEverything(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	exec(t, cfg, "ALTER TABLE evaluations DROP COLUMN feedback")
	r, stopped := newTestRanker(t, st, func(context.Context) error { return errors.New("no repair expected") })
	refused, err := r.write(t.Context(), records("altered", "a", "b", "c"))
	if !errors.Is(err, errFatal) || len(refused) > 0 {
		t.Fatalf("write: %v, refused %v; want a fatal error", err, refused)
	}
	if !strings.Contains(err.Error(), "column feedback is missing") {
		t.Errorf("the error does not name the column: %v", err)
	}
	if stopped.Load() == nil {
		t.Error("the ranker was not stopped")
	}
	if err := r.writes.Err(); err == nil {
		t.Error("ready after a fatal fault")
	}
}

// TestWriteRetriesTransientFaults: two inserts fail as if ClickHouse were down; the third
// stores the batch, and readiness comes back.
func TestWriteRetriesTransientFaults(t *testing.T) {
	st, _ := testenv.Store(t, true)
	f := &faulty{Store: st}
	f.transient.Store(2)
	r, _ := newTestRanker(t, f, nil)
	if _, err := r.write(t.Context(), records("flaky", "a")); err != nil {
		t.Fatal(err)
	}
	if n := f.inserts.Load(); n != 3 || r.writes.Err() != nil {
		t.Errorf("%d inserts, failing %v; want 3 and recovered", n, r.writes.Err())
	}
}

func exec(t *testing.T, cfg chstore.Config, q string) {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(t.Context(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// rowCounter counts the rows inserted through it.
type rowCounter struct {
	*chstore.Store
	rows atomic.Int32
}

func (c *rowCounter) Insert(ctx context.Context, recs []rank.Record) error {
	c.rows.Add(int32(len(recs)))
	return c.Store.Insert(ctx, recs)
}

// TestRefillGoesOnWhereItStopped: a refill stopped after sequence 3 of 6 (its ranker killed): the
// table holds its last stored row, so the next refill writes sequences 4 to 6 only, and the
// store is whole again under the same lineage.
func TestRefillGoesOnWhereItStopped(t *testing.T) {
	st, _ := testenv.Store(t, true)
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(t.Context(), js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	recs := records("resumed", "x1", "x2", "x3", "x4", "x5", "x6")
	for _, rec := range recs {
		body, err := events.Marshal(rec.EventID, "test", events.TypeEvaluationCompleted, rec.EvaluatedAt, rec.EvaluationCompleted)
		if err == nil {
			_, err = js.Publish(t.Context(), events.EvaluationSubject(rec.ExecutionID, rec.TeamID), body)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Insert(t.Context(), recs[:3]); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), events.StreamEvaluations)
	if err != nil {
		t.Fatal(err)
	}
	stopped := chstore.Lineage{Epoch: 5, Stream: chstore.StreamID(stream.CachedInfo().Created), Anchor: chstore.KeyOf(recs[2]), Through: 3}
	if err := st.NoteLineage(t.Context(), stopped); err != nil {
		t.Fatal(err)
	}
	counter := &rowCounter{Store: st}
	r, _ := newTestRanker(t, counter, nil)
	r.js, r.maxBytes, r.batchSize = js, 1<<20, 10
	r.keep = r.newKeeper(quick(time.Millisecond))
	time.Sleep(5 * time.Millisecond) // the stopped refill's note is stale now
	if err := r.keep.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := counter.rows.Load(); n != 3 {
		t.Errorf("the refill wrote %d rows, want the 3 after sequence 3", n)
	}
	lin, _, err := st.Lineage(t.Context())
	if err != nil || !lin.Whole || lin.Epoch != 5 || lin.Anchor != chstore.KeyOf(recs[5]) {
		t.Errorf("lineage after the refill: %+v (%v), want epoch 5 whole, anchored at x6", lin, err)
	}
	if got := stored(t, st, "resumed"); len(got) != 6 {
		t.Errorf("stored %v, want x1 to x6", got)
	}
}

// quick has a keeper take a stopped refill over after stale, and wait no grace before it refills.
func quick(stale time.Duration) func(*sink.Config[rank.Record]) {
	return func(c *sink.Config[rank.Record]) { c.StaleAfter, c.Grace = stale, time.Millisecond }
}

// publishRecords stores recs in a real EVALUATIONS, as the orchestrator would.
func publishRecords(t *testing.T, js jetstream.JetStream, recs []rank.Record) {
	t.Helper()
	if err := events.EnsureStreams(t.Context(), js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		body, err := events.Marshal(rec.EventID, "test", events.TypeEvaluationCompleted, rec.EvaluatedAt, rec.EvaluationCompleted)
		if err == nil {
			_, err = js.Publish(t.Context(), events.EvaluationSubject(rec.ExecutionID, rec.TeamID), body)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestRefillAfterARebuildFromAFastClock: `podium store rebuild` ran on a machine an hour fast, so
// its lineage's epoch reads an hour ahead; then the table lost its rows. The refill that follows
// takes an epoch after it (epochs are ordered by the store, not by clocks) and fills the table:
// it neither yields to the finished rebuild nor takes the empty table for whole.
func TestRefillAfterARebuildFromAFastClock(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	_, js := testenv.JetStream(t, testenv.NATS(t))
	recs := records("fast", "f1", "f2", "f3")
	publishRecords(t, js, recs)
	stream, err := js.Stream(t.Context(), events.StreamEvaluations)
	if err != nil {
		t.Fatal(err)
	}
	future := uint64(time.Now().Add(time.Hour).UnixNano())
	if err := st.NoteLineage(t.Context(), chstore.Lineage{Epoch: future, Stream: chstore.StreamID(stream.CachedInfo().Created),
		Anchor: chstore.KeyOf(recs[2]), Through: 3, Whole: true}); err != nil {
		t.Fatal(err)
	}
	exec(t, cfg, "TRUNCATE TABLE evaluations") // the rows the rebuild wrote are gone
	r, _ := newTestRanker(t, st, nil)
	r.js, r.maxBytes, r.batchSize = js, 1<<20, 10
	r.keep = r.newKeeper(quick(time.Millisecond))
	if err := r.keep.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, st, "fast"); len(got) != len(recs) {
		t.Errorf("the store holds %d of the %d evaluations after the refill", len(got), len(recs))
	}
	if lin, _, err := st.Lineage(t.Context()); err != nil || !lin.Whole || lin.Epoch <= future {
		t.Errorf("lineage after the refill: %+v (%v), want whole, after the rebuild's epoch %d", lin, err, future)
	}
}

// TestStoppedRefillNotedByAFastClockIsTakenOver: a ranker on a machine an hour fast stopped in the
// middle of a refill; its last note reads an hour ahead. Another ranker takes the refill over
// once it has watched the note stand still (its own clock, never the note's time), and the store
// ends whole.
func TestStoppedRefillNotedByAFastClockIsTakenOver(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	_, js := testenv.JetStream(t, testenv.NATS(t))
	recs := records("stopped", "s1", "s2", "s3", "s4")
	publishRecords(t, js, recs)
	stream, err := js.Stream(t.Context(), events.StreamEvaluations)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Insert(t.Context(), recs[:2]); err != nil {
		t.Fatal(err)
	}
	// Its note, as that ranker wrote it: version and time an hour ahead.
	ahead := time.Now().Add(time.Hour)
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	batch, err := conn.PrepareBatch(t.Context(), "INSERT INTO store_lineage (epoch, version, stream_created, anchor_execution_id, anchor_team_id, anchor_event_id, through, whole, noted_at)")
	if err != nil {
		t.Fatal(err)
	}
	if err := batch.Append(uint64(ahead.UnixNano()), uint64(ahead.UnixNano()), chstore.StreamID(stream.CachedInfo().Created), "stopped", "team-s2", "s2", uint64(2), uint8(0), ahead); err != nil {
		t.Fatal(err)
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	r, _ := newTestRanker(t, st, nil)
	r.js, r.maxBytes, r.batchSize = js, 1<<20, 10
	r.keep = r.newKeeper(quick(50 * time.Millisecond))
	done := make(chan error, 1)
	go func() { done <- r.keep.Check(t.Context()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the refill noted an hour ahead was never taken over")
	}
	if got := stored(t, st, "stopped"); len(got) != len(recs) {
		t.Errorf("the store holds %d of the %d evaluations after the takeover", len(got), len(recs))
	}
	if lin, _, err := st.Lineage(t.Context()); err != nil || !lin.Whole {
		t.Errorf("lineage after the takeover: %+v (%v), want whole", lin, err)
	}
}
