package consume

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
)

// Trace starts each message's span, named name, as a child of the trace context the message
// carries (the envelope's traceparent, else its headers), so the producer's trace goes on through
// the handler; the handler adds its attributes (and an error status where it answers a failure)
// to trace.SpanFromContext(ctx). A retry or a dead letter sets an error status, and the context
// returned (which the message is settled with, so its log lines
// carry the trace) holds the span's context.
func Trace(tr *tracing.Tracing, name string) Middleware {
	return func(next HandlerFunc) HandlerFunc {
		return func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome) {
			attrs := []attribute.KeyValue{attribute.String("messaging.destination.name", msg.Subject())}
			if md, err := msg.Metadata(); err == nil {
				attrs = append(attrs, attribute.Int64("podium.delivery", int64(md.NumDelivered)), attribute.Int64("podium.stream_seq", int64(md.Sequence.Stream)))
			}
			sctx, span := tr.Start(tr.Extract(ctx, events.TraceOf(msg.Data()), msg.Headers()), name,
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
			defer span.End()
			_, o := next(sctx, msg)
			switch o.Kind {
			case settle.Retry:
				span.SetStatus(codes.Error, "retry: "+o.Why)
			case settle.Poison:
				span.SetStatus(codes.Error, "dead-lettered: "+o.Why)
			}
			return trace.ContextWithSpanContext(ctx, span.SpanContext()), o
		}
	}
}
