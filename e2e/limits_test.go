package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

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
