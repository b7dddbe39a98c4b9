package composer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/pkg/compose"
)

// templates is the composer's library: the built-in and directory templates (base), plus the
// template registry's versions and labels, rebuilt and swapped whole whenever the registry
// changes. A request takes the library once and renders with it from start to end, so it never
// mixes versions.
type templates struct {
	base *compose.Library
	cur  atomic.Pointer[compose.Library]
	log  *slog.Logger
	m    *metrics

	rejected map[string]bool // problems already reported, so a rebuild does not repeat them
	// followed is the "templates" condition: it fails while the registry is not followed (its
	// labels may have moved since) and holds while it is, or where there is none.
	followed *health.Condition
}

func newTemplates(base *compose.Library, log *slog.Logger, m *metrics, h *health.Health) *templates {
	t := &templates{base: base, log: log, m: m, rejected: map[string]bool{}, followed: h.Condition("templates", nil)}
	t.cur.Store(base)
	return t
}

// lib is the library requests render with now.
func (t *templates) lib() *compose.Library { return t.cur.Load() }

// follow starts watching the registry (kv nil: there is none) and returns once its content at
// the start is loaded, or after 5s, so its labels apply from the first request.
func (t *templates) follow(ctx context.Context, kv jetstream.KeyValue) {
	if kv == nil {
		return
	}
	ready := make(chan struct{})
	go t.follower(ctx, kv, sync.OnceFunc(func() { close(ready) }))
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	select {
	case <-ready:
	case <-wait.Done():
		t.log.Warn("template registry not loaded within 5s; starting with built-in and directory templates")
	}
}

// follower watches the registry until ctx ends. A watch that ends by itself (the bucket deleted,
// the connection's subscription lost) leaves the library as the registry was: the composer turns
// unready naming it, and watches again with the shared backoff, loading the registry whole.
func (t *templates) follower(ctx context.Context, kv jetstream.KeyValue, loaded func()) {
	for attempt := uint64(1); ; attempt++ {
		err := t.watch(ctx, kv, func() { loaded(); attempt = 0 })
		loaded() // the first requests do not wait for a registry that cannot be watched
		if ctx.Err() != nil {
			return
		}
		t.followed.Fail("the template registry is not followed (%v): its labels may have moved since", err)
		delay := retry.Redelivery().Backoff(max(attempt, 1))
		t.log.Error("template registry not followed; unready until it is watched again", "error", err, "retry_in", delay.String())
		if retry.Sleep(ctx, delay) != nil {
			return
		}
	}
}

// watch follows the registry until ctx ends or the watch ends by itself (its error says why);
// loaded is called once the registry's content at the start is in.
func (t *templates) watch(ctx context.Context, kv jetstream.KeyValue, loaded func()) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", registry.Bucket, err)
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
				gone <- fmt.Errorf("the bucket %s is gone: %w", registry.Bucket, err)
				_ = w.Stop()
				return
			}
		}
	}()
	entries := map[string][]byte{}
	initial := true
	for e := range w.Updates() {
		if e == nil { // the registry's content at the start is in
			initial = false
			t.rebuild(entries)
			t.followed.Holds()
			loaded()
			continue
		}
		if e.Operation() == jetstream.KeyValuePut {
			entries[e.Key()] = e.Value()
		} else {
			delete(entries, e.Key())
		}
		if !initial {
			t.rebuild(entries)
		}
	}
	select {
	case err := <-gone:
		return err
	default:
		return fmt.Errorf("the watch of %s ended", registry.Bucket)
	}
}

// registryLookupEvery is how often a followed registry is looked up: the longest a deleted
// bucket goes unnoticed.
const registryLookupEvery = 2 * time.Second

// rebuild makes the library of the registry's current content and swaps it in. A version that
// fails its check is never served: it is logged as an error and counted, once.
func (t *templates) rebuild(entries map[string][]byte) {
	state, errs := registry.Parse(entries)
	lib, bad := t.base.WithRegistry(state.Versions, state.Labels)
	lib = lib.WithSplits(state.Splits)
	// Each rejection is logged and counted once while it lasts; the set holds the current ones
	// only, so it does not grow with every bad version the registry ever held.
	now := map[string]bool{}
	for _, err := range append(errs, bad...) {
		now[err.Error()] = true
		if !t.rejected[err.Error()] {
			t.m.templatesRejected.Inc()
			t.log.Error("template registry entry rejected; it is not served", "error", err)
		}
	}
	t.rejected = now
	for _, tmpl := range lib.Registered() {
		t.m.templatesLoaded.WithLabelValues(tmpl.Name, strconv.Itoa(tmpl.Version)).Set(1)
	}
	t.cur.Store(lib)
	t.log.Info("templates swapped", "registry_versions", len(lib.Registered()), "labels", len(state.Labels))
}
