package composer

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
)

// Every request gets exactly one answer, prompt.composed or prompt.failed, under an event id
// derived from the request's id alone, so the PROMPTS duplicate window keeps one of them
// whichever replica answered and however often, and ANSWERED keeps it one after the window
// (once.go).

// Each answer carries the trace context of the request's span, which produced it, in its
// envelope and headers: the orchestrator's model call continues the trace.

func (c *composer) publishComposed(ctx context.Context, out events.PromptComposed) (*jetstream.PubAck, error) {
	id := events.PromptEventID(out.RequestID)
	tc := c.trace.Inject(ctx)
	body, err := events.MarshalTraced(id, c.source, events.TypePromptComposed, c.now(), out, tc)
	if err != nil {
		return nil, err
	}
	ack, err := c.publish(ctx, events.PromptComposedSubject(out.ExecutionID, out.TeamID), id, body, tc)
	if err != nil {
		return nil, err
	}
	// Counted for published prompts only, not for renders of POST /v1/render.
	c.m.requests.WithLabelValues("composed", "").Inc()
	c.m.promptTokens.Observe(float64(out.TokenEstimate))
	for _, t := range out.Truncated {
		c.m.truncations.WithLabelValues(t.Section).Inc()
	}
	c.log.DebugContext(ctx, "prompt composed", "request_id", out.RequestID, "execution_id", out.ExecutionID, "team_id", out.TeamID, "round_number", out.RoundNumber, "tokens", out.TokenEstimate)
	return ack, nil
}

// maxFailureMessage bounds the message of a prompt.failed, so the answer to any request fits in
// one message whatever the request held (an invalid one may list many problems).
const maxFailureMessage = 4096

// publishFailed answers a request with its failure; assigned is the template version the request
// was assigned when it failed after that (nil before).
func (c *composer) publishFailed(ctx context.Context, requestID, exec, team string, round int, f *events.Failure, assigned *events.TemplateRef) (*jetstream.PubAck, error) {
	id := events.PromptEventID(requestID)
	msg := f.Message
	if len(msg) > maxFailureMessage {
		msg = strings.ToValidUTF8(msg[:maxFailureMessage-len("…")], "") + "…"
	}
	data := events.PromptFailed{RequestID: requestID, ExecutionID: exec, TeamID: team, RoundNumber: round,
		Code: f.Code, Message: msg, Retryable: f.Retryable, Template: assigned}
	tc := c.trace.Inject(ctx)
	body, err := events.MarshalTraced(id, c.source, events.TypePromptFailed, c.now(), data, tc)
	if err != nil {
		return nil, err
	}
	ack, err := c.publish(ctx, events.PromptFailedSubject(exec, team), id, body, tc)
	if err != nil {
		return nil, err
	}
	c.m.requests.WithLabelValues("failed", string(f.Code)).Inc()
	c.log.InfoContext(ctx, "prompt failed", "request_id", requestID, "execution_id", exec, "team_id", team, "round_number", round, "code", f.Code, "message", f.Message)
	return ack, nil
}

// publish stores an answer in PROMPTS, as a span of the request.
func (c *composer) publish(ctx context.Context, subject, id string, body []byte, tc events.TraceContext) (*jetstream.PubAck, error) {
	ctx, span := c.trace.Start(ctx, "composer.publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.destination.name", subject), attribute.Int("messaging.message.body.size", len(body))))
	start := time.Now()
	ack, err := events.PublishTraced(ctx, c.js, subject, id, body, tc)
	tracing.Observe(ctx, c.m.publishDuration, time.Since(start).Seconds())
	tracing.End(span, err)
	return ack, err
}
