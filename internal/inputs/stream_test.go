package inputs

import (
	"context"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestLeaderNext: the leader's answer to "the first message on a subject at or after a
// sequence" agrees with the direct get, found or not.
func TestLeaderNext(t *testing.T) {
	nc, js := testenv.JetStream(t, testenv.NATS(t))
	createEvaluations(t, js)
	for _, subject := range []string{"evaluation.completed.a.t", "evaluation.completed.b.t", "evaluation.completed.a.u", "evaluation.completed.b.t"} {
		if _, err := js.Publish(context.Background(), subject, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	e := &evaluationsStream{js: js}
	for _, tt := range []struct {
		subject string
		from    uint64
		want    uint64
	}{{"evaluation.completed.a.*", 1, 1}, {"evaluation.completed.a.*", 2, 3}, {"evaluation.completed.a.*", 4, 0}, {"evaluation.completed.b.*", 3, 4}, {"evaluation.completed.c.*", 1, 0}} {
		got, err := leaderNext(context.Background(), nc, events.StreamEvaluations, tt.subject, tt.from)
		if err != nil || got != tt.want {
			t.Errorf("leaderNext(%s, %d) = %d, %v; want %d", tt.subject, tt.from, got, err, tt.want)
		}
		direct, err := e.next(context.Background(), tt.subject, tt.from)
		if err != nil || direct != tt.want {
			t.Errorf("next(%s, %d) = %d, %v; want %d", tt.subject, tt.from, direct, err, tt.want)
		}
	}
}
