package ranker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/rank"
)

// How a batch gets into ClickHouse is internal/sink's (retries, a lost table, refused rows). The
// ranker's part:
//   - a missing database or table is recreated from the migrations and refilled from the
//     EVALUATIONS stream (lineage.go), unready meanwhile, then the batch is written again;
//   - rows the table refuses (sink.Split): if the table is not what the migrations made (a column
//     dropped or retyped by hand), it would refuse every row, so the ranker stops with an error
//     naming the difference (unready, exit 1, the batch given back for redelivery after the fix);
//     if it is, each refused evaluation is dead-lettered with ClickHouse's error as Dead-Reason
//     while the rest are stored.

// errFatal marks a fault the ranker cannot mend by itself.
var errFatal = errors.New("ranker: clickhouse fault")

// maxRepairs bounds how often in a row a missing table is recreated for one batch.
const maxRepairs = 3

// newSink is how the ranker writes evaluations.
func newSink(st store, m *metrics, writes *health.Condition, log *slog.Logger) *sink.Writer[rank.Record] {
	return &sink.Writer[rank.Record]{Rows: "evaluations", Table: "the evaluations table", Insert: st.Insert, Refusals: sink.Split,
		CheckTable: st.CheckTable, Writes: writes, Log: log,
		Metrics: m.sink}
}

// stopWith turns the ranker unready for good and stops its consumer with err as its exit error.
func (r *ranker) stopWith(err error) {
	r.writes.Fatal(errors.New("stopped: clickhouse refuses every evaluation (see the error log)"))
	if r.fail != nil {
		r.fail(err)
	}
}

// write stores the recs of a commit (see the top of this file), refilling the table from the
// stream when it is missing. It returns the evaluations ClickHouse refused, by their place in
// recs with its error, when the others are stored; an error when nothing was settled: ctx ended,
// or a fault stopped the ranker.
func (r *ranker) write(ctx context.Context, recs []rank.Record) (map[int]error, error) {
	for repairs := 1; ; repairs++ {
		refused, err := r.writeRows(ctx, recs)
		if !errors.Is(err, sink.ErrTableLost) {
			return refused, err
		}
		if repairs > maxRepairs {
			fatal := fmt.Errorf("%w: the evaluations table was recreated %d times and is missing again: %v", errFatal, maxRepairs, err)
			r.log.ErrorContext(ctx, "the evaluations table keeps disappearing; stopping", "error", fatal)
			r.stopWith(fatal)
			return nil, fatal
		}
		r.log.WarnContext(ctx, "clickhouse database or table is missing; recreating it and refilling it from EVALUATIONS", "error", err, "repair", repairs)
		if err := r.keep.RefillLost(ctx); err != nil {
			return nil, err
		}
	}
}

// writeRows stores recs through the sink: the refused ones by their place in recs. A table that
// refuses every evaluation stops the ranker. It returns sink.ErrTableLost when the table is
// missing.
func (r *ranker) writeRows(ctx context.Context, recs []rank.Record) (map[int]error, error) {
	refused, err := r.sink.Write(ctx, recs)
	if errors.Is(err, chstore.ErrTableMismatch) {
		fatal := fmt.Errorf("%w: it refuses every evaluation: %v; fix the table or recreate it with `ranker migrate`", errFatal, err)
		r.log.ErrorContext(ctx, "clickhouse refuses every evaluation; stopping", "error", fatal)
		r.stopWith(fatal)
		return nil, fatal
	}
	if err != nil {
		return nil, err
	}
	return refused, nil
}

// deadLetterRefused dead-letters the messages of refused evaluations (by their place in b.recs)
// with what ClickHouse said, and returns the batch without them.
func (r *ranker) deadLetterRefused(b batch, refused map[int]error, outcomes []settle.Outcome) batch {
	kept := batch{recs: b.recs[:0:0], links: b.links}
	moved := make([]int, len(b.recs)) // a kept record's place in kept.recs
	for j, rec := range b.recs {
		if refused[j] == nil {
			moved[j] = len(kept.recs)
			kept.recs = append(kept.recs, rec)
		}
	}
	for k, i := range b.keep {
		err := refused[b.recOf[k]]
		if err == nil {
			kept.keep, kept.recOf = append(kept.keep, i), append(kept.recOf, moved[b.recOf[k]])
			continue
		}
		r.m.events.WithLabelValues("dead_lettered").Inc()
		r.m.clickhouseErrors.WithLabelValues("refused").Inc()
		outcomes[i] = settle.Reject("clickhouse refused the evaluation: " + strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return kept
}
