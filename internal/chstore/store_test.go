package chstore_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

func openStore(t testing.TB) *chstore.Store {
	t.Helper()
	s, _ := openStoreAt(t)
	return s
}

// openStoreAt also returns a raw connection to the test database, to force merges.
func openStoreAt(t testing.TB) (*chstore.Store, driver.Conn) {
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

func checkStore(t *testing.T, s *chstore.Store, merged bool) {
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
	for _, b := range []rank.Bound{rank.Everything(), {BeforeRound: 2, UpTo: rank.End}, {UpTo: rank.Pos{Seq: 3}}, {BeforeRound: 3, UpTo: rank.Pos{Seq: 1}}, {UpTo: rank.Pos{Seq: 0}}} {
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
	if got := ev.Reduce(rank.Bound{UpTo: rank.Pos{Seq: 1}}).Leaderboard(events.Desc); len(got.Rows) != 1 || got.Rows[0].BestScore != 70 || got.Seq != 1 {
		t.Errorf("leaderboard as of sequence 1 = %+v, want a with 70", got)
	}
	before2 := ev.Reduce(rank.Bound{BeforeRound: 2, UpTo: rank.End}).Leaderboard(events.Desc)
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
		s, err := chstore.Open(ctx, c)
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
