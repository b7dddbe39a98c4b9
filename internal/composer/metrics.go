package composer

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the composer's Prometheus series; their names are stable because dashboards and
// alerts in deploy/ depend on them.
type metrics struct {
	requests          *prometheus.CounterVec
	renderDuration    prometheus.Histogram
	publishDuration   prometheus.Histogram
	answerRetries     prometheus.Counter
	inputsWait        prometheus.Histogram
	promptTokens      prometheus.Histogram
	truncations       *prometheus.CounterVec
	templatesLoaded   *prometheus.GaugeVec
	templatesRejected prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "composer_requests_total",
			Help: "round.requested handled, by outcome (composed, failed, dead_lettered) and failure code.",
		}, []string{"outcome", "code"}),
		renderDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "composer_render_duration_seconds",
			Help:    "Time to render one prompt from its inputs.",
			Buckets: prometheus.ExponentialBuckets(0.00001, 2, 18),
		}),
		publishDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "composer_publish_duration_seconds",
			Help:    "Time to publish one answer (prompt.composed or prompt.failed) until JetStream acknowledged it.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		answerRetries: f.NewCounter(prometheus.CounterOpts{
			Name: "composer_answer_retries_total",
			Help: "Publishes of an answer that PROMPTS did not take (deleted, full, without a quorum); the request is held and the answer tried again.",
		}),
		inputsWait: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "composer_inputs_wait_seconds",
			Help:    "Time waiting for the ranker to commit the evaluations acknowledged before a request.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		promptTokens: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "composer_prompt_tokens",
			Help:    "Estimated tokens per published prompt.composed.",
			Buckets: prometheus.ExponentialBuckets(64, 2, 12),
		}),
		truncations: f.NewCounterVec(prometheus.CounterOpts{
			Name: "composer_truncations_total",
			Help: "Cuts the budget made in published prompts, by section.",
		}, []string{"section"}),
		templatesRejected: f.NewCounter(prometheus.CounterOpts{
			Name: "composer_template_versions_rejected_total",
			Help: "Entries of the template registry that failed their check (or are not of its layout) and are not served.",
		}),
		templatesLoaded: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "composer_templates_loaded",
			Help: "1 for every loaded template, by name and version.",
		}, []string{"name", "version"}),
	}
}
