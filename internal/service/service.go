// Package service is the wiring both services share: the command line and configuration from the
// environment (docs/operating.md#configuration), the JSON logger, the NATS connection and the streams, the
// metrics registry, and the HTTP server with /metrics, /healthz and /readyz; then serving,
// draining and joining on shutdown. Business logic lives in cmd/* and pkg/*; this package only
// connects it to the world, so each service's run reads as the list of what that service does.
package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/internal/tracing"
	"github.com/podium-llm/podium/internal/version"
	"github.com/podium-llm/podium/pkg/events"
)

// Config is a service's configuration: Common plus its own settings.
type Config interface {
	Shared() *Common
	Validate() error
}

// Command is what a service's command line knows: its name, its --help text and the
// subcommands it takes besides running.
type Command struct {
	Name, Summary string
	Subcommands   []string
}

// Prepared is a service's command line and configuration, read and checked.
type Prepared[C any] struct {
	Config *C
	Sub    string // the subcommand, "" to run the service
	Log    *slog.Logger
}

// Prepare reads the command line and the configuration C from the environment, checks it and
// makes the service's logger on stderr. It returns nil when --help was answered.
func Prepare[C any, P interface {
	*C
	Config
}](args []string, stdout, stderr io.Writer, cmd Command) (*Prepared[C], error) {
	var sub string
	if len(args) > 1 {
		sub = args[1]
	}
	cfg := P(new(C))
	switch sub {
	case "-h", "--help", "help":
		return nil, Usage(stdout, cmd.Name, cmd.Summary, cfg)
	case "--version", "version":
		_, err := fmt.Fprintln(stdout, version.String(cmd.Name))
		return nil, err
	case "":
	default:
		if !slices.Contains(cmd.Subcommands, sub) {
			return nil, fmt.Errorf("unknown argument %q; see %s --help", sub, cmd.Name)
		}
	}
	if err := Load(cmd.Name, cfg); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	return &Prepared[C]{Config: (*C)(cfg), Sub: sub, Log: NewLogger(stderr, cfg.Shared().LogLevel, cmd.Name)}, nil
}

// Main is a service's whole command for internal/process: the command line and configuration
// read and checked (Prepare), then run, which returns when ctx ends and the work in hand is
// finished, or on a start-up error.
func Main[C any, P interface {
	*C
	Config
}](cmd Command, run func(ctx context.Context, p *Prepared[C], stdout io.Writer) error) func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		p, err := Prepare[C, P](args, stdout, stderr, cmd)
		if p == nil {
			return err // or --help answered
		}
		return run(ctx, p, stdout)
	}
}

// Base is what every service has once started: its logger, metrics registry, NATS connection
// with JetStream and the streams it uses.
type Base struct {
	Name   string
	Source string // CloudEvents source of what it publishes: "<name>/<host>"
	Log    *slog.Logger
	Reg    *prometheus.Registry
	NC     *nats.Conn
	JS     jetstream.JetStream
	Trace  *tracing.Tracing // OTEL_*: spans joined to the orchestrator's trace, exported or not
	// Health is the service's readiness: "nats" and "consuming" are the base's, every other
	// condition is registered by the component that owns it.
	Health *health.Health

	common    *Common
	consuming *health.Condition
}

// Start connects a service to NATS and creates or updates its streams (unless MANAGE_STREAMS is
// false). The caller closes the connection with Run, or with Close when it stops before Run. No
// server answering is waited out with the shared backoff for NATS_CONNECT_WAIT (a NATS restarting
// as the service starts); any other failure to connect (credentials, TLS) ends the start.
func Start(ctx context.Context, name string, c *Common, log *slog.Logger, streams ...string) (*Base, error) {
	nc, err := Connect(ctx, &c.NATS, name, log)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if c.ManageStreams {
		// Made when missing, never changed: a stream's limits are the operator's (podium streams
		// apply); how one differs from this configuration is said.
		drifts, err := events.MakeStreams(ctx, js, c.Streams.Options(), streams...)
		if err != nil {
			nc.Close()
			return nil, err
		}
		for _, d := range drifts {
			logDrift(log, d)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	host, _ := os.Hostname()
	tr, err := tracing.Setup(ctx, name, reg, log)
	if err != nil {
		nc.Close()
		return nil, err
	}
	b := &Base{Name: name, Source: name + "/" + host, Log: log, Reg: reg, NC: nc, JS: js, Trace: tr, common: c,
		Health: health.New(reg, name)}
	b.Health.Probe("nats", NATSConnected(nc))
	b.consuming = b.Health.Condition("consuming", consume.ErrNotConsuming)
	return b, nil
}

// logDrift says how a stream differs from the configuration, and who changes it.
func logDrift(log *slog.Logger, d events.Drift) {
	log.Warn("stream differs from the configuration; an operator applies it with `podium streams apply` (services never change a stream)",
		"stream", d.Stream, "differences", strings.Join(d.Fields, "; "))
}

// StreamMaker makes a stream the service publishes to again when it is missing (an operator
// deleted it), with its configuration, and says whether it made it; an operator who made it
// meanwhile wins. Nil when the operator owns the streams (MANAGE_STREAMS=false). Call it only once
// the deletion has settled (a second after the first failure): a stream made again while
// nats-server still moves the deleted one's files away loses its files (internal/consume).
func (b *Base) StreamMaker(name string) func(ctx context.Context) (bool, error) {
	if !b.common.ManageStreams {
		return nil
	}
	return func(ctx context.Context) (bool, error) {
		if _, err := b.JS.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			return false, nil
		}
		sc, err := events.StreamConfig(name, b.common.Streams.Options())
		if err != nil {
			return false, err
		}
		if _, err := b.JS.CreateStream(ctx, sc); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return false, fmt.Errorf("make %s again: %w", name, err)
		}
		return true, nil
	}
}

