package rank_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

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

func openStore(t testing.TB) *rank.Store {
	t.Helper()
	s, _ := openStoreAt(t)
	return s
}

// openStoreAt also returns a raw connection to the test database, to force merges.
func openStoreAt(t testing.TB) (*rank.Store, driver.Conn) {
	t.Helper()
	s, cfg := testenv.Store(t, true)
	raw, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return s, raw
}

func TestMigrateTwiceChangesNothing(t *testing.T) {
	s := openStore(t)
	applied, err := s.Migrate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 0 {
		t.Errorf("second Migrate applied %v, want nothing", applied)
	}
}

func record(id string, seq uint64, team string, round int, score float64, at string) rank.Record {
	ts, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		panic(err)
	}
	return rank.Record{EventID: id, Source: "test", Seq: seq, EvaluationCompleted: events.EvaluationCompleted{
		ExecutionID: "exec", TeamID: team, TeamName: "Team " + team, RoundNumber: round,
		Submission:  events.Submission{Content: "sub " + id, Format: "md"},
		Evaluation:  events.Scores{OverallScore: score, Metrics: []events.Metric{{MetricName: "m", Score: score, EvaluatorComment: "c " + id}}, Feedback: "fb " + id},
		EvaluatedAt: ts,
	}}
}

func TestStoreLatestEvaluationWinsAndReplaysCountOnce(t *testing.T) {
	s, raw := openStoreAt(t)
	ctx := context.Background()
	recs := []rank.Record{
		record("e1", 1, "a", 1, 70, "2026-11-21T10:00:00Z"),
		// A re-evaluation of a/1 an hour later in another offset wins...
		record("e2", 2, "a", 1, 60, "2026-11-21T20:00:00+09:00"),
		// ...and one at the same microsecond with a smaller id does not.
		record("e0", 3, "a", 1, 99, "2026-11-21T11:00:00.0000004Z"),
		record("e3", 4, "a", 2, 80, "2026-11-21T12:00:00Z"),
		record("e4", 5, "b", 1, 80, "2026-11-21T10:00:00Z"),
	}
	for i := 0; i < 2; i++ { // the second insert is a replay of every id
		if err := s.Insert(ctx, recs); err != nil {
			t.Fatal(err)
		}
	}
	// A replay of e1 with a later seq and different content changes nothing either.
	replay := record("e1", 9, "a", 1, 100, "2026-11-22T10:00:00Z")
	if err := s.Insert(ctx, []rank.Record{replay}); err != nil {
		t.Fatal(err)
	}

	// A replay naming another round is still the same event: it changes nothing.
	moved := record("e4", 10, "b", 3, 100, "2026-11-22T10:00:00Z")
	if err := s.Insert(ctx, []rank.Record{moved}); err != nil {
		t.Fatal(err)
	}
	for _, merged := range []bool{false, true} {
		if merged {
			// Merges collapse replays; the first stored copy must be the one that survives.
			if err := raw.Exec(ctx, "OPTIMIZE TABLE evaluations FINAL"); err != nil {
				t.Fatal(err)
			}
		}
		checkStore(t, s, merged)
	}
}

