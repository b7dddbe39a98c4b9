// Package rank is the ranker's store: the ClickHouse schema and its migrations, idempotent writes
// of evaluations, and the leaderboard and history reads that the ranker's API and the composer
// share. Reads are exact whatever the merge state of the table: they deduplicate by event id and
// pick the latest evaluation of each round (history with argMin/argMax in SQL, leaderboards with
// Latest in Go over the execution's rows), never summing raw rows.
package rank

import (
	"cmp"
	"slices"

	"github.com/podium-llm/podium/pkg/events"
)

// RoundScore is the latest evaluation of one (team, round), as ranking needs it.
type RoundScore struct {
	TeamID   string
	TeamName string
	Round    int
	Score    float64
	AtMicros int64  // evaluated_at in microseconds since the epoch
	EventID  string // breaks ties of AtMicros
}

// Stored is one stored row of an evaluation as leaderboards need it. The same event id may be
// stored more than once (redeliveries, replays) until ClickHouse merges the copies.
type Stored struct {
	RoundScore
	Seq uint64 // EVALUATIONS stream sequence of this copy
}

// Latest reduces stored rows of one execution to the latest evaluation of each (team, round)
// with round < beforeRound (0 = all), in no particular order, and returns the highest stream
// sequence among the evaluations considered. Copies of an event id on one team collapse to the
// first stored copy (lowest sequence), even when a replay names another round; then the latest
// evaluation of a round wins: later evaluated_at, then the greater id. The result does not depend
// on the order of rows, so it does not depend on ClickHouse's merge state either.
func Latest(rows []Stored, beforeRound int) ([]RoundScore, uint64) {
	type eventKey struct{ team, id string }
	first := make(map[eventKey]Stored, len(rows))
	for _, r := range rows {
		k := eventKey{r.TeamID, r.EventID}
		if have, ok := first[k]; !ok || r.Seq < have.Seq {
			first[k] = r
		}
	}
	type roundKey struct {
		team  string
		round int
	}
	latest := make(map[roundKey]RoundScore, len(first))
	var seq uint64
	for _, r := range first {
		if beforeRound > 0 && r.Round >= beforeRound {
			continue
		}
		seq = max(seq, r.Seq)
		k := roundKey{r.TeamID, r.Round}
		if have, ok := latest[k]; !ok || later(r.RoundScore, have) {
			latest[k] = r.RoundScore
		}
	}
	out := make([]RoundScore, 0, len(latest))
	for _, r := range latest {
		out = append(out, r)
	}
	return out, seq
}

// later reports whether a is a later evaluation than b: later evaluated_at, then greater id.
func later(a, b RoundScore) bool {
	if a.AtMicros != b.AtMicros {
		return a.AtMicros > b.AtMicros
	}
	return a.EventID > b.EventID
}

// better reports whether score a beats b under order.
func better(a, b float64, order events.ScoreOrder) bool {
	if order == events.Asc {
		return a < b
	}
	return a > b
}

// Rank builds the leaderboard of CONTRACT section 4 from the latest evaluation of each (team,
// round): best score per team, the first round that reached it, the number of rounds, a total
// order by best score then team_id, and competition ranks for equal best scores.
func Rank(rounds []RoundScore, order events.ScoreOrder) []events.LeaderboardRow {
	type team struct {
		row    events.LeaderboardRow
		latest RoundScore
	}
	byTeam := make(map[string]*team)
	for _, r := range rounds {
		t, ok := byTeam[r.TeamID]
		if !ok {
			t = &team{row: events.LeaderboardRow{TeamID: r.TeamID, BestScore: r.Score, BestRound: r.Round}, latest: r}
			byTeam[r.TeamID] = t
		}
		t.row.Rounds++
		if better(r.Score, t.row.BestScore, order) || r.Score == t.row.BestScore && r.Round < t.row.BestRound {
			t.row.BestScore, t.row.BestRound = r.Score, r.Round
		}
		if later(r, t.latest) {
			t.latest = r
		}
	}
	rows := make([]events.LeaderboardRow, 0, len(byTeam))
	for _, t := range byTeam {
		t.row.TeamName = t.latest.TeamName
		rows = append(rows, t.row)
	}
	slices.SortFunc(rows, func(a, b events.LeaderboardRow) int {
		if a.BestScore != b.BestScore {
			if better(a.BestScore, b.BestScore, order) {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.TeamID, b.TeamID)
	})
	for i := range rows {
		rows[i].Position = i + 1
		rows[i].Rank = i + 1
		if i > 0 && rows[i].BestScore == rows[i-1].BestScore {
			rows[i].Rank = rows[i-1].Rank
		}
	}
	return rows
}
