package ranker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/replies"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/tracing"
)

// leaderboardSubject is where the board is read over NATS: the micro service "podium-ranker",
// endpoint "leaderboard", answered as GET /v1/executions/{execution_id}/leaderboard is.
const leaderboardSubject = "podium.leaderboard"

// maxRequestBytes bounds a request's body: its fields are an id, an order, a sequence and a wait.
const maxRequestBytes = 4096

// leaderboardRequest is a podium.leaderboard request: the query of the HTTP read, as JSON.
type leaderboardRequest struct {
	ExecutionID string `json:"execution_id"`
	ScoreOrder  string `json:"score_order,omitempty"`
	// AsOf is the sequence of the orchestrator's last publish acknowledgement (asof.go); Wait how
	// long to wait for it ("5s" by default, at most "60s").
	AsOf uint64 `json:"as_of,omitempty"`
	Wait string `json:"wait,omitempty"`
}

// leaderboardOf answers one podium.leaderboard request.
func (rd *reads) leaderboardOf(ctx context.Context, data []byte) (int, any, bool) {
	if len(data) > maxRequestBytes {
		return http.StatusBadRequest, service.Error{Code: "invalid_request", Message: fmt.Sprintf("the request is %d bytes, over %d", len(data), maxRequestBytes)}, true
	}
	var req leaderboardRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return http.StatusBadRequest, service.Error{Code: "invalid_request", Message: `a podium.leaderboard request is {"execution_id", "score_order", "as_of", "wait"}: ` + err.Error()}, true
	}
	asOf := ""
	if req.AsOf > 0 {
		asOf = strconv.FormatUint(req.AsOf, 10)
	}
	a := rd.leaderboard(ctx, req.ExecutionID, req.ScoreOrder, asOf, req.Wait)
	return a.status, a.body, ctx.Err() == nil
}

// startReadService serves the board over NATS as the micro service "podium-ranker", discoverable
// with $SRV.PING, $SRV.INFO and $SRV.STATS; replicas share the queue group. Only reply subjects of
// inboxes are answered (internal/replies). The returned stop ends the service and waits for the
// requests in flight to publish their answers.
func startReadService(work context.Context, nc *nats.Conn, rd *reads, trace *tracing.Tracing, inboxes replies.Inboxes, refused *prometheus.CounterVec) (stop func(), err error) {
	ep := &replies.Endpoints{Work: work, NC: nc, Trace: trace, Log: rd.log, Inboxes: inboxes, Refused: refused, Service: "ranker",
		TooLarge: func(size int, max int64) (int, any) {
			return http.StatusUnprocessableEntity, service.Error{Code: "too_large",
				Message: fmt.Sprintf("the board is %d bytes, over the largest message the server takes (%d bytes): read it over HTTP", size, max)}
		}}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "podium-ranker",
		Version:     "1.0.0",
		Description: "reads an execution's leaderboard, as of the sequence of an orchestrator's last publish when asked (as GET /v1/executions/{execution_id}/leaderboard)",
	})
	if err != nil {
		return nil, fmt.Errorf("micro service podium-ranker: %w", err)
	}
	if err := ep.Serve(svc, "RANKER_API_NATS_USER, ranker-api", replies.Endpoint{Name: "leaderboard", Subject: leaderboardSubject, Answer: rd.leaderboardOf}); err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return func() { ep.Stop(svc) }, nil
}
