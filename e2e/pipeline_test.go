package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

var t0 = time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)

type leaderboard struct {
	ExecutionID    string                  `json:"execution_id"`
	Teams          []events.LeaderboardRow `json:"teams"`
	EvaluationsSeq uint64                  `json:"evaluations_seq"`
}

// TestRoundTwoPromptCarriesRoundOneAndTheLeaderboard is the pipeline's main job: evaluations in,
// a round-2 prompt out that holds the team's round-1 score and submission and the leaderboard,
// and nothing of the other teams' submissions or feedback.
func TestRoundTwoPromptCarriesRoundOneAndTheLeaderboard(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")

	const exec = "exec-7f3a"
	teams := []struct {
		id, name string
		score    float64
	}{{"team-alpha", "Alpha", 72.25}, {"team-beta", "Beta", 90}, {"team-gamma", "Gamma", 72.25}}
	for i, tm := range teams {
		e.publishEvaluation(fmt.Sprintf("ev-%d", i), evaluation(exec, tm.id, tm.name, 1, tm.score, "SUBMISSION OF "+tm.id+" <a href=\"x\">&</a>", t0.Add(time.Duration(i)*time.Second)))
	}
	// Read-your-writes: the request is published right after the evaluations, without waiting.
	e.requestRound("req-alpha-2", events.RoundRequested{ExecutionID: exec, TeamID: "team-alpha", TeamName: "Alpha",
		RoundNumber: 2, UserPrompt: "Write a haiku about consensus.", MaxRounds: 3, Timezone: "Asia/Tokyo"}, t0.Add(time.Hour))

	got := e.collect(events.StreamPrompts, "prompt.*."+exec+".team-alpha", 1, 30*time.Second)
	if len(got) != 1 {
		t.Fatalf("got %d prompts, want 1", len(got))
	}
	if err := events.Validate(got[0].Subject, got[0].Body, 0); err != nil {
		t.Fatalf("published event breaks the contract: %v\n%s", err, got[0].Body)
	}
	if got[0].Subject != "prompt.composed."+exec+".team-alpha" {
		t.Fatalf("subject %s: %s", got[0].Subject, got[0].Body)
	}
	var pc events.PromptComposed
	envl := dataOf(t, got[0].Body, &pc)
	if envl.ID != events.PromptEventID("req-alpha-2") || got[0].Header.Get("Nats-Msg-Id") != envl.ID {
		t.Errorf("event id %q / Nats-Msg-Id %q, want both derived from the request id", envl.ID, got[0].Header.Get("Nats-Msg-Id"))
	}
	for _, want := range []string{
		"Round 2 of 3.",
		"Current time: 2026-11-21T20:00:00+09:00",
		"## Round 1: 72.25",
		`SUBMISSION OF team-alpha <a href="x">&</a>`, // raw, not HTML-escaped
		"Evaluator feedback: feedback for team-alpha round 1",
		"1. Beta: best 90.00 in round 1",
		"2. Alpha: best 72.25 in round 1 (rounds evaluated: 1) new <- your team",
		"3. Gamma: best 72.25",
		"Your team is in position 2 of 3 (rank 2), best score 72.25, 17.75 behind the leader.",
	} {
		if !strings.Contains(pc.Prompt, want) {
			t.Errorf("prompt lacks %q:\n%s", want, pc.Prompt)
		}
	}
	for _, other := range []string{"SUBMISSION OF team-beta", "SUBMISSION OF team-gamma", "feedback for team-beta", "comment team-gamma"} {
		if strings.Contains(pc.Prompt, other) {
			t.Errorf("prompt of team-alpha contains another team's %q", other)
		}
	}
	wantBoard := []events.LeaderboardRow{
		{Position: 1, Rank: 1, TeamID: "team-beta", TeamName: "Beta", BestScore: 90, BestRound: 1, Rounds: 1},
		{Position: 2, Rank: 2, TeamID: "team-alpha", TeamName: "Alpha", BestScore: 72.25, BestRound: 1, Rounds: 1},
		{Position: 3, Rank: 2, TeamID: "team-gamma", TeamName: "Gamma", BestScore: 72.25, BestRound: 1, Rounds: 1},
	}
	if diff := cmp.Diff(wantBoard, pc.Inputs.Leaderboard); diff != "" {
		t.Errorf("inputs.leaderboard (-want +got):\n%s", diff)
	}
	if pc.Inputs.TeamPosition == nil || *pc.Inputs.TeamPosition != 2 || pc.Inputs.TeamCount != 3 {
		t.Errorf("team_position %v team_count %d, want 2 of 3", pc.Inputs.TeamPosition, pc.Inputs.TeamCount)
	}
	if diff := cmp.Diff([]string{"ev-0"}, pc.Inputs.EvaluationIDs); diff != "" {
		t.Errorf("evaluation_ids (-want +got):\n%s", diff)
	}

	var lb leaderboard
	if code := ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &lb); code != http.StatusOK {
		t.Fatalf("leaderboard status %d", code)
	}
	if diff := cmp.Diff(wantBoard, lb.Teams); diff != "" {
		t.Errorf("ranker API leaderboard (-want +got):\n%s", diff)
	}
	if lb.EvaluationsSeq != 3 {
		t.Errorf("evaluations_seq = %d, want 3", lb.EvaluationsSeq)
	}

	// The ranker announced the leaderboard it committed: the stream keeps the last one, which
	// reaches seq 3 once the last commit is announced (evaluations may be committed one by one).
	var lu events.LeaderboardUpdated
	testenv.WaitFor(t, 10*time.Second, "leaderboard.updated of all three evaluations", func() (bool, string) {
		updates := e.collect(events.StreamLeaderboards, events.LeaderboardSubject(exec), 1, time.Second)
		if len(updates) != 1 {
			return false, fmt.Sprintf("%d kept", len(updates))
		}
		dataOf(t, updates[0].Body, &lu)
		return lu.EvaluationsSeq == 3, fmt.Sprintf("%+v", lu)
	})
	if len(lu.Leaderboard) != 3 {
		t.Errorf("leaderboard.updated = %+v, want 3 rows at seq 3", lu)
	}
}

