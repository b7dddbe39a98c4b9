// Package series declares a service's Prometheus series, one line each, so that a metrics.go
// reads as the list of names and meanings that dashboards and alerts depend on. It only shortens
// client_golang's options structs: the series are client_golang's own, registered through
// promauto on the service's registry (a name registered twice panics at start-up, as promauto
// does).
package series

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Factory makes series registered on one registry, under one namespace ("" for none).
type Factory struct {
	f         promauto.Factory
	namespace string
}

// On is a factory registering on reg.
func On(reg prometheus.Registerer) Factory { return Factory{f: promauto.With(reg)} }

// Under is f with every name prefixed by namespace and "_" (the shared series that each service
// exports under its own name).
func (f Factory) Under(namespace string) Factory {
	f.namespace = namespace
	return f
}

// Counter is a counter without labels.
func (f Factory) Counter(name, help string) prometheus.Counter {
	return f.f.NewCounter(prometheus.CounterOpts{Namespace: f.namespace, Name: name, Help: help})
}

// CounterVec is a counter by labels.
func (f Factory) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return f.f.NewCounterVec(prometheus.CounterOpts{Namespace: f.namespace, Name: name, Help: help}, labels)
}

// Gauge is a gauge without labels.
func (f Factory) Gauge(name, help string) prometheus.Gauge {
	return f.f.NewGauge(prometheus.GaugeOpts{Namespace: f.namespace, Name: name, Help: help})
}

// GaugeVec is a gauge by labels.
func (f Factory) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return f.f.NewGaugeVec(prometheus.GaugeOpts{Namespace: f.namespace, Name: name, Help: help}, labels)
}

// Histogram is a histogram without labels.
func (f Factory) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return f.f.NewHistogram(prometheus.HistogramOpts{Namespace: f.namespace, Name: name, Help: help, Buckets: buckets})
}

// HistogramVec is a histogram by labels.
func (f Factory) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return f.f.NewHistogramVec(prometheus.HistogramOpts{Namespace: f.namespace, Name: name, Help: help, Buckets: buckets}, labels)
}

// Doubling is count buckets from start, each twice the one before: the shape of every latency
// and size histogram here (a latency from start up to start×2^(count-1)).
func Doubling(start float64, count int) []float64 {
	return prometheus.ExponentialBuckets(start, 2, count)
}
