package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// A loss is named, never refilled over. The store holds the rows of every era since its lineage's
// floor (chstore.Lineage.Floor), but EVALUATIONS holds only its own stream's: the streams of the
// eras before were deleted, and their rows are kept nowhere else. When the table is lost (dropped,
// emptied, its database dropped) while it held such rows, a refill would make it whole for the
// stream there is now and call the store whole, and every later prompt would silently lack those
// evaluations. Instead the ranker:
//   - names the loss (events.StoreLoss: the lineage, the eras, the executions that had rows of
//     them, from their score snapshots and last boards) in its log, on its consumer
//     (events.MetaStoreLoss) and in /readyz;
//   - stays unready, refills nothing, commits nothing (batches are given back) and publishes that
//     the store is not whole, so composers compose nothing: requests wait and answer
//     inputs_not_ready;
//   - waits for an operator: a restore (`nats stream restore` of EVALUATIONS' backup, then the
//     check finds nothing lost) or `podium store accept-loss`, which records the loss with a reason
//     on AUDIT (events.SubjectLossAccepted). Once accepted the refill runs, and the new lineage's
//     floor is its own era.

// errLossHeld is a refill refused because it would hide a loss (loss.go).
var errLossHeld = errors.New("the store lost evaluations that no stream holds; waiting for an operator (`podium store accept-loss`, or a restore of EVALUATIONS)")

// lastLineage is the newest lineage known of the store: the store's own; else, when the store
// lost it (its database dropped), the one this ranker published, or the one its consumer carries
// (a ranker started after the loss). false when none is known.
func (r *ranker) lastLineage(ctx context.Context) (chstore.Lineage, bool, error) {
	lin, found, err := r.store.Lineage(ctx)
	if err != nil && chstore.FaultOf(err) != chstore.Missing {
		return chstore.Lineage{}, false, err
	}
	if found {
		return lin, true, nil
	}
	if pub := r.lineage.Load(); pub != nil && pub.Epoch > 0 {
		return *pub, true, nil
	}
	return r.consumerLineage(ctx)
}

// consumerLineage is the lineage the ranker's consumer carries (its metadata), as a lineage:
// epoch, stream, era, floor and anchor; false when it carries none.
func (r *ranker) consumerLineage(ctx context.Context) (chstore.Lineage, bool, error) {
	cons, err := r.js.Consumer(ctx, events.StreamEvaluations, events.ConsumerRanker)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return chstore.Lineage{}, false, nil
	}
	if err != nil {
		return chstore.Lineage{}, false, fmt.Errorf("the ranker's consumer: %w", err)
	}
	md := cons.CachedInfo().Config.Metadata
	lin, ok := parseLineage(md[events.MetaStoreLineage])
	if !ok {
		return chstore.Lineage{}, false, nil
	}
	era, _ := strconv.ParseUint(md[events.MetaStoreEra], 10, 32)
	floor, err := strconv.ParseUint(md[events.MetaStoreFloor], 10, 32)
	if err != nil {
		floor = 0 // a ranker before floors: every era since the first
	}
	lin.Era, lin.Floor, lin.Whole = uint32(era), uint32(floor), true
	if a := md[events.MetaStoreAnchor]; a != "" {
		lin.Anchor, _ = chstore.ParseRowKey(a)
	}
	return lin, true, nil
}

// parseLineage reads a lineage's ID (epoch@stream).
func parseLineage(id string) (chstore.Lineage, bool) {
	epochText, stream, ok := strings.Cut(id, "@")
	epoch, err := strconv.ParseUint(epochText, 10, 64)
	if !ok || err != nil || epoch == 0 {
		return chstore.Lineage{}, false
	}
	return chstore.Lineage{Epoch: epoch, Stream: stream}, true
}

