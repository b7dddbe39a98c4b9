// Package sink is how a service writes batches into a ClickHouse table that is a view of a stream
// (the ranker's evaluations, the archiver's prompts), whatever ClickHouse says (chstore.FaultOf sorts
// its errors):
//   - transient faults (down, busy, a lost quorum, no disk space) are retried with the shared
//     backoff for as long as they last, the batch kept in progress by the runtime and the
//     "clickhouse" condition failing meanwhile, naming the fault;
//   - a missing database or table (dropped by an operator) is ErrTableLost: the caller fills the
//     table again from its stream, then writes the batch again;
//   - rows the table refuses are the one difference between sinks (Refusals): the ranker's are
//     found and dead-lettered (Split), the archiver's held until the table takes them (Hold).
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/tracing"
)

// ErrTableLost is a write that found the database or the table missing.
var ErrTableLost = errors.New("sink: the table is missing")

// Refusals is what a sink does with rows the table refuses.
type Refusals int

const (
	// Split finds which rows the table refuses by writing halves of the batch: the others are
	// stored, and Write returns the refused ones for the caller to dead-letter. A table that
	// refuses rows is checked first (Writer.CheckTable): one that is not what the migrations made
	// would refuse every row.
	Split Refusals = iota
	// Hold keeps the batch and tries it again with the backoff, the condition failing with
	// ClickHouse's refusal, until the table takes it (fixed, or dropped and filled again): a row
	// the stream's readers need is never given up.
	Hold
)

// Metrics are a sink's series (QuorumFailures may be nil).
type Metrics struct {
	BatchSize      prometheus.Histogram
	InsertDuration prometheus.Histogram   // with the trace as exemplar, where there is one
	Errors         *prometheus.CounterVec // by kind: insert, refused
	QuorumFailures prometheus.Counter
}

// NewMetrics declares a writer's series under f's namespace (the service's name):
// batch_size and insert_duration_seconds. Errors is the service's clickhouse_errors_total, in
// which other parts count other kinds.
func NewMetrics(f series.Factory, errors *prometheus.CounterVec) Metrics {
	return Metrics{
		BatchSize:      f.Histogram("batch_size", "Rows written per ClickHouse insert (the ranker's evaluations, the archiver's prompt records).", series.Doubling(1, 14)),
		InsertDuration: f.Histogram("insert_duration_seconds", "Latency of one successful ClickHouse insert of a batch.", series.Doubling(0.0005, 16)),
		Errors:         errors,
	}
}

// Writer writes batches of R.
type Writer[R any] struct {
	// Rows and Table name what is written, for the condition and the logs ("evaluations", "the
	// evaluations table").
	Rows, Table string
	Insert      func(ctx context.Context, rows []R) error
	Refusals    Refusals
	// CheckTable (Split) says whether the table is what the migrations made; an error wrapping
	// chstore.ErrTableMismatch when it is not.
	CheckTable func(ctx context.Context) error
	// Writes is the "clickhouse" condition: it fails while writes fail.
	Writes  *health.Condition
	Log     *slog.Logger
	Metrics Metrics
}

// A quorum insert refused because another one is still being confirmed is retried after a short
// wait that doubles up to quorumBusyMax (each try sends the batch again), for about
// quorumBusyFor, before it counts as a quorum failure.
const (
	quorumBusyFirst = 10 * time.Millisecond
	quorumBusyMax   = 320 * time.Millisecond
	quorumBusyFor   = 3 * time.Second
)

// refusal is an insert the table refused for what the rows hold or for how the table is.
type refusal struct{ err error }

func (e *refusal) Error() string { return "clickhouse refused the rows: " + e.err.Error() }
func (e *refusal) Unwrap() error { return e.err }

// Write stores rows. It returns nil once they are stored; with Split, the refused rows by index
// with ClickHouse's error, once the others are stored; ErrTableLost when the table is missing; an
// error wrapping chstore.ErrTableMismatch when the table refuses every row (Split); ctx's error when
// ctx ends first.
func (w *Writer[R]) Write(ctx context.Context, rows []R) (map[int]error, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	err := w.insert(ctx, rows)
	var ref *refusal
	if err == nil || !errors.As(err, &ref) {
		return nil, err
	}
	if err := w.CheckTable(ctx); err != nil {
		if errors.Is(err, chstore.ErrTableMismatch) {
			return nil, fmt.Errorf("%w (the insert said: %v)", err, ref.err)
		}
		return nil, fmt.Errorf("check the table after a refusal: %w", err) // ClickHouse went away: retry later
	}
	refused := map[int]error{}
	idx := make([]int, len(rows))
	for i := range idx {
		idx[i] = i
	}
	if err := w.split(ctx, rows, idx, ref.err, refused); err != nil {
		return nil, err
	}
	// Every row is settled: stored, or found refused (the caller's to dead-letter). The table
	// takes what it can, though a batch of refused rows alone inserted nothing.
	w.Writes.Holds()
	return refused, nil
}

