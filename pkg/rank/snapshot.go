package rank

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/podium-llm/podium/pkg/events"
)

// Snapshot is everything the composer needs of one execution before a round: the latest
// evaluation of every (team, round) with its submission, feedback and metrics. One query fills
// it, and it answers the leaderboard and every team's history, so the requests of a whole round
// cost ClickHouse one round trip instead of two per team.
type Snapshot struct {
	rounds  []RoundScore       // sorted by team, then round
	history []events.TeamRound // history[i] is the content of rounds[i]
	seq     uint64
	bytes   int
}

type eventKey struct{ team, id string }

// Snapshot reads every stored row of an execution and reduces them with Latest, so its
// leaderboard and histories follow exactly the rules of Leaderboard and History.
func (s *Store) Snapshot(ctx context.Context, executionID string, beforeRound int) (*Snapshot, error) {
	// Rows of later rounds are read too: a replayed event id keeps the round of its first copy,
	// which a WHERE on round_number could not see.
	const q = `
SELECT team_id, event_id, round_number, team_name, overall_score, evaluated_at_us, stream_seq,
       metrics, feedback, submission, submission_format, evaluated_at
FROM evaluations
WHERE execution_id = ?`
	rows, err := s.conn.Query(ctx, q, executionID)
	if err != nil {
		return nil, fmt.Errorf("rank: snapshot of %s: %w", executionID, err)
	}
	defer rows.Close()
	var stored []Stored
	details := make(map[eventKey]*events.TeamRound)
	firstSeq := make(map[eventKey]uint64)
	for rows.Next() {
		var r Stored
		var round uint32
		var d events.TeamRound
		var metrics string
		if err := rows.Scan(&r.TeamID, &r.EventID, &round, &r.TeamName, &r.Score, &r.AtMicros, &r.Seq,
			&metrics, &d.Feedback, &d.Submission.Content, &d.Submission.Format, &d.EvaluatedAt); err != nil {
			return nil, fmt.Errorf("rank: snapshot of %s: %w", executionID, err)
		}
		r.Round = int(round)
		stored = append(stored, r)
		// Keep the content of the copy Latest keeps: the first stored one.
		k := eventKey{r.TeamID, r.EventID}
		if seq, ok := firstSeq[k]; ok && seq <= r.Seq {
			continue
		}
		firstSeq[k] = r.Seq
		if err := json.Unmarshal([]byte(metrics), &d.Metrics); err != nil {
			return nil, fmt.Errorf("rank: snapshot of %s: metrics of %s: %w", executionID, r.EventID, err)
		}
		d.RoundNumber, d.EvaluationID, d.OverallScore = r.Round, r.EventID, r.Score
		details[k] = &d
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rank: snapshot of %s: %w", executionID, err)
	}
	rounds, seq := Latest(stored, beforeRound)
	slices.SortFunc(rounds, func(a, b RoundScore) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), cmp.Compare(a.Round, b.Round))
	})
	sn := &Snapshot{rounds: rounds, history: make([]events.TeamRound, len(rounds)), seq: seq}
	for i, r := range rounds {
		d := details[eventKey{r.TeamID, r.EventID}]
		sn.history[i] = *d
		sn.bytes += len(d.Submission.Content) + len(d.Feedback) + len(d.EvaluatedAt) + len(r.EventID) + len(r.TeamName) + 64*(1+len(d.Metrics))
		for _, m := range d.Metrics {
			sn.bytes += len(m.MetricName) + len(m.EvaluatorComment)
		}
	}
	return sn, nil
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

// Bytes approximates the memory the snapshot holds, for caches that bound it.
func (sn *Snapshot) Bytes() int { return sn.bytes }
