// Package ranker is the ranker service: it consumes evaluation.completed from JetStream, stores
// every evaluation in ClickHouse exactly once per event id, announces leaderboard.updated after each
// commit and serves leaderboards and team histories over HTTP.
package ranker

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/door"
	"github.com/podium-llm/podium/internal/replies"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Command is the service's command line (internal/service).
var Command = service.Command{Name: "ranker", Subcommands: []string{"migrate"}, Summary: `ranker: stores evaluation.completed events in ClickHouse and serves exact leaderboards.

Usage:
  ranker           run the service until SIGTERM or SIGINT
  ranker migrate   apply the ClickHouse migrations and exit
  ranker --help    print this text`}

// Run is the whole service, its configuration read and checked: it returns when ctx ends and
// the work in hand is finished, or on a start-up error.
func Run(ctx context.Context, p *service.Prepared[Config], stdout io.Writer) error {
	cfg, log, sub := p.Config, p.Log, p.Sub
	st, applied, err := service.OpenStore(ctx, cfg.Store(log), log)
	if err != nil {
		return err
	}
	defer st.Close()
	if sub == "migrate" {
		fmt.Fprintf(stdout, "migrations applied: %d\n", len(applied))
		return nil
	}
	base, err := service.Start(ctx, "ranker", &cfg.Common, log, events.StreamEvaluations, events.StreamLeaderboards, events.StreamDeadLetter)
	if err != nil {
		return err
	}
	r := newRanker(base, cfg, st)
	base.Health.Probe("clickhouse_ping", func(ctx context.Context) error {
		err := st.Ping(ctx)
		if err != nil {
			r.m.clickhouseErrors.WithLabelValues("unavailable").Inc()
		}
		return err
	})
	if r.snapshots, err = base.KeyValue(ctx, events.ScoresBucketConfig(cfg.StreamReplicas, cfg.StateMaxIdle)); err != nil {
		base.Close()
		return err
	}
	if r.snapshots == nil {
		log.Info("no SCORES bucket: composers read every execution's scores from ClickHouse")
	}
	// The pull buffer holds a batch by count and by bytes, so large submissions bound memory too.
	runtime, cons, err := base.Consumer(ctx, events.StreamEvaluations, events.ConsumerRanker, events.ConsumerOptions{
		AckWait:       cfg.AckWait,
		MaxAckPending: 4 * cfg.BatchSize, // two replicas, each with a batch in hand and one buffered
		MaxDeliver:    cfg.MaxDeliver,
	}, consume.Buffer{Messages: r.batchSize, Bytes: r.batchBytes})
	if err != nil {
		base.Close()
		return err
	}
	base.StoreMetrics(st)
	r.runtime = runtime
	r.passOf = runtime.Pass
	r.delivering = runtime.Delivering
	r.keep = r.newKeeper(func(c *sink.Config[rank.Record]) { c.Consumes = runtime.Consumes })
	runtime.Remade = r.keep.CheckSoon
	passesKV, err := base.KeyValue(ctx, events.RankerPassesBucketConfig(cfg.StreamReplicas))
	if err != nil {
		base.Close()
		return err
	}
	if passesKV == nil {
		log.Warn("no " + events.BucketRankerPasses + " bucket: run one ranker replica only, or a batch of an EVALUATIONS stream deleted and made again may commit after requests were composed as of the new era (docs/reliability.md)")
	} else {
		r.passes = newPasses(passesKV, base.JS, log, r.passNow, r.keep.RefillStale, r.m)
		runtime.Starting = func(stop context.Context) { _ = r.passes.noteUntil(stop) } // before the pass pulls
	}
	r.repair = func(ctx context.Context) error {
		if err := chstore.CreateDatabase(ctx, cfg.Store(log)); err != nil {
			return err
		}
		_, err := st.Repair(ctx)
		return err
	}
	rd := &reads{log: log, st: st, m: r.m, refilling: r.keep.RefillReason, lost: r.keep.CheckSoon, committed: committedOf(base.JS)}
	inboxes, err := replies.Parse(cfg.ReplyPrefixes)
	if err != nil {
		base.Close()
		return err
	}
	// Requests are answered on a connection of their own (config.go, apiNATS).
	apiNC, err := service.Connect(ctx, cfg.apiNATS(), "ranker-api", log)
	if err != nil {
		base.Close()
		return fmt.Errorf("the connection that answers podium.leaderboard: %w", err)
	}
	defer apiNC.Close()
	base.Health.Probe("nats_api", service.NATSConnected(apiNC))
	return base.Run(ctx, service.Serving{
		HTTPAddr:        cfg.HTTPAddr,
		Guard:           door.API(log, cfg.HTTPAddr, cfg.APIToken, "RANKER_API_TOKEN", "the leaderboards and histories"),
		API:             newAPI(rd),
		ShutdownTimeout: cfg.ShutdownTimeout,
		Started:         []any{"clickhouse", cfg.ClickHouseAddr, "database", cfg.ClickHouseDatabase},
		Consume: func(stop, work context.Context) error {
			stopReads, err := startReadService(work, apiNC, rd, base.Trace, inboxes, r.m.repliesRefused)
			if err != nil {
				return err
			}
			defer func() {
				stopReads() // the answers in flight published first
				service.DrainQuietly(apiNC)
			}()
			return r.consume(stop, work, runtime, cons)
		},
		Watch: []func(context.Context){
			func(work context.Context) { r.watchConsumer(work, cons, 5*time.Second) }, // Info asks by name: it follows a consumer made again
			r.keep.Watch,
			func(work context.Context) {
				if r.passes != nil {
					r.passes.run(work)
				}
			},
		},
	})
}

// newRanker wires the ranker to its NATS connection and store.
func newRanker(base *service.Base, cfg *Config, st *chstore.Store) *ranker {
	writes, whole, boards := newConditions(base.Health)
	m := newMetrics(base.Reg)
	return &ranker{
		log:       base.Log,
		js:        base.JS,
		settler:   settle.New(base.JS, base.Log, base.Reg, "ranker"),
		trace:     base.Trace,
		store:     st,
		m:         m,
		source:    base.Source,
		maxBytes:  cfg.MaxEventBytes,
		batchSize: cfg.BatchSize,
		// A pull asks for at most batchBytes: a stored message larger than that (the server's
		// max payload may exceed MAX_EVENT_BYTES) would never be delivered and hold the consumer.
		batchBytes:       max(cfg.BatchBytes, int(base.NC.MaxPayload())+64<<10),
		flushInterval:    cfg.FlushInterval,
		linger:           cfg.Linger,
		nc:               base.NC,
		ackWait:          cfg.AckWait,
		announceInterval: cfg.AnnounceInterval,
		now:              time.Now,
		writes:           writes,
		whole:            whole,
		boards:           boards,
		remakeBoards:     base.StreamMaker(events.StreamLeaderboards),
		sink:             newSink(st, m, writes, base.Log),
	}
}
