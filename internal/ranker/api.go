package ranker

import (
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

// newAPI serves leaderboards and histories, each read as a view of EVALUATIONS (chstore.View:
// the store's lineage whole, the reads anchored on it, the lineage the same after): while this
// replica refills the store (refilling), while any does, and when the table lost its rows before
// a check noticed, they answer 503 store_unavailable instead of a board that misses evaluations,
// and a lost anchor has the store checked at once (lost). committed reads how far the ranker's
// durable has committed EVALUATIONS, for a board as of a sequence (asof.go).
func newAPI(log *slog.Logger, st store, m *metrics, refilling func() string, lost func(), committed committedFunc) http.Handler {
	mux := http.NewServeMux()
	whole := func(w http.ResponseWriter) bool {
		if why := refilling(); why != "" {
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "store_unavailable", Message: "the store is being refilled from EVALUATIONS (" + why + "); try again when /readyz answers 200"})
			return false
		}
		return true
	}
	// read runs fn on a view of the store; false when it answered the failure.
	read := func(w http.ResponseWriter, r *http.Request, what string, fn func(v *chstore.View) error) bool {
		v, err := st.Begin(r.Context())
		if err == nil {
			err = fn(v)
		}
		if err == nil {
			err = v.Confirm(r.Context())
		}
		switch {
		case err == nil:
			return true
		case chstore.Unwhole(err):
			if errors.Is(err, chstore.ErrAnchorLost) {
				lost()
			}
			m.unwholeReads.Inc()
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "store_unavailable", Message: what + " refused: " + err.Error()})
		default:
			m.clickhouseErrors.WithLabelValues("query").Inc()
			log.Warn(what+" failed", "path", r.URL.Path, "error", err)
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "store_unavailable", Message: what + " failed: " + err.Error()})
		}
		return false
	}
	mux.HandleFunc("GET /v1/executions/{execution_id}/leaderboard", func(w http.ResponseWriter, r *http.Request) {
		exec := r.PathValue("execution_id")
		if !events.ValidIdentifier(exec) {
			badIdentifier(w, "execution_id", exec)
			return
		}
		order, ok := events.ParseScoreOrder(r.URL.Query().Get("score_order"))
		if !ok {
			service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: "invalid_request", Message: `score_order must be "asc" or "desc"`})
			return
		}
		seq, wait, ok := asOf(w, r)
		if !ok || (seq > 0 && !waitCommitted(r.Context(), w, committed, seq, wait)) {
			return
		}
		if !whole(w) {
			return
		}
		start := time.Now()
		var board rank.Board
		ok = read(w, r, "leaderboard read", func(v *chstore.View) (err error) {
			board, err = v.Leaderboard(r.Context(), exec, order, rank.Everything())
			return err
		})
		m.leaderboardQuery.Observe(time.Since(start).Seconds())
		if !ok {
			return
		}
		service.WriteJSON(w, http.StatusOK, leaderboardResponse{ExecutionID: exec, Teams: board.Rows, EvaluationsSeq: board.Seq, EvaluationsEra: board.Era, AsOf: seq})
	})
	mux.HandleFunc("GET /v1/executions/{execution_id}/teams/{team_id}/history", func(w http.ResponseWriter, r *http.Request) {
		exec, team := r.PathValue("execution_id"), r.PathValue("team_id")
		if !events.ValidIdentifier(exec) {
			badIdentifier(w, "execution_id", exec)
			return
		}
		if !events.ValidIdentifier(team) {
			badIdentifier(w, "team_id", team)
			return
		}
		if !whole(w) {
			return
		}
		var rounds []events.TeamRound
		if !read(w, r, "history read", func(v *chstore.View) (err error) {
			rounds, err = v.History(r.Context(), exec, team, rank.Everything())
			return err
		}) {
			return
		}
		service.WriteJSON(w, http.StatusOK, historyResponse{ExecutionID: exec, TeamID: team, Rounds: rounds})
	})
	return mux
}

func badIdentifier(w http.ResponseWriter, field, value string) {
	service.WriteJSON(w, http.StatusBadRequest, service.Error{
		Code:    "invalid_request",
		Message: field + " " + events.Quote(value) + " must be 1-128 characters of A-Z, a-z, 0-9, '_' and '-'",
	})
}
