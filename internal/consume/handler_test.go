package consume

import (
	"context"
	"testing"

	"github.com/podium-llm/podium/internal/settle"
)

// TestJoinGivesEveryMessageOneOutcome: the parts of a batch handled one message at a time each
// give their message exactly one outcome; a part that gives none or two (a handler's mistake)
// gives its message back for redelivery, never shifting another message's outcome onto it.
func TestJoinGivesEveryMessageOneOutcome(t *testing.T) {
	afters := 0
	after := func(context.Context) { afters++ }
	res := join([]Result{
		{Outcomes: []settle.Outcome{settle.Ack()}, After: after},
		{},
		{Outcomes: []settle.Outcome{settle.Ack(), settle.Ack()}},
		{Outcomes: []settle.Outcome{settle.Reject("poison")}, After: after},
	})
	want := []settle.Kind{settle.Done, settle.Retry, settle.Retry, settle.Poison}
	if len(res.Outcomes) != len(want) || len(res.Logs) != len(want) {
		t.Fatalf("%d outcomes and %d log contexts for 4 messages", len(res.Outcomes), len(res.Logs))
	}
	for i, k := range want {
		if res.Outcomes[i].Kind != k {
			t.Errorf("message %d: %s, want %s", i, res.Outcomes[i].Kind, k)
		}
	}
	res.After(context.Background())
	if afters != 2 {
		t.Errorf("%d Afters ran, want the 2 parts'", afters)
	}
}
