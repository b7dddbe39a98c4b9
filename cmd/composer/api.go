package main

import (
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/events"
)

// newAPI serves POST /v1/render: the prompt.composed data a request would produce, without
// publishing it, for template authors and auditors. It waits and reads exactly as the consumer
// does, or renders as of a given evaluations_seq. At most limit renders run at once (more are
// answered 429), and each stops when its client goes away.
func newAPI(c *composer, maxBytes, limit int) http.Handler {
	slots := make(chan struct{}, limit)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/render", func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			w.Header().Set("Retry-After", "1")
			service.WriteJSON(w, http.StatusTooManyRequests, service.Error{Code: "too_many_requests",
				Message: fmt.Sprintf("%d renders are running (COMPOSER_RENDER_CONCURRENCY); retry shortly", limit)})
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, int64(maxBytes)+1))
		if err != nil {
			writeFailure(w, events.Failf(events.CodeInvalidRequest, "read body: %v", err))
			return
		}
		req, err := events.ParseRenderRequest(body, maxBytes)
		if err != nil {
			writeFailure(w, &events.Failure{Code: events.CodeInvalidRequest, Message: err.Error()})
			return
		}
		at := req.Time
		if at.IsZero() {
			at = c.now() // the one non-deterministic case, as the contract says
		}
		id := req.RequestID
		if id == "" {
			id = "render"
		}
		out, err := c.compose(r.Context(), id, req.Data, at.Truncate(time.Microsecond), req.EvaluationsSeq)
		if r.Context().Err() != nil {
			return // the client went away (or the service stops): nobody reads an answer
		}
		if err != nil {
			writeFailure(w, failureOf(err))
			return
		}
		service.WriteJSON(w, http.StatusOK, out)
	})
	return mux
}

// writeFailure answers with the HTTP status of CONTRACT section 7 for the failure's code.
func writeFailure(w http.ResponseWriter, f *events.Failure) {
	status := http.StatusServiceUnavailable // inputs_not_ready, store_unavailable: try again
	switch f.Code {
	case events.CodeInvalidRequest:
		status = http.StatusBadRequest
	case events.CodeUnknownTemplate, events.CodeTemplateError, events.CodeBudgetExceeded:
		status = http.StatusUnprocessableEntity
	}
	service.WriteJSON(w, status, service.Error{Code: string(f.Code), Message: f.Message})
}
