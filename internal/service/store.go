package service

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/podium-llm/podium/pkg/rank"
)

// StoreMetrics exports how the store's replicas serve reads (on a cluster; one node has none):
// <service>_store_replica_reads_total{replica}, reads each replica answered (a read asks a
// quorum of them), and <service>_store_read_failovers_total{replica}, reads that failed on a
// replica (down, cut off from ZooKeeper, table missing) and went to another.
func (b *Base) StoreMetrics(st *rank.Store) {
	f := promauto.With(b.Reg)
	for _, r := range st.ReplicaCounters() {
		labels := prometheus.Labels{"replica": r.Addr}
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: b.Name, Name: "store_replica_reads_total",
			Help: "Reads this ClickHouse replica answered.", ConstLabels: labels},
			func() float64 { return float64(r.Reads()) })
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: b.Name, Name: "store_read_failovers_total",
			Help: "Reads that failed on this ClickHouse replica and were given to another.", ConstLabels: labels},
			func() float64 { return float64(r.Failovers()) })
	}
}

// OpenStore creates the database if needed, connects to it and applies the migrations that are
// missing, logging each: what the services that write ClickHouse (the ranker, the archiver) do
// first. It returns the store and the names of the migrations applied.
func OpenStore(ctx context.Context, cfg rank.Config, log *slog.Logger) (*rank.Store, []string, error) {
	if err := rank.CreateDatabase(ctx, cfg); err != nil {
		return nil, nil, err
	}
	st, err := rank.Open(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	applied, err := st.Migrate(ctx)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	for _, name := range applied {
		log.Info("migration applied", "migration", name)
	}
	return st, applied, nil
}