// Close releases the connection of a service that stops before Run.
func (b *Base) Close() { b.NC.Close() }

// recoverFor is how long a service tries to get its consumer back after an operator deleted it
// (or its stream) before it exits non-zero.
const recoverFor = time.Minute

// Consumer creates or updates the service's durable consumer and returns it with the runtime that
// consumes it: pull options, readiness, and making the consumer (and, under MANAGE_STREAMS, its
// stream) again when it is lost.
func (b *Base) Consumer(ctx context.Context, stream, durable string, o events.ConsumerOptions, buf consume.Buffer) (*consume.Runtime, jetstream.Consumer, error) {
	cfg, err := events.ConsumerConfig(durable, o)
	if err != nil {
		return nil, nil, err
	}
	src := consume.Source{JS: b.JS, Stream: stream, Consumer: cfg}
	if b.common.ManageStreams {
		sc, err := events.StreamConfig(stream, b.common.Streams.Options())
		if err != nil {
			return nil, nil, err
		}
		src.StreamConfig = &sc
	}
	rt := &consume.Runtime{Source: src, Log: b.Log, Buffer: buf, Consuming: b.Consuming, RecoverFor: recoverFor,
		Recoveries: series.On(b.Reg).Under(b.Name).Counter("consumer_recoveries_total", "Times the durable consumer was made again after it (or its stream) was deleted under the running service."),
		Panics:     series.On(b.Reg).Under(b.Name).Counter("handler_panics_total", "Messages whose handler panicked; each was dead-lettered with the panic as its reason.")}
	cons, err := rt.Open(ctx)
	if err != nil {
		return nil, nil, err
	}
	return rt, cons, nil
}

// Consuming sets the "consuming" condition: nil while messages are consumed, else why not
// (consume.ErrNotConsuming while the loop does not run, a fetch's error while fetches fail).
func (b *Base) Consuming(err error) { b.consuming.Set(err) }

// Serving is how Run serves a started service.
type Serving struct {
	HTTPAddr        string
	API             http.Handler  // the service's own endpoints, beside /metrics and the probes
	ShutdownTimeout time.Duration // how long work may outlive the stop signal
	Started         []any         // extra key-value pairs for the "started" log line
	// Consume runs until stop ends, then finishes what it holds under work, which outlives
	// stop by the shutdown timeout.
	Consume func(stop, work context.Context) error
	// Watch are background loops that run under work (gauges, watchers).
	Watch []func(work context.Context)
	// Guard, when set, wraps every HTTP endpoint (authentication).
	Guard func(http.Handler) http.Handler
}

// Run serves HTTP, runs the consumer until ctx ends, then stops HTTP, drains NATS and returns
// the joined errors of shutdown.
func (b *Base) Run(ctx context.Context, s Serving) error {
	// work outlives ctx by the shutdown timeout, so what is in hand is still finished.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	srv, err := Listen(work, s.HTTPAddr, b.common.HTTPLimits(), s.API, b.Reg, b.Health.Handler(WriteJSON), b.common.Pprof)
	if err != nil {
		b.NC.Close()
		return err
	}
	if s.Guard != nil {
		srv.Guard(s.Guard)
	}
	b.Log.Info(b.Name+" started", append([]any{"http_addr", srv.Addr(), "nats_url", b.NC.ConnectedUrlRedacted()}, s.Started...)...)

	go func() {
		select {
		case <-ctx.Done():
		case <-work.Done(): // Run returned early
			return
		}
		if retry.Sleep(work, s.ShutdownTimeout) == nil {
			b.Log.Warn("shutdown timeout reached; abandoning work in hand", "timeout", s.ShutdownTimeout.String())
			cancelWork()
		}
	}()
	httpErr := make(chan error, 1)
	go func() { httpErr <- srv.Serve() }()
	go b.Health.Watch(work, 5*time.Second)
	for _, w := range s.Watch {
		go w(work)
	}

	consumeErr := s.Consume(ctx, work)
	b.Log.Info(b.Name + " stopping")
	shutCtx, cancel := context.WithTimeout(work, 5*time.Second)
	defer cancel()
	errs := []error{consumeErr, srv.Shutdown(shutCtx)}
	b.quiet()
	if err := b.NC.Drain(); err != nil {
		errs = append(errs, fmt.Errorf("nats drain: %w", err))
	}
	if err := <-httpErr; err != nil {
		errs = append(errs, err)
	}
	if err := b.Trace.Shutdown(shutCtx); err != nil {
		b.Log.Warn("trace export at shutdown failed", "error", err)
	}
	cancelWork()
	b.Log.Info(b.Name + " stopped")
	return errors.Join(errs...)
}

// quiet stops logging connection events: the disconnect that closes a drained connection is
// the stop itself, not a warning.
func (b *Base) quiet() {
	b.NC.SetDisconnectErrHandler(nil)
	b.NC.SetClosedHandler(nil)
}
