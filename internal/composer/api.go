package composer

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/podium-llm/podium/internal/replies"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// renders answers render requests, POST /v1/render and podium.render over NATS alike: the
// prompt.composed data a request would produce, without publishing it, for template authors,
// auditors and orchestrators. It waits and reads exactly as the consumer does, or renders as of
// a given evaluations_seq. At most len(slots) renders run at once (more are answered 429), and
// each stops when its caller goes away.
type renders struct {
	c        *composer
	maxBytes int
	slots    chan struct{}
}

func newRenders(c *composer, maxBytes, limit int) *renders {
	return &renders{c: c, maxBytes: maxBytes, slots: make(chan struct{}, limit)}
}

// render answers one body with an HTTP status and the JSON to send; ok is false when ctx ended
// first and nobody waits for an answer.
func (r *renders) render(ctx context.Context, body []byte) (status int, answer any, ok bool) {
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	default:
		return http.StatusTooManyRequests, service.Error{Code: "too_many_requests",
			Message: fmt.Sprintf("%d renders are running (COMPOSER_RENDER_CONCURRENCY); retry shortly", cap(r.slots))}, true
	}
	// A render is a request span too, a child of the caller's context (traceparent header).
	ctx, span := r.c.trace.Start(ctx, "composer.render_request", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	req, err := events.ParseRenderRequest(body, r.maxBytes)
	if err != nil {
		span.SetAttributes(attribute.String("podium.failure_code", string(events.CodeInvalidRequest)))
		return failure(&events.Failure{Code: events.CodeInvalidRequest, Message: err.Error()})
	}
	span.SetAttributes(attribute.String("podium.execution_id", req.Data.ExecutionID), attribute.String("podium.team_id", req.Data.TeamID),
		attribute.Int("podium.round_number", req.Data.RoundNumber))
	at := req.Time
	if at.IsZero() {
		at = r.c.now() // the one non-deterministic case, as the contract says
	}
	id := req.RequestID
	if id == "" {
		id = "render"
	}
	var asOf *rank.Pos
	if req.EvaluationsSeq != nil {
		asOf = &rank.Pos{Era: req.EvaluationsEra, Seq: *req.EvaluationsSeq}
	}
	out, err := r.c.compose(ctx, id, req.Data, at.Truncate(time.Microsecond), asOf)
	switch {
	case ctx.Err() != nil:
		return 0, nil, false
	case err != nil:
		f := failureOf(err)
		span.SetAttributes(attribute.String("podium.failure_code", string(f.Code)))
		span.SetStatus(codes.Error, string(f.Code))
		return failure(f)
	}
	return http.StatusOK, out, true
}

// failure is the answer of docs/contract.md#http-and-nats-services for a failure's code.
func failure(f *events.Failure) (int, any, bool) {
	status := http.StatusServiceUnavailable // inputs_not_ready, store_unavailable: try again
	switch f.Code {
	case events.CodeInvalidRequest:
		status = http.StatusBadRequest
	case events.CodeUnknownTemplate, events.CodeTemplateError, events.CodeBudgetExceeded:
		status = http.StatusUnprocessableEntity
	}
	return status, service.Error{Code: string(f.Code), Message: f.Message}, true
}

// newAPI serves POST /v1/render.
func newAPI(rs *renders) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/render", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, int64(rs.maxBytes)+1))
		if err != nil {
			service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: string(events.CodeInvalidRequest), Message: "read body: " + err.Error()})
			return
		}
		status, answer, ok := rs.render(rs.c.trace.ExtractCarrier(r.Context(), propagation.HeaderCarrier(r.Header)), body)
		if !ok {
			return // the client went away (or the service stops): nobody reads an answer
		}
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		service.WriteJSON(w, status, answer)
	})
	return mux
}

// renderSubject is where podium.render listens: the micro service "podium", endpoint "render".
const renderSubject = "podium.render"

// parseSubject is where podium.parse listens: the micro service "podium", endpoint "parse".
const parseSubject = "podium.parse"

// startRenderService serves renders over NATS as the micro service "podium", discoverable with
// $SRV.PING, $SRV.INFO and $SRV.STATS; replicas share the queue group. The answer of "render" is
// the same JSON as POST /v1/render's, that of "parse" a prompt builder's parse (builders.go); a
// failure is also marked with the micro error headers (the HTTP status as the code). Requests
// stop with work. The returned stop ends the service and waits for the requests in flight to
// publish their answers, so the connection is drained after them.
func startRenderService(work context.Context, nc *nats.Conn, rs *renders, pb *promptBuilders, parseTimeout time.Duration, inboxes replies.Inboxes, refused *prometheus.CounterVec) (stop func(), err error) {
	ep := &replies.Endpoints{Work: work, NC: nc, Trace: rs.c.trace, Log: rs.c.log, Inboxes: inboxes, Refused: refused, Service: "composer",
		TooLarge: func(size int, max int64) (int, any) {
			// As a prompt.composed too large is answered.
			status, answer, _ := failure(events.Failf(events.CodeBudgetExceeded, "the answer would be %d bytes, over the largest message the server takes (%d bytes)", size, max))
			return status, answer
		}}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "podium",
		Version:     "1.0.0",
		Description: "renders round.requested data into the prompt.composed data it would publish (as POST /v1/render), and splits a model's output the way its prompt builder does",
	})
	if err != nil {
		return nil, fmt.Errorf("micro service podium: %w", err)
	}
	parse := func(ctx context.Context, data []byte) (int, any, bool) {
		status, answer := pb.parse(ctx, data, parseTimeout)
		return status, answer, true
	}
	// Named endpoints, so $SRV.INFO lists "render" and "parse" (an endpoint given in the
	// service's config is named "default").
	err = ep.Serve(svc, "COMPOSER_API_NATS_USER, composer-api",
		replies.Endpoint{Name: "render", Subject: renderSubject, Answer: rs.render}, replies.Endpoint{Name: "parse", Subject: parseSubject, Answer: parse})
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return func() { ep.Stop(svc) }, nil
}
