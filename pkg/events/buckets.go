package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Every key-value bucket Podium makes (TEMPLATES, BUILDERS, SCORES, ANSWERED) refuses rollups and
// purges: a message with a Nats-Rollup header on any key a user may write would otherwise empty the
// whole bucket, history included (a template author wiping the registry). Podium deletes keys, never
// purges them, so nothing of its own needs either. JetStream never lifts a stream's deny-purge: an
// operator who must purge a bucket makes its stream again.

// BucketStream is the stream of a key-value bucket as nats.go makes it for cfg, but sealed: no
// rollups, no purges.
func BucketStream(cfg jetstream.KeyValueConfig) jetstream.StreamConfig {
	history := int64(max(cfg.History, 1))
	dup := 2 * time.Minute
	if cfg.TTL > 0 && cfg.TTL < dup {
		dup = cfg.TTL
	}
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:              "KV_" + cfg.Bucket,
		Description:       cfg.Description,
		Subjects:          []string{"$KV." + cfg.Bucket + ".>"},
		MaxMsgsPerSubject: history,
		MaxBytes:          maxBytes,
		MaxAge:            cfg.TTL,
		MaxMsgSize:        -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           cfg.Storage,
		Replicas:          max(cfg.Replicas, 1),
		Duplicates:        dup,
		Discard:           jetstream.DiscardNew,
		AllowDirect:       true,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowRollup:       false,
	}
}

// BucketDrift says how a bucket's stream differs from the sealed configuration of cfg (what an
// operator's apply sets: BucketStream's fields, the rest of have as it is).
func BucketDrift(have jetstream.StreamConfig, cfg jetstream.KeyValueConfig) Drift {
	want := BucketStream(cfg)
	next := have
	next.Description, next.MaxMsgsPerSubject, next.MaxAge, next.Replicas = want.Description, want.MaxMsgsPerSubject, want.MaxAge, want.Replicas
	next.Duplicates, next.AllowDirect, next.DenyDelete, next.DenyPurge, next.AllowRollup = want.Duplicates, want.AllowDirect, want.DenyDelete, want.DenyPurge, want.AllowRollup
	return Drift{Stream: have.Name, Fields: ConfigDiff(have, next), Next: next}
}

// EnsureBucket opens a bucket, making it sealed (BucketStream) when it is missing; with update, an
// existing bucket is brought to cfg and sealed too (a service under MANAGE_STREAMS).
func EnsureBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig, update bool) (jetstream.KeyValue, error) {
	sc := BucketStream(cfg)
	var err error
	if update {
		_, err = js.CreateOrUpdateStream(ctx, sc)
	} else if _, err = js.CreateStream(ctx, sc); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		err = nil // made meanwhile, or before: its owner's configuration stands
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", cfg.Bucket, err)
	}
	return js.KeyValue(ctx, cfg.Bucket)
}
