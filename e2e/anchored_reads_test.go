package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// boardOf reads an execution's leaderboard from a ranker's API: its status, and each team's best
// score and rounds.
func boardOf(t *testing.T, ranker *proc, exec string) (int, map[string][2]float64, string) {
	t.Helper()
	resp, err := http.Get("http://" + ranker.addr + "/v1/executions/" + exec + "/leaderboard")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Teams   []events.LeaderboardRow `json:"teams"`
		Code    string                  `json:"code"`
		Message string                  `json:"message"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	rows := map[string][2]float64{}
	for _, r := range body.Teams {
		rows[r.TeamID] = [2]float64{r.BestScore, float64(r.Rounds)}
	}
	return resp.StatusCode, rows, body.Code + ": " + body.Message
}

// recount is the test's own board of what it published: each team's best score and rounds.
func recount(published []scored) map[string][2]float64 {
	out := map[string][2]float64{}
	for _, ev := range published {
		b := out[ev.team]
		if b[1] == 0 || ev.score > b[0] {
			b[0] = ev.score
		}
		b[1]++
		out[ev.team] = b
	}
	return out
}

// cliBoard is `podium leaderboard --json`'s exit status and board.
func cliBoard(t *testing.T, e *env, exec string) (int, map[string][2]float64, string) {
	t.Helper()
	out, code := e.podium(t, nil, "leaderboard", exec, "--json")
	rows := map[string][2]float64{}
	if code != 0 {
		return code, rows, out
	}
	var body struct {
		Teams []events.LeaderboardRow `json:"teams"`
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil {
		t.Fatalf("podium leaderboard --json: %v\n%s", err, out)
	}
	for _, r := range body.Teams {
		rows[r.TeamID] = [2]float64{r.BestScore, float64(r.Rounds)}
	}
	return code, rows, out
}

// TestReadsAfterATruncateAreNeverShort: the evaluations table emptied by hand (TRUNCATE) under two
// ranker replicas, the console and the CLI, none of which has noticed yet. Every read from then on
// (each ranker's API, the console's execution page, `podium leaderboard`) either answers the whole
// board, as the test recounts it from what it published, or refuses with a retryable status naming
// why (503 store_unavailable, a non-zero exit): never a short board with 200. The first API read
// after the TRUNCATE is refused (the table is empty; no refill can have finished). Then the same
// with a replay: the TRUNCATE followed at once by the anchor row's own evaluation published again
// (another message, as after the duplicate window), which on a table checked by the anchor's key
// alone made the emptied table look whole for ever; the anchor's position gives it away, the store
// is refilled and the board is whole again, and stays so once the table merged the anchor's copies.
func TestReadsAfterATruncateAreNeverShort(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	rankers := []*proc{e.start("ranker"), e.start("ranker")}
	console := e.start("console")
	const exec = "anchored"
	var sent []scored
	bodies := map[string]events.EvaluationCompleted{}
	for round := 1; round <= 4; round++ {
		for i, team := range []string{"t1", "t2", "t3"} {
			score := float64((round*11+i*7)%40 + i)
			id := fmt.Sprintf("ev-%s-%d", team, round)
			ev := evaluation(exec, team, "Team "+team, round, score, "work "+id, t0.Add(time.Duration(round)*time.Minute))
			bodies[id] = ev
			sent = append(sent, scored{team, round, score, e.publishEvaluation(id, ev)})
		}
	}
	truth := recount(sent)
	whole := func(what string) {
		testenv.WaitFor(t, 60*time.Second, what, func() (bool, string) {
			var said []string
			for i, r := range rankers {
				status, rows, msg := boardOf(t, r, exec)
				if status != http.StatusOK || !maps.Equal(rows, truth) {
					return false, fmt.Sprintf("ranker %d: %d %v %s", i, status, rows, msg)
				}
				said = append(said, fmt.Sprint(status))
			}
			return true, strings.Join(said, " ")
		})
	}
	whole("both rankers to show every evaluation")

	refills := func() float64 {
		n := 0.0
		for _, r := range rankers {
			n += r.metric(t, "ranker_store_refills_total")
		}
		return n
	}
	// read tries every reader once: what each answered (200 or not); a 200 that is not the truth
	// is the test's failure.
	read := func(phase string) (ok, refused int) {
		for i, r := range rankers {
			status, rows, msg := boardOf(t, r, exec)
			switch {
			case status == http.StatusOK && !maps.Equal(rows, truth):
				t.Errorf("%s: ranker %d answered 200 with %v; the recount is %v", phase, i, rows, truth)
			case status == http.StatusOK:
				ok++
			case status != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "store_unavailable: "):
				t.Errorf("%s: ranker %d answered %d %q; want 200 with the whole board or 503 naming the store", phase, i, status, msg)
			default:
				refused++
			}
		}
		status, page := getPage(t, "http://"+console.addr+"/executions/"+exec)
		switch {
		case status == http.StatusOK:
			// Every team played every round: the whole board is a row of each, each of 4 rounds.
			for team, b := range truth {
				if !strings.Contains(page, `data-team="`+team+`"`) || b[1] != 4 {
					t.Errorf("%s: the console answered 200 without %s's row", phase, team)
				}
			}
			if n := strings.Count(page, `class="num rounds">4</td>`); n != len(truth) {
				t.Errorf("%s: the console answered 200 with %d teams of 4 rounds; the recount has %d", phase, n, len(truth))
			}
			ok++
		case status != http.StatusServiceUnavailable:
			t.Errorf("%s: the console answered %d\n%.1000s", phase, status, page)
		default:
			refused++
		}
		code, rows, out := cliBoard(t, e, exec)
		switch {
		case code == 0 && !maps.Equal(rows, truth):
			t.Errorf("%s: podium leaderboard exited 0 with %v; the recount is %v", phase, rows, truth)
		case code == 0:
			ok++
		case !slices.ContainsFunc([]string{"not whole", "refilling", "no longer holds the row", "changed while it was read"}, func(why string) bool { return strings.Contains(out, why) }):
			t.Errorf("%s: podium leaderboard exited %d without naming the store: %s", phase, code, out)
		default:
			refused++
		}
		return ok, refused
	}

	for _, replay := range []bool{false, true} {
		phase := "after a TRUNCATE"
		if replay {
			phase = "after a TRUNCATE and a replay of the anchor's evaluation"
		}
		before := refills()
		anchor := publishedAnchor(t, e)
		e.storeExec("TRUNCATE TABLE evaluations")
		if replay {
			ev, ok := bodies[anchor.EventID]
			if !ok {
				t.Fatalf("the anchor %+v is no evaluation the test published", anchor)
			}
			// The same evaluation, another message: what JetStream takes after the duplicate window.
			e.publishRaw(events.EvaluationSubject(ev.ExecutionID, ev.TeamID), anchor.EventID+"-again", mustMarshal(t, published{id: anchor.EventID, ev: ev}))
		}
		status, rows, msg := boardOf(t, rankers[0], exec)
		if status == http.StatusOK {
			t.Errorf("%s: the first read answered 200 with %v (%s); the table was emptied just before", phase, rows, msg)
		}
		oks, refused := 0, 0
		deadline := time.Now().Add(90 * time.Second)
		for {
			ok, no := read(phase)
			oks, refused = oks+ok, refused+no
			if no == 0 && refills() > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the readers still refuse after 90 s (refills %v, %v before)", phase, refills(), before)
			}
			time.Sleep(200 * time.Millisecond)
		}
		whole(phase + ": the store whole again")
		t.Logf("%s: %d reads refused, %d answered whole; refills %v (%v before)", phase, refused+1, oks, refills(), before)
	}
	// The table merged: of the anchor's two copies (the refill's, the replay's) the one kept is the
	// first; the anchor is still held, nothing is refilled again, every read is whole.
	e.storeExec("OPTIMIZE TABLE evaluations FINAL")
	settled := refills()
	holds(t, 7*time.Second, "the store whole, and not refilled, after a merge", func() (bool, string) {
		for i, r := range rankers {
			if status, rows, msg := boardOf(t, r, exec); status != http.StatusOK || !maps.Equal(rows, truth) {
				return false, fmt.Sprintf("ranker %d: %d %v %s", i, status, rows, msg)
			}
		}
		return refills() == settled, fmt.Sprintf("refills %v, %v before the merge", refills(), settled)
	})
}

// publishedAnchor is the anchor row the ranker publishes on its consumer.
func publishedAnchor(t *testing.T, e *env) chstore.RowKey {
	t.Helper()
	cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	k, err := chstore.ParseRowKey(cons.CachedInfo().Config.Metadata[events.MetaStoreAnchor])
	if err != nil {
		t.Fatal(err)
	}
	return k
}