func checkStore(t *testing.T, s *rank.Store, merged bool) {
	t.Helper()
	ctx := context.Background()
	board, err := s.Leaderboard(ctx, "exec", events.Desc, rank.Everything())
	if err != nil {
		t.Fatal(err)
	}
	rowA := events.LeaderboardRow{Position: 1, Rank: 1, TeamID: "a", TeamName: "Team a", BestScore: 80, BestRound: 2, Rounds: 2}
	rowB := events.LeaderboardRow{Position: 2, Rank: 1, TeamID: "b", TeamName: "Team b", BestScore: 80, BestRound: 1, Rounds: 1}
	if diff := cmp.Diff([]events.LeaderboardRow{rowA, rowB}, board.Rows); diff != "" {
		t.Errorf("leaderboard mismatch (-want +got):\n%s", diff)
	}
	// The first copies of the ids are at sequences 1-5; replays do not move it, merged or not.
	if board.Seq != 5 {
		t.Errorf("evaluations_seq = %d (merged: %v), want 5", board.Seq, merged)
	}

	hist, err := s.History(ctx, "exec", "a", rank.Everything())
	if err != nil {
		t.Fatal(err)
	}
	round1 := events.TeamRound{RoundNumber: 1, EvaluationID: "e2", OverallScore: 60,
		Metrics: []events.Metric{{MetricName: "m", Score: 60, EvaluatorComment: "c e2"}}, Feedback: "fb e2",
		Submission: events.Submission{Content: "sub e2", Format: "md"}, EvaluatedAt: "2026-11-21T20:00:00+09:00"}
	round2 := events.TeamRound{RoundNumber: 2, EvaluationID: "e3", OverallScore: 80,
		Metrics: []events.Metric{{MetricName: "m", Score: 80, EvaluatorComment: "c e3"}}, Feedback: "fb e3",
		Submission: events.Submission{Content: "sub e3", Format: "md"}, EvaluatedAt: "2026-11-21T12:00:00Z"}
	if diff := cmp.Diff([]events.TeamRound{round1, round2}, hist); diff != "" {
		t.Errorf("history mismatch (-want +got):\n%s", diff)
	}

	// One read of the scores and one of a team's content answer both, at every bound, exactly
	// as the dedicated reads.
	evs, err := s.Scores(ctx, []string{"exec", "nope"})
	if err != nil {
		t.Fatal(err)
	}
	ev := evs["exec"]
	for _, b := range []rank.Bound{rank.Everything(), {BeforeRound: 2, UpToSeq: rank.AllSeqs}, {UpToSeq: 3}, {BeforeRound: 3, UpToSeq: 1}, {UpToSeq: 0}} {
		for _, order := range []events.ScoreOrder{events.Desc, events.Asc} {
			want, err := s.Leaderboard(ctx, "exec", order, b)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, ev.Reduce(b).Leaderboard(order)); diff != "" {
				t.Errorf("read leaderboard within %+v, %s (merged %v) mismatch (-want +got):\n%s", b, order, merged, diff)
			}
		}
		for _, team := range []string{"a", "b", "nobody"} {
			want, err := s.History(ctx, "exec", team, b)
			if err != nil {
				t.Fatal(err)
			}
			content, err := s.Content(ctx, "exec", team, 1, 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, ev.Reduce(b).History(team, content)); diff != "" {
				t.Errorf("read history of %s within %+v (merged %v) mismatch (-want +got):\n%s", team, b, merged, diff)
			}
		}
	}
	// Pinned to sequence 1 only e1 exists: round 1 of a at 70.
	if got := ev.Reduce(rank.Bound{UpToSeq: 1}).Leaderboard(events.Desc); len(got.Rows) != 1 || got.Rows[0].BestScore != 70 || got.Seq != 1 {
		t.Errorf("leaderboard as of sequence 1 = %+v, want a with 70", got)
	}
	before2 := ev.Reduce(rank.Bound{BeforeRound: 2, UpToSeq: rank.AllSeqs}).Leaderboard(events.Desc)
	if got := before2.Rows[0]; got.TeamID != "b" || got.BestScore != 80 {
		t.Errorf("leaderboard before round 2: first row %+v, want team b with 80", got)
	}
	if ev.Bytes() == 0 || evs["nope"] == nil || len(evs["nope"].Reduce(rank.Everything()).Leaderboard(events.Desc).Rows) != 0 {
		t.Errorf("scores of two executions: %d bytes for exec, %+v for an unknown one", ev.Bytes(), evs["nope"])
	}
	// e4 is b's round 1; its replay names round 3. Content of rounds 2-3 holds only that replay,
	// which must not stand in for round 1's content.
	movedContent, err := s.Content(ctx, "exec", "b", 2, 4)
	if err != nil {
		t.Fatal(err)
	}
	wantB := []events.TeamRound{{RoundNumber: 1, EvaluationID: "e4", OverallScore: 80}}
	if diff := cmp.Diff(wantB, ev.Reduce(rank.Everything()).History("b", movedContent)); diff != "" {
		t.Errorf("history of b with the replay's content only (-want +got):\n%s", diff)
	}
	// Content of round 2 only: round 1 keeps its number, id and score, without content.
	later, err := s.Content(ctx, "exec", "a", 2, 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []events.TeamRound{{RoundNumber: 1, EvaluationID: "e2", OverallScore: 60}, round2}
	if diff := cmp.Diff(want, ev.Reduce(rank.Everything()).History("a", later)); diff != "" {
		t.Errorf("history with the content of round 2 only (-want +got):\n%s", diff)
	}

	unknown, err := s.Leaderboard(ctx, "nope", events.Desc, rank.Everything())
	if err != nil {
		t.Fatal(err)
	}
	if len(unknown.Rows) != 0 || unknown.Seq != 0 {
		t.Errorf("unknown execution: %+v, want no rows", unknown)
	}
}

