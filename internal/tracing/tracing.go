// Package tracing joins the orchestrator's trace. W3C trace context comes in with events (the
// CloudEvents traceparent/tracestate attributes, or the traceparent NATS header) and HTTP or
// NATS requests; the services' spans continue it and are exported with the OpenTelemetry SDK's
// OTLP exporter, configured only by the standard OTEL_* variables; every event they publish
// carries the context of the span that produced it, so the orchestrator's model call continues
// the same trace. Without an endpoint nothing is exported and spans cost nothing: the tracer is
// a no-op that still hands on the incoming context.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/pkg/events"
)

// Tracing is a service's tracer and the propagation of its context through events.
type Tracing struct {
	trace.Tracer
	provider  *sdktrace.TracerProvider // nil when nothing is exported
	prop      propagation.TraceContext
	malformed prometheus.Counter
}

// exportErrorsEvery is how often at most an export failure is logged: a receiver that is down
// fails every batch, and one line in a while says as much as all of them.
const exportErrorsEvery = 10 * time.Second

// Setup builds the tracer of service from the OTEL_* variables: OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_EXPORTER_OTLP_PROTOCOL (http/protobuf, the default,
// or grpc), OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER(_ARG), OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES and OTEL_BSP_*, read by the SDK itself. Export runs in the
// background: a collector that is down never delays or fails the work (spans are dropped).
func Setup(ctx context.Context, service string, reg prometheus.Registerer, log *slog.Logger) (*Tracing, error) {
	f := series.On(reg).Under(service)
	t := &Tracing{malformed: f.Counter("trace_context_malformed_total", "Incoming traceparent values that were not W3C trace context and were ignored (the event was handled all the same).")}
	noEndpoint := os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == ""
	if noEndpoint || os.Getenv("OTEL_SDK_DISABLED") == "true" || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		t.Tracer = noop.NewTracerProvider().Tracer(service)
		return t, nil
	}
	exp, err := exporter(ctx)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(service)), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	// The SDK reports export failures through the process's one error handler (it would print
	// plain text on stderr): they go to the service's JSON log instead, at most one line per
	// exportErrorsEvery, and are all counted.
	failures := f.Counter("trace_export_errors_total", "Errors of the OpenTelemetry SDK, mostly span batches the OTLP receiver did not take (the spans are dropped; work goes on).")
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var last atomic.Int64
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		failures.Inc()
		if now := time.Now().UnixNano(); now-last.Load() >= int64(exportErrorsEvery) {
			last.Store(now)
			log.Warn("trace export failed; spans are dropped, work goes on", "error", err)
		}
	}))
	// The sampler is the SDK's reading of OTEL_TRACES_SAMPLER (parent-based, always on by default).
	t.provider = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	t.Tracer = t.provider.Tracer("github.com/podium-llm/podium/" + service)
	return t, nil
}

func exporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_PROTOCOL %q: want http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	return exp, nil
}

// Shutdown exports what is buffered, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// Extract returns ctx carrying the remote span context an event names: its envelope's
// traceparent, else its traceparent header. A malformed value is counted and ignored, as if it
// were absent.
func (t *Tracing) Extract(ctx context.Context, env events.TraceContext, h nats.Header) context.Context {
	if out, ok := t.extract(ctx, env); ok {
		return out
	}
	if h == nil {
		return ctx
	}
	out, _ := t.extract(ctx, events.TraceContext{Parent: headerValue(h, events.HeaderTraceParent), State: headerValue(h, events.HeaderTraceState)})
	return out
}

// ExtractCarrier is Extract for a request's headers (HTTP or a NATS request).
func (t *Tracing) ExtractCarrier(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	out, _ := t.extract(ctx, events.TraceContext{Parent: c.Get(events.HeaderTraceParent), State: c.Get(events.HeaderTraceState)})
	return out
}

// extract reports whether tc held a valid traceparent; an invalid one is counted.
func (t *Tracing) extract(ctx context.Context, tc events.TraceContext) (context.Context, bool) {
	if tc.Parent == "" {
		return ctx, false
	}
	out := t.prop.Extract(ctx, carrier(tc))
	if !trace.SpanContextFromContext(out).IsValid() {
		t.malformed.Inc()
		return ctx, false
	}
	return out, true
}

// SpanContext is the remote span context ctx carries from an event, for links.
func SpanContext(ctx context.Context) trace.SpanContext { return trace.SpanContextFromContext(ctx) }

// Inject is the trace context of ctx's span, for the envelope and headers of an event it
// produces; empty when there is none.
func (t *Tracing) Inject(ctx context.Context) events.TraceContext {
	c := propagation.MapCarrier{}
	t.prop.Inject(ctx, c)
	return events.TraceContext{Parent: c[events.HeaderTraceParent], State: c[events.HeaderTraceState]}
}

// carrier reads events.TraceContext for the propagator.
type carrier events.TraceContext

func (c carrier) Get(key string) string {
	switch strings.ToLower(key) {
	case events.HeaderTraceParent:
		return c.Parent
	case events.HeaderTraceState:
		return c.State
	}
	return ""
}

func (c carrier) Set(string, string) {} // only read: Inject writes a MapCarrier

func (c carrier) Keys() []string { return []string{events.HeaderTraceParent, events.HeaderTraceState} }

func headerValue(h nats.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	// Header names are case-insensitive on the wire (other clients send Traceparent or
	// TRACEPARENT); nats.go keys them as sent.
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}
