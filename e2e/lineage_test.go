package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// lineageTournament publishes rounds 1..rounds of teams t1..tN of exec and waits until the
// ranker committed them all; it returns how many it published.
func lineageTournament(t *testing.T, e *env, exec string, teams, rounds int) int {
	t.Helper()
	n := 0
	for r := 1; r <= rounds; r++ {
		for tm := 1; tm <= teams; tm++ {
			team := fmt.Sprintf("t%d", tm)
			e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r), evaluation(exec, team, "Team "+team, r, float64(10*tm+r), "work of "+team, t0.Add(time.Duration(n)*time.Second)))
			n++
		}
	}
	waitCommitted(t, e, n)
	return n
}

// promptOf requests a round and returns its prompt.composed.
func promptOf(t *testing.T, e *env, exec, team string, round int) events.PromptComposed {
	t.Helper()
	id := fmt.Sprintf("req-%s-%s-%d", exec, team, round)
	e.requestRound(id, events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round, UserPrompt: "go"}, t0.Add(time.Hour))
	got := e.collect(events.StreamPrompts, fmt.Sprintf("prompt.*.%s.%s", exec, team), 1, 30*time.Second)
	for _, m := range got {
		if strings.HasPrefix(m.Subject, "prompt.composed.") {
			var pc events.PromptComposed
			if env := dataOf(t, m.Body, &pc); env.ID == events.PromptEventID(id) {
				return pc
			}
		}
	}
	t.Fatalf("no prompt.composed for %s: %d answers", id, len(got))
	return events.PromptComposed{}
}

// checkWhole fails unless the prompt carries every team and every round of the board, and its
// team's own evaluations of rounds before it.
func checkWhole(t *testing.T, pc events.PromptComposed, teams, rounds int) {
	t.Helper()
	total := 0
	for _, row := range pc.Inputs.Leaderboard {
		total += row.Rounds
	}
	if pc.Inputs.TeamCount != teams || total != rounds {
		t.Errorf("the prompt of %s round %d shows %d teams and %d rounds on its board, want %d and %d: %+v", pc.TeamID, pc.RoundNumber,
			pc.Inputs.TeamCount, total, teams, rounds, pc.Inputs.Leaderboard)
	}
	if len(pc.Inputs.EvaluationIDs) == 0 {
		t.Errorf("the prompt of %s round %d carries none of the team's history", pc.TeamID, pc.RoundNumber)
	}
}

// TestDroppedTableIsRefilledBeforeAnyPrompt is the operator's story of the issue: an execution
// is ranked, a prompt composed (a score snapshot written), the evaluations table dropped, one new
// evaluation arrives. The ranker recreates the table and refills it from EVALUATIONS, unready
// meanwhile; once it is ready again its board is whole, and so is every next prompt: the snapshot
// written before the drop names an older lineage and is not served. A rebuild afterwards changes
// nothing, and every prompt verifies.
func TestDroppedTableIsRefilledBeforeAnyPrompt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	const exec, teams = "refilled", 4
	n := lineageTournament(t, e, exec, teams, 2)
	checkWhole(t, promptOf(t, e, exec, "t1", 3), teams, n)

	e.storeExec("DROP TABLE evaluations")
	dropped := time.Now()
	e.publishEvaluation("ev-after-drop", evaluation(exec, "t1", "Team t1", 3, 99, "after the drop", t0.Add(time.Hour)))
	n++
	testenv.WaitFor(t, 30*time.Second, "the ranker to refill its store", func() (bool, string) {
		v := ranker.metric(t, "ranker_store_refills_total")
		return v >= 1, fmt.Sprint(v, " refills")
	})
	waitReadiness(t, ranker, http.StatusOK, 30*time.Second)
	ready := time.Since(dropped)
	waitCommitted(t, e, n)
	if got, lb := boardRounds(t, ranker, exec); got != n || len(lb.Teams) != teams {
		t.Fatalf("the ranker's board counts %d rounds of %d teams after the refill, want %d of %d", got, len(lb.Teams), n, teams)
	}
	checkWhole(t, promptOf(t, e, exec, "t2", 3), teams, n)

	out, code := e.podium(t, nil, "store", "rebuild", "--no-progress")
	if code != 0 {
		t.Fatalf("podium store rebuild: exit %d\n%s", code, out)
	}
	checkWhole(t, promptOf(t, e, exec, "t3", 3), teams, n)
	if out, code := e.verifySettled(t, exec); code != 0 {
		t.Fatalf("podium prompts verify: exit %d\n%s", code, out)
	}
	if lines := logLines(ranker, "refilling the store from EVALUATIONS; unready until it is whole"); len(lines) == 0 {
		t.Error("the ranker did not log why it refilled")
	}
	t.Logf("table dropped, one evaluation published: the ranker refilled %d evaluations and was ready %s after the drop", n, ready.Round(time.Millisecond))
}

