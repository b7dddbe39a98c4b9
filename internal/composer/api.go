package composer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
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
	"github.com/podium-llm/podium/internal/tracing"
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
	ep := &endpoints{work: work, nc: nc, trace: rs.c.trace, log: rs.c.log, inboxes: inboxes, refused: refused}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "podium",
		Version:     "1.0.0",
		Description: "renders round.requested data into the prompt.composed data it would publish (as POST /v1/render), and splits a model's output the way its prompt builder does",
	})
	if err != nil {
		return nil, fmt.Errorf("micro service podium: %w", err)
	}
	// Named endpoints, so $SRV.INFO lists "render" and "parse" (an endpoint given in the
	// service's config is named "default").
	if err := svc.AddEndpoint("render", ep.handler("render", rs.render), micro.WithEndpointSubject(renderSubject)); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro service podium: endpoint render: %w", err)
	}
	parse := func(ctx context.Context, data []byte) (int, any, bool) {
		status, answer := pb.parse(ctx, data, parseTimeout)
		return status, answer, true
	}
	if err := svc.AddEndpoint("parse", ep.handler("parse", parse), micro.WithEndpointSubject(parseSubject)); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro service podium: endpoint parse: %w", err)
	}
	// A user that may not subscribe to the endpoints is refused asynchronously: asked here, once the
	// server has answered the subscriptions, so the composer does not run deaf to every request.
	if err := nc.Flush(); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro service podium: %w", err)
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		_ = svc.Stop()
		return nil, fmt.Errorf("micro service podium: the connection that answers podium.render and podium.parse was refused (%v): give it a NATS user that may (COMPOSER_API_NATS_USER; deploy/nats/nats.conf, composer-api)", err)
	}
	return func() {
		ep.mu.Lock()
		ep.stopping = true
		ep.mu.Unlock()
		_ = svc.Stop() // no new requests
		ep.inFlight.Wait()
	}, nil
}

// endpoints answers the requests of the micro service, each in its own goroutine: a render may
// wait seconds for inputs, and the subscription must not. micro drains the endpoints'
// subscriptions in the background after Stop, so a handler can still run afterwards: stopping,
// under mu, turns those requests away instead of starting work that the Wait of stop would miss.
type endpoints struct {
	work     context.Context
	nc       *nats.Conn
	trace    *tracing.Tracing
	log      *slog.Logger
	inboxes  replies.Inboxes // where an answer may go (internal/replies)
	refused  *prometheus.CounterVec
	mu       sync.Mutex
	stopping bool
	inFlight sync.WaitGroup
}

func (ep *endpoints) handler(name string, answer func(ctx context.Context, data []byte) (int, any, bool)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		if reply := req.Reply(); !ep.inboxes.Allows(reply) {
			// Answered nowhere, not even with an error: any answer would go where the caller asked.
			ep.refused.WithLabelValues(name).Inc()
			ep.log.Warn("request not answered: its reply subject is outside COMPOSER_REPLY_PREFIXES", "endpoint", name,
				"reply", events.Quote(reply), "reply_prefixes", ep.inboxes.String())
			return
		}
		ep.mu.Lock()
		defer ep.mu.Unlock()
		if ep.stopping {
			// The same JSON and headers as any failure of the endpoint: retry on another replica.
			e := service.Error{Code: "shutting_down", Message: "the composer is shutting down; retry"}
			_ = req.Error(strconv.Itoa(http.StatusServiceUnavailable), e.Message, service.EncodeJSON(e))
			return
		}
		ep.inFlight.Go(func() {
			ctx := ep.trace.Extract(ep.work, events.TraceContext{}, nats.Header(req.Headers()))
			status, body, ok := answer(ctx, req.Data())
			if ok {
				ep.reply(req.Reply(), status, body)
			}
		})
	})
}

// reply publishes an answer: here rather than with req.Respond, because micro's request is not
// safe to use after its handler returned, and this answer comes later.
func (ep *endpoints) reply(subject string, status int, answer any) {
	body := service.EncodeJSON(answer)
	if limit := ep.nc.MaxPayload() - 1024; status == http.StatusOK && int64(len(body)) > limit {
		// It can never be sent: answer why, as a prompt.composed too large is answered.
		status, answer, _ = failure(events.Failf(events.CodeBudgetExceeded, "the answer would be %d bytes, over the largest message the server takes (%d bytes)", len(body), ep.nc.MaxPayload()))
		body = service.EncodeJSON(answer)
	}
	reply := nats.NewMsg(subject)
	reply.Data = body
	if status != http.StatusOK {
		reply.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(status))
		if e, isErr := answer.(service.Error); isErr {
			reply.Header.Set(micro.ErrorHeader, e.Message)
		}
	}
	_ = ep.nc.PublishMsg(reply)
}
