package consume

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// pullEnv is a ROUNDS stream holding n messages of size bytes each and a durable consumer of it
// with a 1 s AckWait and at most three deliveries.
func pullEnv(t *testing.T, n, size int) (jetstream.JetStream, jetstream.Consumer, *settle.Settler) {
	t.Helper()
	ctx := t.Context()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamRounds, events.StreamDeadLetter); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		body := string(rune('a'+i)) + strings.Repeat(".", size-1)
		if _, err := js.Publish(ctx, "round.requested.x.t", []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := events.ConsumerConfig(events.ConsumerComposer, events.ConsumerOptions{AckWait: time.Second, MaxAckPending: 100, MaxDeliver: 3})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamRounds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return js, cons, settle.New(js, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), "test")
}

// TestBufferedMessagesAreKeptAlive: while the one worker holds its message for three AckWaits,
// the messages the runtime pulled behind it are kept alive too: each is delivered once, none is
// redelivered (nats.go's own buffer left them to the server, which delivered them again every
// AckWait and, past MaxDeliver, dropped them).
func TestBufferedMessagesAreKeptAlive(t *testing.T) {
	js, cons, settler := pullEnv(t, 4, 8)
	var mu sync.Mutex
	deliveries := map[string]uint64{}
	var order []string
	h := func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome) {
		md, err := msg.Metadata()
		if err != nil {
			t.Error(err)
			return ctx, settle.Ack()
		}
		id := string(msg.Data()[:1])
		mu.Lock()
		deliveries[id] = max(deliveries[id], md.NumDelivered)
		order = append(order, id)
		mu.Unlock()
		if id == "a" {
			time.Sleep(3 * time.Second) // three AckWaits: the buffered ones would be delivered again
		}
		return ctx, settle.Ack()
	}
	stop, cancel := context.WithCancel(t.Context())
	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cons.CachedInfo().Config},
		Log: slog.New(slog.DiscardHandler), Buffer: Buffer{Messages: 3}, Consuming: func(error) {}, RecoverFor: time.Second}
	done := make(chan error, 1)
	go func() {
		done <- rt.Run(stop, t.Context(), cons, Workers(1, Stage{Handler: Each(h), Settler: settler, KeepAlive: 300 * time.Millisecond}, func(string, ...any) {}))
	}()
	testenv.WaitFor(t, 20*time.Second, "every message settled", func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream == 4 && info.NumAckPending == 0, ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(order, "") != "abcd" || info.NumRedelivered != 0 {
		t.Errorf("handled %v, %d redelivered; want a, b, c, d each once", order, info.NumRedelivered)
	}
	for id, n := range deliveries {
		if n != 1 {
			t.Errorf("message %s delivered %d times", id, n)
		}
	}
}

// TestBufferIsBoundedByBytes: with a 400-byte buffer and messages of 100 bytes, the runtime holds
// a few messages beside the one in hand while it is held, never all ten.
func TestBufferIsBoundedByBytes(t *testing.T) {
	js, cons, settler := pullEnv(t, 10, 100)
	release := make(chan struct{})
	h := func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome) {
		<-release
		return ctx, settle.Ack()
	}
	stop, cancel := context.WithCancel(t.Context())
	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cons.CachedInfo().Config},
		Log: slog.New(slog.DiscardHandler), Buffer: Buffer{Messages: 100, Bytes: 400}, Consuming: func(error) {}, RecoverFor: time.Second}
	done := make(chan error, 1)
	go func() {
		done <- rt.Run(stop, t.Context(), cons, Workers(1, Stage{Handler: Each(h), Settler: settler}, func(string, ...any) {}))
	}()
	var pending int
	testenv.WaitFor(t, 10*time.Second, "the buffer filled", func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		pending = info.NumAckPending
		return pending >= 2, ""
	})
	time.Sleep(300 * time.Millisecond) // room for a fetch past the bound, were there one
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending > 5 {
		t.Errorf("%d messages delivered and not acked with one in hand and a 400-byte buffer of 100-byte messages; want at most 5", info.NumAckPending)
	}
	close(release)
	testenv.WaitFor(t, 10*time.Second, "every message settled", func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream == 10, ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
