package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/rank"
)

const help = `podium: tools for the people around the pipeline.

Usage: podium COMMAND [flags] [arguments]

Template authors:
  templates push DIR|FILE [--label L]   store the next version of a template (checked first)
  templates list | show NAME[@V|:L] | history NAME | diff A B
  templates label NAME VERSION LABEL    move a label (production is what a bare name renders)
  templates render NAME --request F [--evaluations F] [--time T]   render offline, no server
  templates import-mixseek prompt_builder.toml [--name N] [--out DIR | --push]   convert mixseek-core's Jinja2 team template

Auditors:
  prompts show EXEC TEAM ROUND      print the recorded prompt of a team's round and what it was made from
  prompts verify EXEC TEAM ROUND    render the record again from itself and compare (sha256)
  prompts verify --all --execution EXEC   every record of an execution
  prompts verify --bundle FILE      every record of an export bundle, with no NATS and no ClickHouse
  export --execution EXEC [--out F] one execution's evaluations, prompts and templates in one bundle
  prompts diff EXEC TEAM R1 R2      unified diff of a team's prompts of two rounds
  prompts tail [--execution E] [--team T] [--all] [--count N]   follow the audit stream

Operators:
  leaderboard EXEC [--asc] [--json] an execution's standings, as the ranker computes them
  history EXEC TEAM [--json]        a team's latest evaluation of each round
  publish evaluation|round --file F publish an event (a data object, or a whole CloudEvent), validated first
  deadletters list [--subject S]    what was dead-lettered, with the reasons
  deadletters replay SEQ|--all      republish dead-lettered originals that are now valid, under a new message id
  store status [--json]             which ClickHouse replicas answer and how far each is behind
  store rebuild [--from-start]      write the EVALUATIONS stream into the store again (it is the log; the store a view)

  help, COMMAND --help              this text, or a command's flags

Configuration is the services' environment (NATS_URL, NATS_CREDS, CLICKHOUSE_ADDR,
CLICKHOUSE_DATABASE, ...; PODIUM_ prefixed names override the shared ones). verify also reads the
composer's COMPOSER_TEMPLATES_DIR and TZ, so it loads the templates the composer loaded.

Exit codes: 0 ok; 1 a check failed (a record differs, an event is still invalid); 2 bad arguments or
configuration; 3 NATS or ClickHouse could not be used.`

// config is what podium reads from the environment: the services' shared settings.
type config struct {
	service.Common
}

// Validate checks the shared settings.
func (c *config) Validate() error { return c.ValidateShared("PODIUM") }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) < 2 || args[1] == "help" || args[1] == "-h" || args[1] == "--help" {
		fmt.Fprintln(stdout, help)
		if len(args) < 2 {
			return usagef("no command")
		}
		return nil
	}
	cmd, rest := args[1], args[2:]
	if (cmd == "prompts" || cmd == "deadletters" || cmd == "publish" || cmd == "templates" || cmd == "store") && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		cmd, rest = cmd+" "+rest[0], rest[1:]
	}
	c, ok := commands()[cmd]
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
	var cfg config
	if err := service.Load("podium", &cfg); err != nil {
		return &usageError{err.Error()}
	}
	if err := cfg.Validate(); err != nil {
		return &usageError{"configuration: " + err.Error()}
	}
	e := &env{cfg: &cfg, out: stdout, stderr: stderr, args: fs.Args()}
	defer e.done()
	return parse(ctx, e)
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

// command is one subcommand: its usage and flags, and what it does once they are parsed.
type command struct {
	args, what string
	flags      func(fs *flag.FlagSet) func(ctx context.Context, e *env) error
}

// env is what a command works with; connections are opened on first use.
type env struct {
	cfg    *config
	out    io.Writer
	stderr io.Writer // notes beside the output (a source that could not be read)
	args   []string

	js    jetstream.JetStream
	close []func()
	store *rank.Store
}

func (e *env) jetstream() (jetstream.JetStream, error) {
	if e.js != nil {
		return e.js, nil
	}
	nc, err := service.ConnectNATS(&e.cfg.Common, "podium", slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	e.close = append(e.close, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	e.js = js
	return js, nil
}

func (e *env) rank(ctx context.Context) (*rank.Store, error) {
	if e.store != nil {
		return e.store, nil
	}
	st, err := rank.Open(ctx, e.cfg.Store(nil))
	if err != nil {
		return nil, err
	}
	e.close = append(e.close, func() { st.Close() })
	e.store = st
	return st, nil
}

func (e *env) done() {
	for _, c := range e.close {
		c()
	}
}
