package replies

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/pkg/events"
)

// Answer answers one request's data: an HTTP-like status and the JSON body, the same as the
// service's HTTP endpoint answers; ok false when nobody reads an answer (the service stops).
type Answer func(ctx context.Context, data []byte) (status int, body any, ok bool)

// Endpoints answers the requests of a service's micro endpoints (podium.render, podium.parse,
// podium.leaderboard), each in its own goroutine: an answer may wait seconds (for inputs, for a
// commit), and the subscription must not. Only reply subjects in Inboxes are answered. micro
// drains the endpoints' subscriptions in the background after Stop, so a handler can still run
// afterwards: stopping, under mu, turns those requests away instead of starting work that the
// Wait of Stop would miss.
type Endpoints struct {
	Work    context.Context // requests' work stops with it
	NC      *nats.Conn      // the connection that answers
	Trace   *tracing.Tracing
	Log     *slog.Logger
	Inboxes Inboxes
	// Refused counts requests not answered for their reply subject, by endpoint.
	Refused *prometheus.CounterVec
	// Service names the service in the answer to a request that comes while it stops.
	Service string
	// TooLarge is the answer in place of a 200 body over the server's max payload.
	TooLarge func(size int, max int64) (status int, body any)

	mu       sync.Mutex
	stopping bool
	inFlight sync.WaitGroup
}

// Endpoint is one endpoint of a micro service: its name (what $SRV.INFO lists), its subject, and
// how it answers.
type Endpoint struct {
	Name, Subject string
	Answer        Answer
}

// Serve adds the endpoints to svc, in their order, then checks that the server let the
// connection subscribe to them: a user that may not is refused asynchronously, and a service deaf
// to every request must not start. user names the setting that gives the connection its user.
func (ep *Endpoints) Serve(svc micro.Service, user string, endpoints ...Endpoint) error {
	subjects := make([]string, len(endpoints))
	for i, e := range endpoints {
		subjects[i] = e.Subject
		if err := svc.AddEndpoint(e.Name, ep.handler(e.Name, e.Answer), micro.WithEndpointSubject(e.Subject)); err != nil {
			return fmt.Errorf("micro service %s: endpoint %s: %w", svc.Info().Name, e.Name, err)
		}
	}
	if err := ep.NC.Flush(); err != nil {
		return fmt.Errorf("micro service %s: %w", svc.Info().Name, err)
	}
	if err := ep.NC.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return fmt.Errorf("micro service %s: the connection that answers %s was refused (%v): give it a NATS user that may (%s; deploy/nats/nats.conf)", svc.Info().Name, strings.Join(subjects, " and "), err, user)
	}
	return nil
}

// Stop ends the service and waits for the requests in flight to publish their answers.
func (ep *Endpoints) Stop(svc micro.Service) {
	ep.mu.Lock()
	ep.stopping = true
	ep.mu.Unlock()
	_ = svc.Stop() // no new requests
	ep.inFlight.Wait()
}

func (ep *Endpoints) handler(name string, answer Answer) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		if reply := req.Reply(); !ep.Inboxes.Allows(reply) {
			// Answered nowhere, not even with an error: any answer would go where the caller asked.
			ep.Refused.WithLabelValues(name).Inc()
			ep.Log.Warn("request not answered: its reply subject is outside the reply prefixes", "endpoint", name,
				"reply", events.Quote(reply), "reply_prefixes", ep.Inboxes.String())
			return
		}
		ep.mu.Lock()
		defer ep.mu.Unlock()
		if ep.stopping {
			// The same JSON and headers as any failure of the endpoint: retry on another replica.
			e := service.Error{Code: "shutting_down", Message: "the " + ep.Service + " is shutting down; retry"}
			_ = req.Error(strconv.Itoa(http.StatusServiceUnavailable), e.Message, service.EncodeJSON(e))
			return
		}
		ep.inFlight.Go(func() {
			ctx := ep.Trace.Extract(ep.Work, events.TraceContext{}, nats.Header(req.Headers()))
			status, body, ok := answer(ctx, req.Data())
			if ok {
				ep.reply(req.Reply(), status, body)
			}
		})
	})
}

// reply publishes an answer: here rather than with req.Respond, because micro's request is not
// safe to use after its handler returned, and this answer comes later. A failure carries micro's
// error headers too (the HTTP status as the code).
func (ep *Endpoints) reply(subject string, status int, answer any) {
	body := service.EncodeJSON(answer)
	if limit := ep.NC.MaxPayload() - 1024; status == http.StatusOK && int64(len(body)) > limit && ep.TooLarge != nil {
		// It can never be sent: answer why.
		status, answer = ep.TooLarge(len(body), ep.NC.MaxPayload())
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
	_ = ep.NC.PublishMsg(reply)
}
