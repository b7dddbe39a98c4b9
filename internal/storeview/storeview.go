// Package storeview is what a reader outside the services (the podium CLI, the console) needs to
// trust a read of the ranker's store: the store is a view of the EVALUATIONS stream, and while the
// ranker refills it a read sees part of the rows, or none. The ranker publishes on its consumer
// that it refills (events.MetaStoreRefilling), then waits chstore.RefillGrace before it touches
// the table, and names the store's lineage (events.MetaStoreLineage), which every refill changes.
// A reader therefore looks before it reads (Begin: no refill) and after (End: still none, and the
// same lineage): a refill that touched the table while it read shows in either, and the read is
// refused as partial rather than shown, exported or verified as if whole.
//
// The reads themselves go through the store's own view (chstore.View): its lineage whole, each
// read anchored on the lineage's anchor row in the same query, the lineage the same after. So a
// table emptied or made again by hand, which the ranker has not noticed yet and which changes
// nothing it published, is refused too, instead of read as a short board.
package storeview

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
)

// state is the store as the ranker published it.
type state struct {
	known     bool // a ranker consumer exists
	lineage   string
	refilling string
}

func read(ctx context.Context, js jetstream.JetStream) (state, error) {
	cons, err := js.Consumer(ctx, events.StreamEvaluations, events.ConsumerRanker)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return state{}, nil // no evaluation to read
	}
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// Without the consumer nothing says whether a refill runs (a ranker makes it again, with
		// its state, only after a loss): unknown, unless no evaluation was ever accepted.
		st, serr := js.Stream(ctx, events.StreamEvaluations)
		if serr == nil && st.CachedInfo().State.Msgs == 0 {
			return state{}, nil
		}
		return state{}, errors.New("the ranker's consumer on " + events.StreamEvaluations + " is missing, so whether it refills its store is unknown: start the ranker (it makes the consumer again), then read")
	}
	if err != nil {
		return state{}, fmt.Errorf("the ranker's state of its store (its consumer on %s): %w", events.StreamEvaluations, err)
	}
	md := cons.CachedInfo().Config.Metadata
	return state{known: true, lineage: md[events.MetaStoreLineage], refilling: md[events.MetaStoreRefilling]}, nil
}

// RefillingError is a read refused because the ranker refills its store.
type RefillingError struct{ Why string }

func (e *RefillingError) Error() string {
	return "the ranker is refilling its store from EVALUATIONS (" + e.Why + "): what it holds now is partial; try again once the ranker is ready"
}

// Store begins the store's own view (a *chstore.Store).
type Store interface {
	Begin(ctx context.Context) (*chstore.View, error)
}

// Read is one reader's view of the store, from Begin to End: its reads are the view's.
type Read struct {
	*chstore.View
	js     jetstream.JetStream
	before state
}

// Begin looks at the store before reading it: a *RefillingError while the ranker refills it, a
// *chstore.NotWholeError while the store says it is not whole.
func Begin(ctx context.Context, js jetstream.JetStream, st Store) (*Read, error) {
	s, err := read(ctx, js)
	if err != nil {
		return nil, err
	}
	if s.refilling != "" {
		return nil, &RefillingError{Why: s.refilling}
	}
	v, err := st.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &Read{View: v, js: js, before: s}, nil
}

// End looks again after reading: nil when the store was the same whole view throughout, else an
// error saying the read may be partial.
func (r *Read) End(ctx context.Context) error {
	s, err := read(ctx, r.js)
	switch {
	case err != nil:
		return err
	case s.refilling != "":
		return &RefillingError{Why: s.refilling}
	case s != r.before:
		return fmt.Errorf("the ranker's store changed while it was read (lineage %q, now %q: refilled or rebuilt meanwhile): what was read may be partial; try again", r.before.lineage, s.lineage)
	}
	return r.Confirm(ctx)
}
