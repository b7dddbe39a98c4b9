package composer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/retry"
)

// follower keeps what a composer serves in step with a key-value bucket (the template registry,
// the builders): apply gets the bucket's whole content at the start and at every change (every
// key's value and how many times it was written: the registry's rules never serve a version key
// written again).
// While the bucket is not followed its condition fails: what the composer serves may be behind
// the bucket's labels.
type follower struct {
	what, bucket string // "template registry", TEMPLATES
	log          *slog.Logger
	followed     *health.Condition
	apply        func(ctx context.Context, content registry.Content)
}

// follow starts watching the bucket (kv nil: there is none) and returns once its content at the
// start is applied, or after 5s, so its labels apply from the first request. Until it is applied
// the composer is unready (its condition is made failing): a composer that has not yet loaded
// production's builders would compose without them.
func (f *follower) follow(ctx context.Context, kv jetstream.KeyValue) {
	if kv == nil {
		f.followed.Holds() // nothing to follow: what the composer serves is all there is
		return
	}
	// Loaded is a cancel: called once or many times, it ends the wait below.
	loaded, done := context.WithTimeout(ctx, 5*time.Second)
	go f.run(ctx, kv, done)
	<-loaded.Done()
	if errors.Is(loaded.Err(), context.DeadlineExceeded) {
		f.log.Warn(f.what + " not loaded within 5s; starting without it")
	}
}

// run watches the bucket until ctx ends. A watch that ends by itself (the bucket deleted, the
// connection's subscription lost) leaves what was applied as it was: the composer turns unready
// naming it, and watches again with the shared backoff, loading the bucket whole.
func (f *follower) run(ctx context.Context, kv jetstream.KeyValue, loaded func()) {
	for attempt := uint64(1); ; attempt++ {
		err := f.watch(ctx, kv, func() { loaded(); attempt = 0 })
		loaded() // the first requests do not wait for a bucket that cannot be watched
		if ctx.Err() != nil {
			return
		}
		f.followed.Fail("the %s is not followed (%v): its labels may have moved since", f.what, err)
		delay := retry.Redelivery().Backoff(max(attempt, 1))
		f.log.Error(f.what+" not followed; unready until it is watched again", "error", err, "retry_in", delay.String())
		if retry.Sleep(ctx, delay) != nil {
			return
		}
	}
}

// watch follows the bucket until ctx ends or the watch ends by itself (its error says why);
// loaded is called once the bucket's content at the start is applied.
func (f *follower) watch(ctx context.Context, kv jetstream.KeyValue, loaded func()) error {
	w, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	if err != nil {
		return fmt.Errorf("watch %s: %w", f.bucket, err)
	}
	defer w.Stop()
	// A watch goes on retrying for a while after its bucket is deleted; a lookup finds it gone at
	// once, and ends the watch (Stop closes its updates).
	gone := make(chan error, 1)
	lookup, stopLookup := context.WithCancel(ctx)
	defer stopLookup()
	go func() {
		for {
			if retry.Sleep(lookup, registryLookupEvery) != nil {
				return
			}
			if _, err := kv.Status(lookup); errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) {
				gone <- fmt.Errorf("the bucket %s is gone: %w", f.bucket, err)
				_ = w.Stop()
				return
			}
		}
	}()
	content := registry.NewContent()
	initial := true
	for e := range w.Updates() {
		if e == nil { // the bucket's content at the start is in
			initial = false
			f.apply(ctx, content)
			f.followed.Holds()
			loaded()
			continue
		}
		content.Note(e)
		if !initial {
			f.apply(ctx, content)
		}
	}
	select {
	case err := <-gone:
		return err
	default:
		return fmt.Errorf("the watch of %s ended", f.bucket)
	}
}

// registryLookupEvery is how often a followed bucket is looked up: the longest a deleted bucket
// goes unnoticed.
const registryLookupEvery = 2 * time.Second
