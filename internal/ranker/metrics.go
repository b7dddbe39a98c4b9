package ranker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/sink"
)

// metrics are the ranker's Prometheus series; their names are stable because dashboards and
// alerts in deploy/ depend on them.
type metrics struct {
	events            *prometheus.CounterVec
	sink              sink.Metrics // batch size, insert duration, and through it quorum failures
	clickhouseErrors  *prometheus.CounterVec
	quorumFailures    prometheus.Counter
	clickhouseRepairs prometheus.Counter
	refills           prometheus.Counter
	refilling         prometheus.Gauge
	snapshots         *prometheus.CounterVec
	leaderboardQuery  prometheus.Histogram
	unwholeReads      prometheus.Counter
	repliesRefused    *prometheus.CounterVec
	leaderboardsSent  prometheus.Counter
	announcements     *prometheus.CounterVec
	pending           prometheus.Gauge
	ackPending        prometheus.Gauge
	replicaFenced     prometheus.Counter
	replicasFenced    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := series.On(reg)
	m := &metrics{
		events:            f.CounterVec("ranker_events_total", "evaluation.completed events handled, by outcome: stored, duplicate (same id again in a batch), dead_lettered.", "outcome"),
		clickhouseErrors:  f.CounterVec("ranker_clickhouse_errors_total", "ClickHouse failures by kind: insert, query, unavailable (ping), refused (an evaluation the table refused, dead-lettered), refill (a try of a store refill that failed and starts over).", "kind"),
		quorumFailures:    f.Counter("ranker_insert_quorum_failures_total", "Inserts that a quorum of ClickHouse replicas did not confirm (too few alive, an earlier write unconfirmed, or the quorum timeout); the batch is held and retried."),
		snapshots:         f.CounterVec("ranker_score_snapshots_total", "Score snapshots of executions for composers (the SCORES bucket), by result: written, too_large (composers read ClickHouse), failed.", "result"),
		clickhouseRepairs: f.Counter("ranker_clickhouse_repairs_total", "Times the ranker recreated its database or table from the migrations because it found it missing."),
		refills:           f.Counter("ranker_store_refills_total", "Refills of the ranker's store from the EVALUATIONS stream, counted once the store is whole again: it was found not whole (a table missing or recreated, a new database, a refill that did not finish). A refill another ranker did is not counted here."),
		refilling:         f.Gauge("ranker_store_refilling", "1 while the ranker refills its store from EVALUATIONS (commits are held and the ranker is unready), else 0."),
		leaderboardQuery:  f.Histogram("ranker_leaderboard_query_duration_seconds", "Latency of leaderboard reads (API and leaderboard.updated).", series.Doubling(0.0001, 16)),
		unwholeReads:      f.Counter("ranker_api_reads_refused_total", "API reads (leaderboards, histories) answered 503 store_unavailable because the store was not whole: a refill running, or the table found without its anchor row (emptied or made again before a check noticed; the store is then checked at once)."),
		repliesRefused:    f.CounterVec("ranker_replies_refused_total", "Requests to podium.leaderboard not answered because their reply subject is outside RANKER_REPLY_PREFIXES (an answer there would publish on a caller's behalf).", "endpoint"),
		leaderboardsSent:  f.Counter("ranker_leaderboard_updates_total", "leaderboard.updated events published."),
		announcements:     f.CounterVec("ranker_leaderboard_updates_unpublished_total", "leaderboard.updated not published whole, by reason: failed (retried a second later at least) or too_large (the whole board is over the server's max payload: its top rows are published instead, marked truncated).", "reason"),
		pending:           f.Gauge("ranker_consumer_pending", "Evaluations in EVALUATIONS not yet delivered to the ranker consumer."),
		ackPending:        f.Gauge("ranker_consumer_ack_pending", "Evaluations delivered to rankers and not yet acknowledged."),
		replicaFenced:     f.Counter("ranker_replica_fenced_total", "Times this ranker found that another replica had taken it for gone (its notes in RANKER_PASSES stood still) and begun the era of a stream made again without waiting for it: a batch of the stream before that it committed since may be missing from prompts composed as of the new era."),
		replicasFenced:    f.Counter("ranker_replicas_fenced_total", "Other ranker replicas this one took for gone (their notes in RANKER_PASSES stood still while they might hold a batch of the EVALUATIONS stream before) so as to begin the era of a stream made again."),
	}
	m.sink = sink.NewMetrics(f.Under("ranker"), m.clickhouseErrors)
	m.sink.QuorumFailures = m.quorumFailures
	return m
}
