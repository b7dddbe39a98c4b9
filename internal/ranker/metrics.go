package ranker

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the ranker's Prometheus series; their names are stable because dashboards and
// alerts in deploy/ depend on them.
type metrics struct {
	events            *prometheus.CounterVec
	batchSize         prometheus.Histogram
	insertDuration    prometheus.Histogram
	clickhouseErrors  *prometheus.CounterVec
	quorumFailures    prometheus.Counter
	clickhouseRepairs prometheus.Counter
	refills           prometheus.Counter
	refilling         prometheus.Gauge
	snapshots         *prometheus.CounterVec
	leaderboardQuery  prometheus.Histogram
	leaderboardsSent  prometheus.Counter
	announcements     *prometheus.CounterVec
	pending           prometheus.Gauge
	ackPending        prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		events: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ranker_events_total",
			Help: "evaluation.completed events handled, by outcome: stored, duplicate (same id again in a batch), dead_lettered.",
		}, []string{"outcome"}),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "ranker_batch_size",
			Help:    "Evaluations written per ClickHouse insert.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		insertDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "ranker_insert_duration_seconds",
			Help:    "Latency of one successful ClickHouse batch insert.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		clickhouseErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ranker_clickhouse_errors_total",
			Help: "ClickHouse failures by kind: insert, query, unavailable (ping), refused (an evaluation the table refused, dead-lettered), refill (a try of a store refill that failed and starts over).",
		}, []string{"kind"}),
		quorumFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "ranker_insert_quorum_failures_total",
			Help: "Inserts that a quorum of ClickHouse replicas did not confirm (too few alive, an earlier write unconfirmed, or the quorum timeout); the batch is held and retried.",
		}),
		snapshots: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ranker_score_snapshots_total",
			Help: "Score snapshots of executions for composers (the SCORES bucket), by result: written, too_large (composers read ClickHouse), failed.",
		}, []string{"result"}),
		clickhouseRepairs: f.NewCounter(prometheus.CounterOpts{
			Name: "ranker_clickhouse_repairs_total",
			Help: "Times the ranker recreated its database or table from the migrations because it found it missing.",
		}),
		refills: f.NewCounter(prometheus.CounterOpts{
			Name: "ranker_store_refills_total",
			Help: "Refills of the ranker's store from the EVALUATIONS stream, counted once the store is whole again: it was found not whole (a table missing or recreated, a new database, a refill that did not finish). A refill another ranker did is not counted here.",
		}),
		refilling: f.NewGauge(prometheus.GaugeOpts{
			Name: "ranker_store_refilling",
			Help: "1 while the ranker refills its store from EVALUATIONS (commits are held and the ranker is unready), else 0.",
		}),
		leaderboardQuery: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "ranker_leaderboard_query_duration_seconds",
			Help:    "Latency of leaderboard reads (API and leaderboard.updated).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		leaderboardsSent: f.NewCounter(prometheus.CounterOpts{
			Name: "ranker_leaderboard_updates_total",
			Help: "leaderboard.updated events published.",
		}),
		announcements: f.NewCounterVec(prometheus.CounterOpts{
			Name: "ranker_leaderboard_updates_unpublished_total",
			Help: "leaderboard.updated not published whole, by reason: failed (retried a second later at least) or too_large (the whole board is over the server's max payload: its top rows are published instead, marked truncated).",
		}, []string{"reason"}),
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "ranker_consumer_pending",
			Help: "Evaluations in EVALUATIONS not yet delivered to the ranker consumer.",
		}),
		ackPending: f.NewGauge(prometheus.GaugeOpts{
			Name: "ranker_consumer_ack_pending",
			Help: "Evaluations delivered to rankers and not yet acknowledged.",
		}),
	}
}