// TestRoundOneAndAnUnknownTemplate shows the first round's prompt and a prompt.failed.
func TestRoundOneAndAnUnknownTemplate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	e.requestRound("req-1", events.RoundRequested{ExecutionID: "ex", TeamID: "t1", TeamName: "One", RoundNumber: 1, UserPrompt: "Task."}, t0)
	e.requestRound("req-2", events.RoundRequested{ExecutionID: "ex", TeamID: "t2", TeamName: "Two", RoundNumber: 1, UserPrompt: "Task.", Template: "nope"}, t0)
	got := e.collect(events.StreamPrompts, "prompt.*.ex.*", 2, 30*time.Second)
	if len(got) != 2 {
		t.Fatalf("got %d answers, want 2", len(got))
	}
	for _, m := range got {
		if err := events.Validate(m.Subject, m.Body, 0); err != nil {
			t.Errorf("%s breaks the contract: %v", m.Subject, err)
		}
		switch m.Subject {
		case "prompt.composed.ex.t1":
			var pc events.PromptComposed
			dataOf(t, m.Body, &pc)
			if !strings.Contains(pc.Prompt, "This is the first round") || pc.Inputs.TeamPosition != nil {
				t.Errorf("round 1 prompt: %+v", pc)
			}
		case "prompt.failed.ex.t2":
			var pf events.PromptFailed
			dataOf(t, m.Body, &pf)
			if pf.Code != events.CodeUnknownTemplate || pf.RequestID != "req-2" || pf.Retryable || pf.Message != `template "nope" not found (loaded: mixseek-team, runner-task, team-round)` {
				t.Errorf("prompt.failed = %+v", pf)
			}
		default:
			t.Errorf("unexpected answer on %s", m.Subject)
		}
	}
}

// TestGracefulShutdown: SIGTERM makes both services drain and exit 0.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker", "RANKER_SHUTDOWN_TIMEOUT=5s")
	composer := e.start("composer", "COMPOSER_SHUTDOWN_TIMEOUT=5s")
	for i := range 50 {
		e.publishEvaluation(fmt.Sprintf("ev-%d", i), evaluation("ex", fmt.Sprintf("t%d", i%5), "T", 1+i/5, float64(i), "s", t0))
	}
	for _, p := range []*proc{composer, ranker} {
		took, err := p.stop(t, 10*time.Second)
		if err != nil {
			t.Errorf("%s exited with %v after SIGTERM\n%s", p.name, err, p.logs)
		}
		if !strings.Contains(p.logs.String(), `"msg":"`+p.name+` stopped"`) {
			t.Errorf("%s did not log its stop", p.name)
		}
		// A clean stop is not a warning: the drained connection's close is not a disconnect.
		if strings.Contains(p.logs.String(), `"level":"WARN"`) {
			t.Errorf("%s logged a warning on a clean stop:\n%s", p.name, p.logs)
		}
		t.Logf("%s stopped in %s", p.name, took)
	}
	// Nothing was lost: a new ranker finds every evaluation acked or still pending, never dropped.
	ranker2 := e.start("ranker")
	testenv.WaitFor(t, 20*time.Second, "50 evaluated rounds on the leaderboard after the restart", func() (bool, string) {
		var lb leaderboard
		ranker2.getJSON(t, "/v1/executions/ex/leaderboard", &lb)
		rounds := 0
		for _, r := range lb.Teams {
			rounds += r.Rounds
		}
		return rounds == 50, fmt.Sprintf("%d rounds", rounds)
	})
}

