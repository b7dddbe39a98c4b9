package compose

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/podium-llm/podium/pkg/events"
)

// cuts are what the budget takes out of a prompt, in the order docs/prompts.md gives: level 3 first
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

// cutStep is one step of the budget's cut order. The table cutOrder is the one place the order
// lives: it drives the cut sets the budget tries (budgetSteps), the truncated list of the event
// (truncations) and the order the tests check.
type cutStep struct {
	section string // the section named in truncated
	// times is how often the step can cut in (0 when it would change nothing): the oldest rounds
	// go one at a time, every other step at once. printed are the rounds whose content the
	// template can print: content cuts consider those only, so content that is never printed
	// (and not read) cannot change the cuts.
	times func(in Inputs, printed []events.TeamRound, lim Limits) int
	set   func(c *cuts, k int) // make the step's k-th cut
	made  func(c cuts) int     // how many of the step's cuts c holds
	says  func(in Inputs, lim Limits, k int) string
}

// cutOrder is docs/prompts.md's order: level 3 (older rounds, oldest first; the leaderboard below
// the top 3; per-metric details; whole submissions), then level 2 (the trend; the top rows; the
// latest feedback). Level 1 (the task, the team's position, its latest score) is never cut.
func cutOrder() []cutStep {
	once := func(ok bool) int {
		if ok {
			return 1
		}
		return 0
	}
	return []cutStep{{
		section: "history",
		times:   func(in Inputs, _ []events.TeamRound, _ Limits) int { return max(len(in.History)-1, 0) },
		set:     func(c *cuts, k int) { c.droppedRounds = k },
		made:    func(c cuts) int { return c.droppedRounds },
		says: func(in Inputs, _ Limits, k int) string {
			first, last := in.History[0].RoundNumber, in.History[k-1].RoundNumber
			if first == last {
				return fmt.Sprintf("round %d omitted", first)
			}
			return fmt.Sprintf("rounds %d-%d omitted", first, last)
		},
	}, {
		section: "leaderboard",
		times:   func(in Inputs, _ []events.TeamRound, _ Limits) int { return once(len(in.Leaderboard) > 3) },
		set:     func(c *cuts, _ int) { c.leaderboardTop3 = true },
		made:    func(c cuts) int { return once(c.leaderboardTop3) },
		says: func(in Inputs, _ Limits, _ int) string {
			return fmt.Sprintf("rows below the top 3 omitted (%d teams)", len(in.Leaderboard))
		},
	}, {
		section: "metrics",
		times: func(_ Inputs, printed []events.TeamRound, _ Limits) int {
			return once(slices.ContainsFunc(printed, func(r events.TeamRound) bool { return len(r.Metrics) > 0 }))
		},
		set:  func(c *cuts, _ int) { c.noMetrics = true },
		made: func(c cuts) int { return once(c.noMetrics) },
		says: func(Inputs, Limits, int) string { return "per-metric details omitted" },
	}, {
		section: "submissions",
		times: func(_ Inputs, printed []events.TeamRound, lim Limits) int {
			return once(slices.ContainsFunc(printed, func(r events.TeamRound) bool {
				return utf8.RuneCountInString(r.Submission.Content) > previewLimit(lim)
			}))
		},
		set:  func(c *cuts, _ int) { c.previewSubmissions = true },
		made: func(c cuts) int { return once(c.previewSubmissions) },
		says: func(_ Inputs, lim Limits, _ int) string {
			return fmt.Sprintf("submissions over %d characters cut to head and tail", previewLimit(lim))
		},
	}, {
		section: "trend",
		times:   func(in Inputs, _ []events.TeamRound, _ Limits) int { return once(len(in.History) > 0) },
		set:     func(c *cuts, _ int) { c.noTrend = true },
		made:    func(c cuts) int { return once(c.noTrend) },
		says:    func(Inputs, Limits, int) string { return "score trend omitted" },
	}, {
		section: "leaderboard",
		times:   func(in Inputs, _ []events.TeamRound, _ Limits) int { return once(len(in.Leaderboard) > 1) },
		set:     func(c *cuts, _ int) { c.selfOnlyLeaderboard = true },
		made:    func(c cuts) int { return once(c.selfOnlyLeaderboard) },
		says:    func(Inputs, Limits, int) string { return "top rows omitted, the team's own row kept" },
	}, {
		section: "feedback",
		times: func(_ Inputs, printed []events.TeamRound, _ Limits) int {
			n := len(printed) // a suffix of the history: its last round is the latest
			return once(n > 0 && printed[n-1].Feedback != "")
		},
		set:  func(c *cuts, _ int) { c.noLatestFeedback = true },
		made: func(c cuts) int { return once(c.noLatestFeedback) },
		says: func(Inputs, Limits, int) string { return "latest feedback omitted" },
	}}
}

// budgetSteps lists the cut sets to try, each one cutting more than the one before; steps[0]
// cuts nothing. Only cuts that change something are listed. contentFrom is the first round whose
// content the template can print (Template.contentFrom).
func budgetSteps(in Inputs, lim Limits, contentFrom int) []cuts {
	printed := printedRounds(in.History, contentFrom)
	steps := []cuts{{}}
	var c cuts
	for _, s := range cutOrder() {
		for k := 1; k <= s.times(in, printed, lim); k++ {
			s.set(&c, k)
			steps = append(steps, c)
		}
	}
	return steps
}

func previewLimit(lim Limits) int {
	if lim.PreviewChars > 0 {
		return lim.PreviewChars
	}
	return previewFallback
}

// truncations describes c for the event's truncated list, in the cut order; never nil.
func (c cuts) truncations(in Inputs, lim Limits) []events.Truncation {
	out := []events.Truncation{}
	for _, s := range cutOrder() {
		if k := s.made(c); k > 0 {
			out = append(out, events.Truncation{Section: s.section, Detail: s.says(in, lim, k)})
		}
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
