package ranker

import (
	"context"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Score snapshots (events.BucketScores) let composer replicas share one ClickHouse read of an
// execution: the ranker reads the rows once per announcement anyway, and writes them beside the
// leaderboard. A snapshot that cannot be written (too large, the bucket unavailable) is left
// out: composers then read ClickHouse, as they always can.

// committedThrough is the ranker consumer's ack floor: every evaluation up to it is committed.
// 0 when it cannot be read (no snapshot is written then).
func (r *ranker) committedThrough(ctx context.Context) uint64 {
	if r.snapshots == nil {
		return 0
	}
	cons, err := r.js.Consumer(ctx, events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		r.log.Debug("ack floor not read; no score snapshots this round", "error", err)
		return 0
	}
	return cons.CachedInfo().AckFloor.Stream
}

// putSnapshot writes an execution's rows with what they were derived from.
func (r *ranker) putSnapshot(ctx context.Context, executionID string, ev *rank.Evaluations, d rank.Derivation) {
	if r.snapshots == nil || d.Through == 0 || d.Lineage == "" || ev == nil {
		return
	}
	b, err := ev.Snapshot(d)
	if err == nil && int64(len(b)) > r.nc.MaxPayload()-4096 {
		r.m.snapshots.WithLabelValues("too_large").Inc()
		// The snapshot written while the execution was smaller is stale from now on: composers
		// would fetch and parse it only to find it behind and read ClickHouse anyway.
		if err := r.snapshots.Delete(ctx, executionID); err != nil {
			r.log.Debug("stale score snapshot not deleted", "execution_id", executionID, "error", err)
		}
		return
	}
	if err == nil {
		_, err = r.snapshots.Put(ctx, executionID, b)
	}
	if err != nil {
		r.m.snapshots.WithLabelValues("failed").Inc()
		r.log.Debug("score snapshot not written; composers read ClickHouse for it", "execution_id", executionID, "error", err)
		return
	}
	r.m.snapshots.WithLabelValues("written").Inc()
}
