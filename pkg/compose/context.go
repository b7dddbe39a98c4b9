package compose

import (
	"strconv"
	"strings"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// buildContext computes every variable of docs/prompts.md with the budget's cuts c applied. It uses
// maps, not structs, because mustache looks struct fields up by Go name; and only values that
// print the same everywhere. The costly values are computed only when the template uses them.
// TestContextMatchesVariables checks it produces exactly the names of variables().
func buildContext(in Inputs, lim Limits, loc *time.Location, c cuts, uses func(string) bool) map[string]any {
	ctx := requestValues(in, loc)
	kept := keptRounds(in.History, lim, c)
	ctx["trend"] = trend(in.History, c)
	ctx["history"] = historyItems(in.History, kept, lim)
	ctx["leaderboard"] = leaderboardItems(c.leaderboardRows(in.Leaderboard, in.Request.TeamID, lim.LeaderboardTeams), in.Request.TeamID, in.PreviousRanks)
	position := 0
	if self, ok := selfRow(in.Leaderboard, in.Request.TeamID); ok {
		position = self.Position
		ctx["self"] = selfValue(in, self)
	}
	// mixseek's strings are whole whatever the structured limits say; only the budget cuts them.
	if uses("submission_history") {
		ctx["submission_history"] = submissionHistory(kept)
	}
	if uses("ranking_table") {
		ctx["ranking_table"] = rankingTable(c.leaderboardRows(in.Leaderboard, in.Request.TeamID, len(in.Leaderboard)), in.Request.TeamID)
	}
	ctx["team_position_message"] = teamPositionMessage(position, len(in.Leaderboard))
	return ctx
}

// requestValues are the variables taken from the request itself.
func requestValues(in Inputs, loc *time.Location) map[string]any {
	req := in.Request
	ctx := map[string]any{
		"user_prompt":      req.UserPrompt,
		"round_number":     req.RoundNumber,
		"is_first_round":   req.RoundNumber == 1,
		"has_history":      len(in.History) > 0,
		"has_leaderboard":  len(in.Leaderboard) > 0,
		"team":             map[string]any{"id": req.TeamID, "name": req.TeamName},
		"current_datetime": isoformat(in.Time.In(loc)),
	}
	if req.MaxRounds > 0 {
		ctx["max_rounds"] = req.MaxRounds
		ctx["rounds_remaining"] = req.MaxRounds - req.RoundNumber
	}
	vars := make(map[string]any, len(req.Vars))
	for k, v := range req.Vars {
		vars[k] = v
	}
	ctx["vars"] = vars
	return ctx
}

// trend is the team's scores by round, unless the budget cut it.
func trend(history []events.TeamRound, c cuts) string {
	if c.noTrend {
		return ""
	}
	scores := make([]string, 0, len(history))
	for _, r := range history {
		scores = append(scores, score2(r.OverallScore))
	}
	return strings.Join(scores, " -> ")
}

// keptRounds are the rounds the budget kept, with its cuts applied to each.
func keptRounds(history []events.TeamRound, lim Limits, c cuts) []events.TeamRound {
	kept := make([]events.TeamRound, 0, len(history)-c.droppedRounds)
	for i, r := range history[c.droppedRounds:] {
		if c.noMetrics {
			r.Metrics = nil
		}
		if c.previewSubmissions {
			r.Submission.Content, _ = preview(r.Submission.Content, previewLimit(lim))
		}
		if c.noLatestFeedback && c.droppedRounds+i == len(history)-1 {
			r.Feedback = ""
		}
		kept = append(kept, r)
	}
	return kept
}

// historyItems is the structured history: the last history_rounds kept rounds, submissions
// previewed, each with its delta to the team's previous round.
func historyItems(history, kept []events.TeamRound, lim Limits) []any {
	if len(kept) > lim.HistoryRounds {
		kept = kept[len(kept)-lim.HistoryRounds:]
	}
	items := make([]any, 0, len(kept))
	for _, r := range kept {
		metrics := make([]any, 0, len(r.Metrics))
		for _, m := range r.Metrics {
			metrics = append(metrics, map[string]any{
				"metric_name": m.MetricName, "score": m.Score, "score_text": score2(m.Score), "evaluator_comment": m.EvaluatorComment,
			})
		}
		pv, cut := preview(r.Submission.Content, lim.PreviewChars)
		item := map[string]any{
			"round_number": r.RoundNumber, "score": r.OverallScore, "score_text": score2(r.OverallScore),
			"metrics": metrics, "feedback": r.Feedback, "submission": r.Submission.Content,
			"preview": pv, "preview_truncated": cut, "delta": "", "has_delta": false,
		}
		if prev, ok := previousRound(history, r.RoundNumber); ok {
			item["delta"] = signed(r.OverallScore - prev.OverallScore)
			item["has_delta"] = true
		}
		items = append(items, item)
	}
	return items
}

func previousRound(hist []events.TeamRound, round int) (events.TeamRound, bool) {
	var prev events.TeamRound
	found := false
	for _, r := range hist {
		if r.RoundNumber >= round {
			break
		}
		prev, found = r, true
	}
	return prev, found
}

// leaderboardItems is the structured leaderboard of the rows the limits and the budget kept.
func leaderboardItems(rows []events.LeaderboardRow, teamID string, previous map[string]int) []any {
	items := make([]any, 0, len(rows))
	for _, r := range rows {
		item := map[string]any{
			"position": r.Position, "rank": r.Rank, "team_id": r.TeamID, "team_name": r.TeamName,
			"best_score": r.BestScore, "best_score_text": score2(r.BestScore), "best_round": r.BestRound,
			"rounds": r.Rounds, "is_self": r.TeamID == teamID,
		}
		addMovement(item, r, previous)
		items = append(items, item)
	}
	return items
}

// addMovement adds a row's change of rank since the previous board: movement is "▲N" (up N
// ranks), "▼N" (down N), "=" (unchanged) or "new" (not on the previous board), movement_places
// is N (0 when unchanged or new), and one of moved_up, moved_down, unchanged, is_new is true.
func addMovement(item map[string]any, r events.LeaderboardRow, previous map[string]int) {
	before, ranked := previous[r.TeamID]
	up := before - r.Rank
	text, places := "new", 0
	switch {
	case !ranked:
	case up > 0:
		text, places = "▲"+strconv.Itoa(up), up
	case up < 0:
		text, places = "▼"+strconv.Itoa(-up), -up
	default:
		text = "="
	}
	item["movement"], item["movement_places"] = text, places
	item["moved_up"], item["moved_down"] = ranked && up > 0, ranked && up < 0
	item["unchanged"], item["is_new"] = ranked && up == 0, !ranked
}

// selfValue is the requesting team's standing, with its gap to the leader in the request's order.
func selfValue(in Inputs, self events.LeaderboardRow) map[string]any {
	gap := in.Leaderboard[0].BestScore - self.BestScore
	if in.Request.ScoreOrder == events.Asc {
		gap = -gap
	}
	v := map[string]any{
		"position": self.Position, "rank": self.Rank, "best_score_text": score2(self.BestScore),
		"gap_to_leader_text": score2(gap), "team_count": len(in.Leaderboard),
	}
	addMovement(v, self, in.PreviousRanks)
	return v
}
