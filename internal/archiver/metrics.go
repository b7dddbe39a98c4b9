package archiver

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the archiver's Prometheus series; their names are stable because dashboards and
// alerts in deploy/ depend on them.
type metrics struct {
	records          *prometheus.CounterVec
	batchSize        prometheus.Histogram
	insertDuration   prometheus.Histogram
	clickhouseErrors *prometheus.CounterVec
	refills          prometheus.Counter
	refilling        prometheus.Gauge
	lag              prometheus.Histogram
	pending          prometheus.Gauge
	oldest           prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		records: f.NewCounterVec(prometheus.CounterOpts{
			Name: "archiver_records_total",
			Help: "PROMPTS records handled, by outcome: archived, dead_lettered (not a prompt record, or refused by ClickHouse).",
		}, []string{"outcome"}),
		batchSize: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "archiver_batch_size",
			Help:    "Records written per ClickHouse insert.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}),
		insertDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "archiver_insert_duration_seconds",
			Help:    "Latency of one successful ClickHouse insert of records.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		clickhouseErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "archiver_clickhouse_errors_total",
			Help: "ClickHouse failures by kind: insert (retried), refused (a record the table refused: held until it takes it), refill (a try of a refill of the table that failed and starts over).",
		}, []string{"kind"}),
		refills: f.NewCounter(prometheus.CounterOpts{
			Name: "archiver_refills_total",
			Help: "Times the prompts table was found missing, made again and filled from the PROMPTS stream (counted once filled).",
		}),
		refilling: f.NewGauge(prometheus.GaugeOpts{
			Name: "archiver_refilling",
			Help: "1 while the archiver fills the prompts table again from PROMPTS (it is unready meanwhile), else 0.",
		}),
		lag: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "archiver_lag_seconds",
			Help:    "From the stream storing a record to ClickHouse having it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		pending: f.NewGauge(prometheus.GaugeOpts{
			Name: "archiver_pending_records",
			Help: "Records PROMPTS holds that are not archived yet (the consumer's pending and unacknowledged).",
		}),
		oldest: f.NewGauge(prometheus.GaugeOpts{
			Name: "archiver_oldest_unarchived_seconds",
			Help: "Age of the oldest record not archived yet, 0 when none: PROMPTS must keep records at least this long (PROMPTS_MAX_AGE).",
		}),
	}
}
