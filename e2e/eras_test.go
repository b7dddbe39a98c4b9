package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestEvaluationsDeletedLosesNothingAcknowledged is the operator's case of issue 34: 3 teams x 2
// rounds committed, EVALUATIONS deleted, 3 round-3 requests at once, the stream made again by the
// ranker, one new evaluation, 3 round-4 requests. Every prompt carries every evaluation
// acknowledged before its request (the board of all 3 teams and each team's whole history), as
// the test recounts them from what it published; none is composed as of a sequence of the new
// stream alone. The new stream is a new era (evaluations_era 1 in the records), and an audit
// renders each record again to the same bytes.
func TestEvaluationsDeletedLosesNothingAcknowledged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	const exec = "eras"
	teams := []string{"t1", "t2", "t3"}
	var published []scored // the oracle: every evaluation the test published
	publish := func(id, team string, round int, score float64) {
		e.publishEvaluation(id, evaluation(exec, team, "Team "+team, round, score, fmt.Sprintf("work of %s in round %d", team, round), t0.Add(time.Duration(round)*time.Minute)))
		published = append(published, scored{team, round, score, 0})
	}
	for round := 1; round <= 2; round++ {
		for i, team := range teams {
			publish(fmt.Sprintf("ev-%s-%d", team, round), team, round, float64(10*round+i))
		}
	}
	waitBoardRounds(t, ranker, exec, 6, 30*time.Second)

	if err := e.js.DeleteStream(t.Context(), events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	request := func(round int) {
		for _, team := range teams {
			e.requestRound(fmt.Sprintf("req-%s-%d", team, round), events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team,
				RoundNumber: round, UserPrompt: "go"}, t0.Add(time.Hour))
		}
	}
	request(3) // while EVALUATIONS is missing: they wait for it, never compose as of nothing
	// check recounts what a prompt for round of team must show, from what the test published.
	check := func(a answer, team string, round int) {
		t.Helper()
		if !a.ok() {
			t.Errorf("the request of %s round %d was not composed: %s %+v", team, round, a.subject, a.failed)
			return
		}
		pc := a.composed
		// Live standings count the rounds before the request's.
		if why := differs(pc, published, func(ev scored) bool { return ev.round < round }); why != "" {
			t.Errorf("the prompt of %s round %d %s", team, round, why)
		}
		if pc.Inputs.EvaluationsEra != 1 {
			t.Errorf("the prompt of %s round %d is composed as of era %d (sequence %d), want era 1: the stream was made again", team, round, pc.Inputs.EvaluationsEra, pc.Inputs.EvaluationsSeq)
		}
	}
	third := e.answers("prompt.*."+exec+".*", 3, 60*time.Second)
	for _, team := range teams {
		check(third[fmt.Sprintf("req-%s-3", team)], team, 3)
	}

	// The ranker made the stream again; one new evaluation, then round 4.
	testenv.WaitFor(t, 30*time.Second, "EVALUATIONS made again", func() (bool, string) {
		_, err := e.js.Stream(t.Context(), events.StreamEvaluations)
		return err == nil, fmt.Sprint(err)
	})
	publish("ev-t1-3", "t1", 3, 99)
	waitBoardRounds(t, ranker, exec, 7, 30*time.Second)
	request(4)
	all := e.answers("prompt.*."+exec+".*", 6, 60*time.Second)
	for _, team := range teams {
		check(all[fmt.Sprintf("req-%s-4", team)], team, 4)
	}
	for _, p := range []*proc{ranker, composer} {
		waitReadiness(t, p, http.StatusOK, 30*time.Second)
	}
	// An auditor renders every record again as of its position (era and sequence): the same bytes.
	out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec)
	if code != 0 {
		t.Errorf("podium prompts verify: exit %d\n%s", code, out)
	}
}