// TestNewDatabaseIsRefilledAtStart: the database is dropped while the ranker is down. The ranker
// that starts finds its store empty beside a stream that holds evaluations, refills it before it
// is ready, and its first board is whole. `podium store rebuild --from-start` works on such a
// database as well.
func TestNewDatabaseIsRefilledAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	const exec, teams = "restarted", 3
	n := lineageTournament(t, e, exec, teams, 3)
	if _, err := ranker.stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	dropDatabase(t, e)

	start := time.Now()
	ranker = e.start("ranker")
	ready := time.Since(start)
	if got, lb := boardRounds(t, ranker, exec); got != n || len(lb.Teams) != teams {
		t.Errorf("the first board after the start counts %d rounds of %d teams, want %d of %d", got, len(lb.Teams), n, teams)
	}
	if lines := logLines(ranker, "refilling the store from EVALUATIONS; unready until it is whole"); len(lines) != 1 {
		t.Errorf("%d refills logged, want 1", len(lines))
	} else if reason := fmt.Sprint(lines[0]["reason"]); !strings.Contains(reason, "empty") && !strings.Contains(reason, "missing") {
		t.Errorf("the refill's reason %q says nothing of the empty store", reason)
	}
	if _, err := ranker.stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	dropDatabase(t, e)
	out, code := e.podium(t, nil, "store", "rebuild", "--from-start", "--no-progress")
	if code != 0 {
		t.Fatalf("podium store rebuild --from-start on a new database: exit %d\n%s", code, out)
	}
	if want := fmt.Sprintf("%d messages read, %d evaluations written", n, n); !strings.Contains(out, want) {
		t.Errorf("the rebuild does not say %q:\n%s", want, out)
	}
	t.Logf("a ranker started on a new database beside %d evaluations was ready, with its store whole, after %s", n, ready.Round(time.Millisecond))
}

// TestTwoRankersRefillTogether: two ranker replicas find the table dropped at once. One refills
// it, the other waits for that refill instead of starting its own over and over; both end ready
// with the whole board, and no refill starts again afterwards.
func TestTwoRankersRefillTogether(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rankers := []*proc{e.start("ranker"), e.start("ranker")}
	e.start("composer")
	const exec, teams = "two-rankers", 4
	n := lineageTournament(t, e, exec, teams, 3)
	e.storeExec("DROP TABLE evaluations")
	for i := range 8 {
		e.publishEvaluation(fmt.Sprintf("ev-after-%d", i), evaluation(exec, fmt.Sprintf("t%d", i%teams+1), "Team", 4+i/teams, 42, "after", t0.Add(time.Hour)))
		n++
	}
	waitCommitted(t, e, n)
	for _, r := range rankers {
		waitReadiness(t, r, http.StatusOK, 60*time.Second)
	}
	refills := func() float64 {
		return rankers[0].metric(t, "ranker_store_refills_total") + rankers[1].metric(t, "ranker_store_refills_total")
	}
	settled := refills()
	if settled < 1 {
		t.Fatal("no ranker refilled the store")
	}
	time.Sleep(3 * checkEveryForTests) // each ranker checks its store this often
	if again := refills(); again != settled {
		t.Errorf("refills went on after the store was whole: %v, then %v", settled, again)
	}
	for _, r := range rankers {
		if got, lb := boardRounds(t, r, exec); got != n || len(lb.Teams) != teams {
			t.Errorf("a ranker's board counts %d rounds of %d teams, want %d of %d", got, len(lb.Teams), n, teams)
		}
	}
	checkWhole(t, promptOf(t, e, exec, "t1", 7), teams, n)
	t.Logf("two rankers, table dropped: %v refill(s) in all, both ready with the whole board", settled)
}

// checkEveryForTests is the ranker's lineage check period (cmd/ranker checkEvery).
const checkEveryForTests = 5 * time.Second

// TestOneEventIDForTwoTeamsCountsBoth: an orchestrator whose event ids are unique per team sends
// one id for the evaluations of two teams, and they reach the ranker in one batch. An evaluation
// is its id within its team, as the store and every read count it: both are stored and ranked,
// and the store refilled from the stream after its table is dropped ranks them the same.
func TestOneEventIDForTwoTeamsCountsBoth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const exec = "shared-id"
	want := []struct {
		team  string
		score float64
	}{{"bravo", 97}, {"alpha", 95}} // the board, best first
	if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	for _, w := range want {
		body, err := events.Marshal("ev-shared", "orchestrator/test", events.TypeEvaluationCompleted, t0,
			evaluation(exec, w.team, "Team "+w.team, 1, w.score, "the answer of "+w.team, t0))
		if err != nil {
			t.Fatal(err)
		}
		// Each its own message id: the stream keeps both, as it does beyond its duplicate window.
		if _, err := e.js.Publish(t.Context(), events.EvaluationSubject(exec, w.team), body, jetstream.WithMsgID("ev-shared/"+w.team)); err != nil {
			t.Fatal(err)
		}
	}
	// Started after both are stored: they come in one batch.
	ranker := e.start("ranker")
	check := func(when string) {
		t.Helper()
		testenv.WaitFor(t, 30*time.Second, "both teams ranked "+when, func() (bool, string) {
			var lb leaderboard
			if code := ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &lb); code != http.StatusOK || len(lb.Teams) != len(want) {
				return false, fmt.Sprintf("%d: %+v", code, lb.Teams)
			}
			for i, w := range want {
				if lb.Teams[i].TeamID != w.team || lb.Teams[i].BestScore != w.score || lb.Teams[i].Rounds != 1 {
					return false, fmt.Sprintf("%+v", lb.Teams)
				}
			}
			return true, ""
		})
	}
	check("as committed")
	e.storeExec("DROP TABLE evaluations")
	testenv.WaitFor(t, 30*time.Second, "the ranker to refill its store", func() (bool, string) {
		v := ranker.metric(t, "ranker_store_refills_total")
		return v >= 1, fmt.Sprint(v, " refills")
	})
	waitReadiness(t, ranker, http.StatusOK, 30*time.Second)
	check("after the refill")
}
