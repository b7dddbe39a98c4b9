package composer

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/podium-llm/podium/internal/health"
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
	// registry follows the TEMPLATES bucket, rebuilding the library at each change.
	registry *follower
}

func newTemplates(base *compose.Library, log *slog.Logger, m *metrics, h *health.Health) *templates {
	t := &templates{base: base, log: log, m: m, rejected: map[string]bool{}}
	t.registry = &follower{what: "template registry", bucket: registry.Bucket, log: log, followed: h.Condition("templates", errors.New("the template registry is not loaded yet")),
		apply: func(_ context.Context, c registry.Content) { t.rebuild(c) }}
	t.cur.Store(base)
	return t
}

// lib is the library requests render with now.
func (t *templates) lib() *compose.Library { return t.cur.Load() }

// rebuild makes the library of the registry's current content and swaps it in. A version that
// fails its check is never served: it is logged as an error and counted, once.
func (t *templates) rebuild(c registry.Content) {
	state, errs := registry.Parse(c)
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
