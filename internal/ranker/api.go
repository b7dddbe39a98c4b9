package ranker

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// leaderboardResponse is the body of GET /v1/executions/{execution_id}/leaderboard.
type leaderboardResponse struct {
	ExecutionID    string                  `json:"execution_id"`
	Teams          []events.LeaderboardRow `json:"teams"`
	EvaluationsSeq uint64                  `json:"evaluations_seq"`
	EvaluationsEra uint32                  `json:"evaluations_era,omitempty"`
	// AsOf is the request's as_of: every evaluation of EVALUATIONS up to it is counted (asof.go).
	AsOf uint64 `json:"as_of,omitempty"`
}

// historyResponse is the body of GET /v1/executions/{execution_id}/teams/{team_id}/history.
type historyResponse struct {
	ExecutionID string             `json:"execution_id"`
	TeamID      string             `json:"team_id"`
	Rounds      []events.TeamRound `json:"rounds"`
}

// answer is what a read answers: an HTTP status and the JSON body, the same over HTTP and NATS;
// retryAfter asks the caller to try again in a second.
type answer struct {
	status     int
	body       any
	retryAfter bool
}

// reads answers leaderboards and histories, each read as a view of EVALUATIONS (chstore.View: the
// store's lineage whole, the reads anchored on it, the lineage the same after): while this
// replica refills the store (refilling), while any does, and when the table lost its rows before
// a check noticed, they answer 503 store_unavailable instead of a board that misses evaluations,
// and a lost anchor has the store checked at once (lost). committed reads how far the ranker's
// durable has committed EVALUATIONS, for a board as of a sequence (asof.go). The HTTP API and the
// NATS endpoint podium.leaderboard (nats.go) answer alike.
type reads struct {
	log       *slog.Logger
	st        store
	m         *metrics
	refilling func() string
	lost      func()
	committed committedFunc
}

// leaderboard is GET /v1/executions/{execution_id}/leaderboard: the board of exec in order
// ("asc", "desc", empty: desc), as of the sequence asOf when given (waiting at most wait).
func (rd *reads) leaderboard(ctx context.Context, exec, order, asOf, wait string) answer {
	if !events.ValidIdentifier(exec) {
		return badIdentifier("execution_id", exec)
	}
	o, ok := events.ParseScoreOrder(order)
	if !ok {
		return answer{status: http.StatusBadRequest, body: service.Error{Code: "invalid_request", Message: `score_order must be "asc" or "desc"`}}
	}
	seq, waitFor, bad := parseAsOf(asOf, wait)
	if bad != nil {
		return *bad
	}
	if seq > 0 {
		if a := waitCommitted(ctx, rd.committed, seq, waitFor); a != nil {
			return *a
		}
	}
	start := time.Now()
	var board rank.Board
	a := rd.read(ctx, "leaderboard read", func(v *chstore.View) (err error) {
		board, err = v.Leaderboard(ctx, exec, o, rank.Everything())
		return err
	})
	rd.m.leaderboardQuery.Observe(time.Since(start).Seconds())
	if a != nil {
		return *a
	}
	return answer{status: http.StatusOK, body: leaderboardResponse{ExecutionID: exec, Teams: board.Rows, EvaluationsSeq: board.Seq, EvaluationsEra: board.Era, AsOf: seq}}
}

// history is GET /v1/executions/{execution_id}/teams/{team_id}/history.
func (rd *reads) history(ctx context.Context, exec, team string) answer {
	if !events.ValidIdentifier(exec) {
		return badIdentifier("execution_id", exec)
	}
	if !events.ValidIdentifier(team) {
		return badIdentifier("team_id", team)
	}
	var rounds []events.TeamRound
	if a := rd.read(ctx, "history read", func(v *chstore.View) (err error) {
		rounds, err = v.History(ctx, exec, team, rank.Everything())
		return err
	}); a != nil {
		return *a
	}
	return answer{status: http.StatusOK, body: historyResponse{ExecutionID: exec, TeamID: team, Rounds: rounds}}
}

// read runs fn on a view of the store; nil when it read the store whole, else the answer.
func (rd *reads) read(ctx context.Context, what string, fn func(v *chstore.View) error) *answer {
	if why := rd.refilling(); why != "" {
		return &answer{status: http.StatusServiceUnavailable, body: service.Error{Code: "store_unavailable", Message: "the store is being refilled from EVALUATIONS (" + why + "); try again when /readyz answers 200"}}
	}
	v, err := rd.st.Begin(ctx)
	if err == nil {
		err = fn(v)
	}
	if err == nil {
		err = v.Confirm(ctx)
	}
	switch {
	case err == nil:
		return nil
	case chstore.Unwhole(err):
		if errors.Is(err, chstore.ErrAnchorLost) {
			rd.lost()
		}
		rd.m.unwholeReads.Inc()
		return &answer{status: http.StatusServiceUnavailable, body: service.Error{Code: "store_unavailable", Message: what + " refused: " + err.Error()}}
	default:
		rd.m.clickhouseErrors.WithLabelValues("query").Inc()
		rd.log.Warn(what+" failed", "error", err)
		return &answer{status: http.StatusServiceUnavailable, body: service.Error{Code: "store_unavailable", Message: what + " failed: " + err.Error()}}
	}
}

// newAPI serves the reads over HTTP.
func newAPI(rd *reads) http.Handler {
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, a answer) {
		if a.retryAfter {
			w.Header().Set("Retry-After", "1")
		}
		service.WriteJSON(w, a.status, a.body)
	}
	mux.HandleFunc("GET /v1/executions/{execution_id}/leaderboard", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		write(w, rd.leaderboard(r.Context(), r.PathValue("execution_id"), q.Get("score_order"), q.Get("as_of"), q.Get("wait")))
	})
	mux.HandleFunc("GET /v1/executions/{execution_id}/teams/{team_id}/history", func(w http.ResponseWriter, r *http.Request) {
		write(w, rd.history(r.Context(), r.PathValue("execution_id"), r.PathValue("team_id")))
	})
	return mux
}

func badIdentifier(field, value string) answer {
	return answer{status: http.StatusBadRequest, body: service.Error{
		Code:    "invalid_request",
		Message: field + " " + events.Quote(value) + " must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'",
	}}
}