// TestVersionAndGroupHelp: every binary's --version says the commit it was built from (the checkout's
// HEAD); `podium GROUP`, `podium GROUP --help` and `podium COMMAND --help` list what they should
// and exit 0, as git's and kubectl's do.
func TestVersionAndGroupHelp(t *testing.T) {
	t.Parallel()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("no git checkout to compare the commit with: %v", err)
	}
	for _, name := range []string{"ranker", "composer", "archiver", "console", "podium"} {
		out, err := exec.Command(filepath.Join(bins.dir, name), "--version").CombinedOutput()
		if want := name + " "; err != nil || !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), "commit "+strings.TrimSpace(string(head))) {
			t.Errorf("%s --version: %v\n%s\nwant %q and commit %s", name, err, out, want, head)
		}
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"templates"}, []string{"Usage: podium templates COMMAND", "  push DIR|FILE", "  compare NAME"}},
		{[]string{"builders", "--help"}, []string{"Usage: podium builders COMMAND", "  label NAME VERSION[@DIGEST] LABEL"}},
		{[]string{"prompts", "-h"}, []string{"  verify EXEC TEAM ROUND", "  tail "}},
		{[]string{"audit"}, []string{"  check [--key PUBLIC_KEY]", "  keygen NAME"}},
		{[]string{"audit", "check", "--help"}, []string{"Usage: podium audit check", "-since"}},
		{[]string{"help"}, []string{"--version", "GROUP"}},
	} {
		out, err := exec.Command(filepath.Join(bins.dir, "podium"), tt.args...).CombinedOutput()
		if err != nil {
			t.Errorf("podium %s: %v, want exit 0\n%s", strings.Join(tt.args, " "), err, out)
		}
		for _, w := range tt.want {
			if !strings.Contains(string(out), w) {
				t.Errorf("podium %s does not say %q:\n%s", strings.Join(tt.args, " "), w, out)
			}
		}
	}
	if out, err := exec.Command(filepath.Join(bins.dir, "podium"), "templates", "nonesuch").CombinedOutput(); err == nil || !strings.Contains(string(out), "unknown command") {
		t.Errorf("podium templates nonesuch: %v\n%s", err, out)
	}
}

func TestHelpAndBadConfiguration(t *testing.T) {
	t.Parallel()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	for _, name := range []string{"ranker", "composer"} {
		out, err := exec.Command(bins.dir+"/"+name, "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("%s --help: %v\n%s", name, err, out)
		}
		for _, v := range []string{"NATS_URL", "CLICKHOUSE_ADDR", "CLICKHOUSE_DATABASE", "HTTP_ADDR", "MANAGE_STREAMS", "STREAM_REPLICAS", "LOG_LEVEL", "MAX_EVENT_BYTES"} {
			if !strings.Contains(string(out), v) {
				t.Errorf("%s --help does not list %s", name, v)
			}
		}
	}
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, "typo.mustache"), []byte("Round {{round_number}}\n{{team.nmae}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		bin, env, want string
	}{
		{"composer", "COMPOSER_TEMPLATES_DIR=" + bad, `template "typo" line 2: unknown variable "team.nmae"`},
		{"composer", "COMPOSER_READ_CACHE_TTL=-1s", "COMPOSER_READ_CACHE_TTL"},
		{"ranker", "RANKER_BATCH_SIZE=lots", "BATCH_SIZE"},
		{"ranker", "LOG_LEVEL=loud", "LOG_LEVEL"},
		{"composer", "COMPOSER_INPUTS_TIMEOUT=soon", "INPUTS_TIMEOUT"},
		{"composer", "TZ=Mars/Olympus", "TZ"},
		{"composer", "STREAM_REPLICAS=0", "STREAM_REPLICAS"},
		{"composer", "COMPOSER_DEFAULT_TEMPLATE=missing", `default template "missing"`},
		{"ranker", "RANKER_NATS_URL=garbage", `NATS_URL (or RANKER_NATS_URL): "garbage" is neither a nats://, tls://, ws:// or wss:// URL nor host:port`},
		{"composer", "COMPOSER_NATS_URL=http://user:s3cret@host:4222", `"http://user:xxxxx@host:4222" is not a nats://`},
		{"ranker", "HTTP_READ_TIMEOUT=0s", "HTTP_READ_TIMEOUT (or RANKER_HTTP_READ_TIMEOUT) must be positive"},
		{"ranker", "CLICKHOUSE_CLUSTER=podium", "CLICKHOUSE_CLUSTER (or RANKER_CLICKHOUSE_CLUSTER) needs CLICKHOUSE_REPLICATED=true"},
	}
	for _, tt := range tests {
		cmd := exec.Command(bins.dir + "/" + tt.bin)
		cmd.Env = []string{tt.env, "NATS_URL=nats://127.0.0.1:1", "CLICKHOUSE_ADDR=127.0.0.1:1"}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) || strings.Contains(string(out), "s3cret") {
			t.Errorf("%s with %s: err %v, output %q; want an error naming %s", tt.bin, tt.env, err, out, tt.want)
		}
	}
}

