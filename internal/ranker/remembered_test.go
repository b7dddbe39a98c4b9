package ranker

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// bareRanker is a ranker over a fresh store (no lineage) and a fresh NATS, without a consumer.
func bareRanker(t *testing.T) (*ranker, jetstream.JetStream, *chstore.Store) {
	st, _ := testenv.Store(t, true)
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	r := &ranker{log: slog.New(slog.DiscardHandler), js: js, nc: nc, store: st, m: newMetrics(prometheus.NewRegistry()), now: time.Now}
	r.writes, r.whole, r.boards = newConditions(health.New(prometheus.NewRegistry(), "ranker"))
	r.sink = newSink(st, r.m, r.writes, r.log)
	r.repair = func(context.Context) error { return nil }
	if _, err := events.MakeStreams(t.Context(), js, events.StreamOptions{}, events.StreamEvaluations, events.StreamLeaderboards, events.StreamAudit); err != nil {
		t.Fatal(err)
	}
	return r, js, st
}

func putBoard(t *testing.T, js jetstream.JetStream, exec string, era uint32) {
	t.Helper()
	body, err := events.Marshal("board-"+exec, "ranker", events.TypeLeaderboardUpdated, time.Now(), events.LeaderboardUpdated{
		ExecutionID: exec, EvaluationsSeq: 1, EvaluationsEra: era, Leaderboard: []events.LeaderboardRow{{Position: 1, Rank: 1, TeamID: "t", TeamName: "T"}}})
	if err == nil {
		_, err = js.Publish(t.Context(), events.LeaderboardSubject(exec), body)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestAnUpgradedStoreIsAdoptedInItsStreamsEra: a store of a Podium before lineages (rows, no
// store_lineage note, no lineage on the consumer), every row of the stream there is now, with or
// without a board on LEADERBOARDS (any upgraded deployment has them): adopted in era 0, floor 0,
// its rows' (a review found a board making it era 1, and a later loss of the table name era 0).
func TestAnUpgradedStoreIsAdoptedInItsStreamsEra(t *testing.T) {
	for _, board := range []bool{false, true} {
		t.Run(fmt.Sprintf("board=%v", board), func(t *testing.T) {
			ctx := t.Context()
			r, js, st := bareRanker(t)
			recs := records("x", "e1", "e2")
			publishRecords(t, js, recs)
			if err := st.Insert(ctx, recs); err != nil {
				t.Fatal(err)
			}
			if board {
				putBoard(t, js, "x", 0)
			}
			r.keep = r.newKeeper()
			if err := r.keep.Check(ctx); err != nil {
				t.Fatal(err)
			}
			lin, _, err := st.Lineage(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if lin.Era != 0 || lin.Floor != 0 {
				t.Errorf("adopted in era %d, floor %d; want era 0, floor 0 (every row is of the stream there is now)", lin.Era, lin.Floor)
			}
			info, _ := js.Stream(ctx, events.StreamEvaluations)
			if from, to, lost := lin.LostEras(chstore.StreamID(info.CachedInfo().Created)); lost {
				t.Errorf("losing this table would name eras %d-%d lost, though EVALUATIONS holds all of it", from, to)
			}
		})
	}
}

// TestALineageTableDroppedAloneKeepsTheFloor: the table keeps its rows (era 0 of a stream deleted
// since, era 1 of the stream there is now) but store_lineage is dropped, with the ranker down and
// its consumer deleted; LEADERBOARDS holds a board of era 1, SCORES nothing. The refill takes era
// 1 (eras never go back) and keeps the floor at 0, what the table holds: its era-0 rows are kept
// nowhere else (a review found it raised to the era).
func TestALineageTableDroppedAloneKeepsTheFloor(t *testing.T) {
	ctx := t.Context()
	st, cfg := testenv.Store(t, true)
	r, js, _ := bareRanker(t)
	r.store = st
	r.repair = func(ctx context.Context) error { _, err := st.Repair(ctx); return err }
	recs := records("x", "e1")
	recs[0].Era = 1
	publishRecords(t, js, recs)
	old := records("x", "e0")
	old[0].Seq, old[0].TeamID = 5, "team-old"
	if err := st.Insert(ctx, append(old, recs...)); err != nil {
		t.Fatal(err)
	}
	putBoard(t, js, "x", 1)
	exec(t, cfg, "DROP TABLE store_lineage")
	r.keep = r.newKeeper()
	if err := r.keep.Check(ctx); err != nil {
		t.Fatal(err)
	}
	lin, _, err := st.Lineage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lin.Floor != 0 || lin.Era != 1 {
		t.Errorf("era %d, floor %d; want era 1 (the board's: eras never go back) and floor 0 (the table still holds era 0's rows: losing it later names them)", lin.Era, lin.Floor)
	}
}

// TestALineageTableDroppedWithNoBoardKeepsTheEra: TestALineageTableDroppedAloneKeepsTheFloor
// without a board (nothing names an era: EraFloor 0). The lineage's table is made again and the
// table, which survived, adopted: era 1 (its newest row's, of the stream there is now), floor 0.
// Before (a review found it), it was refilled over at era 0: the era went back, the stream's rows
// written again at era 0, the refill never finished, and the era-0 rows of the deleted stream were
// taken for the stream there is now.
func TestALineageTableDroppedWithNoBoardKeepsTheEra(t *testing.T) {
	ctx := t.Context()
	st, cfg := testenv.Store(t, true)
	r, js, _ := bareRanker(t)
	r.store = st
	r.repair = func(ctx context.Context) error { _, err := st.Repair(ctx); return err }
	recs := records("x", "e1")
	recs[0].Era = 1
	publishRecords(t, js, recs)
	old := records("x", "e0")
	old[0].Seq, old[0].TeamID = 5, "team-old"
	if err := st.Insert(ctx, append(old, recs...)); err != nil {
		t.Fatal(err)
	}
	exec(t, cfg, "DROP TABLE store_lineage")
	r.keep = r.newKeeper()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := r.keep.Check(cctx); err != nil {
		pub := r.keep.Published()
		t.Fatalf("check: %v (the refill never finishes); published lineage %+v", err, pub)
	}
	lin, _, err := st.Lineage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lin.Era != 1 || lin.Floor != 0 {
		t.Errorf("era %d, floor %d; want era 1 (the table's newest row is era 1: eras never go back) and floor 0", lin.Era, lin.Floor)
	}
	if _, _, lost := lin.LostEras(lin.Stream); !lost {
		t.Errorf("losing this table would name nothing, though its era-0 row (team-old) is kept nowhere else")
	}
}
