package composer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/inputs"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// composer answers round requests.
type composer struct {
	log           *slog.Logger
	js            jetstream.JetStream
	settler       *settle.Settler
	trace         *tracing.Tracing
	inputs        *inputs.Inputs
	templates     *templates
	builders      *promptBuilders
	m             *metrics
	source        string
	maxBytes      int
	renderTimeout time.Duration
	maxDeliver    int
	now           func() time.Time
	answers       *answerStore
	once          *answered
}

// errStore marks a ClickHouse failure: worth retrying by redelivery before giving up.
var errStore = errors.New("store unavailable")

// storeError marks a failed read as errStore, unless the caller went away.
func storeError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("%w: %v", errStore, err)
}

// handle answers one request: parse, compose, publish. The answer is prompt.composed or
// prompt.failed, held until PROMPTS takes it (store.go); a store failure while deliveries are
// left is retried instead. The runtime's middleware gives it its span (a child of the
// orchestrator's, so the trace goes on to the model call), keeps it alive and recovers a panic.
func (c *composer) handle(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome) {
	md, err := msg.Metadata()
	if err != nil {
		return ctx, settle.Reject("message without JetStream metadata: " + err.Error())
	}
	req, err := events.ParseRoundRequest(msg.Subject(), msg.Data(), c.maxBytes)
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("podium.request_id", req.ID), attribute.String("podium.execution_id", req.Data.ExecutionID),
		attribute.String("podium.team_id", req.Data.TeamID), attribute.Int("podium.round_number", req.Data.RoundNumber))
	if err != nil {
		span.SetAttributes(attribute.String("podium.failure_code", string(events.CodeInvalidRequest)))
		span.SetStatus(codes.Error, string(events.CodeInvalidRequest))
		return ctx, c.reject(ctx, msg, md, req, err)
	}
	// A replay is composed too, and found answered before its publish (once.go): looking it up here
	// as well would cost every request a JetStream call (about 80 µs of CPU, measured) to spare the
	// rare replay its render.
	out, err := c.compose(ctx, req.ID, req.Data, req.Time, nil)
	return ctx, c.answer(ctx, md, req, out, err)
}

// answer publishes what compose made of a request: the prompt, or the failure it met. A retryable
// failure (inputs_not_ready, store_unavailable) is retried by redelivery while deliveries are
// left, and answered on the last one (docs/contract.md#promptfailed); any other is answered at once.
func (c *composer) answer(ctx context.Context, md *jetstream.MsgMetadata, req events.RoundRequest, out events.PromptComposed, err error) settle.Outcome {
	answerID := events.PromptEventID(req.ID)
	if err == nil {
		err = c.store(ctx, answerID, func(ctx context.Context) (*jetstream.PubAck, error) { return c.publishComposed(ctx, out) })
		var tooLarge *events.TooLargeError
		if !errors.As(err, &tooLarge) {
			if err != nil {
				return settle.RetryLater(err) // stopping: another replica answers it
			}
			return settle.Ack()
		}
		// It can never be published: answer why instead of retrying (docs/contract.md#events).
		err = events.Failf(events.CodeBudgetExceeded, "the prompt.composed event would be %d bytes, over the largest message the server takes (%d bytes)", tooLarge.Size, tooLarge.Limit)
	}
	if ctx.Err() != nil {
		// Shutting down past the timeout: leave the request to another replica.
		return settle.RetryLater(ctx.Err())
	}
	f := failureOf(err)
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("podium.failure_code", string(f.Code)))
	span.SetStatus(codes.Error, string(f.Code))
	if f.Retryable && int(md.NumDelivered) < c.maxDeliver {
		// The inputs or the store may come back; the COMPOSER_MAX_DELIVER-th delivery answers (the
		// consumer allows a few more, for a composer that dies holding it: run.go).
		return settle.RetryLater(err)
	}
	var assigned *events.TemplateRef // what compose had resolved when it failed, if it had
	if out.Template.Name != "" {
		assigned = &out.Template
	}
	if err := c.store(ctx, answerID, func(ctx context.Context) (*jetstream.PubAck, error) {
		return c.publishFailed(ctx, req.ID, req.Data.ExecutionID, req.Data.TeamID, req.Data.RoundNumber, f, assigned)
	}); err != nil {
		return settle.RetryLater(err)
	}
	return settle.Ack()
}

// failureOf is the rule of which error becomes which prompt.failed: failures carry their code
// from where they were understood; a store error is store_unavailable (retryable); anything
// else unexpected while rendering is template_error.
func failureOf(err error) *events.Failure {
	if f, ok := events.AsFailure(err); ok {
		return f
	}
	if errors.Is(err, errStore) {
		return &events.Failure{Code: events.CodeStoreUnavailable, Message: err.Error(), Retryable: true}
	}
	return &events.Failure{Code: events.CodeTemplateError, Message: err.Error()}
}

