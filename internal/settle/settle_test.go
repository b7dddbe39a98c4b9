package settle_test

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestSettle settles one message per outcome on a real JetStream server and checks what the
// broker then holds: an ack, a redelivery after the backoff, a dead letter with its headers and
// no redelivery, and a poison message terminated even when its dead letter cannot be published.
func TestSettle(t *testing.T) {
	for _, tt := range []struct {
		name           string
		outcome        settle.Outcome
		deadLetters    bool // the DEADLETTER stream exists
		wantRedelivery bool
		wantDead       int
		wantLost       float64
	}{
		{"done acks", settle.Ack(), true, false, 0, 0},
		{"retry redelivers after the backoff", settle.Outcome{Kind: settle.Retry, Why: "store down"}, true, true, 0, 0},
		{"poison is dead-lettered and terminated", settle.Reject("bad json"), true, false, 1, 0},
		{"poison without a dead-letter stream is terminated anyway", settle.Reject("bad json"), false, false, 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ns := testenv.NATS(t)
			_, js := testenv.JetStream(t, ns)
			ctx := t.Context()
			streams := []string{events.StreamEvaluations}
			if tt.deadLetters {
				streams = append(streams, events.StreamDeadLetter)
			}
			if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, streams...); err != nil {
				t.Fatal(err)
			}
			cfg, err := events.ConsumerConfig(events.ConsumerRanker, events.ConsumerOptions{AckWait: 30 * time.Second, MaxAckPending: 10, MaxDeliver: -1})
			if err != nil {
				t.Fatal(err)
			}
			cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvaluations, cfg)
			if err != nil {
				t.Fatal(err)
			}
			msg := nats.NewMsg(events.EvaluationSubject("e", "t"))
			msg.Data = []byte("{not json")
			msg.Header.Set("X-Original", "kept")
			// Expectations of the original's publisher would refuse a copy to DEADLETTER.
			msg.Header.Set("Nats-Expected-Stream", events.StreamEvaluations)
			if _, err := js.PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}

			reg := prometheus.NewRegistry()
			var logs bytes.Buffer
			s := settle.New(js, slog.New(slog.NewJSONHandler(&logs, nil)), reg, "test")
			got, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			m := <-got.Messages()
			start := time.Now()
			s.Settle(ctx, m, tt.outcome)

			// An expected redelivery is awaited 20 times its 500ms backoff (the fetch returns as soon
			// as it comes: a loaded machine only costs time); none is awaited 2s.
			wait := 2 * time.Second
			if tt.wantRedelivery {
				wait = 20 * retry.Redelivery().Backoff(1)
			}
			again, err := cons.Fetch(1, jetstream.FetchMaxWait(wait))
			if err != nil {
				t.Fatal(err)
			}
			var redelivered jetstream.Msg
			for r := range again.Messages() {
				redelivered = r
			}
			if (redelivered != nil) != tt.wantRedelivery {
				t.Fatalf("redelivered: %v, want %v", redelivered != nil, tt.wantRedelivery)
			}
			if redelivered != nil {
				md, _ := redelivered.Metadata()
				if waited := time.Since(start); md.NumDelivered != 2 || waited < retry.Redelivery().Backoff(1) {
					t.Errorf("redelivery %d after %s, want delivery 2 after at least %s", md.NumDelivered, waited, retry.Redelivery().Backoff(1))
				}
			}
			if tt.deadLetters {
				dl, err := js.Stream(ctx, events.StreamDeadLetter)
				if err != nil {
					t.Fatal(err)
				}
				if n := int(dl.CachedInfo().State.Msgs); n != tt.wantDead {
					t.Fatalf("dead letters: %d, want %d", n, tt.wantDead)
				}
				if tt.wantDead > 0 {
					raw, err := dl.GetMsg(ctx, 1)
					if err != nil {
						t.Fatal(err)
					}
					h := raw.Header
					if raw.Subject != "deadletter."+events.EvaluationSubject("e", "t") || string(raw.Data) != "{not json" ||
						h.Get(events.HeaderDeadReason) != "bad json" || h.Get(events.HeaderDeadStream) != events.StreamEvaluations ||
						h.Get(events.HeaderDeadSequence) != "1" || h.Get("X-Original") != "kept" || h.Get("Nats-Expected-Stream") != "" {
						t.Errorf("dead letter %s %q with headers %v", raw.Subject, raw.Data, h)
					}
				}
			}
			kind := tt.outcome.Kind.String()
			if n := counter(t, reg, "test_messages_settled_total", kind); n != 1 {
				t.Errorf("test_messages_settled_total{outcome=%q} = %v, want 1", kind, n)
			}
			if n := counter(t, reg, "test_dead_letters_failed_total", ""); n != tt.wantLost {
				t.Errorf("test_dead_letters_failed_total = %v, want %v\n%s", n, tt.wantLost, logs.String())
			}
		})
	}
}

// counter is the value of a counter of reg by name and outcome label ("" for none), 0 when absent.
func counter(t *testing.T, reg *prometheus.Registry, name, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == name && (outcome == "" || len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == outcome) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
