package ranker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/rank"
)

// How a batch gets into ClickHouse, whatever ClickHouse says (rank.FaultOf sorts its errors):
//   - transient faults (down, busy, a lost quorum) are retried with the shared backoff for as
//     long as they last, the batch kept in progress and /readyz failing meanwhile;
//   - a missing database or table (dropped by an operator) is recreated from the migrations and
//     refilled from the EVALUATIONS stream (lineage.go), unready meanwhile, then the batch is
//     written again;
//   - rows the table refuses: if the table is not what the migrations made (a column dropped or
//     retyped by hand), it would refuse every row, so the ranker stops with an error naming the
//     difference (unready, exit 1, the batch given back for redelivery after the fix); if it is,
//     the batch is split until each refused evaluation is found, and those are dead-lettered
//     with ClickHouse's error as Dead-Reason while the rest are stored.

// errFatal marks a fault the ranker cannot mend by itself.
var errFatal = errors.New("ranker: clickhouse fault")

// maxRepairs bounds how often in a row a missing table is recreated for one batch.
const maxRepairs = 3

// refusal is an insert the table refused for what the rows hold or for how the table is.
type refusal struct{ err error }

func (e *refusal) Error() string { return "clickhouse refused the rows: " + e.err.Error() }
func (e *refusal) Unwrap() error { return e.err }

// A quorum insert refused because another one is still being confirmed is retried after a
// short wait that doubles up to quorumBusyMax (each try sends the batch again), for about
// quorumBusyFor, before it counts as a quorum failure.
const (
	quorumBusyFirst = 10 * time.Millisecond
	quorumBusyMax   = 320 * time.Millisecond
	quorumBusyFor   = 3 * time.Second
)

// insert writes recs, retrying with the shared backoff while ClickHouse is unavailable (the
// caller keeps the messages in progress meanwhile). It returns ctx's error when ctx ends first,
// a *refusal when the table refuses the rows, and errTableLost when the table is missing.
func (r *ranker) insert(ctx context.Context, recs []rank.Record) error {
	var busySince time.Time
	busyWait := quorumBusyFirst
	for attempt := uint64(1); ; attempt++ {
		start := time.Now()
		err := r.store.Insert(ctx, recs)
		if rank.IsQuorumBusy(err) && (busySince.IsZero() || time.Since(busySince) < quorumBusyFor) {
			// ClickHouse confirms one quorum insert at a time across the cluster, so rankers
			// writing together take turns: wait for the other's confirmation briefly (jittered,
			// so two rankers do not retry in step) instead of backing off for seconds.
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
			tracing.Observe(ctx, r.m.insertDuration, time.Since(start).Seconds())
			r.m.batchSize.Observe(float64(len(recs)))
			if r.writes.Holds() {
				r.log.InfoContext(ctx, "clickhouse insert recovered", "attempts", attempt)
			}
			return nil
		}
		if rank.FaultOf(err) == rank.Missing {
			return errorOf(err) // the caller refills the table (lineage.go)
		}
		r.m.clickhouseErrors.WithLabelValues("insert").Inc()
		delay := retry.Redelivery().Backoff(attempt)
		if rank.FaultOf(err) == rank.Refused {
			r.writes.Fail("inserts are failing")
			return &refusal{err}
		}
		switch {
		case rank.IsQuorumError(err):
			r.writes.Fail("inserts wait for a quorum of ClickHouse replicas; evaluations are held, not lost")
		case rank.NoSpace(err):
			r.writes.Fail("inserts are failing: ClickHouse has no disk space left; evaluations are held, not lost")
		default:
			r.writes.Fail("inserts are failing")
		}
		if rank.IsQuorumError(err) {
			// The rows may already be on some replicas; they count once the quorum has them, and
			// the retry is harmless (block deduplication, and reads collapse copies of an id).
			r.m.quorumFailures.Inc()
			r.log.WarnContext(ctx, "clickhouse replicas did not confirm the insert; holding the batch unacknowledged", "rows", len(recs), "attempt", attempt, "retry_in", delay.String(), "error", err)
		} else {
			r.log.WarnContext(ctx, "clickhouse insert failed, will retry", "rows", len(recs), "attempt", attempt, "retry_in", delay.String(), "error", err)
		}
		if retry.Sleep(ctx, delay) != nil {
			return ctx.Err()
		}
	}
}

