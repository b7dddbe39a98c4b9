package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// sizedEvent is a CloudEvent body of exactly size bytes: data, with pad appended to the text at
// path (a string field) until the body has that size.
func sizedEvent(t *testing.T, id, eventType string, data map[string]any, set func(map[string]any, string), size int) []byte {
	t.Helper()
	set(data, "")
	body, err := events.Marshal(id, "orchestrator/test", eventType, t0, data)
	if err != nil {
		t.Fatal(err)
	}
	set(data, strings.Repeat("x", size-len(body)))
	body, err = events.Marshal(id, "orchestrator/test", eventType, t0, data)
	if err != nil || len(body) != size {
		t.Fatalf("sized event: %d bytes, %v", len(body), err)
	}
	return body
}

// TestPoisonAtTheSizeLimitHoldsNothingUp: an invalid evaluation and an invalid request of
// 1,048,476 bytes (with their headers, just under the server's 1 MiB max payload) cannot be
// copied whole with the dead-letter headers. They are dead-lettered cut to fit, marked
// Dead-Truncated, the request is answered, and the events behind them are processed: the ack
// floor passes the poison, so the next request is composed, not inputs_not_ready.
func TestPoisonAtTheSizeLimitHoldsNothingUp(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer", "COMPOSER_INPUTS_TIMEOUT=3s")
	const size = 1_048_476
	badEval := sizedEvent(t, "poison-ev", events.TypeEvaluationCompleted, map[string]any{
		"execution_id": "big", "team_id": "t1", "team_name": "One", "round_number": 0, // invalid: rounds start at 1
		"submission": map[string]any{}, "evaluation": map[string]any{"overall_score": 1}, "evaluated_at": t0,
	}, func(d map[string]any, pad string) { d["submission"] = map[string]any{"content": pad} }, size)
	badReq := sizedEvent(t, "poison-req", events.TypeRoundRequested, map[string]any{
		"execution_id": "big", "team_id": "t1", "team_name": "One", "round_number": 2, "template": "no/such", // invalid template ref
	}, func(d map[string]any, pad string) { d["user_prompt"] = pad }, size)
	e.publishRaw(events.EvaluationSubject("big", "t1"), "poison-ev", badEval)
	e.publishRaw(events.RoundSubject("big", "t1"), "poison-req", badReq)
	good := e.publishEvaluation("good-ev", evaluation("big", "t1", "One", 1, 50, "fine", t0))
	e.requestRound("good-req", events.RoundRequested{ExecutionID: "big", TeamID: "t1", TeamName: "One", RoundNumber: 2, UserPrompt: "Go."}, t0)

	answers := e.answers("prompt.*.big.t1", 2, 30*time.Second)
	if a := answers["poison-req"]; a.ok() || a.failed.Code != events.CodeInvalidRequest {
		t.Errorf("poison request answered %s %+v, want invalid_request", a.subject, a.failed)
	}
	if a := answers["good-req"]; !a.ok() || a.composed.Inputs.EvaluationsSeq != good {
		t.Errorf("request behind the poison: %s %+v, want composed as of sequence %d", a.subject, a.failed, good)
	}
	dead := e.collect(events.StreamDeadLetter, "deadletter.>", 2, 20*time.Second)
	if len(dead) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dead))
	}
	for _, d := range dead {
		h := d.Header
		if h.Get(events.HeaderDeadTruncated) != strconv.Itoa(size) || len(d.Body) >= size || len(d.Body) < size-4096 ||
			len(h.Get(events.HeaderDeadReason)) == 0 || len(h.Get(events.HeaderDeadReason)) > events.MaxReasonBytes {
			t.Errorf("dead letter %s: %d bytes, Dead-Truncated %q, reason of %d bytes; want the head of the %d-byte original, a reason of at most %d",
				d.Subject, len(d.Body), h.Get(events.HeaderDeadTruncated), len(h.Get(events.HeaderDeadReason)), size, events.MaxReasonBytes)
		}
		if h.Get(events.HeaderDeadSequence) == "" || h.Get(events.HeaderDeadStream) == "" {
			t.Errorf("dead letter %s does not say where the original is: %v", d.Subject, h)
		}
	}
	if floor := ackFloor(t, e); floor < good {
		t.Errorf("ranker ack floor %d is behind the good evaluation at %d", floor, good)
	}
}

