package main

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/registry"
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
}

func newTemplates(base *compose.Library, log *slog.Logger, m *metrics) *templates {
	t := &templates{base: base, log: log, m: m, rejected: map[string]bool{}}
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
	go t.watch(ctx, kv, ready)
	select {
	case <-ready:
	case <-time.After(5 * time.Second):
		t.log.Warn("template registry not loaded within 5s; starting with built-in and directory templates")
	}
}

// watch follows the registry until ctx ends; ready is closed once the registry's content at the
// start is loaded, so the first requests already see its labels.
func (t *templates) watch(ctx context.Context, kv jetstream.KeyValue, ready chan<- struct{}) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.log.Error("template registry not watched; serving built-in and directory templates only", "error", err)
		close(ready)
		return
	}
	defer w.Stop()
	entries := map[string][]byte{}
	initial := true
	for e := range w.Updates() {
		if e == nil { // the registry's content at the start is in
			initial = false
			t.rebuild(entries)
			close(ready)
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
}

// rebuild makes the library of the registry's current content and swaps it in. A version that
// fails its check is never served: it is logged as an error and counted, once.
func (t *templates) rebuild(entries map[string][]byte) {
	state, errs := registry.Parse(entries)
	lib, bad := t.base.WithRegistry(state.Versions, state.Labels)
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
