package e2e

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// TestGoOrchestratorExample builds examples/orchestrator-go, a module of its own that imports
// pkg/client as another module would, and runs it against the real ranker and two composers,
// one of which is killed with SIGKILL once the tournament has begun: every request is answered
// exactly once on PROMPTS, and the board the example read as of its last evaluation equals the
// test's own recount of what EVALUATIONS holds.
func TestGoOrchestratorExample(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "orchestrator-go")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join("..", "examples", "orchestrator-go")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/orchestrator-go: %v\n%s", err, out)
	}
	e := newEnv(t)
	e.extra = []string{"COMPOSER_ACK_WAIT=3s"} // a killed composer's requests come back in seconds
	e.start("ranker")
	victim := e.start("composer")
	e.start("composer")

	const teams, rounds = 4, 3
	run := exec.Command(bin)
	run.Env = e.baseEnv("EXECUTION=goex", "TEAMS=4", "ROUNDS=3") // the board over NATS
	var out, stderr bytes.Buffer
	run.Stdout, run.Stderr = &out, &stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	// Once a first prompt is out, one composer dies with whatever it holds.
	e.answers("prompt.*.goex.*", 1, 60*time.Second)
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- run.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the example: %v\n%s\n%s", err, out.String(), stderr.String())
		}
	case <-time.After(5 * time.Minute):
		_ = run.Process.Kill()
		t.Fatalf("the example did not finish\n%s\n%s", out.String(), stderr.String())
	}
	t.Logf("$ orchestrator-go\n%s", out.String())

	// Every request answered exactly once.
	answers := map[string]int{}
	for _, m := range e.collect(events.StreamPrompts, "prompt.*.goex.*", 2*teams*rounds, 3*time.Second) {
		var d struct {
			RequestID string `json:"request_id"`
		}
		dataOf(t, m.Body, &d)
		answers[d.RequestID]++
	}
	if len(answers) != teams*rounds {
		t.Errorf("%d requests answered, want %d: %v", len(answers), teams*rounds, answers)
	}
	for id, n := range answers {
		if n != 1 {
			t.Errorf("request %s answered %d times", id, n)
		}
	}
	// The board the example printed last, against the test's recount of EVALUATIONS.
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var board struct {
		Teams []events.LeaderboardRow `json:"teams"`
		AsOf  uint64                  `json:"as_of"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &board); err != nil {
		t.Fatalf("the example's last line is not its board: %v", err)
	}
	best, counted := map[string]float64{}, map[string]int{}
	for _, m := range e.collect(events.StreamEvaluations, "evaluation.completed.goex.*", 2*teams*rounds, 3*time.Second) {
		var ev events.EvaluationCompleted
		dataOf(t, m.Body, &ev)
		best[ev.TeamID] = max(best[ev.TeamID], ev.Evaluation.OverallScore)
		counted[ev.TeamID]++
	}
	if len(board.Teams) != teams || board.AsOf == 0 {
		t.Fatalf("the example's board: %+v", board)
	}
	for _, row := range board.Teams {
		if row.BestScore != best[row.TeamID] || row.Rounds != counted[row.TeamID] || row.Rounds != rounds {
			t.Errorf("%s: best %v over %d rounds; EVALUATIONS holds best %v over %d", row.TeamID, row.BestScore, row.Rounds, best[row.TeamID], counted[row.TeamID])
		}
	}
}