// TestAnswerOverMaxPayloadIsBudgetExceeded: a request whose prompt.composed would not fit in one
// message (a 600 KiB task, repeated in the prompt and its messages, with a budget that allows
// it) is answered with prompt.failed budget_exceeded naming the size and the limit, not retried
// into silence.
func TestAnswerOverMaxPayloadIsBudgetExceeded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	huge := 10_000_000
	task := strings.Repeat("word ", 600<<10/5)
	e.requestRound("req-huge", events.RoundRequested{ExecutionID: "huge", TeamID: "t1", TeamName: "One", RoundNumber: 1,
		UserPrompt: task, Limits: events.Limits{MaxPromptTokens: &huge}}, t0)
	a := e.answers("prompt.*.huge.t1", 1, 60*time.Second)["req-huge"]
	var size, limit int
	if a.ok() || a.failed.Code != events.CodeBudgetExceeded || a.failed.Retryable {
		t.Fatalf("answer %s %+v, want budget_exceeded", a.subject, a.failed)
	}
	if _, err := fmt.Sscanf(a.failed.Message, "the prompt.composed event would be %d bytes, over the largest message the server takes (%d bytes)", &size, &limit); err != nil ||
		limit != 1<<20 || size <= limit {
		t.Errorf("message %q does not name the size and the 1 MiB limit", a.failed.Message)
	}
}

// TestMemoryBoundedWithLargeSubmissions: 400 evaluations of 900 KB (40 rounds of 10 teams) go
// through the ranker, then a team asks for round 41. Neither service passes 256 MiB of peak
// resident memory: the ranker's batches and pull buffer are bounded by bytes, and the composer
// reads the other teams' scores only and its own content of the rounds it prints.
func TestMemoryBoundedWithLargeSubmissions(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("stores 360 MB")
	}
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	const teams, rounds, size = 10, 40, 900_000
	var last uint64
	for r := 1; r <= rounds; r++ {
		for k := range teams {
			team := fmt.Sprintf("t%d", k)
			// Distinct texts with spaces, as teams write them.
			phrase := fmt.Sprintf("round %d of %s says %d; ", r, team, r*k)
			content := strings.Repeat(phrase, size/len(phrase)+1)[:size]
			last = e.publishEvaluation(fmt.Sprintf("m-%s-%d", team, r), evaluation("mem", team, "Team "+team, r, float64(r+k), content, t0))
		}
	}
	waitCommitted(t, e, int(last))
	e.requestRound("mem-41", events.RoundRequested{ExecutionID: "mem", TeamID: "t3", TeamName: "Team t3", RoundNumber: 41, UserPrompt: "Go on."}, t0)
	a := e.answers("prompt.*.mem.t3", 1, 60*time.Second)["mem-41"]
	if !a.ok() || len(a.composed.Inputs.HistoryRounds) != rounds || len(a.composed.Inputs.Leaderboard) != teams {
		t.Fatalf("round 41: %s %+v", a.subject, a.failed)
	}
	rankerMiB, composerMiB := rssHighWater(ranker.cmd.Process.Pid)/1024, rssHighWater(composer.cmd.Process.Pid)/1024
	t.Logf("peak RSS: ranker %d MiB, composer %d MiB (%d x %d KB evaluations)", rankerMiB, composerMiB, teams*rounds, size/1000)
	if rankerMiB == 0 || rankerMiB > 256 || composerMiB == 0 || composerMiB > 256 {
		t.Errorf("peak RSS ranker %d MiB, composer %d MiB; want both under 256 MiB", rankerMiB, composerMiB)
	}
}

