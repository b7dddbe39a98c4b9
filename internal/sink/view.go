package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/panics"
	"github.com/podium-llm/podium/internal/retry"
)

// A table that is a view of a stream is kept whole the same way by the ranker (the evaluations
// table of EVALUATIONS) and the archiver (the prompts table of PROMPTS): by a Keeper (keeper.go).
// One vocabulary:
//   - lineage: what the table was derived from: the stream (by its creation time, which a
//     stream deleted and made again changes), its era, and a derivation (an epoch) that every
//     refill starts anew (chstore.Lineage, noted in the table's lineage table). It is published
//     on the service's consumer (its metadata, state.go), so what reads the table, or was derived
//     from it, can tell the table it speaks of;
//   - anchor: a row the table held, at its position (era, sequence), which a table dropped or
//     emptied has lost and a message sent again cannot fake;
//   - check: the table holds its anchor and the lineage names the stream there is now (check.go);
//   - refill: the table filled again from its stream (FillFrom), unready meanwhile (View.Refill),
//     then a new lineage noted and published (refill.go);
//   - loss: rows of streams deleted since, held by the table alone, lost with it: named and
//     waited on instead of refilled over (loss.go).

// ErrAgain is a try of a refill that is to be tried again at once, not after a backoff: another
// replica's refill took over, or finished, and the next try starts by waiting for it.
var ErrAgain = errors.New("sink: the refill is tried again")

// View refills a table from its stream, one try after another, until it is whole.
type View struct {
	// What names the table ("the store", "the prompts archive"), Stream its stream.
	What, Stream string
	// Whole is the condition that fails while the table is not whole: refilling, or a refill
	// that stopped.
	Whole *health.Condition
	Log   *slog.Logger
	// Begin and Done are the log lines of a refill that begins and of one that finished.
	Begin, Done string
	Metrics     ViewMetrics
}

// ViewMetrics are a view's series (the service's own names; Refilling may be nil).
type ViewMetrics struct {
	Refills   prometheus.Counter     // refills finished: the table whole again
	Refilling prometheus.Gauge       // 1 while a refill runs
	Errors    *prometheus.CounterVec // kind refill: a try that failed and starts over
	Repairs   prometheus.Counter     // the tables made again from the migrations (may be nil)
}

// Tried is what one try of a refill did.
type Tried struct {
	// Attrs are key-value pairs for the log line.
	Attrs []any
	// Adopted is a try that found the table made whole by another replica's refill, whose
	// lineage it took: not a refill of this one's, neither counted nor logged as one.
	Adopted bool
}

// Refill makes the table whole: it runs try (one try of the service's refill) until one returns
// nil, with the shared backoff between tries that fail (ErrAgain: at once; ErrBeforeInHand and
// ErrLossHeld end the refill, returned, to be checked again once commits went on or an operator
// acted), the Whole condition
// failing meanwhile with why, and a try that panics failing like any other (a driver that panics
// on a row must not crash the service, which would refill again at its start and crash again).
// It returns nil once the table is whole, or ctx's error.
func (v *View) Refill(ctx context.Context, why string, try func(ctx context.Context, attempt uint64) (Tried, error)) (err error) {
	start := time.Now()
	v.Whole.Fail("filling %s again from %s: %s", v.What, v.Stream, why)
	v.Log.WarnContext(ctx, v.Begin, "reason", why)
	defer func() {
		if err != nil {
			v.Whole.Fail("a refill of %s from %s stopped (%s): %v", v.What, v.Stream, why, err)
			return
		}
		v.Whole.Holds()
	}()
	if v.Metrics.Refilling != nil {
		v.Metrics.Refilling.Set(1)
		defer v.Metrics.Refilling.Set(0)
	}
	for attempt := uint64(1); ; attempt++ {
		var tried Tried
		var err error
		if p := panics.Catch(func() { tried, err = try(ctx, attempt) }); p != nil {
			v.Log.ErrorContext(ctx, "refill of "+v.What+" panicked", "panic", fmt.Sprint(p.Value), "stack", p.Stack)
			err = fmt.Errorf("the refill panicked: %v", p.Value)
		}
		if err == nil && !tried.Adopted {
			v.Metrics.Refills.Inc()
			v.Log.InfoContext(ctx, v.Done, append(tried.Attrs, "reason", why, "took", time.Since(start).Round(time.Millisecond).String())...)
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrAgain) {
			continue
		}
		if errors.Is(err, ErrBeforeInHand) || errors.Is(err, ErrLossHeld) {
			// Put off, not failed: what it waits for (a batch of the stream before, which needs
			// the commits the refill holds; an operator) comes from outside. The caller lets the
			// commits go and checks again.
			return err
		}
		delay := retry.Redelivery().Backoff(attempt)
		v.Metrics.Errors.WithLabelValues("refill").Inc()
		v.Log.WarnContext(ctx, "refill of "+v.What+" failed; starting over", "reason", why, "attempt", attempt, "retry_in", delay.String(), "error", err)
		if retry.Sleep(ctx, delay) != nil {
			return ctx.Err()
		}
	}
}
