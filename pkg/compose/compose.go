// Package compose turns one round request plus the stored history and leaderboard into one prompt.
// It is pure: no NATS, no ClickHouse, no clock. The same Inputs always give the same bytes.
//
// Templates are Mustache, parsed raw (no HTML escaping) and checked at load against the variables
// of PROMPTS.md, so a template that names something the composer does not provide never starts.
package compose

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

//go:embed templates
var builtin embed.FS

// Error is a composition failure with the contract's failure code.
type Error struct {
	Code    events.FailureCode
	Message string
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

func failf(code events.FailureCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Code extracts the failure code of err, template_error for anything unexpected.
func Code(err error) events.FailureCode {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	return events.CodeTemplateError
}

// Inputs is everything a prompt is made of.
type Inputs struct {
	RequestID string
	Request   events.RoundRequested
	Time      time.Time // the request's envelope time: the round's clock

	// History is the requesting team's latest evaluation of each earlier round, ascending.
	History []events.TeamRound
	// Leaderboard ranks the execution's evaluations of earlier rounds in the request's order.
	Leaderboard    []events.LeaderboardRow
	EvaluationsSeq uint64
}

// Compose renders the prompt for in.
func (l *Library) Compose(in Inputs) (events.PromptComposed, error) {
	t, err := l.Lookup(in.Request.Template)
	if err != nil {
		return events.PromptComposed{}, err
	}
	loc, err := l.location(in.Request.Timezone)
	if err != nil {
		return events.PromptComposed{}, err
	}
	if max := in.Request.MaxRounds; max > 0 && in.Request.RoundNumber > max {
		return events.PromptComposed{}, failf(events.CodeInvalidRequest, "round_number %d is past max_rounds %d", in.Request.RoundNumber, max)
	}
	lim := t.limits(in.Request.Limits)
	ctx := buildContext(in, lim, loc)

	if name := missingVariable(t.tmpl.Tags(), []any{ctx}); name != "" {
		return events.PromptComposed{}, failf(events.CodeTemplateError, "template %q uses %q, which this request does not provide", t.Name, name)
	}
	prompt, err := t.tmpl.Render(ctx)
	if err != nil {
		return events.PromptComposed{}, failf(events.CodeTemplateError, "template %q: %v", t.Name, err)
	}
	sum := sha256.Sum256([]byte(prompt))

	out := events.PromptComposed{
		RequestID:     in.RequestID,
		ExecutionID:   in.Request.ExecutionID,
		TeamID:        in.Request.TeamID,
		TeamName:      in.Request.TeamName,
		RoundNumber:   in.Request.RoundNumber,
		Prompt:        prompt,
		PromptSHA256:  hex.EncodeToString(sum[:]),
		Template:      events.TemplateRef{Name: t.Name, Version: t.Version, SHA256: t.SHA256},
		Model:         in.Request.Model,
		TokenEstimate: l.tokens.Count(prompt),
		TokenEncoding: l.tokens.Name(),
		Truncated:     []events.Truncation{},
		Inputs:        recordInputs(in),
	}
	return out, nil
}

// recordInputs lists what the prompt was built from, for audit and replay.
func recordInputs(in Inputs) events.ComposeInputs {
	rec := events.ComposeInputs{
		EvaluationIDs:  make([]string, 0, len(in.History)),
		HistoryRounds:  make([]int, 0, len(in.History)),
		Leaderboard:    in.Leaderboard,
		TeamCount:      len(in.Leaderboard),
		EvaluationsSeq: in.EvaluationsSeq,
	}
	if rec.Leaderboard == nil {
		rec.Leaderboard = []events.LeaderboardRow{}
	}
	for _, r := range in.History {
		rec.EvaluationIDs = append(rec.EvaluationIDs, r.EvaluationID)
		rec.HistoryRounds = append(rec.HistoryRounds, r.RoundNumber)
	}
	if row, ok := selfRow(in.Leaderboard, in.Request.TeamID); ok {
		pos := row.Position
		rec.TeamPosition = &pos
	}
	return rec
}

func selfRow(rows []events.LeaderboardRow, teamID string) (events.LeaderboardRow, bool) {
	for _, r := range rows {
		if r.TeamID == teamID {
			return r, true
		}
	}
	return events.LeaderboardRow{}, false
}

// location resolves the request's timezone, else the composer's default.
func (l *Library) location(name string) (*time.Location, error) {
	if name == "" {
		return l.defaultLocation, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" {
		return nil, failf(events.CodeInvalidRequest, "timezone %q is not an IANA time zone name (for example \"UTC\", \"Asia/Tokyo\", \"Europe/Berlin\", \"America/New_York\")", name)
	}
	return loc, nil
}

// buildContext computes every variable of PROMPTS.md. It uses maps, not structs, because mustache
// looks struct fields up by Go name; and only values that print the same everywhere.
func buildContext(in Inputs, lim Limits, loc *time.Location) map[string]any {
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
	vars := map[string]any{}
	for k, v := range req.Vars {
		vars[k] = v
	}
	ctx["vars"] = vars

	// Structured history: the last history_rounds rounds, submissions previewed.
	hist := in.History
	if len(hist) > lim.HistoryRounds {
		hist = hist[len(hist)-lim.HistoryRounds:]
	}
	items := make([]any, 0, len(hist))
	trend := ""
	for i, r := range in.History {
		if i > 0 {
			trend += " -> "
		}
		trend += score2(r.OverallScore)
	}
	for _, r := range hist {
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
		if prev, ok := previousRound(in.History, r.RoundNumber); ok {
			item["delta"] = signed(r.OverallScore - prev.OverallScore)
			item["has_delta"] = true
		}
		items = append(items, item)
	}
	ctx["history"] = items
	ctx["trend"] = trend

	// Structured leaderboard: the top leaderboard_teams rows, plus the team's own below the cut.
	rows := make([]any, 0, min(len(in.Leaderboard), lim.LeaderboardTeams+1))
	for i, r := range in.Leaderboard {
		isSelf := r.TeamID == req.TeamID
		if i >= lim.LeaderboardTeams && !isSelf {
			continue
		}
		rows = append(rows, map[string]any{
			"position": r.Position, "rank": r.Rank, "team_id": r.TeamID, "team_name": r.TeamName,
			"best_score": r.BestScore, "best_score_text": score2(r.BestScore), "best_round": r.BestRound,
			"rounds": r.Rounds, "is_self": isSelf,
		})
	}
	ctx["leaderboard"] = rows

	position := 0
	if self, ok := selfRow(in.Leaderboard, req.TeamID); ok {
		position = self.Position
		gap := in.Leaderboard[0].BestScore - self.BestScore
		if req.ScoreOrder == events.Asc {
			gap = -gap
		}
		ctx["self"] = map[string]any{
			"position": self.Position, "rank": self.Rank, "best_score_text": score2(self.BestScore),
			"gap_to_leader_text": score2(gap), "team_count": len(in.Leaderboard),
		}
	}
	ctx["submission_history"] = submissionHistory(in.History)
	ctx["ranking_table"] = rankingTable(in.Leaderboard, req.TeamID)
	ctx["team_position_message"] = teamPositionMessage(position, len(in.Leaderboard))
	return ctx
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