// TestRenderBoundedInTime: a task of 900 KB without a space (one piece for the tokenizer) takes
// longer to count than COMPOSER_RENDER_TIMEOUT allows here; the request answers budget_exceeded
// naming the limit, on the stream and from POST /v1/render alike.
func TestRenderBoundedInTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer", "COMPOSER_RENDER_TIMEOUT=50ms")
	huge := 10_000_000
	rr := events.RoundRequested{ExecutionID: "slow", TeamID: "t1", TeamName: "One", RoundNumber: 1,
		UserPrompt: strings.Repeat("a", 900_000), Limits: events.Limits{MaxPromptTokens: &huge}}
	start := time.Now()
	e.requestRound("slow-1", rr, t0)
	a := e.answers("prompt.*.slow.t1", 1, 30*time.Second)["slow-1"]
	want := "rendering took longer than COMPOSER_RENDER_TIMEOUT (50ms)"
	if a.ok() || a.failed.Code != events.CodeBudgetExceeded || a.failed.Message != want {
		t.Fatalf("answer %s %+v, want budget_exceeded %q", a.subject, a.failed, want)
	}
	t.Logf("answered after %s", time.Since(start).Round(time.Millisecond))
	status, body := composer.render(t, map[string]any{"execution_id": "slow", "team_id": "t1", "team_name": "One", "round_number": 1,
		"user_prompt": rr.UserPrompt, "limits": map[string]any{"max_prompt_tokens": huge}, "time": t0.Format(time.RFC3339)})
	if status != http.StatusUnprocessableEntity || !strings.Contains(string(body), want) {
		t.Errorf("render: %d %.200s, want 422 %q", status, body, want)
	}
}

