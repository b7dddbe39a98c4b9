package rank

import "github.com/podium-llm/podium/pkg/events"

// PromptInputs is what a prompt for one team's round shows of the store.
type PromptInputs struct {
	History []events.TeamRound // the team's latest evaluation of each earlier round, ascending
	Board   Board              // the standings the prompt shows
}

// ForPrompt is the rule of what a prompt for round of teamID counts, as of the EVALUATIONS
// sequence asOf (CONTRACT section 5): the team's own history is its rounds below round, with the
// content read for it; the standings count every round (live) or rounds below round only
// (before_round); nothing stored after asOf counts. Round 1 has no standings in either mode
// (PROMPTS.md: it gets no ranking).
func (ev *Evaluations) ForPrompt(teamID string, round int, asOf uint64, standings events.Standings, order events.ScoreOrder, content *Content) PromptInputs {
	before := ev.Reduce(Bound{BeforeRound: round, UpToSeq: asOf})
	in := PromptInputs{History: before.History(teamID, content)}
	switch {
	case round <= 1:
		in.Board = Board{Rows: []events.LeaderboardRow{}}
	case standings == events.BeforeRound:
		in.Board = before.Leaderboard(order)
	default:
		in.Board = ev.Reduce(Bound{UpToSeq: asOf}).Leaderboard(order)
	}
	return in
}
