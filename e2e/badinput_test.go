package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// envelopeWith returns a valid CloudEvent body with data replaced by a mutation of the given one.
func envelopeWith(t *testing.T, eventType string, data any, mutate func(env map[string]any, data map[string]any)) []byte {
	t.Helper()
	body, err := events.Marshal("bad-id", "orchestrator/test", eventType, t0, data)
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatal(err)
	}
	d, _ := env["data"].(map[string]any)
	mutate(env, d)
	out, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// badCase is one poison event: where it is published, its bytes, and what the reason must say.
type badCase struct {
	name    string
	subject string
	body    []byte
	reason  string
}

// badInputs is the contract's table of invalid bodies for one event type.
func badInputs(t *testing.T, eventType string, good any, subject func(exec, team string) string) []badCase {
	n := 0
	mut := func(f func(env, data map[string]any)) []byte {
		n++
		id := fmt.Sprintf("bad-%d", n) // distinct requests: one answer each
		return envelopeWith(t, eventType, good, func(env, data map[string]any) { env["id"] = id; f(env, data) })
	}
	big := mut(func(_, d map[string]any) {})
	oversized := append(big[:len(big)-2:len(big)-2], []byte(`,"pad":"`+strings.Repeat("x", 5000)+`"}}`)...)
	invalidUTF8 := []byte(strings.Replace(string(big), `"team_name":"`, "\"team_name\":\"\xff\xfe", 1))
	return []badCase{
		{"not JSON", subject("ex", "t1"), []byte("{not json"), "body is not JSON"},
		{"wrong specversion", subject("ex", "t1"), mut(func(env, _ map[string]any) { env["specversion"] = "0.3" }), `specversion: must be "1.0"`},
		{"missing data", subject("ex", "t1"), mut(func(env, _ map[string]any) { delete(env, "data") }), "data: is required"},
		{"subject/body mismatch", subject("ex", "t9"), big, `data.team_id: is "t1" but the subject names "t9"`},
		{"identifier with a dot", subject("ex", "t1"), mut(func(_, d map[string]any) { d["execution_id"] = "ex.1" }), `data.execution_id: "ex.1" must be 1-128 characters`},
		{"identifier with a space", subject("ex", "t1"), mut(func(_, d map[string]any) { d["team_id"] = "t 1" }), `data.team_id: "t 1" must be 1-128 characters`},
		{"round 0", subject("ex", "t1"), mut(func(_, d map[string]any) { d["round_number"] = 0 }), "data.round_number: must be an integer from 1"},
		{"invalid UTF-8", subject("ex", "t1"), invalidUTF8, "body is not valid UTF-8"},
		{"over MAX_EVENT_BYTES", subject("ex", "t1"), oversized, "over the limit of 4096 (MAX_EVENT_BYTES)"},
	}
}

// checkDeadLetters reads DEADLETTER and checks one copy per case, byte for byte, with its headers.
func checkDeadLetters(t *testing.T, e *env, cases []badCase, extra int) {
	t.Helper()
	got := e.collect(events.StreamDeadLetter, "deadletter.>", len(cases)+extra, 20*time.Second)
	if len(got) != len(cases)+extra {
		t.Fatalf("got %d dead letters, want %d", len(got), len(cases)+extra)
	}
	bySeq := map[string]received{}
	for _, dl := range got {
		bySeq[dl.Header.Get("Dead-Sequence")] = dl
	}
	for i, tc := range cases {
		dl, ok := bySeq[fmt.Sprint(i+1)] // case i was published as stream sequence i+1
		if !ok {
			t.Errorf("%s: no dead letter with Dead-Sequence %d", tc.name, i+1)
			continue
		}
		if dl.Subject != "deadletter."+tc.subject {
			t.Errorf("%s: dead letter subject %q, want %q", tc.name, dl.Subject, "deadletter."+tc.subject)
		}
		if string(dl.Body) != string(tc.body) {
			t.Errorf("%s: dead letter body differs from the original", tc.name)
		}
		if r := dl.Header.Get("Dead-Reason"); !strings.Contains(r, tc.reason) {
			t.Errorf("%s: Dead-Reason %q does not say %q", tc.name, r, tc.reason)
		}
		if dl.Header.Get("Dead-Stream") == "" {
			t.Errorf("%s: dead letter lacks Dead-Stream/Dead-Sequence: %v", tc.name, dl.Header)
		}
	}
}

