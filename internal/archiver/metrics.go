package archiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/sink"
)

// metrics are the archiver's Prometheus series; their names are stable because dashboards and
// alerts in deploy/ depend on them.
type metrics struct {
	records          *prometheus.CounterVec
	sink             sink.Metrics // batch size, insert duration
	clickhouseErrors *prometheus.CounterVec
	refills          prometheus.Counter
	refilling        prometheus.Gauge
	lag              prometheus.Histogram
	pending          prometheus.Gauge
	oldest           prometheus.Gauge
	checkpoints      prometheus.Counter
	logSize          prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := series.On(reg)
	m := &metrics{
		records:          f.CounterVec("archiver_records_total", "PROMPTS records handled, by outcome: archived, dead_lettered (not a prompt record, or refused by ClickHouse).", "outcome"),
		clickhouseErrors: f.CounterVec("archiver_clickhouse_errors_total", "ClickHouse failures by kind: insert (retried), refused (a record the table refused: held until it takes it), refill (a try of a refill of the table that failed and starts over).", "kind"),
		refills:          f.Counter("archiver_refills_total", "Times the prompts table was found missing, made again and filled from the PROMPTS stream (counted once filled)."),
		refilling:        f.Gauge("archiver_refilling", "1 while the archiver fills the prompts table again from PROMPTS (it is unready meanwhile), else 0."),
		lag:              f.Histogram("archiver_lag_seconds", "From the stream storing a record to ClickHouse having it.", series.Doubling(0.001, 18)),
		pending:          f.Gauge("archiver_pending_records", "Records PROMPTS holds that are not archived yet (the consumer's pending and unacknowledged)."),
		oldest:           f.Gauge("archiver_oldest_unarchived_seconds", "Age of the oldest record not archived yet, 0 when none: PROMPTS must keep records at least this long (PROMPTS_MAX_AGE)."),
		checkpoints:      f.Counter("archiver_audit_checkpoints_total", "Signed checkpoints of the audit log over PROMPTS published to AUDIT."),
		logSize:          f.Gauge("archiver_audit_log_size", "Records the last signed checkpoint of the audit log holds."),
	}
	m.sink = sink.NewMetrics(f.Under("archiver"), m.clickhouseErrors)
	return m
}
