package rank

import (
	"cmp"
	"slices"
	"sync"

	"github.com/podium-llm/podium/pkg/events"
)

// Evaluations are the stored rows of one execution with the content of its evaluations, as one
// read returns them: enough to answer its leaderboard and its teams' histories at any bound.
// The composer reads them once for a whole round of requests instead of twice per team.
type Evaluations struct {
	rows    []Stored
	content map[eventKey]firstCopy // the first stored copy of each event: the one Latest keeps
	bytes   int

	mu      sync.Mutex
	reduced map[Bound]*Reduction // every team of a round asks for the same bounds
}

// firstCopy is the content of the first stored copy of an event.
type firstCopy struct {
	seq   uint64
	round events.TeamRound
}

func newEvaluations() *Evaluations {
	return &Evaluations{content: map[eventKey]firstCopy{}, reduced: map[Bound]*Reduction{}}
}

// add takes one stored row; content is nil when the read did not fetch it for this row's team.
func (ev *Evaluations) add(r Stored, content *events.TeamRound) {
	ev.rows = append(ev.rows, r)
	ev.bytes += 128
	if content == nil {
		return
	}
	k := eventKey{r.TeamID, r.EventID}
	have, ok := ev.content[k]
	if ok && have.seq <= r.Seq {
		return // a later copy of an event already read
	}
	if ok {
		ev.bytes -= contentBytes(&have.round)
	}
	ev.content[k] = firstCopy{seq: r.Seq, round: *content}
	ev.bytes += contentBytes(content)
}

func contentBytes(d *events.TeamRound) int {
	n := len(d.Submission.Content) + len(d.Feedback) + len(d.EvaluatedAt) + len(d.EvaluationID) + 64
	for _, m := range d.Metrics {
		n += len(m.MetricName) + len(m.EvaluatorComment) + 48
	}
	return n
}

// Bytes approximates the memory the evaluations hold, for caches that bound it.
func (ev *Evaluations) Bytes() int { return ev.bytes }

// Reduction is an execution's evaluations within one Bound, reduced by Latest: its leaderboard
// and every team's history.
type Reduction struct {
	rounds  []RoundScore       // the latest evaluation of each (team, round), by team then round
	history []events.TeamRound // history[i] is the content of rounds[i]
	seq     uint64
}

// Reduce applies Latest within b. The result is shared by every caller asking for the same bound.
func (ev *Evaluations) Reduce(b Bound) *Reduction {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if r, ok := ev.reduced[b]; ok {
		return r
	}
	rounds, seq := Latest(ev.rows, b)
	slices.SortFunc(rounds, func(a, b RoundScore) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), cmp.Compare(a.Round, b.Round))
	})
	r := &Reduction{rounds: rounds, history: make([]events.TeamRound, len(rounds)), seq: seq}
	for i, rs := range rounds {
		r.history[i] = ev.content[eventKey{rs.TeamID, rs.EventID}].round
	}
	ev.reduced[b] = r
	return r
}

// Leaderboard ranks the reduction (CONTRACT section 4).
func (r *Reduction) Leaderboard(order events.ScoreOrder) Board {
	return Board{Rows: Rank(r.rounds, order), Seq: r.seq}
}

// History returns a team's rounds, ascending. The rounds share their metrics with the reduction:
// callers must not modify them. Only a read that fetched the team's content can answer it.
func (r *Reduction) History(teamID string) []events.TeamRound {
	byTeam := func(rs RoundScore, team string) int { return cmp.Compare(rs.TeamID, team) }
	from, _ := slices.BinarySearchFunc(r.rounds, teamID, byTeam)
	to := from
	for to < len(r.rounds) && r.rounds[to].TeamID == teamID {
		to++
	}
	return append([]events.TeamRound{}, r.history[from:to]...)
}
