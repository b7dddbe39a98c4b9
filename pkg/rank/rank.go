// Package rank is the ranker's store: the ClickHouse schema and its migrations, idempotent writes
// of evaluations, and the leaderboard and history reads that the ranker's API and the composer
// share. Reads are exact whatever the merge state of the table: rows are fetched as stored and
// reduced in Go by Latest (latest.go), the one place that decides which evaluation counts.
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

// better reports whether score a beats b under order.
func better(a, b float64, order events.ScoreOrder) bool {
	if order == events.Asc {
		return a < b
	}
	return a > b
}

// Rank builds the leaderboard of docs/contract.md#ranking from the latest evaluation of each (team,
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