// lossOf is what a lost table lost when it was derived as lin and the stream there is now is
// stream: nil when the stream holds everything the table held.
func (r *ranker) lossOf(ctx context.Context, lin chstore.Lineage, stream string) (*events.StoreLoss, error) {
	from, to, lost := lin.LostEras(stream)
	if !lost {
		return nil, nil
	}
	l := &events.StoreLoss{Lineage: lin.ID(), FromEra: from, ToEra: to, Executions: []string{}}
	// The executions are named from what was derived from the table: each execution's score
	// snapshot (SCORES) holds every stored copy with its era, and its last board (LEADERBOARDS)
	// the era of the newest evaluation it counted (an execution too large for a snapshot).
	_, err := streamscan.Scan(ctx, r.js, "KV_"+events.BucketScores, "$KV."+events.BucketScores+".>", 0, func(m jetstream.Msg) error {
		if ev, _, err := rank.ParseSnapshot(m.Data()); err == nil && ev.HoldsEras(from, to) {
			l.Executions = append(l.Executions, strings.TrimPrefix(m.Subject(), "$KV."+events.BucketScores+"."))
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("name the executions lost: %w", err)
	}
	_, err = streamscan.Scan(ctx, r.js, events.StreamLeaderboards, events.TypeLeaderboardUpdated+".>", 0, func(m jetstream.Msg) error {
		var env events.Envelope
		var lu events.LeaderboardUpdated
		if json.Unmarshal(m.Data(), &env) != nil || json.Unmarshal(env.Data, &lu) != nil {
			return nil // not a board this ranker announced: nothing to name
		}
		if lu.EvaluationsEra >= from && lu.EvaluationsEra <= to && len(lu.Leaderboard) > 0 {
			l.Executions = append(l.Executions, lu.ExecutionID)
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("name the executions lost: %w", err)
	}
	slices.Sort(l.Executions)
	l.Executions = slices.Compact(l.Executions)
	if n := len(l.Executions); n > events.StoreLossExecutions {
		l.Executions, l.MoreExecutions = l.Executions[:events.StoreLossExecutions], n-events.StoreLossExecutions
	}
	return l, nil
}

// lossText is a loss as the ranker names it.
func lossText(l events.StoreLoss) string {
	eras := fmt.Sprintf("era %d", l.FromEra)
	if l.ToEra != l.FromEra {
		eras = fmt.Sprintf("eras %d-%d", l.FromEra, l.ToEra)
	}
	execs := fmt.Sprint(l.Executions)
	if l.MoreExecutions > 0 {
		execs = fmt.Sprintf("%v and %d more", l.Executions, l.MoreExecutions)
	}
	return fmt.Sprintf("evaluations lost: the store (lineage %s) lost its table while it held the rows of %s, whose EVALUATIONS streams were deleted; executions that had them: %s; accept it with `podium store accept-loss --lineage %s`, or restore EVALUATIONS",
		l.Lineage, eras, execs, l.Lineage)
}

// accepted reports whether an operator accepted the loss of lineage (AUDIT's last accepted loss
// names it).
func (r *ranker) accepted(ctx context.Context, lineage string) (bool, error) {
	m, err := streamscan.LastOn(ctx, r.nc, events.StreamAudit, events.SubjectLossAccepted)
	if errors.Is(err, jetstream.ErrStreamNotFound) || m == nil && err == nil {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the accepted losses (%s): %w", events.StreamAudit, err)
	}
	var l events.StoreLoss
	if err := json.Unmarshal(m.Data(), &l); err != nil {
		return false, nil // not a record podium wrote: not an acceptance
	}
	return l.Lineage == lineage, nil
}

// lossResolved ends a loss the ranker waited on once a check found the store whole without a
// refill of its own (another replica refilled it after the acceptance, or the operator restored the
// table): ready again, and the loss no longer published.
func (r *ranker) lossResolved(ctx context.Context) {
	if r.loss.Swap(nil) == nil {
		return
	}
	r.log.Warn("the store's loss is resolved: the store is whole again (a restore, or another ranker's refill after the loss was accepted)")
	r.whole.Holds()
	if lin := r.lineage.Load(); lin != nil {
		if err := r.publishLineage(ctx, *lin, ""); err != nil {
			r.log.Warn("the store's state not published; the next check publishes it", "error", err)
		}
	}
}

// checkLoss runs before a refill of a lost table: nil when nothing is lost or the loss was
// accepted (accepted true: the refill's lineage starts its own floor); errLossHeld, with the
// ranker unready and the loss named, while it waits for an operator.
func (r *ranker) checkLoss(ctx context.Context, stream string) (accepted bool, err error) {
	last, known, err := r.lastLineage(ctx)
	if err != nil {
		return false, err // not known: a loss held stays held
	}
	if !known {
		r.loss.Store(nil)
		return false, nil
	}
	// A table that still holds the lineage's anchor lost nothing (only store_lineage went, say):
	// its check adopts it as it is.
	if last.Anchor != (chstore.RowKey{}) {
		if held, err := r.store.Holds(ctx, last.Anchor); err == nil && held {
			r.loss.Store(nil)
			return false, nil
		}
	}
	l := r.loss.Load()
	if l == nil || l.Lineage != last.ID() { // named once per lineage: its scans are not made again
		if l, err = r.lossOf(ctx, last, stream); err != nil {
			return false, err
		}
	}
	if l == nil {
		r.loss.Store(nil)
		return false, nil
	}
	ok, err := r.accepted(ctx, l.Lineage)
	if err != nil {
		return false, err
	}
	if ok {
		r.loss.Store(nil)
		r.log.Warn("the store's loss was accepted by an operator; refilling from the stream there is now", "lineage", l.Lineage, "from_era", l.FromEra, "to_era", l.ToEra)
		return true, nil
	}
	why := lossText(*l)
	if was := r.loss.Swap(l); was == nil || was.Lineage != l.Lineage {
		r.log.Error("the store lost evaluations that no stream holds; unready, composing nothing, until an operator accepts the loss or restores EVALUATIONS",
			"lineage", l.Lineage, "from_era", l.FromEra, "to_era", l.ToEra, "executions", l.Executions)
	}
	r.whole.Fail("%s", why)
	if err := r.publishLineage(ctx, last, why); err != nil {
		r.log.Warn("the loss not published on the ranker's consumer; trying again", "error", err)
	}
	return false, fmt.Errorf("%w: %s", errLossHeld, why)
}
