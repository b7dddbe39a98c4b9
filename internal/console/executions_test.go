package console

import (
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

func row(team string, rnk int) events.LeaderboardRow {
	return events.LeaderboardRow{TeamID: team, TeamName: team, Rank: rnk}
}

func TestMovement(t *testing.T) {
	rows := []struct {
		team           string
		rank, previous int // 0: not on the previous board
		want           string
	}{
		{"a", 1, 3, "▲2"}, {"b", 2, 1, "▼1"}, {"c", 3, 3, "="}, {"d", 4, 0, "new"},
	}
	var now, before []events.LeaderboardRow
	for _, r := range rows {
		now = append(now, row(r.team, r.rank))
		if r.previous > 0 {
			before = append(before, row(r.team, r.previous))
		}
	}
	got := movement(now, before)
	for i, r := range rows {
		if got[i].Movement != r.want {
			t.Errorf("%s: movement %q, want %q", r.team, got[i].Movement, r.want)
		}
	}
}
