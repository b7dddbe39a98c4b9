package events_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestBucketsRefuseRollups: a bucket made as nats.go makes it (rollups allowed) is sealed by
// EnsureBucket under MANAGE_STREAMS, one made by EnsureBucket is sealed from the start: a rollup on
// a key is refused and every key stays; puts, gets and deletes work.
func TestBucketsRefuseRollups(t *testing.T) {
	ns := testenv.NATS(t)
	_, js := testenv.JetStream(t, ns)
	ctx := t.Context()
	old := jetstream.KeyValueConfig{Bucket: "OLD", History: 4}
	if _, err := js.CreateKeyValue(ctx, old); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cfg    jetstream.KeyValueConfig
		update bool
	}{{old, true}, {jetstream.KeyValueConfig{Bucket: "NEW", History: 4}, false}} {
		kv, err := events.EnsureBucket(ctx, js, c.cfg, c.update)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"a.v1", "b.v1"} {
			if _, err := kv.Put(ctx, k, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		if err := kv.Delete(ctx, "b.v1"); err != nil {
			t.Fatal(err)
		}
		msg := &nats.Msg{Subject: "$KV." + c.cfg.Bucket + ".a.v1", Data: []byte("y"), Header: nats.Header{"Nats-Rollup": []string{"all"}}}
		if _, err := js.PublishMsg(ctx, msg); err == nil || !strings.Contains(err.Error(), "rollup") {
			t.Errorf("%s: a rollup: %v, want it refused", c.cfg.Bucket, err)
		}
		if e, err := kv.Get(ctx, "a.v1"); err != nil || string(e.Value()) != "x" {
			t.Errorf("%s: a.v1 after the rollup: %v", c.cfg.Bucket, err)
		}
		st, err := js.Stream(ctx, "KV_"+c.cfg.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Purge(ctx); err == nil {
			t.Errorf("%s: purged", c.cfg.Bucket)
		}
	}
}
