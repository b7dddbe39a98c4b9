package e2e

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestStateOfIdleExecutionsExpires: an execution idle for STATE_MAX_IDLE loses its score
// snapshot (SCORES) and its last leaderboard.updated (LEADERBOARDS); its next prompt reads
// ClickHouse and carries the whole board, exactly the ranker's.
func TestStateOfIdleExecutionsExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	e := newEnv(t)
	ranker := e.start("ranker", "STATE_MAX_IDLE=2s")
	composer := e.start("composer", "STATE_MAX_IDLE=2s")
	const exec = "idle"
	e.play(exec, 3, 2)
	ctx := t.Context()
	kv, err := e.js.KeyValue(ctx, events.BucketScores)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.js.Stream(ctx, events.StreamLeaderboards)
	if err != nil {
		t.Fatal(err)
	}
	// Snapshots were written (they may be gone already on a loaded machine: 2 s is short), and the
	// bucket and the stream carry the idle time.
	testenv.WaitFor(t, 20*time.Second, "score snapshots written", func() (bool, string) {
		n := ranker.metric(t, `ranker_score_snapshots_total{result="written"}`)
		return n > 0, fmt.Sprint(n)
	})
	if st, err := kv.Status(ctx); err != nil || st.TTL() != 2*time.Second {
		t.Fatalf("SCORES' TTL: %v, %v", st, err)
	}
	if c := lb.CachedInfo().Config; c.MaxAge != 2*time.Second {
		t.Fatalf("LEADERBOARDS' max_age %s", c.MaxAge)
	}
	testenv.WaitFor(t, 30*time.Second, "the snapshot and the last board of the idle execution gone", func() (bool, string) {
		_, kerr := kv.Get(ctx, exec)
		_, lerr := lb.GetLastMsgForSubject(ctx, events.TypeLeaderboardUpdated+"."+exec)
		return errors.Is(kerr, jetstream.ErrKeyNotFound) && errors.Is(lerr, jetstream.ErrMsgNotFound), fmt.Sprint(kerr, " ", lerr)
	})

	// The next round of one team: its board comes from ClickHouse and is the ranker's.
	queried := composer.metric(t, `composer_store_reads_total{result="queried"}`)
	e.requestRound("req-idle-after", events.RoundRequested{ExecutionID: exec, TeamID: "team-0", TeamName: "Team team-0",
		RoundNumber: 4, UserPrompt: "Improve.", MaxRounds: 4}, t0.Add(time.Hour))
	got := e.answers("prompt.*."+exec+".team-0", 3, 20*time.Second)
	a, ok := got["req-idle-after"]
	if !ok || !a.ok() {
		t.Fatalf("the request after the idle time: %+v", a)
	}
	var board leaderboard
	ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &board)
	if !slices.Equal(a.composed.Inputs.Leaderboard, board.Teams) || len(board.Teams) != 3 {
		t.Errorf("prompt board %+v, ranker's %+v", a.composed.Inputs.Leaderboard, board.Teams)
	}
	if n := composer.metric(t, `composer_store_reads_total{result="queried"}`); n <= queried {
		t.Errorf("composer_store_reads_total{queried} = %v, was %v: the board did not come from ClickHouse", n, queried)
	}
}
