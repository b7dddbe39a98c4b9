package inputs

import (
	"context"
	"errors"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// A refill rewrites the table composers read (chstore.ProbeFresh says how they stay out of it): every
// ClickHouse read here starts only while the newest commit probe started less than
// chstore.ProbeFresh ago and saw no refill, and probes again otherwise.
//
// Before this gate, a composer whose probe preceded the ranker's publish and whose read followed
// the table's recreation read an empty table and composed two prompts with an empty board (the
// chaos soak, seed 1795628557958354139).

// gate is the store reads, each started only as the rule above allows.
type gate struct {
	store Store
	// anchored is store's reads anchored on a row (chstore.Store.Anchored): each fails unless it
	// finds the lineage's anchor row in the same query, so a table emptied under the composer
	// (TRUNCATE) is never read short. Nil: reads are not anchored.
	anchored func(chstore.RowKey) Store
	probes   *probes
	l        *lineage
	now      func() time.Time
}

// admit returns nil when a store read may start now, or why not (inputs_not_ready, retryable).
func (g gate) admit(ctx context.Context) error {
	why, probed := g.l.refillSince()
	if g.now().Sub(probed) >= chstore.ProbeFresh {
		if _, err := g.probes.join(ctx); err != nil {
			return err
		}
		why, _ = g.l.refillSince()
	}
	if why != "" {
		return &events.Failure{Code: events.CodeInputsNotReady, Retryable: true,
			Message: "the ranker is refilling ClickHouse from EVALUATIONS (" + why + ")"}
	}
	return nil
}

// reads is the store to read now: anchored on the lineage's anchor row where one is known.
func (g gate) reads() Store {
	if k, ok := g.l.anchored(); ok && g.anchored != nil {
		return g.anchored(k)
	}
	return g.store
}

// lost turns an anchored read that did not find its anchor into inputs_not_ready: the ranker
// refills the table (its own reads find the anchor gone too), and the request waits for it.
func lost(err error) error {
	if errors.Is(err, chstore.ErrAnchorLost) {
		return &events.Failure{Code: events.CodeInputsNotReady, Retryable: true, Message: err.Error()}
	}
	return err
}

func (g gate) Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error) {
	if err := g.admit(ctx); err != nil {
		return nil, err
	}
	evs, err := g.reads().Scores(ctx, executionIDs)
	return evs, lost(err)
}

func (g gate) Contents(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error) {
	if err := g.admit(ctx); err != nil {
		return nil, err
	}
	cs, err := g.reads().Contents(ctx, keys, fromRound, beforeRound)
	return cs, lost(err)
}
