package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// TestAnOrderedConsumerOutlivesReaders, on the shipped nats.conf: a reader may delete and pull
// from any consumer on PROMPTS whose name it learns (docs/operating.md, the roles table's last
// row), so the contract's way to wait is an ordered consumer, which the client makes again from
// the last message it saw. A console user lists the orchestrator's consumer, pulls from it and
// deletes it, again and again, while answers arrive: the orchestrator still gets every answer of
// its team, once each and in order.
func TestAnOrderedConsumerOutlivesReaders(t *testing.T) {
	t.Parallel()
	ns := shippedNATS(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	jsAs := func(role string) jetstream.JetStream {
		nc, _ := connectAs(t, ns, role)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	operator, orchestrator, console := jsAs("operator"), jsAs("orchestrator"), jsAs("console")
	if _, err := events.MakeStreams(ctx, operator, events.StreamOptions{}, events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	// From the stream's current last sequence (contract.md, "To wait for it"), not "new": a consumer
	// made again before it saw a message would start after what was published meanwhile.
	prompts, err := orchestrator.Stream(ctx, events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	waiter, err := orchestrator.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.PromptComposedSubject("waits", "t1")}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
		OptStartSeq: prompts.CachedInfo().State.LastSeq + 1})
	if err != nil {
		t.Fatal(err)
	}
	const answers = 12
	got := make(chan string, answers*2)
	cc, err := waiter.Consume(func(m jetstream.Msg) { got <- m.Headers().Get("Nats-Msg-Id") })
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()

	stream, err := console.Stream(ctx, events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	disturbed := 0
	for i := range answers {
		// The reader finds every consumer on PROMPTS, takes what it can from it, and deletes it.
		names := stream.ConsumerNames(ctx)
		for name := range names.Name() {
			if c, err := stream.Consumer(ctx, name); err == nil {
				if batch, err := c.FetchNoWait(5); err == nil {
					for range batch.Messages() {
					}
				}
			}
			if err := stream.DeleteConsumer(ctx, name); err == nil {
				disturbed++
			}
		}
		id := fmt.Sprintf("answer-%02d", i)
		if _, err := operator.Publish(ctx, events.PromptComposedSubject("waits", "t1"), []byte("{}"), jetstream.WithMsgID(id)); err != nil {
			t.Fatal(err)
		}
		// Another team's answer, which the orchestrator's filter leaves out.
		if _, err := operator.Publish(ctx, events.PromptComposedSubject("waits", "t2"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if disturbed == 0 {
		t.Fatal("the reader deleted no consumer: the test disturbed nothing")
	}
	for i := range answers {
		select {
		case id := <-got:
			if want := fmt.Sprintf("answer-%02d", i); id != want {
				t.Fatalf("answer %d is %s, want %s", i, id, want)
			}
		case <-ctx.Done():
			t.Fatalf("the orchestrator got %d of %d answers (its consumer deleted %d times)", i, answers, disturbed)
		}
	}
	select {
	case id := <-got:
		t.Fatalf("an answer twice or another team's: %s", id)
	case <-time.After(500 * time.Millisecond):
	}
	t.Logf("the reader deleted the orchestrator's ordered consumer %d times; every answer arrived once, in order", disturbed)
}
