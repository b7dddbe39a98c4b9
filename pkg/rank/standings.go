package rank

import "github.com/podium-llm/podium/pkg/events"

// PromptInputs is what a prompt for one team's round shows of the store.
type PromptInputs struct {
	History []events.TeamRound // the team's latest evaluation of each earlier round, ascending
	Board   Board              // the standings the prompt shows
	// PreviousRanks are the ranks on the previous board, by team: what each team's movement
	// is measured from. A team without an entry is new on the board.
	PreviousRanks map[string]int
}

// ForPrompt is the rule of what a prompt for round of teamID counts, as of the position asOf in
// the EVALUATIONS history (docs/contract.md#read-your-writes): the team's own history is its rounds below round, with the
// content read for it; the standings count every round (live) or rounds below round only
// (before_round); nothing stored after asOf counts. Round 1 has no standings in either mode
// (docs/prompts.md: it gets no ranking).
//
// Movement on the board is measured from the previous board: the same execution as of the same
// asOf, counting rounds below round-1 only, in the same order (in round 2 it is empty: every team
// is new). It is the same in both standings modes: where each team stood before the round that
// was played last. Pinned to asOf like everything else, so a record renders again the same.
func (ev *Evaluations) ForPrompt(teamID string, round int, asOf Pos, standings events.Standings, order events.ScoreOrder, content *Content) PromptInputs {
	before := ev.Reduce(Bound{BeforeRound: round, UpTo: asOf})
	in := PromptInputs{History: before.History(teamID, content)}
	switch {
	case round <= 1:
		in.Board = Board{Rows: []events.LeaderboardRow{}}
	case standings == events.BeforeRound:
		in.Board = before.Leaderboard(order)
	default:
		in.Board = ev.Reduce(Bound{UpTo: asOf}).Leaderboard(order)
	}
	in.PreviousRanks = map[string]int{}
	if round > 1 {
		for _, row := range ev.Reduce(Bound{BeforeRound: round - 1, UpTo: asOf}).Leaderboard(order).Rows {
			in.PreviousRanks[row.TeamID] = row.Rank
		}
	}
	return in
}
