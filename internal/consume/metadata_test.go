package consume

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// TestMetadataOfADeletedConsumerWaitsForItsRemake: SetMetadata on a consumer deleted meanwhile is
// no error (the ranker's refill, which holds every commit, would otherwise wait for a consumer the
// runtime makes again only once the loop has finished its batch: the deadlock of CI run 31), and
// the consumer made again carries that metadata.
func TestMetadataOfADeletedConsumerWaitsForItsRemake(t *testing.T) {
	js, cons, _ := recoverEnv(t)
	ctx := t.Context()
	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cons.CachedInfo().Config},
		Log: slog.New(slog.DiscardHandler), Consuming: func(error) {}, RecoverFor: 10 * time.Second}
	if err := js.DeleteConsumer(ctx, events.StreamRounds, events.ConsumerComposer); err != nil {
		t.Fatal(err)
	}
	md := map[string]string{events.MetaStoreRefilling: "the evaluations table is missing", events.MetaStoreLineage: "7@x"}
	if err := rt.SetMetadata(ctx, md); err != nil {
		t.Fatalf("SetMetadata on a deleted consumer: %v", err)
	}
	made, err := rt.recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := made.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range md {
		if info.Config.Metadata[k] != v {
			t.Errorf("the consumer made again has %s=%q, want %q", k, info.Config.Metadata[k], v)
		}
	}
}

// TestAConsumerLostAtStartIsMadeAgainPastItsFloor: a service starting (its runtime has seen no ack
// floor yet) whose consumer is deleted while it is being updated makes it again past what the
// consumer had handled, not from the stream's first message (the composer would hand every
// request handled before to its handlers again).
func TestAConsumerLostAtStartIsMadeAgainPastItsFloor(t *testing.T) {
	js, cons, _ := recoverEnv(t)
	ctx := t.Context()
	batch, err := cons.Fetch(2)
	if err != nil {
		t.Fatal(err)
	}
	for msg := range batch.Messages() {
		if err := msg.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rt := &Runtime{Source: Source{JS: js, Stream: events.StreamRounds, Consumer: cons.CachedInfo().Config},
		Log: slog.New(slog.DiscardHandler), Consuming: func(error) {}, RecoverFor: 10 * time.Second}
	deleted := false
	rt.beforeEnsure = func() {
		if !deleted {
			deleted = true
			if err := js.DeleteConsumer(ctx, events.StreamRounds, events.ConsumerComposer); err != nil {
				t.Error(err)
			}
		}
	}
	made, err := rt.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := made.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !deleted || info.Config.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || info.Config.OptStartSeq != 3 {
		t.Errorf("deleted as it started (%v), the consumer was made again with %v at %d, want by start sequence at 3", deleted, info.Config.DeliverPolicy, info.Config.OptStartSeq)
	}
}