// split finds which of rows (their indexes in the batch: idx) the table refuses, by writing
// halves; it refused them all with err.
func (w *Writer[R]) split(ctx context.Context, rows []R, idx []int, err error, refused map[int]error) error {
	if len(rows) == 1 {
		refused[idx[0]] = err
		return nil
	}
	half := len(rows) / 2
	for _, part := range [][2]int{{0, half}, {half, len(rows)}} {
		err := w.insert(ctx, rows[part[0]:part[1]])
		var ref *refusal
		switch {
		case err == nil:
		case errors.As(err, &ref):
			if err := w.split(ctx, rows[part[0]:part[1]], idx[part[0]:part[1]], ref.err, refused); err != nil {
				return err
			}
		default:
			return err
		}
	}
	return nil
}

// insert writes rows, retrying transient faults (see the top of this file). It returns ctx's error
// when ctx ends first, ErrTableLost when the table is missing, and with Split a *refusal when the
// table refuses the rows.
func (w *Writer[R]) insert(ctx context.Context, rows []R) error {
	var busySince time.Time
	busyWait := quorumBusyFirst
	for attempt := uint64(1); ; attempt++ {
		start := time.Now()
		err := w.Insert(ctx, rows)
		if chstore.IsQuorumBusy(err) && (busySince.IsZero() || time.Since(busySince) < quorumBusyFor) {
			// ClickHouse confirms one quorum insert at a time across the cluster, so writers
			// writing together take turns: wait for the other's confirmation briefly (jittered,
			// so two do not retry in step) instead of backing off for seconds.
			if busySince.IsZero() {
				busySince = start
			}
			attempt--
			if retry.Sleep(ctx, busyWait/2+rand.N(busyWait)) != nil {
				return ctx.Err()
			}
			busyWait = min(2*busyWait, quorumBusyMax)
			continue
		}
		busySince, busyWait = time.Time{}, quorumBusyFirst
		if err == nil {
			tracing.Observe(ctx, w.Metrics.InsertDuration, time.Since(start).Seconds())
			w.Metrics.BatchSize.Observe(float64(len(rows)))
			if w.Writes.Holds() {
				w.Log.InfoContext(ctx, "clickhouse insert recovered", "attempts", attempt)
			}
			return nil
		}
		fault := chstore.FaultOf(err)
		if fault == chstore.Missing {
			return fmt.Errorf("%w: %v", ErrTableLost, err)
		}
		delay := retry.Redelivery().Backoff(attempt)
		switch {
		case fault == chstore.Refused && w.Refusals == Split:
			w.Writes.Fail("inserts are failing")
			w.Metrics.Errors.WithLabelValues("insert").Inc()
			return &refusal{err}
		case fault == chstore.Refused:
			w.Writes.Fail("clickhouse refuses the %s (%s is not what the migrations made); they are held, not lost: %s", w.Rows, w.Table, strings.ReplaceAll(err.Error(), "\n", " "))
			w.Metrics.Errors.WithLabelValues("refused").Inc()
			w.Log.ErrorContext(ctx, "clickhouse refuses the "+w.Rows+": "+w.Table+" is not what the migrations made (fix it, or drop it: it is made again and filled from the stream); they are held",
				"rows", len(rows), "attempt", attempt, "retry_in", delay.String(), "error", err)
		case chstore.IsQuorumError(err):
			// The rows may already be on some replicas; they count once the quorum has them, and
			// the retry is harmless (block deduplication, and reads collapse copies of an id).
			w.Writes.Fail("inserts wait for a quorum of ClickHouse replicas; %s are held, not lost", w.Rows)
			w.Metrics.Errors.WithLabelValues("insert").Inc()
			if w.Metrics.QuorumFailures != nil {
				w.Metrics.QuorumFailures.Inc()
			}
			w.Log.WarnContext(ctx, "clickhouse replicas did not confirm the insert; holding the batch unacknowledged", "rows", len(rows), "attempt", attempt, "retry_in", delay.String(), "error", err)
		case chstore.NoSpace(err):
			w.Writes.Fail("inserts into %s are failing: ClickHouse has no disk space left; %s are held, not lost", w.Table, w.Rows)
			w.Metrics.Errors.WithLabelValues("insert").Inc()
			w.Log.WarnContext(ctx, "clickhouse insert failed, will retry", "rows", len(rows), "attempt", attempt, "retry_in", delay.String(), "error", err)
		default:
			w.Writes.Fail("inserts into %s are failing; %s are held, not lost", w.Table, w.Rows)
			w.Metrics.Errors.WithLabelValues("insert").Inc()
			w.Log.WarnContext(ctx, "clickhouse insert failed, will retry", "rows", len(rows), "attempt", attempt, "retry_in", delay.String(), "error", err)
		}
		if retry.Sleep(ctx, delay) != nil {
			return ctx.Err()
		}
	}
}
