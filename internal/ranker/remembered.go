package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// When the store lost its lineage (its database dropped), the keeper asks what else remembers it
// (sink.Config.Published): the ranker's consumer, whose metadata carries it. When the consumer is
// gone too (deleted, or with EVALUATIONS), what was derived from the store still remembers enough
// for eras never to go back and a loss to be named: every score snapshot (SCORES) names the lineage
// it was read from (epoch@stream) and holds its execution's rows with their positions, and every
// board (LEADERBOARDS) the era it was announced in. The remembered lineage is the newest snapshot's
// (or, with boards alone, one of no known stream, whose era the stream there is now follows), in
// the newest era either names, its floor the oldest era a snapshot holds, anchored on the latest row
// a snapshot holds (which the store, had it lost nothing, would still hold).

// remembered is the lineage the ranker's consumer carries, else the one derived from SCORES and
// LEADERBOARDS; false when none remembers one.
func (r *ranker) remembered(ctx context.Context) (chstore.Lineage, bool, error) {
	lin, ok, err := sink.StoreKeys.ConsumerLineage(r.js, events.StreamEvaluations, events.ConsumerRanker)(ctx)
	if err != nil || ok {
		return lin, ok, err
	}
	return r.derived(ctx)
}

// derived is the lineage SCORES and LEADERBOARDS remember (see above); false when they hold none.
func (r *ranker) derived(ctx context.Context) (chstore.Lineage, bool, error) {
	var lin chstore.Lineage
	var first, last rank.Pos
	var anchor chstore.RowKey
	rows := false
	_, err := streamscan.Scan(ctx, r.js, "KV_"+events.BucketScores, "$KV."+events.BucketScores+".>", 0, func(m jetstream.Msg) error {
		ev, d, err := rank.ParseSnapshot(m.Data())
		if err != nil {
			return nil // a deleted key, or not a snapshot the ranker wrote
		}
		if named, ok := sink.ParseLineageID(d.Lineage); ok && named.Epoch > lin.Epoch {
			lin.Epoch, lin.Stream = named.Epoch, named.Stream
		}
		lo, hi, ok := ev.Span()
		if !ok {
			return nil
		}
		if !rows || lo.Pos.Compare(first) < 0 {
			first = lo.Pos
		}
		if !rows || hi.Pos.After(last) {
			last = hi.Pos
			anchor = chstore.RowKey{ExecutionID: strings.TrimPrefix(m.Subject(), "$KV."+events.BucketScores+"."), TeamID: hi.TeamID, EventID: hi.EventID, Pos: hi.Pos}
		}
		rows = true
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return chstore.Lineage{}, false, fmt.Errorf("read what SCORES remembers of the store: %w", err)
	}
	boards := false
	_, err = streamscan.Scan(ctx, r.js, events.StreamLeaderboards, events.TypeLeaderboardUpdated+".>", 0, func(m jetstream.Msg) error {
		var env events.Envelope
		var lu events.LeaderboardUpdated
		if json.Unmarshal(m.Data(), &env) != nil || json.Unmarshal(env.Data, &lu) != nil {
			return nil // not a board this ranker announced
		}
		lin.Era, boards = max(lin.Era, lu.EvaluationsEra), true
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return chstore.Lineage{}, false, fmt.Errorf("read what LEADERBOARDS remembers of the store: %w", err)
	}
	if !rows && !boards {
		return chstore.Lineage{}, false, nil
	}
	lin.Era, lin.Whole = max(lin.Era, last.Era), true
	lin.Floor = lin.Era
	if rows {
		lin.Floor, lin.Anchor = first.Era, anchor
	}
	if lin.Epoch == 0 {
		lin.Epoch = 1 // boards alone: a derivation of no known stream, before any a store notes
	}
	r.log.Warn("the store's lineage is remembered by nothing but what was derived from it (SCORES, LEADERBOARDS): its eras go on from there",
		"lineage", lin.ID(), "era", lin.Era, "floor", lin.Floor)
	return lin, true, nil
}
