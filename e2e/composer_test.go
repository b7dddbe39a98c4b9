package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// answer is a prompt.composed or prompt.failed read back from PROMPTS.
type answer struct {
	subject  string
	composed events.PromptComposed
	failed   events.PromptFailed
	eventID  string
	at       time.Time // when PROMPTS stored it
}

func (a answer) ok() bool { return strings.HasPrefix(a.subject, "prompt.composed.") }

// answers reads n answers of filter from PROMPTS, checks each against the contract and indexes
// them by request id; a request answered twice fails the test.
func (e *env) answers(filter string, n int, limit time.Duration) map[string]answer {
	e.t.Helper()
	out := make(map[string]answer, n)
	for _, m := range e.collect(events.StreamPrompts, filter, n, limit) {
		if err := events.Validate(m.Subject, m.Body, 0); err != nil {
			e.t.Errorf("%s breaks the contract: %v\n%s", m.Subject, err, m.Body)
		}
		a := answer{subject: m.Subject, at: m.Time}
		var requestID string
		if a.ok() {
			a.eventID = dataOf(e.t, m.Body, &a.composed).ID
			requestID = a.composed.RequestID
		} else {
			a.eventID = dataOf(e.t, m.Body, &a.failed).ID
			requestID = a.failed.RequestID
		}
		if _, dup := out[requestID]; dup {
			e.t.Errorf("request %s answered twice (second on %s)", requestID, m.Subject)
		}
		out[requestID] = a
	}
	if len(out) != n {
		e.t.Fatalf("got answers to %d requests, want %d", len(out), n)
	}
	return out
}

