// Package archiver is the archiver service: it copies every record of the PROMPTS audit stream into
// the prompts table of ClickHouse, once per event id, so the audit outlives the stream's retention
// at a fraction of its size (docs/operating.md, "The prompts archive").
package archiver

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/settle"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
)

// Command is the service's command line (internal/service).
var Command = service.Command{Name: "archiver", Summary: `archiver: copies every record of the PROMPTS audit stream into ClickHouse (the prompts table),
once per event id, and acknowledges a record only once ClickHouse has it.

Usage:
  archiver           run the service until SIGTERM or SIGINT
  archiver --help    print this text`}

// Run is the whole service, its configuration read and checked: it returns when ctx ends and
// the work in hand is finished, or on a start-up error.
func Run(ctx context.Context, p *service.Prepared[Config], stdout io.Writer) error {
	cfg, log := p.Config, p.Log
	storeCfg := cfg.Store(log)
	// The archiver makes its table itself, so it can start before or without a ranker.
	st, _, err := service.OpenStore(ctx, storeCfg, log)
	if err != nil {
		return err
	}
	defer st.Close()
	base, err := service.Start(ctx, "archiver", &cfg.Common, log, events.StreamPrompts, events.StreamDeadLetter, events.StreamAudit)
	if err != nil {
		return err
	}
	m := newMetrics(base.Reg)
	keeper, err := newKeeper(cfg.AuditLog, base.JS, st, base.Health, m, log)
	if err != nil {
		base.Close()
		return err
	}
	writes, filled := newConditions(base.Health)
	base.Health.Probe("clickhouse_ping", st.Ping)
	a := &archiver{
		writes:   writes,
		filled:   filled,
		sink:     newSink(st, m, writes, log),
		log:      log,
		js:       base.JS,
		nc:       base.NC,
		store:    st,
		lineages: st.ArchiveLineages(),
		settler:  settle.New(base.JS, log, base.Reg, "archiver"),
		m:        m,
		// A record may be as large as the server's max payload: one must always fit a pull.
		batchSize:      cfg.BatchSize,
		batchBytes:     max(cfg.BatchBytes, int(base.NC.MaxPayload())+64<<10),
		createDatabase: func(ctx context.Context) error { return chstore.CreateDatabase(ctx, storeCfg) },
		now:            time.Now,
	}
	runtime, cons, err := base.Consumer(ctx, events.StreamPrompts, events.ConsumerArchiver, events.ConsumerOptions{
		AckWait:       cfg.AckWait,
		MaxAckPending: 4 * cfg.BatchSize, // two replicas, each with a batch in hand and one buffered
		MaxDeliver:    -1,                // a record is never dropped unarchived
	}, consume.Buffer{Messages: a.batchSize, Bytes: a.batchBytes})
	if err != nil {
		base.Close()
		return err
	}
	a.keep = a.newKeeper(func(c *sink.Config[chstore.ArchivedPrompt]) {
		c.Consumes, c.SetMetadata = runtime.Consumes, runtime.SetMetadata // readers read the state there
	})
	runtime.Remade = a.keep.CheckSoon
	a.warnRetention(ctx)
	base.StoreMetrics(st)
	watch := []func(context.Context){
		func(work context.Context) { a.watchConsumer(work, cons, 5*time.Second) },
		a.keep.Watch,
	}
	if keeper != nil {
		a.offer = keeper.Offer
		watch = append(watch, func(work context.Context) { _ = keeper.Run(work) })
	}
	return base.Run(ctx, service.Serving{
		HTTPAddr:        cfg.HTTPAddr,
		ShutdownTimeout: cfg.ShutdownTimeout,
		Started:         []any{"clickhouse", cfg.ClickHouseAddr, "database", cfg.ClickHouseDatabase},
		Consume: func(stop, work context.Context) error {
			return consumeBatches(stop, work, a, runtime, cons, cfg)
		},
		Watch: watch,
	})
}

// consumeBatches runs the archiver's batches on the runtime: panics recovered into dead letters,
// batches kept alive while they wait for ClickHouse.
func consumeBatches(stop, work context.Context, a *archiver, rt *consume.Runtime, cons jetstream.Consumer, cfg *Config) error {
	// Nothing is archived before the table is known whole: a new database beside a stream that
	// holds records is filled first.
	if !a.keep.Start(stop, work) {
		return nil // stopped before it began
	}
	// A record is acknowledged only once ClickHouse has its row, and the acks are confirmed:
	// readers take everything below the ack floor from the archive. Handling and settling take
	// turns with the keeper's checks and refills (Serial).
	stage := consume.Stage{Handler: consume.Chain(a.handle, consume.Recover(a.log, rt.Panics)), Settler: a.settler, Log: a.log,
		KeepAlive: cfg.AckWait / 3, ConfirmAcks: cfg.AckWait, Current: rt.Delivering, Serial: a.keep.Serial, InHand: a.keep.InHand}
	batching := cfg.batching()
	batching.Size, batching.Bytes = a.batchSize, a.batchBytes
	err := rt.Run(stop, work, cons, consume.Batches(batching, stage, a.log.Warn))
	if err != nil {
		return fmt.Errorf("archiver: %w", err)
	}
	return nil
}
