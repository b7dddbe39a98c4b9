package service

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/podium-llm/podium/pkg/rank"
)

// StoreMetrics exports how the store's replicas serve reads, as
// <service>_store_read_failovers_total{replica}: reads that failed on a replica (down, without
// ZooKeeper, or lagging behind the quorum) and were served by another. One node has none.
func (b *Base) StoreMetrics(st *rank.Store) {
	f := promauto.With(b.Reg)
	for addr, n := range st.ReadFailovers() {
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: b.Name, Name: "store_read_failovers_total",
			Help:        "Reads that failed on this ClickHouse replica and were given to another.",
			ConstLabels: prometheus.Labels{"replica": addr}},
			func() float64 { return float64(n()) })
	}
}
