package chstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestMovementIsMeasuredFromThePreviousBoard stores a tournament and checks each prompt's
// previous ranks, worked out by hand: the board of rounds below round-1, as of the prompt's
// sequence, in its order, the same in both standings modes.
func TestMovementIsMeasuredFromThePreviousBoard(t *testing.T) {
	st, _ := testenv.Store(t, true)
	ctx := context.Background()
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	var recs []rank.Record
	add := func(team string, round int, score float64) {
		seq := uint64(len(recs) + 1)
		recs = append(recs, rank.Record{EventID: team + "-r" + string(rune('0'+round)), Source: "test", Seq: seq,
			EvaluationCompleted: events.EvaluationCompleted{ExecutionID: "mv", TeamID: team, TeamName: team, RoundNumber: round,
				Submission: events.Submission{Content: "x"}, Evaluation: events.Scores{OverallScore: score}, EvaluatedAt: at}})
	}
	// Round 1: b 60, c 55, a 50. Round 2: a 90, b 61, c 50, and d's first evaluation, 70.
	add("a", 1, 50)
	add("b", 1, 60)
	add("c", 1, 55)
	add("a", 2, 90)
	add("b", 2, 61)
	add("c", 2, 50)
	add("d", 2, 70) // sequence 7
	if err := st.Insert(ctx, recs); err != nil {
		t.Fatal(err)
	}
	evs, err := st.Scores(ctx, []string{"mv"})
	if err != nil {
		t.Fatal(err)
	}
	ev := evs["mv"]
	afterRound1 := map[string]int{"b": 1, "c": 2, "a": 3}
	tests := []struct {
		name      string
		round     int
		asOf      uint64
		standings events.Standings
		order     events.ScoreOrder
		want      map[string]int
	}{
		{"round 2: nothing before round 1", 2, 7, events.Live, events.Desc, map[string]int{}},
		{"round 3, live", 3, 7, events.Live, events.Desc, afterRound1},
		{"round 3, before_round: the same previous board", 3, 7, events.BeforeRound, events.Desc, afterRound1},
		{"round 3, lower is better", 3, 7, events.Live, events.Asc, map[string]int{"a": 1, "c": 2, "b": 3}},
		{"round 3 pinned before c's round 1", 3, 2, events.Live, events.Desc, map[string]int{"b": 1, "a": 2}},
		{"round 4: rounds 1 and 2, d included", 4, 7, events.Live, events.Desc, map[string]int{"a": 1, "d": 2, "b": 3, "c": 4}},
		{"round 1", 1, 7, events.Live, events.Desc, map[string]int{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ev.ForPrompt("a", tt.round, rank.Pos{Seq: tt.asOf}, tt.standings, tt.order, nil).PreviousRanks
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("previous ranks (-want +got):\n%s", diff)
			}
		})
	}
	// The board a round-3 prompt shows: a first (up 2 from 3rd), d new, b and c down.
	board := ev.ForPrompt("a", 3, rank.Pos{Seq: 7}, events.Live, events.Desc, nil).Board.Rows
	var order []string
	for _, r := range board {
		order = append(order, r.TeamID)
	}
	if diff := cmp.Diff([]string{"a", "d", "b", "c"}, order); diff != "" {
		t.Errorf("round 3 board (-want +got):\n%s", diff)
	}
}
