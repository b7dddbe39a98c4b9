package ranker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// When the store lost its lineage (its database dropped) and the ranker's consumer lost the one it
// carried (deleted, or with EVALUATIONS), nothing says which stream the store was derived from,
// nor which eras it held. What was derived from the store still says which eras were used: every
// score snapshot (SCORES) holds its execution's rows with their positions, and every board
// (LEADERBOARDS) the era it was announced in. The lineage noted then takes the highest of those
// eras (sink.Config.EraFloor), so that positions never go back to era 0. What it cannot know is
// whether the stream there is now is that era's or one made since (its era would then be the
// next), nor what the lost table held: no loss is named (docs/operating.md, "Evaluations lost").

// eraFloor is the highest era SCORES' snapshots and LEADERBOARDS' boards name (0: none).
func (r *ranker) eraFloor(ctx context.Context) (uint32, error) {
	var era uint32
	_, err := streamscan.Scan(ctx, r.js, "KV_"+events.BucketScores, "$KV."+events.BucketScores+".>", 0, func(m jetstream.Msg) error {
		ev, _, err := rank.ParseSnapshot(m.Data())
		if err != nil {
			return nil // a deleted key, or not a snapshot the ranker wrote
		}
		if _, last, ok := ev.Span(); ok {
			era = max(era, last.Era)
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, fmt.Errorf("read the eras SCORES names: %w", err)
	}
	_, err = streamscan.Scan(ctx, r.js, events.StreamLeaderboards, events.TypeLeaderboardUpdated+".>", 0, func(m jetstream.Msg) error {
		var env events.Envelope
		var lu events.LeaderboardUpdated
		if json.Unmarshal(m.Data(), &env) == nil && json.Unmarshal(env.Data, &lu) == nil {
			era = max(era, lu.EvaluationsEra)
		}
		return nil
	})
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, fmt.Errorf("read the eras LEADERBOARDS names: %w", err)
	}
	if era > 0 {
		r.log.Warn("nothing remembers the store's lineage (its database and the ranker's consumer were lost): its era goes on from the highest that SCORES and LEADERBOARDS name", "era", era)
	}
	return era, nil
}
