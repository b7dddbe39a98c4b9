package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

const summary = `composer: answers every round.requested with prompt.composed or prompt.failed.

Usage:
  composer                 run the service until SIGTERM or SIGINT
  composer check-templates load and check every template (built-in and COMPOSER_TEMPLATES_DIR), then exit
  composer --help          print this text`

// run is the whole service: it returns when ctx ends and the requests in hand are answered, or
// on a start-up error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config
	cmd := ""
	if len(args) > 1 {
		cmd = args[1]
	}
	switch cmd {
	case "-h", "--help", "help":
		return service.Usage(stdout, "composer", summary, &cfg)
	case "", "check-templates":
	default:
		return fmt.Errorf("unknown argument %q; see composer --help", cmd)
	}
	if err := service.Load("composer", &cfg); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	log := service.NewLogger(stderr, cfg.LogLevel, "composer")
	loc, _ := location(cfg.TZ)
	tokens, err := compose.NewTokenCounter(cfg.TokenEncoding)
	if err != nil {
		return fmt.Errorf("configuration: COMPOSER_TOKEN_ENCODING: %w", err)
	}
	lib, err := compose.Load(compose.Options{Dir: cfg.TemplatesDir, DefaultTemplate: cfg.DefaultTemplate, DefaultLocation: loc, Tokens: tokens})
	if err != nil {
		return fmt.Errorf("templates: %w", err)
	}
	if cmd == "check-templates" {
		return printTemplates(stdout, lib)
	}

	st, err := rank.Open(ctx, cfg.Store())
	if err != nil {
		return err
	}
	defer st.Close()
	nc, err := service.ConnectNATS(&cfg.Common, "composer", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if cfg.ManageStreams {
		if err := events.EnsureStreams(ctx, js, cfg.Streams(), events.StreamRounds, events.StreamPrompts, events.StreamDeadLetter); err != nil {
			return err
		}
	}
	ccfg, err := events.ConsumerConfig(events.ConsumerComposer, events.ConsumerOptions{
		AckWait:       cfg.AckWait,
		MaxAckPending: 4 * cfg.Workers, // a few replicas' worth of workers; more would only queue
		MaxDeliver:    cfg.MaxDeliver,
	})
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamRounds, ccfg)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", events.ConsumerComposer, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	for _, t := range lib.Templates() {
		m.templatesLoaded.WithLabelValues(t.Name, strconv.Itoa(t.Version)).Set(1)
	}
	host, _ := os.Hostname()
	c := &composer{
		log:           log,
		js:            js,
		probes:        &commitProbes{js: js, timeout: 5 * time.Second},
		reads:         newStoreReads(st.Evaluations, cfg.ReadCacheTTL, m),
		lib:           lib,
		m:             m,
		source:        "composer/" + host,
		maxBytes:      cfg.MaxEventBytes,
		inputsTimeout: cfg.InputsTimeout,
		maxDeliver:    cfg.MaxDeliver,
		now:           time.Now,
	}
	checks := map[string]service.Check{
		"nats":       service.NATSConnected(nc),
		"clickhouse": st.Ping,
		"consuming": func(context.Context) error {
			if !c.consuming.Load() {
				return errors.New("not consuming")
			}
			return nil
		},
	}
	srv, err := service.Listen(cfg.HTTPAddr, newAPI(c, cfg.MaxEventBytes), reg, checks, cfg.Pprof)
	if err != nil {
		return err
	}
	log.Info("composer started", "http_addr", srv.Addr(), "nats_url", nc.ConnectedUrlRedacted(), "templates", len(lib.Templates()), "default_template", cfg.DefaultTemplate, "workers", cfg.Workers)

	// work outlives ctx by the shutdown timeout, so requests in hand are still answered.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	go func() {
		<-ctx.Done()
		select {
		case <-time.After(cfg.ShutdownTimeout):
			log.Warn("shutdown timeout reached; abandoning requests in hand", "timeout", cfg.ShutdownTimeout.String())
			cancelWork()
		case <-work.Done():
		}
	}()
	httpErr := make(chan error, 1)
	go func() { httpErr <- srv.Serve() }()
	go service.WatchReady(work, m.ready, checks)

	consumeErr := c.consume(ctx, work, cons, cfg.Workers)
	log.Info("composer stopping")
	shutCtx, cancel := context.WithTimeout(work, 5*time.Second)
	defer cancel()
	errs := []error{consumeErr, srv.Shutdown(shutCtx)}
	if err := nc.Drain(); err != nil {
		errs = append(errs, fmt.Errorf("nats drain: %w", err))
	}
	if err := <-httpErr; err != nil {
		errs = append(errs, err)
	}
	cancelWork()
	log.Info("composer stopped")
	return errors.Join(errs...)
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
