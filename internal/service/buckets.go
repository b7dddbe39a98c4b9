package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// KeyValue opens a bucket the service uses: made or updated with cfg when the service manages
// its streams (MANAGE_STREAMS), else looked up, nil when an operator-managed deployment has none
// (the service then does without it: no score snapshots, no registry).
func (b *Base) KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	var err error
	if b.common.ManageStreams {
		kv, err = events.EnsureBucket(ctx, b.JS, cfg, true) // sealed: no rollups, no purges
	} else if kv, err = b.JS.KeyValue(ctx, cfg.Bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// ObjectStore opens an object store the service uses, as KeyValue does a bucket, but a missing one
// is an error: it is looked up only beside a bucket that names its objects.
func (b *Base) ObjectStore(ctx context.Context, cfg jetstream.ObjectStoreConfig) (jetstream.ObjectStore, error) {
	var obj jetstream.ObjectStore
	var err error
	if b.common.ManageStreams {
		obj, err = b.JS.CreateOrUpdateObjectStore(ctx, cfg)
	} else {
		obj, err = b.JS.ObjectStore(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", cfg.Bucket, err)
	}
	return obj, nil
}