// TestTruncateWhileEvaluationsFlow is issue 34's TRUNCATE case: 4 teams, each evaluation followed
// at once by the team's next request, `TRUNCATE TABLE evaluations` after round 4, and a request
// of every team at once after it. Every prompt
// composed shows the truth as of its own evaluations_seq, as the test recounts it from what it
// published (each team's best score and rounds, its own history), and that sequence covers the
// evaluation the team published just before asking: the composers' reads and the ranker's are
// anchored on a row the table held (chstore/anchored.go), so a table emptied under them is
// refilled, never read short.
func TestTruncateWhileEvaluationsFlow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	const exec = "trunc"
	teams := []string{"t1", "t2", "t3", "t4"}
	var published []scored
	asked := map[string]uint64{} // request id -> the sequence of its team's evaluation just before
	const rounds = 10
	for round := 1; round <= rounds; round++ {
		for i, team := range teams {
			score := float64((round*7+i*13)%50 + i)
			seq := e.publishEvaluation(fmt.Sprintf("ev-%s-%d", team, round), evaluation(exec, team, "Team "+team, round, score, fmt.Sprintf("work of %s in round %d", team, round), t0.Add(time.Duration(round)*time.Minute)))
			published = append(published, scored{team, round, score, seq})
			id := fmt.Sprintf("req-%s-%d", team, round+1)
			asked[id] = seq
			e.requestRound(id, events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round + 1, UserPrompt: "go"}, t0.Add(time.Hour))
		}
		if round == 4 {
			e.storeExec("TRUNCATE TABLE evaluations")
			// Asked at once, before any new evaluation: only the composers' reads can find the
			// table emptied (the ranker has nothing to commit that would).
			for i, team := range teams {
				id := "again-" + team
				asked[id] = published[len(published)-len(teams)+i].seq
				e.requestRound(id, events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round + 1, UserPrompt: "again"}, t0.Add(time.Hour))
			}
		}
	}
	got := e.answers("prompt.*."+exec+".*", len(asked), 90*time.Second)
	wrong := 0
	for id, before := range asked {
		a, ok := got[id]
		if !ok {
			t.Errorf("%s was not answered", id)
			continue
		}
		if !a.ok() {
			t.Errorf("%s failed: %+v", id, a.failed)
			continue
		}
		pc := a.composed
		s := pc.Inputs.EvaluationsSeq
		if s < before {
			t.Errorf("%s is composed as of sequence %d, before its team's evaluation %d acknowledged before it", id, s, before)
		}
		if why := differs(pc, published, func(ev scored) bool { return ev.seq <= s }); why != "" {
			wrong++
			t.Errorf("%s (evaluations_seq %d) %s", id, s, why)
		}
	}
	t.Logf("%d prompts, %d with another board or history than the truth as of their sequence", len(asked), wrong)
	for _, p := range []*proc{ranker, composer} {
		waitReadiness(t, p, http.StatusOK, 30*time.Second)
	}
}

// scored is an evaluation a test published: its team, round, score and stream sequence.
type scored struct {
	team  string
	round int
	score float64
	seq   uint64
}

// differs holds a prompt to the test's own recount of the evaluations counted (count says which):
// every team's best score and rounds on its board, and its team's own rounds before its round in
// its history. It says how the prompt differs; empty when it does not.
func differs(pc events.PromptComposed, published []scored, count func(scored) bool) string {
	best, rounds := map[string]float64{}, map[string]int{}
	var own []int
	for _, ev := range published {
		if !count(ev) {
			continue
		}
		if b, ok := best[ev.team]; !ok || ev.score > b {
			best[ev.team] = ev.score
		}
		rounds[ev.team]++
		if ev.team == pc.TeamID && ev.round < pc.RoundNumber {
			own = append(own, ev.round)
		}
	}
	slices.Sort(own)
	bad := len(pc.Inputs.Leaderboard) != len(best) || !slices.Equal(slices.Sorted(slices.Values(pc.Inputs.HistoryRounds)), own)
	for _, row := range pc.Inputs.Leaderboard {
		bad = bad || row.BestScore != best[row.TeamID] || row.Rounds != rounds[row.TeamID]
	}
	if !bad {
		return ""
	}
	return fmt.Sprintf("shows board %+v and history %v; the recount: best %v over %v rounds, history %v", pc.Inputs.Leaderboard, pc.Inputs.HistoryRounds, best, rounds, own)
}

