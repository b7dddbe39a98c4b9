// Package composer is the composer service: it answers every round.requested with a
// prompt.composed (or a prompt.failed). It waits until the ranker has committed every evaluation
// acknowledged before the request, reads the team's history and the leaderboard, renders the
// template and publishes the prompt to the PROMPTS audit stream. Replicas share the work through
// one durable consumer.
package composer

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/door"
	"github.com/podium-llm/podium/internal/inputs"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/replies"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Command is the service's command line (internal/service).
var Command = service.Command{Name: "composer", Subcommands: []string{"check-templates"}, Summary: `composer: answers every round.requested with prompt.composed or prompt.failed.

Usage:
  composer                 run the service until SIGTERM or SIGINT
  composer check-templates load and check every template (built-in and COMPOSER_TEMPLATES_DIR), then exit
  composer --help          print this text`}

// spareDeliveries are the deliveries the consumer allows past COMPOSER_MAX_DELIVER: the delivery
// that answers a retryable failure is the COMPOSER_MAX_DELIVER-th, and one that meets a composer
// killed or stopped past its shutdown timeout comes again instead of being dropped unanswered (a
// delivery past the setting answers at once, composer.go).
const spareDeliveries = 3

// Run is the whole service, its configuration read and checked: it returns when ctx ends and
// the work in hand is finished, or on a start-up error.
func Run(ctx context.Context, p *service.Prepared[Config], stdout io.Writer) error {
	cfg, log, sub := p.Config, p.Log, p.Sub
	lib, err := cfg.library()
	if err != nil {
		return err
	}
	if sub == "check-templates" {
		return printTemplates(stdout, lib)
	}
	st, err := chstore.Open(ctx, cfg.Store(log))
	if err != nil {
		return err
	}
	defer st.Close()
	base, err := service.Start(ctx, "composer", &cfg.Common, log, events.StreamRounds, events.StreamPrompts, events.StreamDeadLetter)
	if err != nil {
		return err
	}
	// A pull buffer the size of the worker pool: what a replica holds it keeps alive, so it must
	// hold no more requests than it can start soon, leaving the rest to the other replicas.
	runtime, cons, err := base.Consumer(ctx, events.StreamRounds, events.ConsumerComposer, events.ConsumerOptions{
		AckWait:       cfg.AckWait,
		MaxAckPending: 4 * cfg.Workers, // a few replicas' worth of workers; more would only queue
		MaxDeliver:    cfg.MaxDeliver + spareDeliveries,
	}, consume.Buffer{Messages: cfg.Workers})
	if err != nil {
		base.Close()
		return err
	}
	// The registries: nil where an operator-managed deployment has none (built-in and directory
	// templates are served; no request is built by a builder).
	kv, err := base.KeyValue(ctx, registry.Config(cfg.StreamReplicas))
	if err != nil {
		base.Close()
		return err
	}
	builderKV, modules, err := builderRegistry(ctx, base, cfg)
	if err != nil {
		base.Close()
		return err
	}
	engine, err := wasm.NewEngine(ctx, cfg.Limits.Wasm())
	if err != nil {
		base.Close()
		return err
	}
	defer engine.Close(context.WithoutCancel(ctx))
	base.StoreMetrics(st)
	c, err := newComposer(base, cfg, st, lib)
	if err != nil {
		base.Close()
		return err
	}
	if c.once, err = openAnswered(ctx, base, &cfg.Streams); err != nil {
		base.Close()
		return err
	}
	c.builders = newPromptBuilders(engine, modules, base.Log, base.Reg, base.Health, cfg.RenderAPILimit)
	base.Health.Probe("clickhouse", st.Ping)
	base.Health.Probe("inputs", c.inputs.Ready)
	rs := newRenders(c, cfg.MaxEventBytes, cfg.RenderAPILimit)
	inboxes, err := replies.Parse(cfg.ReplyPrefixes)
	if err != nil {
		base.Close()
		return err
	}
	// Requests are answered on a connection of their own (config.go, apiNATS).
	apiNC, err := service.Connect(ctx, cfg.apiNATS(), "composer-api", log)
	if err != nil {
		base.Close()
		return fmt.Errorf("the connection that answers podium.render and podium.parse: %w", err)
	}
	defer apiNC.Close()
	base.Health.Probe("nats_api", service.NATSConnected(apiNC))
	return base.Run(ctx, service.Serving{
		HTTPAddr:        cfg.HTTPAddr,
		Guard:           door.API(log, cfg.HTTPAddr, cfg.APIToken, "COMPOSER_API_TOKEN", "the renders"),
		API:             newAPI(rs),
		ShutdownTimeout: cfg.ShutdownTimeout,
		Started:         []any{"templates", len(lib.Templates()), "default_template", cfg.DefaultTemplate, "workers", cfg.Workers},
		Consume: func(stop, work context.Context) error {
			c.templates.registry.follow(work, kv)
			c.builders.registry.follow(work, builderKV)
			stopRenders, err := startRenderService(work, apiNC, rs, c.builders, cfg.RenderTimeout, inboxes, c.m.repliesRefused)
			if err != nil {
				return err
			}
			defer func() {
				stopRenders() // the answers in flight published first
				service.DrainQuietly(apiNC)
			}()
			handle := consume.Chain(consume.Each(c.handle), consume.Trace(c.trace, "composer.request"), consume.Recover(c.log, runtime.Panics))
			// Waiting and rendering may take long: the stage keeps the request in progress, so
			// the broker does not hand it to another replica meanwhile.
			stage := consume.Stage{Handler: handle, Settler: c.settler, KeepAlive: cfg.AckWait / 3, Log: c.log, Current: runtime.Delivering}
			return runtime.Run(stop, work, cons, consume.Workers(cfg.Workers, stage, c.log.Warn))
		},
	})
}

