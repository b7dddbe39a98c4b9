package rank_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestRank(t *testing.T) {
	rs := func(team string, round int, score float64, at int64) rank.RoundScore {
		return rank.RoundScore{TeamID: team, TeamName: "name-" + team, Round: round, Score: score, AtMicros: at, EventID: team}
	}
	row := func(pos, rk int, team string, best float64, bestRound, rounds int) events.LeaderboardRow {
		return events.LeaderboardRow{Position: pos, Rank: rk, TeamID: team, TeamName: "name-" + team, BestScore: best, BestRound: bestRound, Rounds: rounds}
	}
	tests := []struct {
		name   string
		rounds []rank.RoundScore
		order  events.ScoreOrder
		want   []events.LeaderboardRow
	}{
		{name: "empty", want: []events.LeaderboardRow{}},
		{
			name:   "competition ranks for ties, team_id breaks the order",
			rounds: []rank.RoundScore{rs("d", 1, 50, 1), rs("c", 1, 70, 1), rs("b", 1, 70, 1), rs("a", 1, 90, 1)},
			want:   []events.LeaderboardRow{row(1, 1, "a", 90, 1, 1), row(2, 2, "b", 70, 1, 1), row(3, 2, "c", 70, 1, 1), row(4, 4, "d", 50, 1, 1)},
		},
		{
			name:   "best_round is the first round that reached the best",
			rounds: []rank.RoundScore{rs("a", 3, 80, 3), rs("a", 1, 80, 1), rs("a", 2, 60, 2)},
			want:   []events.LeaderboardRow{row(1, 1, "a", 80, 1, 3)},
		},
		{
			name:   "ascending order: lowest is best",
			order:  events.Asc,
			rounds: []rank.RoundScore{rs("a", 1, 10, 1), rs("a", 2, 5, 2), rs("b", 1, 7, 1)},
			want:   []events.LeaderboardRow{row(1, 1, "a", 5, 2, 2), row(2, 2, "b", 7, 1, 1)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rank.Rank(tt.rounds, tt.order)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Rank() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRankTeamNameFromLatestEvaluation(t *testing.T) {
	got := rank.Rank([]rank.RoundScore{
		{TeamID: "a", TeamName: "Old", Round: 2, Score: 1, AtMicros: 10, EventID: "x"},
		{TeamID: "a", TeamName: "New", Round: 1, Score: 1, AtMicros: 20, EventID: "y"},
	}, events.Desc)
	if got[0].TeamName != "New" {
		t.Errorf("team_name = %q, want the latest evaluation's %q", got[0].TeamName, "New")
	}
}

func TestLatest(t *testing.T) {
	st := func(team, id string, round int, score float64, at int64, seq uint64) rank.Stored {
		return rank.Stored{RoundScore: rank.RoundScore{TeamID: team, TeamName: "n-" + team, Round: round, Score: score, AtMicros: at, EventID: id}, Pos: rank.Pos{Seq: seq}}
	}
	rows := []rank.Stored{
		st("a", "e1", 1, 10, 100, 1),
		st("a", "e1", 2, 99, 100, 9), // replay of e1 naming another round: the first copy stands
		st("a", "e2", 1, 20, 200, 2), // later evaluation of round 1 wins
		st("a", "e3", 1, 30, 200, 3), // same time as e2: the greater id wins
		st("b", "e1", 1, 50, 100, 4), // the same id on another team is another evaluation
		st("b", "e4", 2, 60, 100, 5),
		st("b", "e5", 3, 70, 100, 6),
	}
	for _, tt := range []struct {
		bound   rank.Bound
		want    []rank.RoundScore
		wantSeq uint64
	}{
		{rank.Bound{UpTo: rank.End}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore, rows[5].RoundScore, rows[6].RoundScore}, 6},
		{rank.Bound{BeforeRound: 3, UpTo: rank.End}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore, rows[5].RoundScore}, 5},
		{rank.Bound{BeforeRound: 2, UpTo: rank.End}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore}, 4},
		// Pinned: later sequences are not seen, whatever their round or whether they are replays.
		{rank.Bound{UpTo: rank.Pos{Seq: 2}}, []rank.RoundScore{rows[2].RoundScore}, 2},
		{rank.Bound{UpTo: rank.Pos{Seq: 5}}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore, rows[5].RoundScore}, 5},
		{rank.Bound{BeforeRound: 2, UpTo: rank.Pos{Seq: 5}}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore}, 4},
		{rank.Bound{UpTo: rank.Pos{Seq: 0}}, []rank.RoundScore{}, 0},
	} {
		// Any order of the stored rows gives the same answer.
		for _, perm := range [][]int{{0, 1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1, 0}, {1, 3, 0, 6, 2, 5, 4}} {
			in := make([]rank.Stored, len(rows))
			for i, j := range perm {
				in[i] = rows[j]
			}
			got, last := rank.Latest(in, tt.bound)
			seq := last.Seq
			sort := func(a, b rank.RoundScore) int { return strings.Compare(a.TeamID+a.EventID, b.TeamID+b.EventID) }
			slices.SortFunc(got, sort)
			slices.SortFunc(tt.want, sort)
			if diff := cmp.Diff(tt.want, got); diff != "" || seq != tt.wantSeq {
				t.Errorf("Latest(%+v, order %v): seq %d, want %d; mismatch (-want +got):\n%s", tt.bound, perm, seq, tt.wantSeq, diff)
			}
		}
	}
}

