package compose

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/podium-llm/podium/pkg/events"
)

// cuts are what the budget takes out of a prompt, in the order PROMPTS.md gives: level 3 first
// (older rounds, oldest first; the leaderboard below the top 3; per-metric details; whole
// submissions), then level 2 (the trend; the top rows; the latest feedback). Level 1 (the task,
// the team's position, its latest score) is never cut.
type cuts struct {
	droppedRounds       int  // oldest rounds of the team's history left out; the latest always stays
	leaderboardTop3     bool // rows below the top 3 left out, the team's own row kept
	noMetrics           bool // per-metric details left out
	previewSubmissions  bool // whole submissions replaced by their previews
	noTrend             bool
	selfOnlyLeaderboard bool // every row but the team's own left out
	noLatestFeedback    bool
}

// previewFallback is the preview length the budget cuts whole submissions to when the template's
// preview_chars is 0 (whole).
const previewFallback = 200

// budgetSteps lists the cut sets to try, each one cutting more than the one before; steps[0]
// cuts nothing. Only cuts that change something are listed.
func budgetSteps(in Inputs, lim Limits) []cuts {
	steps := []cuts{{}}
	c := cuts{}
	add := func() { steps = append(steps, c) }
	for k := 1; k < len(in.History); k++ {
		c.droppedRounds = k
		add()
	}
	if len(in.Leaderboard) > 3 {
		c.leaderboardTop3 = true
		add()
	}
	for _, r := range in.History {
		if len(r.Metrics) > 0 {
			c.noMetrics = true
			add()
			break
		}
	}
	for _, r := range in.History {
		if utf8.RuneCountInString(r.Submission.Content) > previewLimit(lim) {
			c.previewSubmissions = true
			add()
			break
		}
	}
	if len(in.History) > 0 {
		c.noTrend = true
		add()
	}
	if len(in.Leaderboard) > 1 {
		c.selfOnlyLeaderboard = true
		add()
	}
	if n := len(in.History); n > 0 && in.History[n-1].Feedback != "" {
		c.noLatestFeedback = true
		add()
	}
	return steps
}

func previewLimit(lim Limits) int {
	if lim.PreviewChars > 0 {
		return lim.PreviewChars
	}
	return previewFallback
}

// truncations describes c for the event's truncated list; never nil.
func (c cuts) truncations(in Inputs, lim Limits) []events.Truncation {
	out := []events.Truncation{}
	add := func(section, detail string) {
		out = append(out, events.Truncation{Section: section, Detail: detail})
	}
	if k := c.droppedRounds; k > 0 {
		first, last := in.History[0].RoundNumber, in.History[k-1].RoundNumber
		if first == last {
			add("history", fmt.Sprintf("round %d omitted", first))
		} else {
			add("history", fmt.Sprintf("rounds %d-%d omitted", first, last))
		}
	}
	if c.leaderboardTop3 {
		add("leaderboard", fmt.Sprintf("rows below the top 3 omitted (%d teams)", len(in.Leaderboard)))
	}
	if c.noMetrics {
		add("metrics", "per-metric details omitted")
	}
	if c.previewSubmissions {
		add("submissions", fmt.Sprintf("submissions over %d characters cut to head and tail", previewLimit(lim)))
	}
	if c.noTrend {
		add("trend", "score trend omitted")
	}
	if c.selfOnlyLeaderboard {
		add("leaderboard", "top rows omitted, the team's own row kept")
	}
	if c.noLatestFeedback {
		add("feedback", "latest feedback omitted")
	}
	return out
}

// leaderboardRows applies the leaderboard cuts: rows up to keep, plus the team's own row.
func (c cuts) leaderboardRows(rows []events.LeaderboardRow, teamID string, keep int) []events.LeaderboardRow {
	switch {
	case c.selfOnlyLeaderboard:
		keep = 0
	case c.leaderboardTop3:
		keep = min(keep, 3)
	}
	out := make([]events.LeaderboardRow, 0, min(len(rows), keep+1))
	for i, r := range rows {
		if i < keep || r.TeamID == teamID {
			out = append(out, r)
		}
	}
	return out
}

// checkRelativePaths rejects a request whose vars hold, under a name the template declares as
// workspace paths, an absolute path or one that climbs out with "..": files are named relative
// to the workspace, never inlined and never outside it.
func checkRelativePaths(vars map[string]any, names []string) error {
	for _, name := range names {
		v, ok := lookupValue([]any{map[string]any(vars)}, name)
		if !ok || v == nil {
			continue
		}
		items, isList := v.([]any)
		if !isList {
			items = []any{v}
		}
		for i, it := range items {
			where := "vars." + name
			if isList {
				where = fmt.Sprintf("%s[%d]", where, i)
			}
			s, isString := it.(string)
			if !isString {
				return failf(events.CodeInvalidRequest, "%s must be a path string, got %s", where, jsonKind(it))
			}
			if problem := relativePathProblem(s); problem != "" {
				return failf(events.CodeInvalidRequest, "%s %q %s", where, s, problem)
			}
		}
	}
	return nil
}

func relativePathProblem(p string) string {
	switch {
	case p == "":
		return "is empty; name a file relative to the workspace"
	case strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) || len(p) >= 2 && p[1] == ':':
		return "is absolute; name it relative to the workspace (like src/main.go)"
	}
	for _, seg := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if seg == ".." {
			return "climbs out of the workspace with \"..\"; name it relative to the workspace"
		}
	}
	return ""
}

// jsonKind names the JSON type of a decoded value for error messages.
func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "a number"
}