// TestClickHouseCredentialsNamed: a wrong ClickHouse user or password stops a service at start
// with an error that says it is ClickHouse, at which address, and what it answered.
func TestClickHouseCredentialsNamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, tt := range []struct{ bin, env, want string }{
		{"ranker", "CLICKHOUSE_PASSWORD=wrong", "Wrong password for user default"},
		{"composer", "CLICKHOUSE_USER=podium", "podium"},
	} {
		cmd := exec.Command(bins.dir + "/" + tt.bin)
		cmd.Env = e.baseEnv(tt.env, "HTTP_ADDR="+freeAddr(t))
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "clickhouse at "+e.chAddr+": ") || !strings.Contains(string(out), tt.want) {
			t.Errorf("%s with %s: err %v, output %s; want the address %s and %q", tt.bin, tt.env, err, out, e.chAddr, tt.want)
		}
	}
}

// TestNATSPasswordNeverPrinted: a password inside NATS_URL is redacted in the error of a failed
// connection, which names the URL.
func TestNATSPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, bin := range []string{"ranker", "composer"} {
		cmd := exec.Command(bins.dir + "/" + bin)
		cmd.Env = e.baseEnv("NATS_URL=nats://podium:s3cret@127.0.0.1:1", "NATS_CONNECT_WAIT=2s", "HTTP_ADDR="+freeAddr(t))
		out, err := cmd.CombinedOutput()
		if err == nil || strings.Contains(string(out), "s3cret") || !strings.Contains(string(out), "connect nats nats://podium:xxxxx@127.0.0.1:1") {
			t.Errorf("%s: err %v, output %s; want a redacted connection error", bin, err, out)
		}
	}
}

// TestHTTPLimitsCloseSlowAndIdleConnections: a request whose body never comes and an idle
// keep-alive connection are closed after their timeouts; headers over 64 KiB are refused.
func TestHTTPLimitsCloseSlowAndIdleConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	composer := e.start("composer", "HTTP_READ_TIMEOUT=1s", "HTTP_IDLE_TIMEOUT=1s")
	closedWithin := func(conn net.Conn, limit time.Duration) bool {
		_ = conn.SetReadDeadline(time.Now().Add(limit))
		_, err := io.ReadAll(conn) // a 408 may come first; what matters is that the server closes
		return err == nil
	}
	slow, err := net.Dial("tcp", composer.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	start := time.Now()
	fmt.Fprintf(slow, "POST /v1/render HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
	if !closedWithin(slow, 5*time.Second) {
		t.Errorf("a request whose body never comes was not closed within 5s")
	} else if waited := time.Since(start); waited < 900*time.Millisecond {
		t.Errorf("slow request closed after %s, before HTTP_READ_TIMEOUT", waited)
	}

	idle, err := net.Dial("tcp", composer.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz over keep-alive: %v %v", resp, err)
	}
	if !closedWithin(idle, 5*time.Second) {
		t.Errorf("an idle keep-alive connection was not closed within 5s")
	}

	req, _ := http.NewRequest(http.MethodGet, "http://"+composer.addr+"/healthz", nil)
	req.Header.Set("X-Big", strings.Repeat("y", 70<<10))
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("70 KiB header: %v %v, want 431", resp, err)
	}
}
