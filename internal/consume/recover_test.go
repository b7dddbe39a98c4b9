package consume

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// recoverEnv is a ROUNDS stream holding three messages, the second of which its handlers panic
// on, a durable consumer of it, and DEADLETTER.
func recoverEnv(t *testing.T) (jetstream.JetStream, jetstream.Consumer, *settle.Settler) {
	t.Helper()
	ctx := t.Context()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamRounds, events.StreamDeadLetter); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"one", "boom", "three"} {
		if _, err := js.Publish(ctx, "round.requested.x.t", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := events.ConsumerConfig(events.ConsumerComposer, events.ConsumerOptions{AckWait: 30 * time.Second, MaxAckPending: 10, MaxDeliver: 5})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamRounds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, settle.New(js, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), "test")
}

// consumeAll runs loop until the consumer has settled every message, then stops it.
func consumeAll(t *testing.T, js jetstream.JetStream, cons jetstream.Consumer, loop Loop) {
	t.Helper()
	stop, cancel := context.WithCancel(t.Context())
	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cons.CachedInfo().Config},
		Log: slog.New(slog.DiscardHandler), Consuming: func(error) {}, RecoverFor: time.Second}
	done := make(chan error, 1)
	go func() { done <- rt.Run(stop, t.Context(), cons, loop) }()
	testenv.WaitFor(t, 10*time.Second, "every message settled", func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream == 3 && info.NumAckPending == 0, ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// checkDeadLetter checks that DEADLETTER holds the panicking message alone, with the panic as
// its reason.
func checkDeadLetter(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	st, err := js.Stream(t.Context(), events.StreamDeadLetter)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("DEADLETTER holds %d messages, want 1", n)
	}
	msg, err := st.GetMsg(t.Context(), st.CachedInfo().State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "boom" || !strings.Contains(msg.Header.Get(events.HeaderDeadReason), "panicked: the handler met boom") {
		t.Errorf("dead letter %q with reason %q", msg.Data, msg.Header.Get(events.HeaderDeadReason))
	}
}

// TestRecoverDeadLettersAPanic: a worker whose handler panics on one message dead-letters that
// message with the panic as its reason and handles the others.
func TestRecoverDeadLettersAPanic(t *testing.T) {
	js, cons, settler := recoverEnv(t)
	panics := prometheus.NewCounter(prometheus.CounterOpts{Name: "panics"})
	var handled []string
	h := Chain(Each(func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome) {
		if string(msg.Data()) == "boom" {
			panic("the handler met boom")
		}
		handled = append(handled, string(msg.Data()))
		return ctx, settle.Ack()
	}), Recover(slog.New(slog.DiscardHandler), panics))
	consumeAll(t, js, cons, Workers(1, Stage{Handler: h, Settler: settler, KeepAlive: time.Second}, func(string, ...any) {}))
	checkDeadLetter(t, js)
	if !slices.Equal(handled, []string{"one", "three"}) || testutil.ToFloat64(panics) != 1 {
		t.Errorf("handled %v, %v panics", handled, testutil.ToFloat64(panics))
	}
}

// TestRecoverBatchesDeadLettersOnlyThePanic: a batch that panics is handled again one message at
// a time; only the message that panics alone is dead-lettered.
func TestRecoverBatchesDeadLettersOnlyThePanic(t *testing.T) {
	js, cons, settler := recoverEnv(t)
	panics := prometheus.NewCounter(prometheus.CounterOpts{Name: "panics"})
	var handled []string
	h := Chain(func(_ context.Context, msgs []jetstream.Msg) Result {
		for _, msg := range msgs {
			if string(msg.Data()) == "boom" {
				panic("the handler met boom")
			}
		}
		for _, msg := range msgs {
			handled = append(handled, string(msg.Data()))
		}
		return All(msgs, settle.Ack())
	}, Recover(slog.New(slog.DiscardHandler), panics))
	consumeAll(t, js, cons, Batches(Batching{Size: 10, Bytes: 1 << 20, Flush: 50 * time.Millisecond, Linger: 20 * time.Millisecond},
		Stage{Handler: h, Settler: settler, ConfirmAcks: time.Second}, func(string, ...any) {}))
	checkDeadLetter(t, js)
	slices.Sort(handled)
	if !slices.Equal(handled, []string{"one", "three"}) || testutil.ToFloat64(panics) != 1 {
		t.Errorf("handled %v, %v panics", handled, testutil.ToFloat64(panics))
	}
}
