package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestStoreRebuiltFromTheStream: the EVALUATIONS stream is the log and ClickHouse a view of it.
// Prompts are composed from the first half of a tournament; then, while the second half flows,
// the database is dropped. The ranker makes it again and stores what comes next; `podium store
// rebuild` writes the whole stream back. Every leaderboard equals the ground truth, and every
// prompt recorded before the drop verifies: the rows are the ones the ranker had written, at
// the same sequences.
func TestStoreRebuiltFromTheStream(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker", "RANKER_BATCH_SIZE=32", "RANKER_FLUSH_INTERVAL=20ms")
	e.start("composer")
	sends, first := tournament(2026, 4, 5, 4)
	half := len(sends) / 2
	publishAll(t, e, sends, 0, half)
	waitCommitted(t, e, half)

	// Round 5 of every team of exec-0: prompts pinned to what was stored before the drop.
	teams := map[string]bool{}
	for _, s := range sends[:half] {
		if s.ev.ExecutionID == "exec-0" {
			teams[s.ev.TeamID] = true
		}
	}
	at := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	for team := range teams {
		e.requestRound("req-"+team, events.RoundRequested{ExecutionID: "exec-0", TeamID: team, TeamName: team, RoundNumber: 5, UserPrompt: "go"}, at)
	}
	if got := e.collect(events.StreamPrompts, "prompt.composed.exec-0.*", len(teams), 30*time.Second); len(got) != len(teams) {
		t.Fatalf("%d prompts composed, want %d", len(got), len(teams))
	}

	// The second half flows while an operator drops the database.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := half; i < len(sends); i += 10 {
			publishAll(t, e, sends, i, min(i+10, len(sends)))
			time.Sleep(10 * time.Millisecond) // pacing: the drop lands while evaluations flow
		}
	}()
	dropDatabase(t, e)
	<-done // before anything can fail the test: the publisher must not outlive it
	waitCommitted(t, e, len(sends))
	testenv.WaitFor(t, 30*time.Second, "the ranker to recreate the database", func() (bool, string) {
		n := ranker.metric(t, "ranker_clickhouse_repairs_total")
		return n >= 1, fmt.Sprintf("%v repairs", n)
	})

	out, code := e.podium(t, nil, "store", "rebuild", "--no-progress")
	if code != 0 {
		t.Fatalf("podium store rebuild: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, fmt.Sprintf("%d messages read, %d evaluations written, 0 invalid skipped", len(sends), len(sends))) {
		t.Errorf("the rebuild did not write the whole stream:\n%s", out)
	}
	t.Logf("rebuild:\n%s", out)
	checkAgainstTruth(t, ranker, first)

	out, code = e.verifySettled(t, "exec-0")
	if code != 0 {
		t.Fatalf("podium prompts verify after the rebuild: exit %d\n%s", code, out)
	}

	// Again: nothing left to write, and nothing changes.
	out, code = e.podium(t, nil, "store", "rebuild", "--no-progress")
	if code != 0 || !strings.Contains(out, "0 messages read") {
		t.Errorf("a second rebuild: exit %d\n%s", code, out)
	}
	checkAgainstTruth(t, ranker, first)
}

// dropDatabase drops the test's database as an operator would. The ranker may be recreating a
// table in it at that moment (it was dropped a moment ago, or an insert races the drop); the drop
// is tried again then, as an operator would.
func dropDatabase(t *testing.T, e *env) {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.chAddr}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testenv.WaitFor(t, 10*time.Second, "DROP DATABASE to succeed", func() (bool, string) {
		err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+e.database)
		return err == nil, fmt.Sprint(err)
	})
}