func TestLatest(t *testing.T) {
	st := func(team, id string, round int, score float64, at int64, seq uint64) rank.Stored {
		return rank.Stored{RoundScore: rank.RoundScore{TeamID: team, TeamName: "n-" + team, Round: round, Score: score, AtMicros: at, EventID: id}, Seq: seq}
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
	var all uint64 = rank.AllSeqs
	for _, tt := range []struct {
		bound   rank.Bound
		want    []rank.RoundScore
		wantSeq uint64
	}{
		{rank.Bound{UpToSeq: all}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore, rows[5].RoundScore, rows[6].RoundScore}, 6},
		{rank.Bound{BeforeRound: 3, UpToSeq: all}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore, rows[5].RoundScore}, 5},
		{rank.Bound{BeforeRound: 2, UpToSeq: all}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore}, 4},
		// Pinned: later sequences are not seen, whatever their round or whether they are replays.
		{rank.Bound{UpToSeq: 2}, []rank.RoundScore{rows[2].RoundScore}, 2},
		{rank.Bound{UpToSeq: 5}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore, rows[5].RoundScore}, 5},
		{rank.Bound{BeforeRound: 2, UpToSeq: 5}, []rank.RoundScore{rows[3].RoundScore, rows[4].RoundScore}, 4},
		{rank.Bound{UpToSeq: 0}, []rank.RoundScore{}, 0},
	} {
		// Any order of the stored rows gives the same answer.
		for _, perm := range [][]int{{0, 1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1, 0}, {1, 3, 0, 6, 2, 5, 4}} {
			in := make([]rank.Stored, len(rows))
			for i, j := range perm {
				in[i] = rows[j]
			}
			got, seq := rank.Latest(in, tt.bound)
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
	ev.Reduce(rank.Bound{BeforeRound: 3, UpToSeq: rank.AllSeqs})
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
	for _, bound := range []rank.Bound{rank.Everything(), {BeforeRound: 4, UpToSeq: 40}, {UpToSeq: 12}} {
		for _, order := range []events.ScoreOrder{events.Desc, events.Asc} {
			want, got := ev.Reduce(bound).Leaderboard(order), back.Reduce(bound).Leaderboard(order)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%+v %s (-rows +snapshot):\n%s", bound, order, diff)
			}
		}
	}
}

// TestReadThreadsOfAReadonlyUser: reads with ReadThreads work for a user who may write and for
// one with readonly=1 (the console's). Current servers refuse a readonly=1 user's max_threads
// (code 164) and the store then reads with the server's default; 18.16 takes the setting from
// such a user, so here neither is refused.
func TestReadThreadsOfAReadonlyUser(t *testing.T) {
	st, cfg := testenv.Store(t, true)
	ctx := context.Background()
	if err := st.Insert(ctx, []rank.Record{record("e1", 1, "team-a", 1, 50, "2026-11-25T10:00:00Z")}); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"default", "reader"} {
		c := cfg
		c.User, c.ReadThreads = user, 1
		s, err := rank.Open(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for range 2 {
			board, err := s.Leaderboard(ctx, "exec", events.Desc, rank.Everything())
			if err != nil {
				t.Fatalf("%s: %v", user, err)
			}
			if len(board.Rows) != 1 || board.Rows[0].BestScore != 50 {
				t.Fatalf("%s: board %+v, want team-a at 50", user, board.Rows)
			}
		}
		if s.ThreadsRefused() {
			t.Errorf("%s: ClickHouse 18.16 refused max_threads", user)
		}
	}
}
