package main

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/events"
)

// newAPI serves POST /v1/render: the prompt.composed data a request would produce, without
// publishing it, for template authors. It reads the same inputs the consumer reads.
func newAPI(c *composer, maxBytes int) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/render", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, int64(maxBytes)+1))
		if err != nil {
			service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: string(events.CodeInvalidRequest), Message: "read body: " + err.Error()})
			return
		}
		req, at, requestID, err := events.ParseRenderRequest(body, maxBytes)
		if err != nil {
			service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: string(events.CodeInvalidRequest), Message: err.Error()})
			return
		}
		if at.IsZero() {
			at = c.now() // the one non-deterministic case, as the contract says
		}
		at = at.Truncate(time.Microsecond)
		if requestID == "" {
			requestID = "render"
		}
		out, err := c.compose(r.Context(), requestID, req, at, func() {})
		if err != nil {
			code, status := events.CodeStoreUnavailable, http.StatusServiceUnavailable
			var f *failure
			if errors.As(err, &f) {
				code = f.code
				switch f.code {
				case events.CodeInvalidRequest:
					status = http.StatusBadRequest
				case events.CodeUnknownTemplate, events.CodeTemplateError, events.CodeBudgetExceeded:
					status = http.StatusUnprocessableEntity
				}
			}
			service.WriteJSON(w, status, service.Error{Code: string(code), Message: err.Error()})
			return
		}
		service.WriteJSON(w, http.StatusOK, out)
	})
	return mux
}