// TestRenderBoundedInWork: a pushed template of eight nested {{#history}} sections is valid
// Mustache and 20^8 iterations over 20 rounds. The request answers budget_exceeded naming the bound
// after a bounded amount of the composer's CPU, and the composer stays ready and composes the next.
func TestRenderBoundedInWork(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	dir := filepath.Join(t.TempDir(), "bomb")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bomb := "Round {{round_number}}:" + strings.Repeat("{{#history}}", 8) + "{{round_number}}" + strings.Repeat("{{/history}}", 8) + "\n"
	if err := os.WriteFile(filepath.Join(dir, "prompt.mustache"), []byte(bomb), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := e.podium(t, nil, "templates", "push", dir); code != 0 || !strings.Contains(out, "pushed bomb@1") {
		t.Fatalf("push: exit %d\n%s", code, out)
	}
	for r := 1; r <= 20; r++ {
		e.publishEvaluation(fmt.Sprintf("bomb-ev-%d", r), evaluation("bomb", "t1", "One", r, float64(r), fmt.Sprintf("answer %d", r), t0))
	}
	waitCommitted(t, e, 20)
	composer := e.start("composer")
	cpu := cpuSince(composer.cmd.Process.Pid)
	rounds := 20
	e.requestRound("bomb-21", events.RoundRequested{ExecutionID: "bomb", TeamID: "t1", TeamName: "One", RoundNumber: 21, UserPrompt: "Go.",
		Template: "bomb:latest", Limits: events.Limits{HistoryRounds: &rounds}}, t0)
	a := e.answers("prompt.*.bomb.t1", 1, 60*time.Second)["bomb-21"]
	if a.ok() || a.failed.Code != events.CodeBudgetExceeded || !strings.Contains(a.failed.Message, "more than 4000000 steps") {
		t.Fatalf("answer %s %+v, want budget_exceeded naming the steps", a.subject, a.failed)
	}
	used := cpu()[0]
	t.Logf("composer CPU for the request: %.2f s", used)
	if used > 10 {
		t.Errorf("the composer spent %.1f s of CPU on one bounded render", used)
	}
	composer.waitOK(t, "http://"+composer.addr+"/readyz")
	e.requestRound("bomb-21b", events.RoundRequested{ExecutionID: "bomb", TeamID: "t1", TeamName: "One", RoundNumber: 21, UserPrompt: "Go."}, t0)
	if b := e.answers("prompt.*.bomb.t1", 2, 60*time.Second)["bomb-21b"]; !b.ok() || len(b.composed.Inputs.HistoryRounds) == 0 {
		t.Errorf("the next request: %s %+v", b.subject, b.failed)
	}
}

// TestLongRequestIsNotRedelivered: a request that waits longer than COMPOSER_ACK_WAIT (here for
// inputs that never come) is kept in progress: it is answered once and never redelivered (one
// delivery allowed, so the wait's own retry by redelivery does not come into it).
func TestLongRequestIsNotRedelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	e.publishEvaluation("never-committed", evaluation("long", "t1", "One", 1, 50, "x", t0)) // no ranker
	e.start("composer", "COMPOSER_ACK_WAIT=1s", "COMPOSER_INPUTS_TIMEOUT=4s", "COMPOSER_MAX_DELIVER=1")
	e.requestRound("long-1", events.RoundRequested{ExecutionID: "long", TeamID: "t1", TeamName: "One", RoundNumber: 2, UserPrompt: "Go."}, t0)
	a := e.answers("prompt.*.long.t1", 1, 30*time.Second)["long-1"]
	if a.ok() || a.failed.Code != events.CodeInputsNotReady {
		t.Fatalf("answer %s %+v, want inputs_not_ready", a.subject, a.failed)
	}
	cons, err := e.js.Consumer(t.Context(), events.StreamRounds, events.ConsumerComposer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.Delivered.Consumer != 1 {
		t.Errorf("the request was delivered %d times (%d redelivered), want once", info.Delivered.Consumer, info.NumRedelivered)
	}
}

// TestRenderAPILimitsAndStopsWithItsClient: with COMPOSER_RENDER_CONCURRENCY=1 a second render
// while one runs answers 429; when the first client goes away its render stops and frees the
// slot at once, not after the inputs timeout.
func TestRenderAPILimitsAndStopsWithItsClient(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	e.publishEvaluation("never-committed", evaluation("api", "t1", "One", 1, 50, "x", t0)) // renders wait for it
	composer := e.start("composer", "COMPOSER_RENDER_CONCURRENCY=1", "COMPOSER_INPUTS_TIMEOUT=30s")
	body := `{"execution_id":"api","team_id":"t1","team_name":"One","round_number":2,"user_prompt":"Go."}`
	post := func(ctx context.Context) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+composer.addr+"/v1/render", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	first, cancelFirst := context.WithCancel(t.Context())
	firstDone := make(chan error, 1)
	go func() { _, err := post(first); firstDone <- err }()
	// Deliberate: the first render holds the slot, waiting for inputs; nothing shows the slots from
	// outside (a probing render would take one).
	time.Sleep(300 * time.Millisecond)
	if status, err := post(t.Context()); err != nil || status != http.StatusTooManyRequests {
		t.Fatalf("second render while one runs: %d %v, want 429", status, err)
	}
	cancelFirst()
	<-firstDone
	// Deliberate: the server frees the slot once it notices the client left, and nothing shows
	// the slots from outside (a probing render would take one).
	time.Sleep(200 * time.Millisecond)
	// The slot is free again: a third render is admitted (it waits for inputs until our timeout).
	third, cancelThird := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancelThird()
	if status, err := post(third); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("render after the first client left: %d %v, want it admitted (waiting)", status, err)
	}
}

// TestSIGTERMWithARequestInHand: a composer stopped while a request waits for inputs exits
// within COMPOSER_SHUTDOWN_TIMEOUT and leaves the request to another replica, which answers it.
func TestSIGTERMWithARequestInHand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	e.publishEvaluation("late", evaluation("term", "t1", "One", 1, 50, "x", t0))
	first := e.start("composer", "COMPOSER_SHUTDOWN_TIMEOUT=2s", "COMPOSER_INPUTS_TIMEOUT=60s")
	e.requestRound("term-2", events.RoundRequested{ExecutionID: "term", TeamID: "t1", TeamName: "One", RoundNumber: 2, UserPrompt: "Go."}, t0)
	testenv.WaitFor(t, 10*time.Second, "the request in hand, waiting for the ranker", func() (bool, string) {
		cons, err := e.js.Consumer(t.Context(), events.StreamRounds, events.ConsumerComposer)
		if err != nil {
			return false, err.Error()
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 1, fmt.Sprintf("ack pending %d, pending %d", info.NumAckPending, info.NumPending)
	})
	took, _ := first.stop(t, 10*time.Second)
	if took > 4*time.Second {
		t.Errorf("exited %s after SIGTERM, want within the 2s shutdown timeout", took)
	}
	e.start("ranker")
	e.start("composer")
	if a := e.answers("prompt.*.term.t1", 1, 30*time.Second)["term-2"]; !a.ok() {
		t.Errorf("the request left by the stopped composer: %s %+v, want composed by the next", a.subject, a.failed)
	}
}