// TestALossIsNamedUntilAccepted: 3 teams' rounds 1-2 stored (era 0), EVALUATIONS deleted and made
// again, round 3 stored (era 1), then the evaluations table dropped. The rows of era 0 exist
// nowhere now. Before, the ranker refilled the table from the new stream and called it whole, and
// every later prompt silently lacked rounds 1-2. Now it stays unready naming the loss (the lineage,
// era 0, the execution), composes nothing (a request waits; the API answers 503), and `podium
// store accept-loss` shows the loss and refuses without the lineage and a reason. Accepted, the loss
// is recorded on AUDIT, the ranker refills from the stream there is now and is ready, and the next
// prompt shows the board of rounds 3 and 4 (round 4 published during the loss), as the test
// recounts it from what the stream holds.
func TestALossIsNamedUntilAccepted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	const exec = "loss"
	teams := []string{"t1", "t2", "t3"}
	var era1 []scored // what the stream there is now holds: the oracle after the loss
	publish := func(round int) {
		for i, team := range teams {
			score := float64(10*round + i)
			e.publishEvaluation(fmt.Sprintf("ev-%s-%d", team, round), evaluation(exec, team, "Team "+team, round, score, "work", t0.Add(time.Duration(round)*time.Minute)))
			if round >= 3 {
				era1 = append(era1, scored{team, round, score, 0})
			}
		}
	}
	publish(1)
	publish(2)
	waitBoardRounds(t, ranker, exec, 6, 30*time.Second)
	remakeEvaluations(t, e)
	publish(3)
	waitBoardRounds(t, ranker, exec, 9, 30*time.Second)

	e.storeExec("DROP TABLE evaluations")
	testenv.WaitFor(t, 30*time.Second, "the ranker to name the loss", func() (bool, string) {
		code, body := readiness(ranker)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "evaluations lost") &&
			strings.Contains(body, "era 0") && strings.Contains(body, "["+exec+"]"), fmt.Sprint(code, body)
	})
	publish(4) // evaluations that arrive during the loss: stored once it is accepted
	e.requestRound("req-during", events.RoundRequested{ExecutionID: exec, TeamID: "t1", TeamName: "Team t1", RoundNumber: 4, UserPrompt: "go"}, t0.Add(time.Hour))
	if got := e.collect(events.StreamPrompts, "prompt.composed."+exec+".>", 1, 5*time.Second); len(got) != 0 {
		t.Fatalf("a prompt was composed while the store's loss waited for an operator: %s", got[0].Body)
	}
	if code, rows, msg := boardOf(t, ranker, exec); code != http.StatusServiceUnavailable {
		t.Errorf("the ranker's API during the loss: %d %v %s, want 503", code, rows, msg)
	}

	out, code := e.podium(t, nil, "store", "accept-loss")
	lineage := ""
	if i := strings.Index(out, "--lineage "); i >= 0 {
		lineage = strings.Fields(out[i+len("--lineage "):])[0]
	}
	if code == 0 || lineage == "" || !strings.Contains(out, "eras 0-0") || !strings.Contains(out, "["+exec+"]") {
		t.Fatalf("podium store accept-loss without --lineage: exit %d, want non-zero naming the loss and its lineage\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "store", "accept-loss", "--lineage", "1@"+lineage, "--reason", "x"); code == 0 {
		t.Errorf("accept-loss of another lineage: exit 0\n%s", out)
	}
	if out, code := e.podium(t, nil, "store", "accept-loss", "--lineage", lineage, "--reason", "the era-0 backup was lost too"); code != 0 {
		t.Fatalf("accept-loss: exit %d\n%s", code, out)
	}
	waitReadiness(t, ranker, http.StatusOK, 60*time.Second)
	rec, err := e.js.Stream(t.Context(), events.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	m, err := rec.GetLastMsgForSubject(t.Context(), events.SubjectLossAccepted)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m.Data), `"reason":"the era-0 backup was lost too"`) || !strings.Contains(string(m.Data), lineage) {
		t.Errorf("the accepted loss on AUDIT: %s", m.Data)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(m.Data))
	if err != nil {
		t.Fatal(err)
	}
	if err := compileSchema(t, filepath.Join("..", "schemas", "audit", "loss.schema.json")).Validate(doc); err != nil {
		t.Errorf("the accepted loss on AUDIT does not match schemas/audit/loss.schema.json: %v\n%s", err, m.Data)
	}
	e.requestRound("req-after", events.RoundRequested{ExecutionID: exec, TeamID: "t2", TeamName: "Team t2", RoundNumber: 5, UserPrompt: "go"}, t0.Add(time.Hour))
	got := e.answers("prompt.*."+exec+".*", 2, 60*time.Second)
	a := got["req-after"]
	if !a.ok() {
		t.Fatalf("the request after the loss was accepted: %s %+v", a.subject, a.failed)
	}
	if why := differs(a.composed, era1, func(scored) bool { return true }); why != "" {
		t.Errorf("the prompt after the loss was accepted %s", why)
	}
	if d := got["req-during"]; d.ok() && differs(d.composed, era1, func(scored) bool { return true }) != "" {
		t.Errorf("the request made during the loss was composed short of what the stream holds: %+v", d.composed.Inputs.Leaderboard)
	}
}

