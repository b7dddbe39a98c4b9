package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// podium runs the CLI against e's servers and returns its output and exit code.
func (e *env) podium(t testing.TB, extraEnv []string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bins.dir, "podium"), args...)
	cmd.Env = e.baseEnv(extraEnv...)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	}
	t.Fatalf("podium %v: %v", args, err)
	return "", 0
}

// verifySettled runs `podium prompts verify --all` on an execution as an auditor does after a
// refill or a rebuild: again while the CLI says the store changed while it was read (the ranker
// notes the lineage it settled on at its next check; the CLI's own advice is to try again), at most
// 30 s. It returns the last run's output and status.
func (e *env) verifySettled(t testing.TB, execution string) (string, int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", execution)
		if code != 3 || !strings.Contains(out, "changed while it was read") || time.Now().After(deadline) {
			return out, code
		}
		t.Logf("verify met the store changing while it was read; again:\n%s", out)
		time.Sleep(500 * time.Millisecond)
	}
}

// TestPodiumCLI plays a round and uses the CLI as an auditor and an operator would: every
// recorded prompt verifies, a tampered copy does not; standings, history, publishing and dead
// letters work, and a dead letter is replayed once a fix makes it valid.
func TestPodiumCLI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker", "RANKER_MAX_EVENT_BYTES=4096")
	e.start("composer")
	const exec = "cli"
	teams := []string{"t1", "t2", "t3"}
	for i, tm := range teams {
		e.publishEvaluation("ev-"+tm, evaluation(exec, tm, "Team "+tm, 1, float64(60+10*i), "answer of "+tm, t0))
		e.requestRound("req-"+tm, events.RoundRequested{ExecutionID: exec, TeamID: tm, TeamName: "Team " + tm, RoundNumber: 2,
			UserPrompt: "Improve.", Template: []string{"team-round", "mixseek-team", "team-round:latest"}[i], Timezone: "Asia/Tokyo"}, t0.Add(time.Hour))
	}
	if got := e.answers("prompt.*."+exec+".*", len(teams), 30*time.Second); len(got) != len(teams) {
		t.Fatalf("%d answers", len(got))
	}

	if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec); code != 0 || !strings.Contains(out, "3 record(s) verified") {
		t.Fatalf("verify --all: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "prompts", "show", exec, "t2", "2"); code != 0 || !strings.Contains(out, "answer of t2") || !strings.Contains(out, "mixseek-team@") {
		t.Errorf("show: exit %d\n%s", code, out)
	}
	// A tampered copy of t1's record, appended to the audit stream, is the latest of its round.
	records := e.collect(events.StreamPrompts, events.PromptComposedSubject(exec, "t1"), 1, 10*time.Second)
	tampered := strings.Replace(string(records[0].Body), "answer of t1", "answer of somebody else", 1)
	e.publishRaw(events.PromptComposedSubject(exec, "t1"), "tampered", []byte(tampered))
	out, code := e.podium(t, nil, "prompts", "verify", exec, "t1", "2")
	t.Logf("verify of a tampered record: exit %d: %s", code, out)
	if code != 1 || !strings.Contains(out, "cli t1 round 2 (PROMPTS sequence 4) differs: its prompt does not match its own prompt_sha256") ||
		!strings.Contains(out, `recorded "somebody else`) {
		t.Errorf("verify of a tampered record: exit %d\n%s", code, out)
	}

	// A third round of t3: diff shows what the round-2 evaluation added; tail lists the records.
	e.publishEvaluation("ev-t3-2", evaluation(exec, "t3", "Team t3", 2, 85, "second answer of t3", t0.Add(2*time.Hour)))
	e.requestRound("req-t3-3", events.RoundRequested{ExecutionID: exec, TeamID: "t3", TeamName: "Team t3", RoundNumber: 3, UserPrompt: "Improve."}, t0.Add(3*time.Hour))
	if a := e.answers("prompt.*."+exec+".t3", 2, 30*time.Second)["req-t3-3"]; !a.ok() {
		t.Fatalf("round 3 of t3: %s %+v", a.subject, a.failed)
	}
	if out, code := e.podium(t, nil, "prompts", "diff", exec, "t3", "2", "3"); code != 0 || !strings.Contains(out, "+++ cli t3 round 3") ||
		!strings.Contains(out, "+second answer of t3") || !strings.Contains(out, "-Round 2.") {
		t.Errorf("diff: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "prompts", "tail", "--all", "--count", "5", "--execution", exec); code != 0 || strings.Count(out, "  composed  cli ") != 5 {
		t.Errorf("tail: exit %d\n%s", code, out)
	}

	if out, code := e.podium(t, nil, "leaderboard", exec); code != 0 || !strings.Contains(out, "Team t3") || !strings.Contains(out, "85.00") {
		t.Errorf("leaderboard: exit %d\n%s", code, out)
	}
	var lb leaderboard
	out, code = e.podium(t, nil, "leaderboard", exec, "--json")
	if err := json.Unmarshal([]byte(out), &lb); code != 0 || err != nil || len(lb.Teams) != 3 || lb.Teams[0].TeamID != "t3" {
		t.Errorf("leaderboard --json: exit %d %v\n%s", code, err, out)
	}
	if out, code := e.podium(t, nil, "history", exec, "t1"); code != 0 || !strings.Contains(out, `"answer of t1"`) {
		t.Errorf("history: exit %d\n%s", code, out)
	}

	// publish: validated first; a valid data object is published and stored.
	dir := t.TempDir()
	write := func(name string, v any) string {
		b, _ := json.Marshal(v)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bad := write("bad.json", map[string]any{"execution_id": exec, "team_id": "t1", "round_number": 0})
	if out, code := e.podium(t, nil, "publish", "evaluation", "--file", bad); code != 1 || !strings.Contains(out, "not published: invalid event") {
		t.Errorf("publish of an invalid evaluation: exit %d\n%s", code, out)
	}
	good := write("good.json", evaluation(exec, "t1", "Team t1", 2, 91, "by hand", t0))
	if out, code := e.podium(t, nil, "publish", "evaluation", "--file", good); code != 0 || !strings.Contains(out, "published evaluation.completed") {
		t.Errorf("publish: exit %d\n%s", code, out)
	}

	// A 6 KB evaluation is over this ranker's 4 KiB limit: dead-lettered. Replaying it is refused
	// while the limit holds; after the fix (the limit lifted) it is replayed and stored.
	big := evaluation(exec, "t2", "Team t2", 2, 99, strings.Repeat("long answer ", 500), t0)
	e.publishEvaluation("big", big)
	var dead string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if dead, _ = e.podium(t, nil, "deadletters", "list"); strings.Contains(dead, "1 dead letter(s)") {
			break
		}
	}
	if !strings.Contains(dead, "evaluation.completed.cli.t2") || !strings.Contains(dead, "4096") {
		t.Fatalf("deadletters list:\n%s", dead)
	}
	if out, code := e.podium(t, []string{"PODIUM_MAX_EVENT_BYTES=4096"}, "deadletters", "replay", "1"); code != 1 || !strings.Contains(out, "refused  1") || !strings.Contains(out, "still invalid") {
		t.Errorf("replay while still invalid: exit %d\n%s", code, out)
	}
	if _, err := ranker.stop(t, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	e.start("ranker") // the fix: the default limit
	if out, code := e.podium(t, nil, "deadletters", "replay", "--all"); code != 0 || !strings.Contains(out, "1 replayed") {
		t.Fatalf("replay after the fix: exit %d\n%s", code, out)
	}
	testenv.WaitFor(t, 20*time.Second, "the replayed evaluation stored", func() (bool, string) {
		out, _ := e.podium(t, nil, "history", exec, "t2")
		return strings.Contains(out, "big"), out
	})
	if out, code := e.podium(t, nil, "help"); code != 0 || !strings.Contains(out, "Exit codes") {
		t.Errorf("help: exit %d\n%s", code, out)
	}
	if out, code := e.podium(t, nil, "nonsense"); code != 2 || !strings.Contains(out, `unknown command "nonsense"`) {
		t.Errorf("unknown command: exit %d\n%s", code, out)
	}
}