// TestTeamsPerExecutionBounded: an execution has no fixed cap on teams, but every event that
// carries its whole board is bounded by the server's max payload. With 2,000 teams a prompt is
// composed (its text shows the template's top teams; its record the whole board); with 12,000 the
// record would be over 1 MiB, and the request is answered budget_exceeded at once, naming the size,
// while the ranker reports the leaderboard.updated it cannot send once and stays ready.
func TestTeamsPerExecutionBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.start("composer")
	for _, tt := range []struct {
		exec  string
		teams int
		ok    bool
	}{{"teams-2k", 2000, true}, {"teams-12k", 12000, false}} {
		var last uint64
		for i := range tt.teams {
			team := fmt.Sprintf("team-%05d", i)
			last = e.publishEvaluation(fmt.Sprintf("ev-%s-%d", tt.exec, i), evaluation(tt.exec, team, "Team "+team, 1, float64(i%1000)/10, "x", t0))
		}
		waitCommitted(t, e, int(last))
		e.requestRound("req-"+tt.exec, events.RoundRequested{ExecutionID: tt.exec, TeamID: "team-00007", TeamName: "Seven", RoundNumber: 2, UserPrompt: "go"}, t0)
		a := e.answers("prompt.*."+tt.exec+".team-00007", 1, 60*time.Second)["req-"+tt.exec]
		switch {
		case tt.ok && !a.ok():
			t.Errorf("%d teams: %s %+v, want prompt.composed", tt.teams, a.subject, a.failed)
		case !tt.ok && (a.ok() || a.failed.Code != events.CodeBudgetExceeded || !strings.Contains(a.failed.Message, "over the largest message the server takes")):
			t.Errorf("%d teams: %s %+v, want budget_exceeded naming the size", tt.teams, a.subject, a.failed)
		}
	}
	waitMetricAtLeast(t, ranker, `ranker_leaderboard_updates_unpublished_total{reason="too_large"}`, 1, 30*time.Second)
	waitReadiness(t, ranker, http.StatusOK, 10*time.Second)
	// The board too large for one message is announced all the same: its top rows, saying what
	// was cut, so the execution's last announcement is never a stale board that looks whole.
	var lu events.LeaderboardUpdated
	testenv.WaitFor(t, 30*time.Second, "the whole 12,000-team board announced", func() (bool, string) {
		var ok bool
		lu, ok = lastBoard(t, e, "teams-12k")
		return ok && lu.Truncated != nil && lu.Truncated.Teams == 12000, fmt.Sprintf("%v %+v", ok, lu.Truncated)
	})
	if lu.Truncated.Shown != len(lu.Leaderboard) || lu.Truncated.Shown < 1000 || lu.Truncated.Shown >= 12000 {
		t.Fatalf("the 12,000-team board's announcement: truncated %+v, %d rows", lu.Truncated, len(lu.Leaderboard))
	}
	var whole leaderboard
	if code := ranker.getJSON(t, "/v1/executions/teams-12k/leaderboard", &whole); code != http.StatusOK || len(whole.Teams) != 12000 {
		t.Fatalf("the API's board: %d, %d teams", code, len(whole.Teams))
	}
	for i, row := range lu.Leaderboard {
		if row != whole.Teams[i] {
			t.Fatalf("announced row %d is %+v, the board's is %+v: want the board's top rows", i, row, whole.Teams[i])
		}
	}
	t.Logf("12,000 teams: the announcement carries the top %d rows, marked truncated", lu.Truncated.Shown)
}
