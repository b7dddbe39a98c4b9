package rank

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/podium-llm/podium/pkg/events"
)

// Evaluations are the stored rows of one execution with their content, as one read returns
// them: enough to answer the leaderboard and every team's history before any round. The
// composer reads them for a whole round of requests at once instead of twice per team.
type Evaluations struct {
	rows   []Stored
	detail map[eventKey]stored // the first stored copy of each event: the one Latest keeps
	bytes  int

	mu     sync.Mutex
	before map[int]*Snapshot // reductions already made: every team of a round asks the same
}

type eventKey struct{ team, id string }

type stored struct {
	seq   uint64
	round events.TeamRound
}

// Evaluations reads every stored row of the executions in one query. Every requested execution
// has an entry, empty when it has no evaluations.
func (s *Store) Evaluations(ctx context.Context, executionIDs []string) (map[string]*Evaluations, error) {
	// Rows of every round are read: a replayed event id keeps the round of its first copy, which
	// a WHERE on round_number could not see.
	const q = `
SELECT execution_id, team_id, event_id, round_number, team_name, overall_score, evaluated_at_us,
       stream_seq, metrics, feedback, submission, submission_format, evaluated_at
FROM evaluations
WHERE execution_id IN ?`
	out := make(map[string]*Evaluations, len(executionIDs))
	for _, id := range executionIDs {
		out[id] = &Evaluations{detail: map[eventKey]stored{}, before: map[int]*Snapshot{}}
	}
	rows, err := s.conn.Query(ctx, q, inSet(executionIDs))
	if err != nil {
		return nil, fmt.Errorf("rank: evaluations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var exec, metrics string
		var r Stored
		var round uint32
		var d events.TeamRound
		if err := rows.Scan(&exec, &r.TeamID, &r.EventID, &round, &r.TeamName, &r.Score, &r.AtMicros, &r.Seq,
			&metrics, &d.Feedback, &d.Submission.Content, &d.Submission.Format, &d.EvaluatedAt); err != nil {
			return nil, fmt.Errorf("rank: evaluations: %w", err)
		}
		r.Round = int(round)
		ev := out[exec]
		if ev == nil {
			continue // IN matched what was not asked: cannot happen, but never index a nil entry
		}
		ev.rows = append(ev.rows, r)
		k := eventKey{r.TeamID, r.EventID}
		have, ok := ev.detail[k]
		if ok && have.seq <= r.Seq {
			continue // a later copy of an event already read
		}
		if err := json.Unmarshal([]byte(metrics), &d.Metrics); err != nil {
			return nil, fmt.Errorf("rank: evaluations of %s: metrics of %s: %w", exec, r.EventID, err)
		}
		d.RoundNumber, d.EvaluationID, d.OverallScore = r.Round, r.EventID, r.Score
		if ok {
			ev.bytes -= detailBytes(&have.round)
		}
		ev.detail[k] = stored{seq: r.Seq, round: d}
		ev.bytes += detailBytes(&d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rank: evaluations: %w", err)
	}
	for _, ev := range out {
		ev.bytes += len(ev.rows) * 128
	}
	return out, nil
}

func detailBytes(d *events.TeamRound) int {
	n := len(d.Submission.Content) + len(d.Feedback) + len(d.EvaluatedAt) + len(d.EvaluationID) + 64
	for _, m := range d.Metrics {
		n += len(m.MetricName) + len(m.EvaluatorComment) + 48
	}
	return n
}

// Bytes approximates the memory the evaluations hold, for caches that bound it.
func (ev *Evaluations) Bytes() int { return ev.bytes }

// Snapshot is an execution's evaluations before one round: its leaderboard and every team's
// history, reduced exactly as Leaderboard and History reduce them.
type Snapshot struct {
	rounds  []RoundScore       // the latest evaluation of each (team, round), by team then round
	history []events.TeamRound // history[i] is the content of rounds[i]
	seq     uint64
}

// Before reduces the evaluations to the rounds below beforeRound (0 = all) with Latest. The
// snapshot is shared by every caller asking for the same round.
func (ev *Evaluations) Before(beforeRound int) *Snapshot {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if sn, ok := ev.before[beforeRound]; ok {
		return sn
	}
	rounds, seq := Latest(ev.rows, beforeRound)
	slices.SortFunc(rounds, func(a, b RoundScore) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), cmp.Compare(a.Round, b.Round))
	})
	sn := &Snapshot{rounds: rounds, history: make([]events.TeamRound, len(rounds)), seq: seq}
	for i, r := range rounds {
		sn.history[i] = ev.detail[eventKey{r.TeamID, r.EventID}].round
	}
	ev.before[beforeRound] = sn
	return sn
}

// Leaderboard ranks the snapshot as Store.Leaderboard would.
func (sn *Snapshot) Leaderboard(order events.ScoreOrder) Board {
	return Board{Rows: Rank(sn.rounds, order), Seq: sn.seq}
}

// History returns a team's rounds as Store.History would, ascending. The rounds share their
// metrics with the snapshot: callers must not modify them.
func (sn *Snapshot) History(teamID string) []events.TeamRound {
	byTeam := func(r RoundScore, team string) int { return cmp.Compare(r.TeamID, team) }
	from, _ := slices.BinarySearchFunc(sn.rounds, teamID, byTeam)
	to := from
	for to < len(sn.rounds) && sn.rounds[to].TeamID == teamID {
		to++
	}
	return append([]events.TeamRound{}, sn.history[from:to]...)
}