// TestRankerDeadLettersPoisonAndGoesOn publishes every invalid body of the contract, then a valid
// one: each bad one is terminated (never redelivered), copied to deadletter.<subject> with its
// reason and counted; the valid one is still stored.
func TestRankerDeadLettersPoisonAndGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker", "RANKER_MAX_EVENT_BYTES=4096")
	good := evaluation("ex", "t1", "One", 1, 50, "ok", t0)
	cases := badInputs(t, events.TypeEvaluationCompleted, good, events.EvaluationSubject)
	nonFinite := envelopeWith(t, events.TypeEvaluationCompleted, good, func(_, d map[string]any) {})
	nonFinite = []byte(strings.Replace(string(nonFinite), `"overall_score":50`, `"overall_score":1e999`, 1))
	cases = append(cases, badCase{"non-finite score", events.EvaluationSubject("ex", "t1"), nonFinite, "data.evaluation.overall_score: must be a finite number, got 1e999"})
	for i, tc := range cases {
		e.publishRaw(tc.subject, fmt.Sprintf("bad-%d", i), tc.body)
	}
	e.publishEvaluation("good-1", good)

	checkDeadLetters(t, e, cases, 0)
	testenv.WaitFor(t, 10*time.Second, "the valid event after the bad ones stored", func() (bool, string) {
		var lb leaderboard
		ranker.getJSON(t, "/v1/executions/ex/leaderboard", &lb)
		return len(lb.Teams) == 1 && lb.Teams[0].BestScore == 50, fmt.Sprintf("%+v", lb)
	})
	if got := ranker.metric(t, `ranker_events_total{outcome="dead_lettered"}`); got != float64(len(cases)) {
		t.Errorf("ranker_events_total{outcome=dead_lettered} = %v, want %d", got, len(cases))
	}
	// Terminated, not redelivered: nothing is pending or waiting for an ack (the valid event's ack
	// follows its commit, which the board may show first).
	testenv.WaitFor(t, 10*time.Second, "the ranker's consumer with nothing pending", func() (bool, string) {
		info, err := consumerInfo(t.Context(), e.js, events.StreamEvaluations, events.ConsumerRanker)
		if err != nil {
			return false, err.Error()
		}
		if info.NumRedelivered != 0 {
			t.Fatalf("consumer after poison: %d redelivered, want none", info.NumRedelivered)
		}
		return info.NumAckPending == 0 && info.NumPending == 0, fmt.Sprintf("pending %d, ack pending %d", info.NumPending, info.NumAckPending)
	})
}

// TestComposerDeadLettersPoisonAndAnswersIt: a bad request is dead-lettered, and when its subject
// still names an execution and a team it also gets prompt.failed invalid_request.
func TestComposerDeadLettersPoisonAndAnswersIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer", "COMPOSER_MAX_EVENT_BYTES=4096")
	good := events.RoundRequested{ExecutionID: "ex", TeamID: "t1", TeamName: "One", RoundNumber: 1, UserPrompt: "Task."}
	cases := badInputs(t, events.TypeRoundRequested, good, events.RoundSubject)
	cases = append(cases,
		badCase{"bad template ref", events.RoundSubject("ex", "t1"), envelopeWith(t, events.TypeRoundRequested, good, func(env, d map[string]any) { env["id"] = "bad-tmpl"; d["template"] = "a/b" }), "data.template"},
		badCase{"subject without team", "round.requested.ex", envelopeWith(t, events.TypeRoundRequested, good, func(env, _ map[string]any) { env["id"] = "bad-subject" }), "must be round.requested.<execution_id>.<team_id>"},
	)
	for i, tc := range cases {
		e.publishRaw(tc.subject, fmt.Sprintf("bad-%d", i), tc.body)
	}
	e.requestRound("good-1", good, t0)

	checkDeadLetters(t, e, cases, 0)
	// Every case but the one whose subject names no team is answered, and so is the good request.
	answers := e.collect(events.StreamPrompts, "prompt.>", len(cases), 20*time.Second)
	if len(answers) != len(cases) {
		t.Fatalf("got %d answers, want %d", len(answers), len(cases))
	}
	composed := 0
	for i, a := range answers {
		if err := events.Validate(a.Subject, a.Body, 0); err != nil {
			t.Errorf("answer %d breaks the contract: %v", i, err)
		}
		if a.Subject == "prompt.composed.ex.t1" {
			composed++
			continue
		}
		var pf events.PromptFailed
		dataOf(t, a.Body, &pf)
		if pf.Code != events.CodeInvalidRequest || pf.Retryable || pf.Message == "" {
			t.Errorf("answer %d on %s = %+v, want a non-retryable invalid_request", i, a.Subject, pf)
		}
	}
	if composed != 1 {
		t.Errorf("the valid request after the bad ones was composed %d times, want 1", composed)
	}
	if got := composer.metric(t, `composer_requests_total{code="invalid_request",outcome="dead_lettered"}`); got != float64(len(cases)) {
		t.Errorf("dead-lettered requests metric = %v, want %d", got, len(cases))
	}
}
