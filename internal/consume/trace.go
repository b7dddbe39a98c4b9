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

// Trace starts the span of a batch of one message (a worker's), named name, as a child of the
// trace context the message carries (the envelope's traceparent, else its headers), so the
// producer's trace goes on through the handler; the handler adds its attributes (and an error
// status where it answers a failure) to trace.SpanFromContext(ctx). A retry or a dead letter sets
// an error status, and the message is settled with the span's context, so its log lines carry the
// trace. A batch of many serves many traces: its handler makes its own span, linked to each (the
// ranker's commit), and Trace leaves it alone.
func Trace(tr *tracing.Tracing, name string) Middleware {
	return func(next Handler) Handler {
		return func(ctx context.Context, msgs []jetstream.Msg) Result {
			if len(msgs) != 1 {
				return next(ctx, msgs)
			}
			msg := msgs[0]
			attrs := []attribute.KeyValue{attribute.String("messaging.destination.name", msg.Subject())}
			if md, err := msg.Metadata(); err == nil {
				attrs = append(attrs, attribute.Int64("podium.delivery", int64(md.NumDelivered)), attribute.Int64("podium.stream_seq", int64(md.Sequence.Stream)))
			}
			sctx, span := tr.Start(tr.Extract(ctx, events.TraceOf(msg.Data()), msg.Headers()), name,
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
			defer span.End()
			res := next(sctx, msgs)
			if len(res.Outcomes) == 1 {
				switch o := res.Outcomes[0]; o.Kind {
				case settle.Retry:
					span.SetStatus(codes.Error, "retry: "+o.Why)
				case settle.Poison:
					span.SetStatus(codes.Error, "dead-lettered: "+o.Why)
				}
			}
			res.Logs = []context.Context{trace.ContextWithSpanContext(ctx, span.SpanContext())}
			return res
		}
	}
}
