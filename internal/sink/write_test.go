package sink_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// writer writes evaluations into a real store, with policy, and its condition and metrics.
func writer(t *testing.T, st *chstore.Store, policy sink.Refusals, insert func(context.Context, []rank.Record) error) (*sink.Writer[rank.Record], *health.Condition, *prometheus.CounterVec) {
	t.Helper()
	writes := health.New(prometheus.NewRegistry(), "test").Condition("clickhouse", nil)
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "errors"}, []string{"kind"})
	return &sink.Writer[rank.Record]{Rows: "evaluations", Table: "the evaluations table", Insert: insert, Refusals: policy,
		CheckTable: st.CheckTable, Writes: writes, Log: slog.New(slog.DiscardHandler),
		Metrics: sink.Metrics{BatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "batch"}),
			InsertDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "insert"}), Errors: errs}}, writes, errs
}

func records(n int) []rank.Record {
	recs := make([]rank.Record, n)
	for i := range recs {
		recs[i] = rank.Record{EventID: "ev-" + string(rune('a'+i)), Seq: uint64(i + 1)}
		recs[i].ExecutionID, recs[i].TeamID, recs[i].RoundNumber = "sink", "t", i+1
		recs[i].EvaluatedAt = time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	}
	return recs
}

// refused is what ClickHouse answers an insert holding a row it cannot take.
func refused(id string) error {
	return fmt.Errorf("rank: insert: %w", &clickhouse.Exception{Code: 53, Name: "DB::Exception", Message: "Type mismatch in VALUES section: " + id})
}

// refusing is the store's insert with ClickHouse's refusal of the rows in bad put in front: the
// rows that get through are stored in a real ClickHouse.
func refusing(st *chstore.Store, bad map[string]bool) func(context.Context, []rank.Record) error {
	return func(ctx context.Context, recs []rank.Record) error {
		for _, r := range recs {
			if bad[r.EventID] {
				return refused(r.EventID)
			}
		}
		return st.Insert(ctx, recs)
	}
}

// exec runs q on the test's database.
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

// TestSplitFindsTheRefusedRows: of a batch the table refuses, the rows it refuses alone are
// returned by place and the others stored.
func TestSplitFindsTheRefusedRows(t *testing.T) {
	st, _ := testenv.Store(t, true)
	recs := records(7)
	w, writes, _ := writer(t, st, sink.Split, refusing(st, map[string]bool{"ev-b": true, "ev-f": true}))
	got, err := w.Write(t.Context(), recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] == nil || got[5] == nil {
		t.Fatalf("refused %v, want the rows at 1 and 5", got)
	}
	board, err := st.Leaderboard(t.Context(), "sink", "desc", rank.Everything())
	if err != nil {
		t.Fatal(err)
	}
	if n := board.Rows[0].Rounds; n != 5 {
		t.Errorf("the store holds %d of the team's rounds, want the 5 not refused", n)
	}
	if writes.Err() != nil {
		t.Errorf("clickhouse = %v after the others were stored, want it to hold", writes.Err())
	}
}

// TestHoldKeepsTheBatch: a table that refuses rows is tried again, the condition naming the
// refusal, until it takes them; nothing is returned refused.
func TestHoldKeepsTheBatch(t *testing.T) {
	st, _ := testenv.Store(t, true)
	var tries atomic.Int32
	var seen atomic.Pointer[string]
	var writes *health.Condition
	insert := func(ctx context.Context, recs []rank.Record) error {
		if tries.Add(1) <= 2 {
			return refused(recs[0].EventID)
		}
		if err := writes.Err(); err != nil {
			why := err.Error()
			seen.Store(&why)
		}
		return st.Insert(ctx, recs)
	}
	w, c, errs := writer(t, st, sink.Hold, insert)
	writes = c
	got, err := w.Write(t.Context(), records(3))
	if err != nil || len(got) > 0 {
		t.Fatalf("Write = %v, %v; want the batch stored", got, err)
	}
	if why := seen.Load(); why == nil || !strings.Contains(*why, "clickhouse refuses the evaluations") {
		t.Errorf("while held, clickhouse was %v, want the refusal named", why)
	}
	if got := testutil.ToFloat64(errs.WithLabelValues("refused")); got != 2 || writes.Err() != nil {
		t.Errorf("refused counted %v times, condition %v; want 2 and holding", got, writes.Err())
	}
}

// TestMissingTableIsLost: a dropped table is ErrTableLost, for the caller to fill again.
func TestMissingTableIsLost(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	exec(t, cfg, "DROP TABLE evaluations")
	w, _, _ := writer(t, st, sink.Split, st.Insert)
	if _, err := w.Write(t.Context(), records(1)); !errors.Is(err, sink.ErrTableLost) {
		t.Errorf("Write into a dropped table = %v, want ErrTableLost", err)
	}
}

// TestTableThatRefusesEverything: a table not as the migrations made it is named, not split.
func TestTableThatRefusesEverything(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	exec(t, cfg, "ALTER TABLE evaluations DROP COLUMN feedback")
	w, _, _ := writer(t, st, sink.Split, st.Insert)
	_, err := w.Write(t.Context(), records(2))
	if !errors.Is(err, chstore.ErrTableMismatch) || !strings.Contains(err.Error(), "feedback") {
		t.Errorf("Write into an altered table = %v, want the mismatch naming the column", err)
	}
}