// stopWith turns the ranker unready for good and stops its consumer with err as its exit error.
func (r *ranker) stopWith(err error) {
	r.writes.Fatal(errors.New("stopped: clickhouse refuses every evaluation (see the error log)"))
	if r.fail != nil {
		r.fail(err)
	}
}

// write stores the recs of a commit (see the top of this file), refilling the table from the
// stream when it is missing. It returns the evaluations ClickHouse refused, by event id with its
// error, when the others are stored; an error when nothing was settled: ctx ended, or a fault
// stopped the ranker.
func (r *ranker) write(ctx context.Context, recs []rank.Record) (map[string]error, error) {
	for repairs := 1; ; repairs++ {
		refused, err := r.writeRows(ctx, recs)
		if !errors.Is(err, errTableLost) {
			return refused, err
		}
		if repairs > maxRepairs {
			fatal := fmt.Errorf("%w: the evaluations table was recreated %d times and is missing again: %v", errFatal, maxRepairs, err)
			r.log.ErrorContext(ctx, "the evaluations table keeps disappearing; stopping", "error", fatal)
			r.stopWith(fatal)
			return nil, fatal
		}
		r.log.WarnContext(ctx, "clickhouse database or table is missing; recreating it and refilling it from EVALUATIONS", "error", err, "repair", repairs)
		if err := r.refill(ctx, refillPlan{why: "the evaluations table is missing", repair: true}); err != nil {
			return nil, err
		}
	}
}

// writeRows stores recs, or finds those the table refuses. It returns errTableLost when the table
// is missing.
func (r *ranker) writeRows(ctx context.Context, recs []rank.Record) (map[string]error, error) {
	err := r.insert(ctx, recs)
	var ref *refusal
	if err == nil || !errors.As(err, &ref) {
		if errors.Is(err, errFatal) {
			r.stopWith(err)
		}
		return nil, err
	}
	if terr := r.store.CheckTable(ctx); terr != nil {
		if !errors.Is(terr, rank.ErrTableMismatch) {
			return nil, fmt.Errorf("check the table after a refusal: %w", terr) // ClickHouse went away: retry later
		}
		fatal := fmt.Errorf("%w: it refuses every evaluation: %v (the insert said: %v); fix the table or recreate it with `ranker migrate`", errFatal, terr, ref.err)
		r.log.ErrorContext(ctx, "clickhouse refuses every evaluation; stopping", "error", fatal)
		r.stopWith(fatal)
		return nil, fatal
	}
	refused := map[string]error{}
	if err := r.split(ctx, recs, ref.err, refused); err != nil {
		return nil, err
	}
	return refused, nil
}

// split finds which of recs the table refuses (it refused them all with err) by writing halves.
func (r *ranker) split(ctx context.Context, recs []rank.Record, err error, refused map[string]error) error {
	if len(recs) == 1 {
		refused[recs[0].EventID] = err
		return nil
	}
	half := len(recs) / 2
	for _, part := range [][]rank.Record{recs[:half], recs[half:]} {
		err := r.insert(ctx, part)
		var ref *refusal
		switch {
		case err == nil:
		case errors.As(err, &ref):
			if err := r.split(ctx, part, ref.err, refused); err != nil {
				return err
			}
		default:
			return err
		}
	}
	return nil
}

// deadLetterRefused dead-letters the messages of refused evaluations with what ClickHouse said,
// and returns the batch without them.
func (r *ranker) deadLetterRefused(b batch, refused map[string]error, outcomes []settle.Outcome) batch {
	kept := batch{recs: b.recs[:0:0], links: b.links}
	for _, rec := range b.recs {
		if refused[rec.EventID] == nil {
			kept.recs = append(kept.recs, rec)
		}
	}
	for k, i := range b.keep {
		err := refused[b.ids[k]]
		if err == nil {
			kept.keep, kept.ids = append(kept.keep, i), append(kept.ids, b.ids[k])
			continue
		}
		r.m.events.WithLabelValues("dead_lettered").Inc()
		r.m.clickhouseErrors.WithLabelValues("refused").Inc()
		outcomes[i] = settle.Reject("clickhouse refused the evaluation: " + strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return kept
}
