package compose

import "github.com/podium-llm/podium/pkg/events"

// Which rounds' content (submission, feedback, metrics) a prompt can print. The composer reads
// that content only, for the requesting team only; every other round is shown by its score
// (trend, delta). TestContentFromChangesNothing proves a prompt is the same either way.

// ContentFrom is the first round whose content a prompt for req can print, given the team's
// rounds below the requested one (with scores; content is not needed): every round when the
// template prints submission_history, else the last history_rounds of them. A template that
// cannot be found prints nothing: Compose answers its failure.
func (l *Library) ContentFrom(req events.RoundRequested, rounds []events.TeamRound) int {
	t, err := l.Lookup(req.Template)
	if err != nil {
		return req.RoundNumber
	}
	return t.ContentFrom(req, rounds)
}

// ContentFrom is Library.ContentFrom of a template already resolved.
func (t *Template) ContentFrom(req events.RoundRequested, rounds []events.TeamRound) int {
	return t.contentFrom(rounds, t.limits(req.Limits))
}

func (t *Template) contentFrom(rounds []events.TeamRound, lim Limits) int {
	if t.usesAnywhere("submission_history") {
		return 1
	}
	if lim.HistoryRounds <= 0 || len(rounds) == 0 {
		return int(^uint(0) >> 1) // no round's content is printed
	}
	return rounds[max(len(rounds)-lim.HistoryRounds, 0)].RoundNumber
}

// usesAnywhere reports whether the base template or any variant names the variable.
func (t *Template) usesAnywhere(name string) bool {
	if anyUses(t.parts, name) {
		return true
	}
	for _, v := range t.Variants {
		if anyUses(v.parts, name) {
			return true
		}
	}
	return false
}

// printedRounds is the suffix of history from the first round whose content can be printed.
func printedRounds(history []events.TeamRound, from int) []events.TeamRound {
	for i, r := range history {
		if r.RoundNumber >= from {
			return history[i:]
		}
	}
	return nil
}
