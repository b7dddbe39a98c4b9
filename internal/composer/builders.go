package composer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/events"
)

// promptBuilders are the prompt builders the composer serves (docs/builders.md): the versions
// the BUILDERS bucket labels production, their modules compiled once, swapped whole whenever the
// bucket changes. A request takes the set once.
type promptBuilders struct {
	loader   *builders.Loader
	log      *slog.Logger
	cur      atomic.Pointer[[]builders.Runner] // one per production version, without a time
	registry *follower
	builds   *prometheus.CounterVec // by result and reason
	served   *prometheus.GaugeVec   // by name and version
	parses   chan struct{}          // one per podium.parse running: more are answered 429

	mu       sync.Mutex
	content  registry.Content // the bucket's content last applied
	failures uint64           // swaps in a row with a module that did not load
	retrying *time.Timer      // the next swap of the same content, while one did not load
}

func newPromptBuilders(engine *wasm.Engine, modules *builders.Store, log *slog.Logger, reg prometheus.Registerer, h *health.Health, parses int) *promptBuilders {
	f := series.On(reg)
	b := &promptBuilders{loader: &builders.Loader{Engine: engine, Modules: modules}, log: log, parses: make(chan struct{}, parses),
		builds: f.CounterVec("composer_builder_builds_total", "Prompts a prompt builder was asked to build, by result: built, or fallback (the template rendered) with the reason: load, timeout, trap, exit, memory, clock, too_large, invalid_output, budget (over max_prompt_tokens).", "result", "reason"),
		served: f.GaugeVec("composer_builders_served", "1 for every prompt builder version a production label serves, by name and version.", "name", "version")}
	b.registry = &follower{what: "builder registry", bucket: builders.Bucket, log: log, followed: h.Condition("builders", errors.New("the builder registry is not loaded yet")), apply: b.rebuild}
	b.cur.Store(&[]builders.Runner{})
	return b
}

// rebuild serves the bucket's current production versions. A module is read and compiled once
// per sha256; one that cannot be read or compiled is served all the same, every request of its
// models falling back to its template saying why, and is tried again with the shared backoff
// (the store may be electing a leader) until it loads or the bucket moves on.
func (b *promptBuilders) rebuild(ctx context.Context, c registry.Content) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.content, b.failures = registry.Content{Values: maps.Clone(c.Values), Writes: maps.Clone(c.Writes)}, 0
	b.swap(ctx)
}

// swap serves b.content; b.mu is held.
func (b *promptBuilders) swap(ctx context.Context) {
	state, bad := builders.Parse(b.content)
	for _, err := range bad {
		b.log.Error("builder registry entry rejected; it is not served", "error", err)
	}
	var next []builders.Runner
	b.served.Reset() // a version no label serves any more is not listed
	for _, v := range state.Serving() {
		m, err := b.loader.Load(ctx, v)
		if err != nil {
			b.log.Error("builder module cannot load; requests of its models fall back to their templates", "builder", v.Name, "version", v.Version, "error", err)
		}
		next = append(next, builders.Runner{V: v, Module: m, Err: err})
		b.served.WithLabelValues(v.Name, strconv.Itoa(v.Version)).Set(1)
	}
	b.cur.Store(&next)
	// What production serves stays compiled; what it served before goes to the engine's bounded
	// cache, and out of memory as other versions come.
	served := make([]string, 0, len(next))
	for _, r := range next {
		served = append(served, r.V.SHA256)
	}
	b.loader.Engine.Keep(ctx, served)
	b.log.Info("builders swapped", "serving", len(next))
	if !slices.ContainsFunc(next, func(r builders.Runner) bool { return r.Err != nil }) || b.retrying != nil {
		return
	}
	b.failures++
	b.retrying = time.AfterFunc(retry.Redelivery().Backoff(b.failures), func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.retrying = nil
		if ctx.Err() == nil {
			b.swap(ctx)
		}
	})
}

// builderRegistry opens the BUILDERS bucket and, beside it, the store of the modules production
// serves (BUILDER_RELEASES: never the authors' store); nils when an operator-managed deployment
// has no bucket. Under MANAGE_STREAMS the composer makes both module stores (authors and release
// managers make none: one made unsealed could not be trusted). Without, a missing releases store
// is said, and every builder falls back to its template (load) until the operator makes it.
func builderRegistry(ctx context.Context, base *service.Base, cfg *Config) (jetstream.KeyValue, *builders.Store, error) {
	kv, err := base.KeyValue(ctx, builders.BucketConfig(cfg.StreamReplicas))
	if kv == nil || err != nil {
		return nil, nil, err
	}
	if base.ManagesStreams() {
		if _, err := builders.OpenStore(ctx, base.JS, builders.ModulesConfig(cfg.StreamReplicas), true); err != nil {
			return nil, nil, err
		}
	}
	obj, err := builders.OpenStore(ctx, base.JS, builders.ReleasesConfig(cfg.StreamReplicas), base.ManagesStreams())
	if errors.Is(err, builders.ErrNoStore) {
		base.Log.Warn("no BUILDER_RELEASES stream: production builders fall back to their templates until the operator makes it (`podium streams apply`)")
		return kv, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return kv, obj, nil
}

// For is the builder of a request's model at its time, nil when no production builder serves it.
func (b *promptBuilders) For(model string, at time.Time) *builders.Runner {
	if b == nil || model == "" {
		return nil
	}
	for _, r := range *b.cur.Load() {
		if r.V.Serves(model) {
			r.At = at
			return &r
		}
	}
	return nil
}

// count counts a record's builder in composer_builder_builds_total: built, or fallback with the
// kind of failure (the reason's first word: "builder timeout: ..." is timeout, "budget: ..." is
// budget).
func (b *promptBuilders) count(ref *events.BuilderRef) {
	if !ref.Fallback {
		b.builds.WithLabelValues("built", "").Inc()
		return
	}
	kind, _, _ := strings.Cut(strings.TrimPrefix(ref.Reason, "builder "), ":")
	b.builds.WithLabelValues("fallback", kind).Inc()
}

// parseRequest is what podium.parse takes.
type parseRequest struct {
	Model  string  `json:"model"`
	Output *string `json:"output"`
}

// parse answers podium.parse: the output split by the production builder of the model, within
// timeout. The builder's wall clock reads the Unix epoch: a parse has no request time.
func (b *promptBuilders) parse(ctx context.Context, data []byte, timeout time.Duration) (int, any) {
	var req parseRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Model == "" || req.Output == nil {
		msg := `want {"model": "...", "output": "..."}`
		if err != nil {
			msg += ": " + err.Error()
		}
		return http.StatusBadRequest, service.Error{Code: string(events.CodeInvalidRequest), Message: msg}
	}
	select {
	case b.parses <- struct{}{}:
		defer func() { <-b.parses }()
	default:
		return http.StatusTooManyRequests, service.Error{Code: "too_many_requests",
			Message: fmt.Sprintf("%d parses are running (COMPOSER_RENDER_CONCURRENCY); retry shortly", cap(b.parses))}
	}
	r := b.For(req.Model, time.Unix(0, 0).UTC())
	if r == nil {
		return http.StatusNotFound, service.Error{Code: "no_builder", Message: fmt.Sprintf("no builder labelled production serves model %s", events.Quote(req.Model))}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	parsed, err := r.Parse(ctx, req.Model, *req.Output)
	if err != nil {
		return http.StatusBadGateway, service.Error{Code: "builder_failed", Message: fmt.Sprintf("%s@%d: %v", r.V.Name, r.V.Version, err)}
	}
	return http.StatusOK, parsed
}
