package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// A loss is named, never refilled over. A table holds the rows of every era since its lineage's
// floor (chstore.Lineage.Floor), but its stream holds only its own: the streams of the eras before
// were deleted, and their rows are kept nowhere else. When the table is lost (dropped, emptied,
// its database dropped) while it held such rows, a refill would make it whole for the stream
// there is now and call it whole, and every later read would silently lack those rows. Instead
// the keeper:
//   - names the loss (events.StoreLoss, from the service's Losses) in its log, on its consumer
//     (State.Loss) and in /readyz;
//   - stays unready, refills nothing, and publishes that the table is not whole; the service
//     commits nothing meanwhile (Loss), so readers wait;
//   - waits for an operator: a restore (the stream's backup, then the check finds nothing lost)
//     or an acceptance (Losses.Accepted, `podium store accept-loss`). Once accepted the refill
//     runs, and the new lineage's floor is its own era.

// ErrLossHeld is a refill refused because it would hide a loss.
var ErrLossHeld = errors.New("the table lost rows that no stream holds; waiting for an operator (`podium store accept-loss`, or a restore of the stream)")

// AcceptedOn reports whether an operator accepted the loss of lineage: the last accepted loss on
// AUDIT's subject names it (`podium store accept-loss` records it there). A Losses' Accepted.
func AcceptedOn(ctx context.Context, nc *nats.Conn, subject, lineage string) (bool, error) {
	m, err := streamscan.LastOn(ctx, nc, events.StreamAudit, subject)
	if errors.Is(err, jetstream.ErrStreamNotFound) || m == nil && err == nil {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the accepted losses (%s, %s): %w", events.StreamAudit, subject, err)
	}
	var l events.StoreLoss
	if err := json.Unmarshal(m.Data(), &l); err != nil {
		return false, nil // not a record podium wrote: not an acceptance
	}
	return l.Lineage == lineage, nil
}

// ErasText names the eras of a loss: "era 3", "eras 1-3".
func ErasText(l events.StoreLoss) string {
	if l.ToEra != l.FromEra {
		return fmt.Sprintf("eras %d-%d", l.FromEra, l.ToEra)
	}
	return fmt.Sprintf("era %d", l.FromEra)
}

// lastLineage is the newest lineage known of the table: its own; else, when the store lost it
// (its database dropped), the one this keeper published, or the one its consumer carries (a
// service started after the loss). false when none is known.
func (k *Keeper[R]) lastLineage(ctx context.Context) (chstore.Lineage, bool, error) {
	lin, found, err := k.cfg.Table.Lineage(ctx)
	if err != nil && chstore.FaultOf(err) != chstore.Missing {
		return chstore.Lineage{}, false, err
	}
	if found {
		return lin, true, nil
	}
	if pub := k.published.Load(); pub != nil && pub.Epoch > 0 {
		return *pub, true, nil
	}
	return k.consumerLineage(ctx)
}

// checkLoss runs before a refill of a lost table: nil when nothing is lost or the loss was
// accepted (accepted true); ErrLossHeld, with the service unready and the loss named, while it
// waits for an operator.
func (k *Keeper[R]) checkLoss(ctx context.Context, stream string) (accepted bool, err error) {
	if k.cfg.Losses == nil {
		return false, nil
	}
	last, known, err := k.lastLineage(ctx)
	if err != nil {
		return false, err // not known: a loss held stays held
	}
	if !known {
		k.loss.Store(nil)
		return false, nil
	}
	// A table that still holds the lineage's anchor lost nothing (only its lineage went, say).
	if last.Anchor != (chstore.RowKey{}) {
		if held, err := k.cfg.Table.Holds(ctx, last.Anchor); err == nil && held {
			k.loss.Store(nil)
			return false, nil
		}
	}
	l := k.loss.Load()
	if l == nil || l.Lineage != last.ID() { // named once per lineage: its scans are not made again
		if l, err = k.cfg.Losses.Of(ctx, last, stream); err != nil {
			return false, err
		}
	}
	if l == nil {
		k.loss.Store(nil)
		return false, nil
	}
	ok, err := k.cfg.Losses.Accepted(ctx, l.Lineage)
	if err != nil {
		return false, err
	}
	if ok {
		k.loss.Store(nil)
		k.cfg.Log.Warn("the loss was accepted by an operator; refilling from the stream there is now", "table", k.cfg.View.What, "lineage", l.Lineage, "from_era", l.FromEra, "to_era", l.ToEra)
		return true, nil
	}
	why := k.cfg.Losses.Text(*l)
	if was := k.loss.Swap(l); was == nil || was.Lineage != l.Lineage {
		k.cfg.Log.Error("the table lost rows that no stream holds; unready, committing nothing, until an operator accepts the loss or restores the stream",
			"table", k.cfg.View.What, "lineage", l.Lineage, "from_era", l.FromEra, "to_era", l.ToEra, "executions", l.Executions)
	}
	k.cfg.View.Whole.Fail("%s", why)
	if err := k.Publish(ctx, last, why); err != nil {
		k.cfg.Log.Warn("the loss not published on the consumer; trying again", "table", k.cfg.View.What, "error", err)
	}
	return false, fmt.Errorf("%w: %s", ErrLossHeld, why)
}

// lossResolved ends a loss the keeper waited on once a check found the table whole without a
// refill of its own (another replica refilled it after the acceptance, or the operator restored
// it): ready again, and the loss no longer published.
func (k *Keeper[R]) lossResolved(ctx context.Context) {
	if k.loss.Swap(nil) == nil {
		return
	}
	k.cfg.Log.Warn("the loss is resolved: the table is whole again (a restore, or another replica's refill after the loss was accepted)", "table", k.cfg.View.What)
	if lin := k.published.Load(); lin != nil {
		if err := k.Publish(ctx, *lin, ""); err != nil {
			k.cfg.Log.Warn("the state not published; the next check publishes it", "table", k.cfg.View.What, "error", err)
		}
	}
}
