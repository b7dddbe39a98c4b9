package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

const summary = `ranker: stores evaluation.completed events in ClickHouse and serves exact leaderboards.

Usage:
  ranker           run the service until SIGTERM or SIGINT
  ranker migrate   apply the ClickHouse migrations and exit
  ranker --help    print this text`

// run is the whole service: it returns when ctx ends and everything in hand is finished, or on a
// start-up error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config
	cmd := ""
	if len(args) > 1 {
		cmd = args[1]
	}
	switch cmd {
	case "-h", "--help", "help":
		return service.Usage(stdout, "ranker", summary, &cfg)
	case "", "migrate":
	default:
		return fmt.Errorf("unknown argument %q; see ranker --help", cmd)
	}
	if err := service.Load("ranker", &cfg); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	log := service.NewLogger(stderr, cfg.LogLevel, "ranker")

	st, err := openStore(ctx, cfg.Store())
	if err != nil {
		return err
	}
	defer st.Close()
	applied, err := st.Migrate(ctx)
	if err != nil {
		return err
	}
	for _, name := range applied {
		log.Info("migration applied", "migration", name)
	}
	if cmd == "migrate" {
		fmt.Fprintf(stdout, "migrations applied: %d\n", len(applied))
		return nil
	}

	nc, err := service.ConnectNATS(&cfg.Common, "ranker", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	if cfg.ManageStreams {
		if err := events.EnsureStreams(ctx, js, cfg.Streams(), events.StreamEvaluations, events.StreamLeaderboards, events.StreamDeadLetter); err != nil {
			return err
		}
	}
	ccfg, err := events.ConsumerConfig(events.ConsumerRanker, events.ConsumerOptions{
		AckWait:       cfg.AckWait,
		MaxAckPending: 4 * cfg.BatchSize, // two replicas, each with a batch in hand and one buffered
		MaxDeliver:    cfg.MaxDeliver,
	})
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, events.StreamEvaluations, ccfg)
	if err != nil {
		return fmt.Errorf("consumer %s: %w", events.ConsumerRanker, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)
	host, _ := os.Hostname()
	r := &ranker{
		log:              log,
		js:               js,
		store:            st,
		m:                m,
		source:           "ranker/" + host,
		maxBytes:         cfg.MaxEventBytes,
		batchSize:        cfg.BatchSize,
		flushInterval:    cfg.FlushInterval,
		announceInterval: cfg.AnnounceInterval,
		now:              time.Now,
	}
	checks := map[string]service.Check{
		"nats":       service.NATSConnected(nc),
		"clickhouse": r.storeReady,
		"consuming": func(context.Context) error {
			if !r.consuming.Load() {
				return errors.New("not consuming")
			}
			return nil
		},
	}
	srv, err := service.Listen(cfg.HTTPAddr, newAPI(log, st, m), reg, checks, cfg.Pprof)
	if err != nil {
		return err
	}
	log.Info("ranker started", "http_addr", srv.Addr(), "nats_url", nc.ConnectedUrlRedacted(), "clickhouse", cfg.ClickHouseAddr, "database", cfg.ClickHouseDatabase)

	// work outlives ctx by the shutdown timeout, so a batch in hand can still be committed.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	go func() {
		<-ctx.Done()
		select {
		case <-time.After(cfg.ShutdownTimeout):
			log.Warn("shutdown timeout reached; abandoning work in hand", "timeout", cfg.ShutdownTimeout.String())
			cancelWork()
		case <-work.Done():
		}
	}()

	httpErr := make(chan error, 1)
	go func() { httpErr <- srv.Serve() }()
	go r.watchConsumer(work, cons, 5*time.Second)
	go service.WatchReady(work, m.ready, checks)

	consumeErr := r.consume(ctx, work, cons)
	log.Info("ranker stopping")

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
	log.Info("ranker stopped")
	return errors.Join(errs...)
}

// openStore creates the database if needed and connects to it.
func openStore(ctx context.Context, cfg rank.Config) (*rank.Store, error) {
	if err := rank.CreateDatabase(ctx, cfg); err != nil {
		return nil, err
	}
	return rank.Open(ctx, cfg)
}

// storeReady fails while inserts are failing or ClickHouse does not answer a ping.
func (r *ranker) storeReady(ctx context.Context) error {
	if r.insertFails.Load() {
		return errors.New("inserts are failing")
	}
	if err := r.store.Ping(ctx); err != nil {
		r.m.clickhouseErrors.WithLabelValues("unavailable").Inc()
		return err
	}
	return nil
}