// TestBytesCountsReductions: a cache bounding its memory by Bytes sees what the reductions kept
// for later callers hold, not the rows alone.
func TestBytesCountsReductions(t *testing.T) {
	var recs []rank.Record
	for i := range 50 {
		recs = append(recs, rank.Record{EventID: fmt.Sprint(i), Seq: uint64(i + 1), EvaluationCompleted: events.EvaluationCompleted{
			ExecutionID: "x", TeamID: fmt.Sprintf("t%d", i%5), RoundNumber: 1 + i/5, EvaluatedAt: time.Unix(int64(i), 0)}})
	}
	ev, _ := rank.FromRecords(recs)
	rows := ev.Bytes()
	ev.Reduce(rank.Everything())
	ev.Reduce(rank.Bound{BeforeRound: 3, UpTo: rank.End})
	if got := ev.Bytes(); got <= rows+50*100 {
		t.Errorf("Bytes after two reductions of 50 rows = %d, rows alone %d", got, rows)
	}
}

// TestSnapshotRoundTrips: an execution's rows written as a snapshot and read back rank and
// reduce exactly as the rows did, at every bound.
func TestSnapshotRoundTrips(t *testing.T) {
	var recs []rank.Record
	scores := []float64{70.25, 1e-05, 99.99, -3, 0.1 + 0.2, 77.5}
	for i := range 60 {
		recs = append(recs, rank.Record{EventID: fmt.Sprintf("ev-%d", i), Seq: uint64(i + 1), EvaluationCompleted: events.EvaluationCompleted{
			ExecutionID: "x", TeamID: fmt.Sprintf("t%d", i%7), TeamName: fmt.Sprintf("Team «%d»", i%7), RoundNumber: 1 + i/7,
			Evaluation: events.Scores{OverallScore: scores[i%len(scores)]}, EvaluatedAt: time.Unix(int64(i%5), int64(i%3)*1000)}})
	}
	ev, _ := rank.FromRecords(recs)
	b, err := ev.Snapshot(rank.Derivation{Through: 55, Lineage: "7@2026-11-25T10:00:00Z"})
	if err != nil {
		t.Fatal(err)
	}
	back, d, err := rank.ParseSnapshot(b)
	if err != nil || d != (rank.Derivation{Through: 55, Lineage: "7@2026-11-25T10:00:00Z"}) {
		t.Fatalf("parse: %v, derivation %+v", err, d)
	}
	for _, bound := range []rank.Bound{rank.Everything(), {BeforeRound: 4, UpTo: rank.Pos{Seq: 40}}, {UpTo: rank.Pos{Seq: 12}}} {
		for _, order := range []events.ScoreOrder{events.Desc, events.Asc} {
			want, got := ev.Reduce(bound).Leaderboard(order), back.Reduce(bound).Leaderboard(order)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%+v %s (-rows +snapshot):\n%s", bound, order, diff)
			}
		}
	}
}

// TestLatestAcrossEras: EVALUATIONS deleted and made again starts era 1, whose sequences start
// over. A bound in era 1 counts every row of era 0 whatever its sequence, and the rows of era 1 up
// to its sequence; the first stored copy of an id is the one at the lowest position, whatever the
// sequences of the two eras say.
func TestLatestAcrossEras(t *testing.T) {
	st := func(team, id string, round int, score float64, era uint32, seq uint64) rank.Stored {
		return rank.Stored{RoundScore: rank.RoundScore{TeamID: team, TeamName: "n-" + team, Round: round, Score: score, AtMicros: int64(round), EventID: id},
			Pos: rank.Pos{Era: era, Seq: seq}}
	}
	rows := []rank.Stored{
		st("a", "a1", 1, 10, 0, 1),
		st("b", "b1", 1, 20, 0, 2),
		st("a", "a2", 2, 30, 0, 3),
		st("b", "b2", 2, 40, 0, 4),
		st("a", "a3", 3, 50, 1, 1), // the stream made again: its first evaluation
		st("b", "b1", 3, 99, 1, 2), // b1 sent again to the new stream: the era 0 copy stands
		st("b", "b3", 3, 60, 1, 3),
	}
	for _, tt := range []struct {
		upTo     rank.Pos
		want     []string // team:id of the counted evaluations
		wantLast rank.Pos
	}{
		{rank.Pos{Era: 1, Seq: 0}, []string{"a:a1", "a:a2", "b:b1", "b:b2"}, rank.Pos{Era: 0, Seq: 4}},
		{rank.Pos{Era: 1, Seq: 1}, []string{"a:a1", "a:a2", "a:a3", "b:b1", "b:b2"}, rank.Pos{Era: 1, Seq: 1}},
		{rank.Pos{Era: 1, Seq: 3}, []string{"a:a1", "a:a2", "a:a3", "b:b1", "b:b2", "b:b3"}, rank.Pos{Era: 1, Seq: 3}},
		{rank.Pos{Era: 0, Seq: 2}, []string{"a:a1", "b:b1"}, rank.Pos{Era: 0, Seq: 2}}, // an audit of a prompt of era 0
		{rank.End, []string{"a:a1", "a:a2", "a:a3", "b:b1", "b:b2", "b:b3"}, rank.Pos{Era: 1, Seq: 3}},
	} {
		got, last := rank.Latest(rows, rank.Bound{UpTo: tt.upTo})
		var ids []string
		for _, r := range got {
			ids = append(ids, r.TeamID+":"+r.EventID)
			if r.EventID == "b1" && (r.Round != 1 || r.Score != 20) {
				t.Errorf("up to %+v: b1 counts as round %d score %v, want the era 0 copy (round 1, 20)", tt.upTo, r.Round, r.Score)
			}
		}
		slices.Sort(ids)
		if diff := cmp.Diff(tt.want, ids); diff != "" || last != tt.wantLast {
			t.Errorf("up to %+v: last %+v, want %+v; counted (-want +got):\n%s", tt.upTo, last, tt.wantLast, diff)
		}
	}
}
