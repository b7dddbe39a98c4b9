// Package health is a service's readiness as a set of named conditions. Each condition is owned
// by the one component that knows it (the consumer runtime owns "consuming", a store writer owns
// its inserts) and set by it as things happen; a probe is a condition asked at the time (a ping of
// ClickHouse). /readyz answers 200 only while every condition holds, and 503 naming each failing
// one with its reason otherwise; <service>_ready_condition{condition} exports each, and
// <service>_ready all of them together. Nothing else decides readiness.
package health

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/series"
)

// Health is one service's conditions.
type Health struct {
	mu         sync.Mutex
	conditions map[string]*Condition
	probes     map[string]func(context.Context) error

	ready prometheus.Gauge
	each  *prometheus.GaugeVec
}

// New makes the health of the service namespace (its metrics' prefix).
func New(reg prometheus.Registerer, namespace string) *Health {
	f := series.On(reg).Under(namespace)
	return &Health{
		conditions: map[string]*Condition{},
		probes:     map[string]func(context.Context) error{},
		ready:      f.Gauge("ready", "1 when the service is ready (every condition of /readyz holds), else 0."),
		each:       f.GaugeVec("ready_condition", "1 while the named readiness condition holds, else 0 (/readyz says why).", "condition"),
	}
}

// Condition is one named condition, set by its owner.
type Condition struct {
	name  string
	gauge prometheus.Gauge
	mu    sync.Mutex
	why   error // nil while it holds
	final bool  // set by Fatal: no later Set clears it
}

// Condition registers the condition name, failing with why until its owner sets it (nil: it
// holds from the start). A name is registered once: a second owner is a wiring mistake.
func (h *Health) Condition(name string, why error) *Condition {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claim(name)
	c := &Condition{name: name, gauge: h.each.WithLabelValues(name), why: why}
	c.gauge.Set(holds(why))
	h.conditions[name] = c
	return c
}

// Probe registers a condition that is asked at each look (a ping of a server).
func (h *Health) Probe(name string, probe func(context.Context) error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claim(name)
	h.probes[name] = probe
}

func (h *Health) claim(name string) {
	if _, ok := h.conditions[name]; ok {
		panic(fmt.Sprintf("health: condition %q registered twice", name))
	}
	if _, ok := h.probes[name]; ok {
		panic(fmt.Sprintf("health: condition %q registered twice", name))
	}
}

// Set says whether the condition holds (nil) or why not; it returns whether it was failing.
func (c *Condition) Set(why error) (wasFailing bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	wasFailing = c.why != nil
	if !c.final {
		c.why = why
		c.gauge.Set(holds(why))
	}
	return wasFailing
}

// Fatal sets the condition failing for good: a fault its owner cannot mend (the service then
// exits), which no later Set hides.
func (c *Condition) Fatal(why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.why, c.final = why, true
	c.gauge.Set(0)
}

// Fail sets the condition failing with the reason.
func (c *Condition) Fail(format string, args ...any) { c.Set(fmt.Errorf(format, args...)) }

// Holds sets the condition holding; it returns whether it was failing.
func (c *Condition) Holds() (wasFailing bool) { return c.Set(nil) }

// Err is why the condition fails; nil while it holds.
func (c *Condition) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.why
}

func holds(why error) float64 {
	if why == nil {
		return 1
	}
	return 0
}

// Failing asks every condition and returns the failing ones by name with their reasons (empty
// when ready). Probes run with ctx, which bounds them.
func (h *Health) Failing(ctx context.Context) map[string]string {
	h.mu.Lock()
	conds := slices.Collect(maps.Values(h.conditions))
	probes := maps.Clone(h.probes)
	h.mu.Unlock()
	failing := map[string]string{}
	for _, c := range conds {
		if err := c.Err(); err != nil {
			failing[c.name] = err.Error()
		}
	}
	for name, probe := range probes {
		err := probe(ctx)
		h.each.WithLabelValues(name).Set(holds(err))
		if err != nil {
			failing[name] = err.Error()
		}
	}
	if len(failing) == 0 {
		h.ready.Set(1)
	} else {
		h.ready.Set(0)
	}
	return failing
}

// Ready is nil when every condition holds, else an error naming the failing ones.
func (h *Health) Ready(ctx context.Context) error {
	failing := h.Failing(ctx)
	if len(failing) == 0 {
		return nil
	}
	errs := make([]error, 0, len(failing))
	for _, name := range slices.Sorted(maps.Keys(failing)) {
		errs = append(errs, fmt.Errorf("%s: %s", name, failing[name]))
	}
	return errors.Join(errs...)
}

// probeTimeout bounds one look at the probes.
const probeTimeout = 2 * time.Second

// Handler is /readyz: 200 {"status":"ready"}, or 503 {"status":"not ready","failing":{name:why}}.
func (h *Health) Handler(write func(w http.ResponseWriter, status int, v any)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
		defer cancel()
		if failing := h.Failing(ctx); len(failing) > 0 {
			write(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "failing": failing})
			return
		}
		write(w, http.StatusOK, map[string]string{"status": "ready"})
	}
}

// Watch looks at the conditions every period until ctx ends, so the gauges follow the probes
// even when nobody asks /readyz.
func (h *Health) Watch(ctx context.Context, period time.Duration) {
	retry.Every(ctx, period, func(ctx context.Context) {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		h.Failing(pctx)
	})
}
