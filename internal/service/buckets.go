package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// KeyValue opens a bucket the service uses: made (sealed: no rollups, no purges) when missing and
// the service manages its streams (MANAGE_STREAMS), never changed (how it differs from cfg is said:
// an operator applies it), else looked up, nil when an operator-managed deployment has none (the
// service then does without it: no score snapshots, no registry).
func (b *Base) KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	var err error
	if b.common.ManageStreams {
		if kv, err = events.EnsureBucket(ctx, b.JS, cfg, false); err == nil {
			if st, err := b.JS.Stream(ctx, "KV_"+cfg.Bucket); err == nil {
				if d := events.BucketDrift(st.CachedInfo().Config, cfg); len(d.Fields) > 0 {
					logDrift(b.Log, d)
				}
			}
		}
	} else if kv, err = b.JS.KeyValue(ctx, cfg.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// ManagesStreams says whether the service makes what is missing (MANAGE_STREAMS): the streams,
// buckets and stores it uses.
func (b *Base) ManagesStreams() bool { return b.common.ManageStreams }