// TestErasOnlyGrow: rounds stored in era 0, EVALUATIONS deleted and made again, a round in era 1;
// then store_lineage is lost (TRUNCATE) while the rows survive, and the ranker restarted. Before,
// it noted the surviving table as era 0, so the rows of era 1 sorted after every new one and the
// next prompts, composed as of era 0, dropped them. Now the era is taken from the lineage its
// consumer published (1) and the rows: the next prompt shows every round, as of era 1.
func TestErasOnlyGrow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	const exec = "grow"
	teams := []string{"t1", "t2"}
	var published []scored
	publish := func(round int) {
		for i, team := range teams {
			score := float64(10*round + i)
			e.publishEvaluation(fmt.Sprintf("ev-%s-%d", team, round), evaluation(exec, team, "Team "+team, round, score, "work", t0.Add(time.Duration(round)*time.Minute)))
			published = append(published, scored{team, round, score, 0})
		}
	}
	publish(1)
	waitBoardRounds(t, ranker, exec, 2, 30*time.Second)
	remakeEvaluations(t, e)
	publish(2)
	waitBoardRounds(t, ranker, exec, 4, 30*time.Second)
	if _, err := ranker.stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	e.storeExec("TRUNCATE TABLE store_lineage")
	ranker = e.start("ranker")
	waitReadiness(t, ranker, http.StatusOK, 60*time.Second)
	cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	if era := cons.CachedInfo().Config.Metadata[events.MetaStoreEra]; era != "1" {
		t.Errorf("the era after the lineage was lost: %q, want 1", era)
	}
	publish(3)
	waitBoardRounds(t, ranker, exec, 6, 30*time.Second)
	e.requestRound("req-t1-4", events.RoundRequested{ExecutionID: exec, TeamID: "t1", TeamName: "Team t1", RoundNumber: 4, UserPrompt: "go"}, t0.Add(time.Hour))
	a := e.answers("prompt.*."+exec+".*", 1, 60*time.Second)["req-t1-4"]
	if !a.ok() {
		t.Fatalf("round 4: %s %+v", a.subject, a.failed)
	}
	if why := differs(a.composed, published, func(scored) bool { return true }); why != "" {
		t.Errorf("the prompt after the lineage was lost (era %d) %s", a.composed.Inputs.EvaluationsEra, why)
	}
	if a.composed.Inputs.EvaluationsEra != 1 {
		t.Errorf("round 4 is composed as of era %d, want 1", a.composed.Inputs.EvaluationsEra)
	}
}

// remakeEvaluations deletes EVALUATIONS and waits until the ranker has made it again: a new era.
func remakeEvaluations(t *testing.T, e *env) {
	t.Helper()
	if err := e.js.DeleteStream(t.Context(), events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "EVALUATIONS made again", func() (bool, string) {
		_, err := e.js.Stream(t.Context(), events.StreamEvaluations)
		return err == nil, fmt.Sprint(err)
	})
}

// TestErasNeverGoBackWhenNothingRemembersTheLineage: rounds stored in era 0, EVALUATIONS deleted
// and made again, a round in era 1; then, with the ranker down, its database is dropped and its
// consumer deleted: nothing remembers the store's lineage. Before, the ranker refilled from the
// stream there is now in era 0: eras went back. Now it takes the highest era what was derived from
// the store names (the score snapshots in SCORES, the boards on LEADERBOARDS): era 1.
func TestErasNeverGoBackWhenNothingRemembersTheLineage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	const exec = "remembered"
	teams := []string{"t1", "t2"}
	publish := func(round int) {
		for i, team := range teams {
			e.publishEvaluation(fmt.Sprintf("ev-%s-%d", team, round), evaluation(exec, team, "Team "+team, round, float64(10*round+i), "work", t0.Add(time.Duration(round)*time.Minute)))
		}
	}
	publish(1)
	publish(2)
	waitBoardRounds(t, ranker, exec, 4, 30*time.Second)
	remakeEvaluations(t, e)
	publish(3)
	waitBoardRounds(t, ranker, exec, 6, 30*time.Second)
	if _, err := ranker.stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	dropDatabase(t, e)
	if err := e.js.DeleteConsumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker); err != nil {
		t.Fatal(err)
	}

	ranker = e.start("ranker")
	info, err := consumerInfo(t.Context(), e.js, events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	if md := info.Config.Metadata; md[events.MetaStoreEra] != "1" || md[events.MetaStoreFloor] != "1" {
		t.Fatalf("the store refilled when nothing remembers its lineage: %v, want era 1 (eras never go back), floor 1", md)
	}
	publish(4)
	waitBoardRounds(t, ranker, exec, 4, 30*time.Second) // rounds 3 and 4: what the stream holds
}
