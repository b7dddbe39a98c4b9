package consume

import (
	"log/slog"
	"testing"
	"time"

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
