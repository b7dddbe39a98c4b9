package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/library"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/storeview"
	"github.com/podium-llm/podium/internal/version"
)

// config is what podium reads from the environment: the services' shared settings, and ClickHouse
// as a writer (`podium store rebuild` writes the store).
type config struct {
	service.Common
	service.ClickHouseWriter
	builders.ComposersLimits
	// Inputs from outside are read with a limit checked while reading (internal/bounded): one event,
	// request or template folder at most MAX_EVENT_BYTES, anything larger (an export bundle, its
	// decompressed bytes counted; an --evaluations file) at most this.
	MaxInputBytes int64 `envconfig:"MAX_INPUT_BYTES" default:"536870912" desc:"largest file podium reads whole besides one event (PODIUM_MAX_INPUT_BYTES): an export bundle, counted decompressed, or an --evaluations file"`
}

// Validate checks the shared settings.
func (c *config) Validate() error {
	var errs []error
	if c.MaxInputBytes < 1 {
		errs = append(errs, fmt.Errorf("PODIUM_MAX_INPUT_BYTES must be positive, got %d", c.MaxInputBytes))
	}
	return errors.Join(append(errs, c.ValidateShared("PODIUM"), c.ClickHouseWriter.Validate("PODIUM"), c.ComposersLimits.Validate())...)
}

// inputLimit bounds a large input read whole (a bundle, an --evaluations file).
func (c *config) inputLimit() bounded.Limit {
	return bounded.Limit{Bytes: c.MaxInputBytes, Setting: "PODIUM_MAX_INPUT_BYTES"}
}

// eventLimit bounds an input of the size of one event: an event to publish, a request, a template.
func (c *config) eventLimit() bounded.Limit {
	return bounded.Limit{Bytes: int64(c.MaxEventBytes), Setting: "MAX_EVENT_BYTES"}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmds := commands()
	if len(args) < 2 || args[1] == "help" || args[1] == "-h" || args[1] == "--help" {
		fmt.Fprintln(stdout, helpText(cmds))
		if len(args) < 2 {
			return usagef("no command")
		}
		return nil
	}
	if args[1] == "--version" || args[1] == "version" {
		fmt.Fprintln(stdout, version.String("podium"))
		return nil
	}
	cmd, rest := args[1], args[2:]
	if isGroup(cmds, cmd) {
		// A group alone, or asked for help, lists its commands, as git and kubectl do.
		if len(rest) == 0 || rest[0] == "-h" || rest[0] == "--help" || rest[0] == "help" {
			fmt.Fprint(stdout, groupHelp(cmds, cmd))
			return nil
		}
		if !strings.HasPrefix(rest[0], "-") {
			cmd, rest = cmd+" "+rest[0], rest[1:]
		}
	}
	c, ok := find(cmds, cmd)
	if !ok {
		return usagef("unknown command %q", strings.Join(args[1:min(len(args), 3)], " "))
	}
	fs := flag.NewFlagSet("podium "+cmd, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(stdout, "Usage: podium %s %s\n\n%s\n", cmd, c.args, c.what)
		fs.PrintDefaults()
	}
	parse := c.flags(fs)
	if err := fs.Parse(interleave(fs, rest)); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return usagef("%v", err)
	}
	if err := c.checkArgs(fs.Args()); err != nil {
		return err
	}
	var cfg config
	if err := service.Load("podium", &cfg); err != nil {
		return &usageError{err.Error()}
	}
	if err := cfg.Validate(); err != nil {
		return &usageError{"configuration: " + err.Error()}
	}
	e := &env{cfg: &cfg, out: stdout, stderr: stderr, args: fs.Args(), templates: library.FromEnv(os.Getenv)}
	defer e.done()
	if err := parse(ctx, e); err != nil {
		return err
	}
	if e.view != nil {
		// A refill that touched the store while the command read it: what it printed or wrote
		// may be partial, and the exit status says so.
		if err := e.view.End(ctx); err != nil {
			return fmt.Errorf("%w (what podium printed or wrote above may be partial)", err)
		}
	}
	return nil
}

// interleave moves flags before positional arguments, so `verify EXEC TEAM 2 --json` parses.
func interleave(fs *flag.FlagSet, args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		// A flag with a separate value: the next argument is its value.
		if f := fs.Lookup(strings.TrimLeft(a, "-")); f != nil && !strings.Contains(a, "=") && i+1 < len(args) && !isBool(f) {
			flags = append(flags, args[i+1])
			i++
		}
	}
	return append(flags, pos...)
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// env is what a command works with; connections are opened on first use.
type env struct {
	cfg    *config
	out    io.Writer
	stderr io.Writer // notes beside the output (a source that could not be read)
	args   []string
	// templates are the composers' template settings, from their environment (internal/library).
	templates library.Settings
	// denied hears the server refuse a publish for want of permission (see jetstream).
	denied chan error

	js    jetstream.JetStream
	close []func()
	store *chstore.Store
	// view is the read of the ranker's store a command made (evaluations: reads), checked again
	// when the command is done.
	view *storeview.Read
}

func (e *env) jetstream() (jetstream.JetStream, error) {
	if e.js != nil {
		return e.js, nil
	}
	nc, err := service.ConnectNATS(&e.cfg.NATS, "podium", slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	// The server refuses a publish this user may not make asynchronously: the publish itself
	// would wait out its deadline. The refusal is handed to whoever waits on e.denied.
	e.denied = make(chan error, 1)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			select {
			case e.denied <- err:
			default:
			}
		}
	})
	e.close = append(e.close, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	e.js = js
	return js, nil
}

func (e *env) rank(ctx context.Context) (*chstore.Store, error) {
	if e.store != nil {
		return e.store, nil
	}
	st, err := chstore.Open(ctx, e.cfg.Store(nil))
	if err != nil {
		return nil, err
	}
	e.close = append(e.close, func() { st.Close() })
	e.store = st
	return st, nil
}

// reads begins a read of the ranker's evaluations (boards, histories, inputs to render again,
// exports): refused while the ranker refills its store or the store is not whole, anchored on the
// store's lineage, and checked again when the command is done (internal/storeview).
func (e *env) reads(ctx context.Context) (*storeview.Read, error) {
	if e.view == nil {
		js, err := e.jetstream()
		if err != nil {
			return nil, err
		}
		st, err := e.rank(ctx)
		if err != nil {
			return nil, err
		}
		if e.view, err = storeview.Begin(ctx, js, st); err != nil {
			return nil, err
		}
	}
	return e.view, nil
}

// permitted runs publish, which writes to NATS, and ends it as soon as the server refuses this
// user's publish: the refusal is its error (a *permissionError), not a deadline passed.
func (e *env) permitted(ctx context.Context, publish func(ctx context.Context) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case err := <-e.denied:
			cancel(&permissionError{err})
		case <-ctx.Done():
		}
	}()
	err := publish(ctx)
	var denied *permissionError
	if errors.As(context.Cause(ctx), &denied) {
		return denied
	}
	return err
}

// permissionError is a publish the server refused this user.
type permissionError struct{ err error }

func (e *permissionError) Error() string { return e.err.Error() }
func (e *permissionError) Unwrap() error { return e.err }

func (e *env) done() {
	for _, c := range e.close {
		c()
	}
}