// reject answers a request that can never be processed with prompt.failed invalid_request when
// its subject still names an execution and a team, and hands it to the settler as poison.
func (c *composer) reject(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, req events.RoundRequest, cause error) settle.Outcome {
	c.m.requests.WithLabelValues("dead_lettered", string(events.CodeInvalidRequest)).Inc()
	if addr, err := events.ParseTeamSubject(events.TypeRoundRequested, msg.Subject()); err == nil {
		requestID := req.ID
		if !events.ValidEventID(requestID) {
			// Too broken to carry an id: the stream position names it uniquely and stably.
			requestID = md.Stream + "-" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
		f := &events.Failure{Code: events.CodeInvalidRequest, Message: cause.Error()}
		if err := c.store(ctx, events.PromptEventID(requestID), func(ctx context.Context) (*jetstream.PubAck, error) {
			return c.publishFailed(ctx, requestID, addr.ExecutionID, addr.TeamID, req.Data.RoundNumber, f, nil)
		}); err != nil {
			return settle.RetryLater(err)
		}
	}
	return settle.Reject(cause.Error())
}

// compose builds the prompt.composed data of a request: the read-your-writes wait (or, when
// asOf is set, the wait for the ranker to reach that position), the store reads, the render
// within renderTimeout. It returns ctx's error when ctx ends first.
func (c *composer) compose(ctx context.Context, requestID string, req events.RoundRequested, at time.Time, asOf *rank.Pos) (events.PromptComposed, error) {
	waitStart := time.Now()
	wctx, wait := c.trace.Start(ctx, "composer.inputs_wait")
	pos, err := c.inputs.Wait(wctx, asOf)
	wait.SetAttributes(attribute.Int64("podium.evaluations_seq", int64(pos.Seq)), attribute.Int64("podium.evaluations_era", int64(pos.Era)))
	tracing.End(wait, err)
	if err != nil {
		return events.PromptComposed{}, err
	}
	tracing.Observe(ctx, c.m.inputsWait, time.Since(waitStart).Seconds())

	// The reads are shared: one read of an execution's scores serves every team of a round, and
	// the teams asking meanwhile have their own content read together (internal/inputs).
	lib := c.templates.lib() // one library for the whole request, however the registry moves
	t, label, split, err := c.resolve(ctx, lib, req)
	if err != nil {
		if _, isFailure := events.AsFailure(err); !isFailure {
			err = storeError(ctx, err) // PROMPTS did not answer: retried, as a store read is
		}
		return events.PromptComposed{}, err
	}
	// From here on a failure names the version the request was assigned (prompt.failed's
	// template): compare counts it against that version, even for a team that only ever failed.
	assigned := events.PromptComposed{Template: events.TemplateRef{Name: t.Name, Version: t.Version, SHA256: t.SHA256, Label: label, Split: split}}
	in, err := render.Inputs(ctx, t, c.inputs.Reader(), requestID, req, at, pos)
	if err != nil {
		return assigned, storeError(ctx, err)
	}
	renderStart := time.Now()
	sctx, span := c.trace.Start(ctx, "composer.render")
	rctx, cancel := context.WithTimeout(sctx, c.renderTimeout)
	defer cancel()
	if r := c.builders.For(req.Model, at); r != nil {
		in.Builder = r
	}
	out, err := lib.Compose(rctx, in)
	tracing.Observe(sctx, c.m.renderDuration, time.Since(renderStart).Seconds())
	if err == nil && span.IsRecording() { // nothing is built when nothing is exported
		// On the render and on the request: what an operator looks for first.
		attrs := []attribute.KeyValue{attribute.String("podium.template", out.Template.Name+"@"+strconv.Itoa(out.Template.Version)),
			attribute.Int("podium.token_estimate", out.TokenEstimate), attribute.String("podium.token_encoding", out.TokenEncoding),
			attribute.Int("podium.truncations", len(out.Truncated)), attribute.StringSlice("podium.truncated_sections", truncatedSections(out))}
		span.SetAttributes(attrs...)
		trace.SpanFromContext(ctx).SetAttributes(attrs...)
	}
	tracing.End(span, err)
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return assigned, events.Failf(events.CodeBudgetExceeded, "rendering took longer than COMPOSER_RENDER_TIMEOUT (%s)", c.renderTimeout)
	}
	if err != nil {
		return assigned, err
	}
	// The record names what was asked (the request as it came), and the label, the split that
	// assigned the version, and the version that answered it.
	out.Template.Label, out.Template.Split = label, split
	if out.Template.Fallback {
		c.log.WarnContext(ctx, "model variant failed; composed with the base template", "request_id", requestID, "template", out.Template.Name, "variant", out.Template.Variant, "model", req.Model)
	}
	if b := out.Builder; b != nil {
		c.builders.count(b)
		if b.Fallback {
			c.log.WarnContext(ctx, "prompt builder failed; composed with the template", "request_id", requestID, "builder", b.Name, "version", b.Version, "reason", b.Reason, "template", out.Template.Name)
		}
	}
	return out, nil
}

func truncatedSections(out events.PromptComposed) []string {
	s := make([]string, len(out.Truncated))
	for i, t := range out.Truncated {
		s[i] = t.Section
	}
	return s
}