// newComposer wires the composer to its NATS connection, store and templates.
func newComposer(base *service.Base, cfg *Config, st *chstore.Store, lib *compose.Library) (*composer, error) {
	m := newMetrics(base.Reg)
	in, err := inputs.New(inputs.Deps{NC: base.NC, JS: base.JS, Store: st, Trace: base.Trace, Reg: base.Reg,
		Timeout: cfg.InputsTimeout, CacheTTL: cfg.ReadCacheTTL, MaxBytes: cfg.MaxEventBytes,
		StoreLineage: st.Lineage, Anchored: func(k chstore.RowKey) inputs.Store { return st.Anchored(k) }})
	if err != nil {
		return nil, err
	}
	for _, t := range lib.Templates() {
		m.templatesLoaded.WithLabelValues(t.Name, strconv.Itoa(t.Version)).Set(1)
	}
	return &composer{
		log:           base.Log,
		js:            base.JS,
		settler:       settle.New(base.JS, base.Log, base.Reg, "composer"),
		trace:         base.Trace,
		inputs:        in,
		templates:     newTemplates(lib, base.Log, m, base.Health),
		m:             m,
		source:        base.Source,
		maxBytes:      cfg.MaxEventBytes,
		renderTimeout: cfg.RenderTimeout,
		maxDeliver:    cfg.MaxDeliver,
		now:           time.Now,
		answers:       &answerStore{remake: base.StreamMaker(events.StreamPrompts), stored: base.Health.Condition("prompts", nil)},
	}, nil
}

// printTemplates is check-templates' report: one line per template and one per variant.
func printTemplates(w io.Writer, lib *compose.Library) error {
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TEMPLATE\tKIND\tMESSAGES\tLIMITS\tSHA256")
	for _, t := range lib.Templates() {
		l := t.Limits
		fmt.Fprintf(tw, "%s@%d\t%s\t%v\thistory %d, leaderboard %d, preview %d, tokens %d\t%s\n",
			t.Name, t.Version, t.Kind, t.Roles(), l.HistoryRounds, l.LeaderboardTeams, l.PreviewChars, l.MaxPromptTokens, t.SHA256)
		for _, v := range t.Variants {
			fmt.Fprintf(tw, "  variant %s\t%s\tpriority %d\tmodels %s\t\n", v.Name, v.Format, v.Priority, strings.Join(v.Models, " "))
		}
	}
	fmt.Fprintf(tw, "token encoding: %s\n", lib.TokenEncoding())
	return tw.Flush()
}

// openAnswered opens events.BucketAnswered (once.go). Under MANAGE_STREAMS it is made when missing
// so that a key lives as long as a PROMPTS record as the server has it now (podium streams apply
// keeps the two equal afterwards); an operator-managed deployment must have made it, since without
// it a request replayed after the duplicate window would be answered twice.
func openAnswered(ctx context.Context, base *service.Base, streams *service.Streams) (*answered, error) {
	var maxAge time.Duration
	managed := streams.ManageStreams
	if managed {
		st, err := base.JS.Stream(ctx, events.StreamPrompts)
		if err != nil {
			return nil, fmt.Errorf("read %s's retention for %s: %w", events.StreamPrompts, events.BucketAnswered, err)
		}
		maxAge = st.CachedInfo().Config.MaxAge
	}
	cfg := events.AnsweredBucketConfig(streams.StreamReplicas, maxAge)
	kv, err := base.KeyValue(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if kv == nil {
		return nil, fmt.Errorf("bucket %s is missing and MANAGE_STREAMS is false: make it as docs/operating.md#answered-one-answer-per-request says, or let the composer make it (MANAGE_STREAMS=true)", events.BucketAnswered)
	}
	a := &answered{kv: kv, js: base.JS}
	if managed {
		a.remake = func(ctx context.Context) error {
			_, err := events.EnsureBucket(ctx, base.JS, cfg, false)
			return err
		}
	}
	return a, nil
}
