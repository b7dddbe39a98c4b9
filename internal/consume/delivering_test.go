package consume

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestABatchOfAConsumerMadeAgainIsNotSettled: a message taken from a consumer whose stream was then
// deleted and made again, with the consumer (same name) and a new message at the same sequence,
// delivered and not yet handled. Settling the old message sends its ack on a subject that names the
// stream and the consumer only: the new consumer took it as the ack of its own message at that
// sequence, which was then never handled nor delivered again (found in review). Now the stage asks
// the runtime whether the consumer that delivered the batch is still the one there is
// (Runtime.Delivering) and settles nothing otherwise; a batch of the consumer there is now is
// settled as before.
func TestABatchOfAConsumerMadeAgainIsNotSettled(t *testing.T) {
	ctx := t.Context()
	js, cons, settler := pullEnv(t, 1, 8)
	take := func(cons jetstream.Consumer) jetstream.Msg {
		t.Helper()
		st, err := js.Stream(ctx, events.StreamRounds)
		if err != nil {
			t.Fatal(err)
		}
		p := newPull(cons, st.CachedInfo().Created, Buffer{Messages: 1}, time.Hour, slog.New(slog.DiscardHandler), func(error) {})
		defer p.Stop()
		next, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		msg, err := p.Next(next)
		if err != nil {
			t.Fatal(err)
		}
		return msg
	}
	old := take(cons)

	// The stream and the consumer made again; a new request at sequence 1, delivered.
	if err := js.DeleteStream(ctx, events.StreamRounds); err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamRounds); err != nil {
		t.Fatal(err)
	}
	cfg := cons.CachedInfo().Config
	remade, err := js.CreateOrUpdateConsumer(ctx, events.StreamRounds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "round.requested.x.t", []byte("new")); err != nil {
		t.Fatal(err)
	}
	fresh := take(remade)
	if md, err := fresh.Metadata(); err != nil || md.Sequence.Stream != 1 {
		t.Fatalf("the new message: %+v %v, want sequence 1", md, err)
	}

	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cfg}, Log: slog.New(slog.DiscardHandler)}
	if rt.Delivering(ctx, []jetstream.Msg{old}) {
		t.Fatal("the consumer that delivered the old message is said to be the one there is now")
	}
	if !rt.Delivering(ctx, []jetstream.Msg{fresh}) {
		t.Fatal("the consumer that delivered the new message is said to be gone")
	}
	ack := func(ctx context.Context, msgs []jetstream.Msg) Result { return All(msgs, settle.Ack()) }
	stage := Stage{Handler: ack, Settler: settler, ConfirmAcks: 2 * time.Second, Current: rt.Delivering} // acks confirmed: done when run returns
	pending := func() int {
		t.Helper()
		info, err := remade.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumAckPending
	}
	stage.run(ctx, []jetstream.Msg{old})
	if n := pending(); n != 1 {
		t.Fatalf("after the old batch was handled, the new consumer has %d messages pending, want 1 (the old batch's ack settled the new message)", n)
	}
	stage.run(ctx, []jetstream.Msg{fresh})
	testenv.WaitFor(t, 10*time.Second, "the new message acknowledged", func() (bool, string) {
		n := pending()
		return n == 0, fmt.Sprintf("%d pending", n)
	})
}

// TestAcksAreNotSentAgainToAConsumerMadeAgain: a batch whose first confirmation failed (its
// stream was deleted just after the check) has its acks sent again only while its consumer is
// still the one there is: sent after the stream and the consumer were made again, they would
// settle the new consumer's message at the same sequence. The test orders it without timing:
// the check before sending again waits until the consumer was made again and a new message is
// delivered.
func TestAcksAreNotSentAgainToAConsumerMadeAgain(t *testing.T) {
	ctx := t.Context()
	js, cons, settler := pullEnv(t, 1, 8)
	cfg := cons.CachedInfo().Config
	st, err := js.Stream(ctx, events.StreamRounds)
	if err != nil {
		t.Fatal(err)
	}
	p := newPull(cons, st.CachedInfo().Created, Buffer{Messages: 1}, time.Hour, slog.New(slog.DiscardHandler), func(error) {})
	old, err := p.Next(ctx)
	p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cfg}, Log: slog.New(slog.DiscardHandler)}
	if err := js.DeleteStream(ctx, events.StreamRounds); err != nil { // the first confirmation fails
		t.Fatal(err)
	}
	var remade jetstream.Consumer
	still := func() bool {
		// Before sending again: the stream and the consumer made again, a new request delivered.
		if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamRounds); err != nil {
			t.Fatal(err)
		}
		if remade, err = js.CreateOrUpdateConsumer(ctx, events.StreamRounds, cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := js.Publish(ctx, "round.requested.x.t", []byte("new")); err != nil {
			t.Fatal(err)
		}
		if _, err := remade.Fetch(1, jetstream.FetchMaxWait(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		return rt.Delivering(ctx, []jetstream.Msg{old})
	}
	settler.AckAll(ctx, []jetstream.Msg{old}, 5*time.Second, still)
	if remade == nil {
		t.Fatal("the acks were not tried again: the test did not reach the check")
	}
	info, err := remade.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 1 {
		t.Fatalf("the new consumer has %d messages pending after the old batch's acks, want 1: an ack sent again settled the new message", info.NumAckPending)
	}
}

// TestLookupsAreSharedAndFresh: callers that ask at once share lookups, never more than one in
// flight, and each gets the answer of a lookup that started after it asked (as fresh as its own).
func TestLookupsAreSharedAndFresh(t *testing.T) {
	var l lookups
	var mu sync.Mutex
	started, inFlight, most := 0, 0, 0
	look := func() (time.Time, error) {
		mu.Lock()
		started++
		n := started
		inFlight++
		most = max(most, inFlight)
		mu.Unlock()
		time.Sleep(time.Millisecond) // a round trip, during which more callers come
		mu.Lock()
		inFlight--
		mu.Unlock()
		return time.Unix(int64(n), 0), nil
	}
	const callers = 200
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			before := started // lookups that had started when this caller asked
			mu.Unlock()
			got, err := l.created(t.Context(), look)
			if err != nil || got.Unix() <= int64(before) {
				t.Errorf("answered by lookup %d (%v), asked once %d had started: want a later one", got.Unix(), err, before)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d callers, %d lookups", callers, started)
	if most != 1 {
		t.Errorf("%d lookups were in flight at once, want 1", most)
	}
	if started > callers {
		t.Errorf("%d lookups for %d callers", started, callers)
	}
}
