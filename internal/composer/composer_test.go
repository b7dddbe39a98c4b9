package composer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/pkg/events"
)

// TestFailureOf is the rule of which error becomes which prompt.failed.
func TestFailureOf(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	down := errors.New("clickhouse: connection refused")
	cases := []struct {
		name      string
		err       error
		code      events.FailureCode
		retryable bool
	}{
		{"a failure keeps its code", events.Failf(events.CodeBudgetExceeded, "too long"), events.CodeBudgetExceeded, false},
		{"a wrapped failure too", errorsJoin(events.Failf(events.CodeUnknownTemplate, "no such template")), events.CodeUnknownTemplate, false},
		{"a store read that failed", storeError(context.Background(), down), events.CodeStoreUnavailable, true},
		{"a read its caller abandoned is no store failure", storeError(cancelled, down), events.CodeTemplateError, false},
		{"anything else while rendering", errors.New("mustache: unexpected"), events.CodeTemplateError, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := failureOf(c.err)
			if f.Code != c.code || f.Retryable != c.retryable {
				t.Errorf("failureOf(%v) = %s retryable %v, want %s retryable %v", c.err, f.Code, f.Retryable, c.code, c.retryable)
			}
			if f.Message == "" || strings.HasPrefix(f.Message, string(f.Code)) {
				t.Errorf("message %q: want the cause, not the code repeated", f.Message)
			}
		})
	}
}

func errorsJoin(err error) error { return errors.Join(errors.New("compose"), err) }

// TestAnswersConditionHoldsOnlyWhenNoneWaits: "prompts" fails while any answer waits for PROMPTS,
// naming the last cause, and holds again only once every waiting answer is stored or given back.
func TestAnswersConditionHoldsOnlyWhenNoneWaits(t *testing.T) {
	h := health.New(prometheus.NewRegistry(), "composer")
	a := &answerStore{stored: h.Condition("prompts", nil)}
	a.failed("stream not found", true)
	a.failed("JetStream storage is full: insufficient resources", true)
	a.failed("JetStream storage is full: insufficient resources", false) // the second answer's next try
	err := a.stored.Err()
	if err == nil || !strings.Contains(err.Error(), "answers cannot be stored in PROMPTS (JetStream storage is full") {
		t.Fatalf("prompts = %v, want the last cause named", err)
	}
	a.done()
	if a.stored.Err() == nil {
		t.Fatal("prompts holds while an answer still waits")
	}
	a.done()
	if err := a.stored.Err(); err != nil {
		t.Fatalf("prompts = %v once no answer waits, want it to hold", err)
	}
}