// waitMetric waits up to 5s for a series of p to reach want, and fails the test if it does not.
func waitMetric(t testing.TB, p *proc, series string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := p.metric(t, series)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s = %v, want %v", series, got, want)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// render posts body to the composer's POST /v1/render and returns status and body.
func (p *proc) render(t testing.TB, body any) (int, []byte) {
	t.Helper()
	return p.renderTraced(t, body, "")
}

// renderTraced is render with a traceparent header (none when empty).
func (p *proc) renderTraced(t testing.TB, body any, traceparent string) (int, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+p.addr+"/v1/render", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// rywLoad is the read-your-writes workload: each team's evaluation of round r, then, right after
// its publish ack, the team's request of round r+1. Every prompt must hold the evaluation
// published just before its request, and its board exactly the evaluations up to its
// evaluations_seq.
type rywLoad struct {
	exec          string
	teams, rounds int
	seqs          map[string][]uint64 // the stream sequence of each team's evaluations, by round
	sent          []published
	requested     map[string]time.Time // request id -> when it was published
}

func newRYWLoad(exec string, teams, rounds int) *rywLoad {
	return &rywLoad{exec: exec, teams: teams, rounds: rounds, seqs: map[string][]uint64{}, requested: map[string]time.Time{}}
}

func (l *rywLoad) pairs() int { return l.teams * l.rounds }

// publish sends pair i: team i%teams, round i/teams+1.
func (l *rywLoad) publish(e *env, i int) {
	r, k := i/l.teams+1, i%l.teams
	team := fmt.Sprintf("team-%d", k)
	ev := evaluation(l.exec, team, "Team "+team, r, float64(10*r+k), fmt.Sprintf("RYW-%s-R%d", team, r), t0.Add(time.Duration(r)*time.Minute))
	id := fmt.Sprintf("ev-%s-%d", team, r)
	l.seqs[team] = append(l.seqs[team], e.publishEvaluation(id, ev))
	l.sent = append(l.sent, published{id: id, ev: ev})
	req := fmt.Sprintf("req-%s-%d", team, r+1)
	l.requested[req] = time.Now()
	e.requestRound(req, events.RoundRequested{ExecutionID: l.exec, TeamID: team, TeamName: "Team " + team,
		RoundNumber: r + 1, UserPrompt: "Improve.", MaxRounds: l.rounds + 1}, t0.Add(time.Duration(r)*time.Minute+time.Second))
}

// check reads the answers to the first n pairs and checks each prompt; it returns the answers
// by request id.
func (l *rywLoad) check(t *testing.T, e *env, n int, limit time.Duration) map[string]answer {
	t.Helper()
	got := e.answers("prompt.*."+l.exec+".*", n, limit)
	for i := range n {
		r, k := i/l.teams+1, i%l.teams
		team := fmt.Sprintf("team-%d", k)
		a := got[fmt.Sprintf("req-%s-%d", team, r+1)]
		if !a.ok() {
			t.Errorf("%s round %d: %s %+v", team, r+1, a.subject, a.failed)
			continue
		}
		in := a.composed.Inputs
		if !strings.Contains(a.composed.Prompt, fmt.Sprintf("RYW-%s-R%d", team, r)) ||
			!slices.Contains(in.EvaluationIDs, fmt.Sprintf("ev-%s-%d", team, r)) ||
			len(in.HistoryRounds) == 0 || in.HistoryRounds[len(in.HistoryRounds)-1] != r {
			t.Errorf("%s round %d: the evaluation of round %d published just before is missing: history %v, ids %v",
				team, r+1, r, in.HistoryRounds, in.EvaluationIDs)
		}
		// Live standings count exactly the evaluations up to evaluations_seq, whatever their
		// round: at least the team's own round r, published just before the request.
		if in.EvaluationsSeq < l.seqs[team][r-1] {
			t.Errorf("%s round %d: evaluations_seq %d is before the evaluation of round %d (%d)", team, r+1, in.EvaluationsSeq, r, l.seqs[team][r-1])
		}
		for _, row := range in.Leaderboard {
			want := 0
			for _, s := range l.seqs[row.TeamID] {
				if s <= in.EvaluationsSeq {
					want++
				}
			}
			if row.Rounds != want {
				t.Errorf("%s round %d: %s has %d rounds on the board, want %d (evaluations up to sequence %d)", team, r+1, row.TeamID, row.Rounds, want, in.EvaluationsSeq)
			}
		}
		ranked := 0 // teams with an evaluation up to evaluations_seq
		for _, s := range l.seqs {
			if s[0] <= in.EvaluationsSeq {
				ranked++
			}
		}
		if len(in.Leaderboard) != ranked {
			t.Errorf("%s round %d: %d teams on the board, want %d", team, r+1, len(in.Leaderboard), ranked)
		}
	}
	return got
}

// TestReadYourWrites publishes 60 pairs of an evaluation and, right after its publish ack, the
// request of the next round of the same team, all back to back. Every prompt must hold the
// evaluation published just before its request.
func TestReadYourWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	load := newRYWLoad("ryw", 6, 10)
	for i := range load.pairs() {
		load.publish(e, i)
	}
	load.check(t, e, load.pairs(), 60*time.Second)
}

// TestInputsNotReady: with no ranker committing, a request after an evaluation fails with
// inputs_not_ready once each of its COMPOSER_MAX_DELIVER deliveries waited COMPOSER_INPUTS_TIMEOUT;
// once a ranker runs, the same request succeeds.
func TestInputsNotReady(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if err := events.EnsureStreams(t.Context(), e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	composer := e.start("composer", "COMPOSER_INPUTS_TIMEOUT=700ms", "COMPOSER_MAX_DELIVER=2")
	e.publishEvaluation("ev-1", evaluation("nr", "t1", "One", 1, 50, "first", t0))
	rr := events.RoundRequested{ExecutionID: "nr", TeamID: "t1", TeamName: "One", RoundNumber: 2, UserPrompt: "Go."}
	start := time.Now()
	e.requestRound("req-1", rr, t0.Add(time.Minute))
	got := e.answers("prompt.*.nr.t1", 1, 30*time.Second)["req-1"]
	want := "the ranker has not committed the evaluations acknowledged before this request within 700ms (ranker consumer not found)"
	if got.ok() || got.failed.Code != events.CodeInputsNotReady || !got.failed.Retryable || got.failed.Message != want {
		t.Fatalf("answer %s %+v, want retryable inputs_not_ready naming the timeout and the cause", got.subject, got.failed)
	}
	if waited := time.Since(start); waited < 2*700*time.Millisecond {
		t.Errorf("answered after %s, before two deliveries waited 700ms each", waited)
	}
	// The counter moves just after the publish, so the answer may be seen first.
	waitMetric(t, composer, `composer_requests_total{code="inputs_not_ready",outcome="failed"}`, 1)

	e.start("ranker")
	e.requestRound("req-2", rr, t0.Add(time.Minute)) // the orchestrator retries under a new id
	retry := e.answers("prompt.*.nr.t1", 2, 30*time.Second)["req-2"]
	if !retry.ok() || !strings.Contains(retry.composed.Prompt, "first") {
		t.Fatalf("retry after the ranker started: %s %+v", retry.subject, retry.failed)
	}
}

// TestThreeComposersOneKilled runs three composer replicas on one durable, kills one with SIGKILL
// while it holds requests, and checks every request is answered exactly once in PROMPTS.
func TestThreeComposersOneKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	const exec, teams, requests = "kill", 20, 1000
	for k := range teams {
		team := fmt.Sprintf("team-%02d", k)
		e.publishEvaluation("ev-"+team, evaluation(exec, team, "Team "+team, 1, float64(k), "first round of "+team, t0))
	}
	waitCommitted(t, e, teams)
	replica := func() *proc {
		return e.start("composer", "COMPOSER_WORKERS=2", "COMPOSER_ACK_WAIT=4s", "LOG_LEVEL=info")
	}
	// The victim starts alone and gets a backlog, so it is sure to hold requests when frozen.
	victim := replica()
	for i := range requests {
		team := fmt.Sprintf("team-%02d", i%teams)
		id := fmt.Sprintf("req-%04d", i)
		body, err := events.Marshal(id, "orchestrator/test", events.TypeRoundRequested, t0.Add(time.Hour), events.RoundRequested{
			ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: 2, UserPrompt: fmt.Sprintf("Task %d.", i)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.PublishAsync(events.RoundSubject(exec, team), body, jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(10 * time.Second):
		t.Fatal("requests not acknowledged by JetStream in 10s")
	}
	// Freeze the victim once it has answered some and count what it holds from the consumer (no
	// other replica consumes yet), then kill it at once: counted after the others started, the
	// held requests could pass AckWait on a loaded machine and be answered before the kill.
	// Polled every 2 ms, not with testenv.WaitFor's backoff: the victim must be frozen while it still
	// holds requests.
	deadline := time.Now().Add(30 * time.Second)
	var answered float64
	for answered < 1 {
		answered = victim.metric(t, `composer_requests_total{code="",outcome="composed"}`)
		if time.Now().After(deadline) {
			t.Fatal("the victim replica answered nothing in 30s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // acks already sent reach the server
	cons, err := e.js.Consumer(t.Context(), events.StreamRounds, events.ConsumerComposer)
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	held := info.NumAckPending
	if held <= 0 {
		t.Fatalf("the frozen victim held no request (it had answered %v); the test proves nothing", answered)
	}
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = <-victim.done
	victim.done <- err
	t.Logf("the victim was killed holding %d unanswered requests", held)
	replica()
	replica()
	promptsCount := func() uint64 {
		stream, err := e.js.Stream(t.Context(), events.StreamPrompts)
		if err != nil {
			t.Fatal(err)
		}
		return stream.CachedInfo().State.Msgs
	}

	got := e.answers("prompt.*."+exec+".*", requests, 60*time.Second)
	for i := range requests {
		id := fmt.Sprintf("req-%04d", i)
		a := got[id]
		if !a.ok() || a.eventID != events.PromptEventID(id) || !strings.Contains(a.composed.Prompt, fmt.Sprintf("Task %d.", i)) {
			t.Errorf("%s: %s id %s %+v", id, a.subject, a.eventID, a.failed)
		}
	}
	// A request the victim answered but did not ack is composed again by another replica: the
	// duplicate window must have dropped the second answer. Every such answer is published before
	// its request is acked, so once the consumer is settled all of them were sent.
	testenv.WaitFor(t, 30*time.Second, "the composer consumer settled", func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == 0 && info.NumPending == 0, fmt.Sprintf("%d ack pending, %d pending", info.NumAckPending, info.NumPending)
	})
	if n := promptsCount(); n != requests {
		t.Errorf("PROMPTS holds %d messages, want exactly %d", n, requests)
	}
	if info, err = cons.Info(t.Context()); err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 0 {
		t.Errorf("composer consumer not settled: %d ack pending, %d pending", info.NumAckPending, info.NumPending)
	}
}

// TestRenderIsDeterministicAndMatchesPublished: the same request twice, and POST /v1/render of
// it, give byte-identical prompts and the same event data.
func TestRenderIsDeterministicAndMatchesPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	const exec = "det"
	for r := 1; r <= 3; r++ {
		for k, team := range []string{"t-a", "t-b", "t-c"} {
			e.publishEvaluation(fmt.Sprintf("ev-%s-%d", team, r), evaluation(exec, team, strings.ToUpper(team), r, float64(60+r*k), strings.Repeat("long answer ", 50*r), t0.Add(time.Duration(r)*time.Minute)))
		}
	}
	rr := events.RoundRequested{ExecutionID: exec, TeamID: "t-b", TeamName: "T-B", RoundNumber: 4, UserPrompt: "Final round: <b>bold</b> & \"quoted\".",
		Model: "phi-4-mini", Timezone: "Europe/Paris", MaxRounds: 5}
	at := time.Date(2026, 11, 23, 9, 30, 15, 123456000, time.UTC)
	e.requestRound("req-1", rr, at)
	e.requestRound("req-2", rr, at)
	got := e.answers("prompt.*."+exec+".t-b", 2, 30*time.Second)
	first, second := got["req-1"], got["req-2"]
	if !first.ok() || !second.ok() {
		t.Fatalf("answers: %+v %+v", first.failed, second.failed)
	}
	if first.composed.Prompt != second.composed.Prompt || first.composed.PromptSHA256 != second.composed.PromptSHA256 {
		t.Errorf("the same request twice gave different prompts")
	}
	if first.composed.Template.Variant != "phi-4" || len(first.composed.Messages) != 2 {
		t.Errorf("template %+v with %d messages, want the phi-4 variant with system and user", first.composed.Template, len(first.composed.Messages))
	}

	body := map[string]any{}
	raw, _ := json.Marshal(rr)
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	body["time"] = at.Format(time.RFC3339Nano)
	body["request_id"] = "req-1"
	status1, render1 := composer.render(t, body)
	status2, render2 := composer.render(t, body)
	if status1 != http.StatusOK || status2 != http.StatusOK {
		t.Fatalf("render: %d %s", status1, render1)
	}
	if !bytes.Equal(render1, render2) {
		t.Errorf("two renders of the same request differ")
	}
	var rendered events.PromptComposed
	if err := json.Unmarshal(render1, &rendered); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first.composed, rendered); diff != "" {
		t.Errorf("render differs from the published prompt.composed (-published +rendered):\n%s", diff)
	}
	// Byte for byte: the event's data is the render's answer (which ends with a line feed), with
	// "<", ">" and "&" written as themselves in both.
	var envelope struct {
		Data json.RawMessage `json:"data"`
	}
	for _, m := range e.collect(events.StreamPrompts, events.PromptComposedSubject(exec, "t-b"), 2, 10*time.Second) {
		var pc events.PromptComposed
		if dataOf(t, m.Body, &pc); pc.RequestID == "req-1" { // the render names req-1
			if err := json.Unmarshal(m.Body, &envelope); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytes.Equal(envelope.Data, bytes.TrimSuffix(render1, []byte("\n"))) {
		t.Errorf("the published data and the render differ in their bytes:\n%.300s\n%.300s", envelope.Data, render1)
	}
	if !bytes.Contains(envelope.Data, []byte("<b>bold</b> &")) {
		t.Errorf("the published data escapes HTML: %.300s", envelope.Data)
	}
	// Nothing was published by rendering.
	stream, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	if n := stream.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("PROMPTS holds %d messages after rendering, want the 2 published", n)
	}
}

// TestIsolationAndInjection: on every shipped round template, a team's prompt holds its own
// submissions, feedback and evaluator comments, never another team's, and user content that
// looks like Mustache or HTML stays literal.
func TestIsolationAndInjection(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	const exec = "iso"
	teams := []string{"t-red", "t-green", "t-blue", "t-gold"}
	const injected = `{{x}} {{{y}}} {{#list}}loop{{/list}} {{> partial}} <&"'>`
	for r := 1; r <= 2; r++ {
		for k, team := range teams {
			ev := evaluation(exec, team, "Name "+team, r, float64(50+10*k+r), fmt.Sprintf("SUB<%s-%d> %s", team, r, injected), t0.Add(time.Duration(r)*time.Minute))
			ev.Evaluation.Feedback = fmt.Sprintf("FB<%s-%d> %s", team, r, injected)
			ev.Evaluation.Metrics[0].EvaluatorComment = fmt.Sprintf("MC<%s-%d>", team, r)
			e.publishEvaluation(fmt.Sprintf("ev-%s-%d", team, r), ev)
		}
	}
	templates := []string{"team-round", "mixseek-team"}
	for _, tmpl := range templates {
		for _, team := range teams {
			e.requestRound("req-"+tmpl+"-"+team, events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Name " + team,
				RoundNumber: 3, UserPrompt: "Task with {{user}} and <b>&amp;</b>", Template: tmpl, MaxRounds: 3}, t0.Add(time.Hour))
		}
	}
	got := e.answers("prompt.*."+exec+".*", len(templates)*len(teams), 30*time.Second)
	for _, tmpl := range templates {
		for _, team := range teams {
			a := got["req-"+tmpl+"-"+team]
			if !a.ok() {
				t.Errorf("%s %s: %+v", tmpl, team, a.failed)
				continue
			}
			text := a.composed.Prompt
			for _, m := range a.composed.Messages {
				text += "\n" + m.Content
			}
			own := []string{fmt.Sprintf("SUB<%s-2>", team), fmt.Sprintf("MC<%s-2>", team), injected, "Task with {{user}} and <b>&amp;</b>"}
			if tmpl == "team-round" {
				// mixseek's history has scores, metrics and submissions but no free-text feedback.
				own = append(own, fmt.Sprintf("FB<%s-2>", team))
			}
			for _, want := range own {
				if !strings.Contains(text, want) {
					t.Errorf("%s prompt of %s lacks its own %q", tmpl, team, want)
				}
			}
			for _, other := range teams {
				if other == team {
					continue
				}
				for r := 1; r <= 2; r++ {
					for _, leak := range []string{"SUB<%s-%d>", "FB<%s-%d>", "MC<%s-%d>"} {
						if s := fmt.Sprintf(leak, other, r); strings.Contains(text, s) {
							t.Errorf("%s prompt of %s contains %q of another team", tmpl, team, s)
						}
					}
				}
			}
		}
	}
}

// TestEveryFailureCodeIsAnswered: each failure the composer can meet ends in one prompt.failed
// with its code (inputs_not_ready has its own test, invalid events their dead-letter test).
func TestEveryFailureCodeIsAnswered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "needs-vars.mustache"), []byte("Task {{vars.task.title}} for {{team.name}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.start("ranker")
	composer := e.start("composer", "COMPOSER_TEMPLATES_DIR="+dir, "COMPOSER_MAX_DELIVER=1", "COMPOSER_READ_CACHE_TTL=0")
	e.publishEvaluation("ev-1", evaluation("fc", "t1", "One", 1, 50, "first", t0))
	tiny := 20
	base := events.RoundRequested{ExecutionID: "fc", TeamID: "t1", TeamName: "One", RoundNumber: 2, UserPrompt: "Go."}
	cases := []struct {
		id     string
		mutate func(*events.RoundRequested)
		code   events.FailureCode
		msg    string
	}{
		{"bad-tz", func(r *events.RoundRequested) { r.Timezone = "Mars/Olympus" }, events.CodeInvalidRequest,
			`timezone "Mars/Olympus" is not an IANA time zone name (for example "UTC", "Asia/Tokyo", "Europe/Berlin", "America/New_York")`},
		{"unknown", func(r *events.RoundRequested) { r.Template = "team-round@99" }, events.CodeUnknownTemplate, `template "team-round" has no version 99 (loaded: version 4)`},
		{"no-vars", func(r *events.RoundRequested) { r.Template = "needs-vars" }, events.CodeTemplateError, `template "needs-vars" uses "vars.task.title", which this request does not provide`},
		{"budget", func(r *events.RoundRequested) { r.Limits.MaxPromptTokens = &tiny }, events.CodeBudgetExceeded,
			`template "team-round" needs 207 tokens (o200k_base) with only the task, the team's position and its latest score, over max_prompt_tokens 20`},
	}
	for _, c := range cases {
		rr := base
		c.mutate(&rr)
		e.requestRound("req-"+c.id, rr, t0.Add(time.Hour))
	}
	got := e.answers("prompt.*.fc.t1", len(cases), 30*time.Second)
	for _, c := range cases {
		a := got["req-"+c.id]
		// Messages are compared whole: they never repeat the code, which travels beside them.
		if a.ok() || a.failed.Code != c.code || a.failed.Message != c.msg || a.failed.Retryable {
			t.Errorf("%s: %s %+v, want %s with message %q", c.id, a.subject, a.failed, c.code, c.msg)
		}
	}

	// One token under the whole prompt: composed, with the budget's first cut listed and counted.
	status, body := composer.render(t, map[string]any{"execution_id": "fc", "team_id": "t1", "team_name": "One", "round_number": 2, "user_prompt": "Go.",
		"time": t0.Add(time.Hour).Format(time.RFC3339)})
	var whole events.PromptComposed
	if err := json.Unmarshal(body, &whole); status != http.StatusOK || err != nil {
		t.Fatalf("render: %d %s", status, body)
	}
	budget := whole.TokenEstimate - 1
	cut := base
	cut.Limits.MaxPromptTokens = &budget
	e.requestRound("req-cut", cut, t0.Add(time.Hour))
	got = e.answers("prompt.*.fc.t1", len(cases)+1, 30*time.Second)
	a := got["req-cut"]
	if !a.ok() || len(a.composed.Truncated) == 0 || a.composed.TokenEstimate > budget {
		t.Fatalf("one token over: %s %+v, %d tokens, truncated %v", a.subject, a.failed, a.composed.TokenEstimate, a.composed.Truncated)
	}
	waitMetric(t, composer, fmt.Sprintf(`composer_truncations_total{section=%q}`, a.composed.Truncated[0].Section), 1)
	waitMetric(t, composer, `composer_templates_loaded{name="needs-vars",version="1"}`, 1)
	waitMetric(t, composer, `composer_prompt_tokens_count`, 1) // the cut request; renders are not counted
	for _, c := range cases {
		waitMetric(t, composer, fmt.Sprintf(`composer_requests_total{code=%q,outcome="failed"}`, c.code), 1)
	}

	// ClickHouse answering errors: with one delivery allowed, store_unavailable at once, retryable.
	e.storeExec("RENAME TABLE evaluations TO evaluations_away")
	// The ranker's score snapshot of the execution would serve the request without ClickHouse:
	// without it, the composer has to read the store.
	e.dropSnapshot("fc")
	e.requestRound("req-store", base, t0.Add(time.Hour))
	got = e.answers("prompt.*.fc.t1", len(cases)+2, 30*time.Second)
	if a := got["req-store"]; a.ok() || a.failed.Code != events.CodeStoreUnavailable || !a.failed.Retryable {
		t.Errorf("store failure: %s %+v, want retryable store_unavailable", a.subject, a.failed)
	}
	e.storeExec("RENAME TABLE evaluations_away TO evaluations")
	e.requestRound("req-back", base, t0.Add(time.Hour))
	got = e.answers("prompt.*.fc.t1", len(cases)+3, 30*time.Second)
	if a := got["req-back"]; !a.ok() {
		t.Errorf("after the table is back: %s %+v", a.subject, a.failed)
	}
}

// TestBurstSharesOneRead: the ten requests of one execution's round, arriving together, cost one
// read of its scores (from ClickHouse, or from the ranker's snapshot when it has written it), and
// each still gets its own team's history.
func TestBurstSharesOneRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	const exec, teams = "burst", 10
	for r := 1; r <= 3; r++ {
		for k := range teams {
			team := fmt.Sprintf("team-%d", k)
			e.publishEvaluation(fmt.Sprintf("ev-%d-%d", k, r), evaluation(exec, team, "Team "+team, r, float64(k*r), fmt.Sprintf("BURST-%s-%d", team, r), t0))
		}
	}
	waitCommitted(t, e, 3*teams)
	queried := func() float64 {
		return composer.metric(t, `composer_store_reads_total{result="queried"}`) + composer.metric(t, `composer_store_reads_total{result="snapshot"}`)
	}
	before := queried()
	for k := range teams {
		team := fmt.Sprintf("team-%d", k)
		e.requestRound("req-"+team, events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: 4, UserPrompt: "Go."}, t0.Add(time.Hour))
	}
	got := e.answers("prompt.*."+exec+".*", teams, 30*time.Second)
	for k := range teams {
		team := fmt.Sprintf("team-%d", k)
		a := got["req-"+team]
		if !a.ok() || !strings.Contains(a.composed.Prompt, "BURST-"+team+"-3") || len(a.composed.Inputs.Leaderboard) != teams {
			t.Errorf("%s: %s %+v", team, a.subject, a.failed)
		}
	}
	reads := queried() - before
	shared := composer.metric(t, `composer_store_reads_total{result="shared"}`) + composer.metric(t, `composer_store_reads_total{result="cached"}`)
	if reads != 1 || shared != teams-1 {
		t.Errorf("a burst of %d requests made %v reads and shared %v, want 1 and %d", teams, reads, shared, teams-1)
	}
}
