package ranker

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/refill"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// The store is a view of the EVALUATIONS stream, kept whole by a sink.Keeper (internal/sink:
// check.go says when the store is checked and what each finding does, refill.go how it is refilled,
// loss.go when a loss is named instead). What is the ranker's own:
//   - its table: the evaluations table and store_lineage (chstore/lineage.go), each message's
//     row by refill.RowOf, the one way for live writes, refills and `podium store rebuild`;
//   - what it publishes: the lineage, a refill and a loss on the ranker consumer's metadata
//     (events.MetaStore*), which composers' commit probes and every reader outside read;
//   - what holds an era switch besides its own runtime: the other replicas' passes (passes.go);
//   - what a loss names: the executions, from SCORES and LEADERBOARDS (loss.go);
//   - no board is read while a refill runs (boardsMu).

// newView is how the ranker refills its store (internal/sink: the condition, the backoff, the
// metrics).
func newView(m *metrics, whole *health.Condition, log *slog.Logger) *sink.View {
	return &sink.View{What: "the store", Stream: events.StreamEvaluations, Whole: whole, Log: log,
		Begin:   "refilling the store from EVALUATIONS; unready until it is whole",
		Done:    "store refilled from EVALUATIONS; ready",
		Metrics: sink.ViewMetrics{Refills: m.refills, Refilling: m.refilling, Errors: m.clickhouseErrors, Repairs: m.clickhouseRepairs}}
}

// newKeeper is the keeper of the ranker's store, tuned by each of tune (the service: its runtime;
// tests: their interleavings).
func (r *ranker) newKeeper(tune ...func(*sink.Config[rank.Record])) *sink.Keeper[rank.Record] {
	cfg := sink.Config[rank.Record]{
		JS:    r.js,
		Table: r.store,
		Rows: sink.Rows[rank.Record]{Filter: events.TypeEvaluationCompleted + ".>",
			Of: func(msg jetstream.Msg, at sink.Origin) (rank.Record, error) {
				rec, _, err := refill.RowOf(msg, at.Era, r.maxBytes)
				return rec, err
			},
			Key: chstore.KeyOf},
		Write:    r.writeRows,
		Repair:   func(ctx context.Context) error { return r.repair(ctx) },
		View:     newView(r.m, r.whole, r.log),
		Log:      r.log,
		Keys:     sink.StoreKeys,
		Consumer: events.ConsumerRanker,
		EraFloor: r.eraFloor,
		Replicas: r.replicasInTheWay,
		Losses:   losses{r},
		Refilling: func() func() {
			r.boardsMu.Lock()
			return r.boardsMu.Unlock
		},
		Now:        r.now,
		Batch:      r.batchSize,
		BatchBytes: r.batchBytes,
	}
	if r.runtime != nil {
		cfg.SetMetadata = r.runtime.SetMetadata // composers' commit probes read it
	}
	for _, t := range tune {
		t(&cfg)
	}
	return sink.NewKeeper(cfg)
}

// eraOf is the era of the stream a batch was consumed from (consume.StreamOf; a batch whose stream
// is not known has none, and is given back), with commits held (sink.Keeper.EraOf).
func (r *ranker) eraOf(ctx context.Context, msgs []jetstream.Msg) (uint32, error) {
	return r.keep.EraOf(ctx, consume.StreamOf(msgs[0]))
}
