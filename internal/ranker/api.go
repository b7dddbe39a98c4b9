package ranker

import (
	"log/slog"
	"net/http"
	"time"

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

// newAPI serves leaderboards and histories; while refilling says the store is being refilled
// (lineage.go) they answer 503 instead of a board that misses evaluations. committed reads how far
// the ranker's durable has committed EVALUATIONS, for a board as of a sequence (asof.go).
func newAPI(log *slog.Logger, st store, m *metrics, refilling func() string, committed committedFunc) http.Handler {
	mux := http.NewServeMux()
	whole := func(w http.ResponseWriter) bool {
		if why := refilling(); why != "" {
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "store_unavailable", Message: "the store is being refilled from EVALUATIONS (" + why + "); try again when /readyz answers 200"})
			return false
		}
		return true
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
		board, err := st.Leaderboard(r.Context(), exec, order, rank.Everything())
		m.leaderboardQuery.Observe(time.Since(start).Seconds())
		if err != nil {
			m.clickhouseErrors.WithLabelValues("query").Inc()
			log.Warn("leaderboard read failed", "execution_id", exec, "error", err)
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "store_unavailable", Message: "leaderboard read failed: " + err.Error()})
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
		rounds, err := st.History(r.Context(), exec, team, rank.Everything())
		if err != nil {
			m.clickhouseErrors.WithLabelValues("query").Inc()
			log.Warn("history read failed", "execution_id", exec, "team_id", team, "error", err)
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "store_unavailable", Message: "history read failed: " + err.Error()})
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
