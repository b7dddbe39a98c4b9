package composer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/series"
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
	repliesRefused    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := series.On(reg)
	return &metrics{
		requests:          f.CounterVec("composer_requests_total", "round.requested handled, by outcome (composed, failed, dead_lettered, replayed: answered before, so not again) and failure code.", "outcome", "code"),
		renderDuration:    f.Histogram("composer_render_duration_seconds", "Time to render one prompt from its inputs.", series.Doubling(0.00001, 18)),
		publishDuration:   f.Histogram("composer_publish_duration_seconds", "Time to publish one answer (prompt.composed or prompt.failed) until JetStream acknowledged it.", series.Doubling(0.0001, 16)),
		answerRetries:     f.Counter("composer_answer_retries_total", "Publishes of an answer that PROMPTS did not take (deleted, full, without a quorum); the request is held and the answer tried again."),
		inputsWait:        f.Histogram("composer_inputs_wait_seconds", "Time waiting for the ranker to commit the evaluations acknowledged before a request.", series.Doubling(0.0005, 16)),
		promptTokens:      f.Histogram("composer_prompt_tokens", "Estimated tokens per published prompt.composed.", series.Doubling(64, 12)),
		truncations:       f.CounterVec("composer_truncations_total", "Cuts the budget made in published prompts, by section.", "section"),
		templatesRejected: f.Counter("composer_template_versions_rejected_total", "Entries of the template registry that failed their check (or are not of its layout) and are not served."),
		repliesRefused:    f.CounterVec("composer_replies_refused_total", "Requests to podium.render or podium.parse not answered because their reply subject is outside COMPOSER_REPLY_PREFIXES (an answer there would publish on a caller's behalf).", "endpoint"),
		templatesLoaded:   f.GaugeVec("composer_templates_loaded", "1 for every loaded template, by name and version.", "name", "version"),
	}
}
