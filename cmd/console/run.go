package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/console"
	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/door"
	"github.com/podium-llm/podium/internal/library"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/internal/wasm"
)

// command is the console's command line (internal/service).
var command = service.Command{Name: "console", Summary: `console: the read-only web console of a Podium tournament.

It shows every execution in the store, each one's leaderboard, score chart and rounds x teams grid,
a team's round with its prompt exactly as published, the diff against the previous round, the
submission, the feedback and a verify action, the template registry and the dead letters. Pages of
a running execution follow it live.

Usage:
  console          serve until SIGTERM or SIGINT, on CONSOLE_ADDR (default 127.0.0.1:8090)
  console --help   print this text

Bound to any address but loopback, it refuses to start without CONSOLE_AUTH_TOKEN (sent as
"Authorization: Bearer TOKEN", or as the password of HTTP basic auth with any user) or
CONSOLE_BASIC_USER and CONSOLE_BASIC_PASSWORD; every request without them is answered 401
(/healthz, /readyz and /metrics excepted). On loopback without a credential it answers requests to
a loopback host only (localhost, 127.0.0.1, [::1]): a page elsewhere cannot rebind its name to it.`}

// config is the services' shared configuration plus the console's own.
type config struct {
	service.Common
	service.ClickHouse
	builders.ComposersLimits
	Addr            string `envconfig:"ADDR" default:"127.0.0.1:8090" desc:"address the console listens on (CONSOLE_ADDR); any but loopback needs a credential"`
	AuthToken       string `envconfig:"AUTH_TOKEN" desc:"token every request must carry (CONSOLE_AUTH_TOKEN): Authorization: Bearer, or the basic-auth password"`
	BasicUser       string `envconfig:"BASIC_USER" desc:"basic-auth user (CONSOLE_BASIC_USER), with CONSOLE_BASIC_PASSWORD"`
	BasicPassword   string `envconfig:"BASIC_PASSWORD" desc:"basic-auth password (CONSOLE_BASIC_PASSWORD)"`
	TemplatesDir    string `envconfig:"COMPOSER_TEMPLATES_DIR" desc:"the composers' template directory, so verify and the templates page load what they load"`
	TZ              string `envconfig:"TZ" desc:"the composers' default timezone, for verify"`
	MaxViewers      int    `envconfig:"MAX_VIEWERS" default:"1000" desc:"live pages open at once (CONSOLE_MAX_VIEWERS); more are answered 503"`
	CacheExecutions int    `envconfig:"CACHE_EXECUTIONS" default:"32" desc:"executions whose rounds x teams grid is kept in memory between pages (CONSOLE_CACHE_EXECUTIONS)"`
}

func (c *config) door() door.Door {
	return door.Door{Token: c.AuthToken, BasicUser: c.BasicUser, BasicPW: c.BasicPassword, TokenVar: "CONSOLE_AUTH_TOKEN"}
}

// Validate checks every setting; the error names each bad variable.
func (c *config) Validate() error {
	errs := []error{c.ValidateShared("CONSOLE"), c.ClickHouse.Validate("CONSOLE"), c.ComposersLimits.Validate()}
	if err := c.door().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("CONSOLE_BASIC_USER and CONSOLE_BASIC_PASSWORD: %w", err))
	}
	if err := c.door().CheckBind(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("CONSOLE_ADDR %w", err))
	}
	if c.MaxViewers < 1 {
		errs = append(errs, fmt.Errorf("CONSOLE_MAX_VIEWERS must be positive, got %d", c.MaxViewers))
	}
	if c.CacheExecutions < 1 {
		errs = append(errs, fmt.Errorf("CONSOLE_CACHE_EXECUTIONS must be positive, got %d", c.CacheExecutions))
	}
	return errors.Join(errs...)
}

// run is the whole service, its configuration read and checked: it returns when ctx ends and
// the work in hand is finished, or on a start-up error.
func run(ctx context.Context, p *service.Prepared[config], stdout io.Writer) error {
	cfg, log := p.Config, p.Log
	// The composers' template settings: the templates page and verify load what they load.
	settings := library.Settings{Dir: cfg.TemplatesDir, TZ: cfg.TZ}
	lib, err := settings.Load("", registry.State{})
	if err != nil {
		return fmt.Errorf("COMPOSER_TEMPLATES_DIR or TZ: %w", err)
	}
	st, err := chstore.Open(ctx, cfg.Store(log))
	if err != nil {
		return err
	}
	defer st.Close()
	// No stream is created or changed: the console only reads.
	base, err := service.Start(ctx, "console", &cfg.Common, log)
	if err != nil {
		return err
	}
	// Prompt builders run as the composers run them (their limits), for verify.
	engine, err := wasm.NewEngine(ctx, cfg.ComposersLimits.Limits().Wasm())
	if err != nil {
		return err
	}
	defer engine.Close(context.WithoutCancel(ctx))
	// A verifier over the registries as they are now: a record names the version that rendered it.
	verifier := func(ctx context.Context) (*audit.Verifier, error) {
		var reg registry.State
		if kv, err := base.JS.KeyValue(ctx, registry.Bucket); err == nil {
			if reg, _, err = registry.Load(ctx, kv); err != nil {
				return nil, err
			}
		}
		v := audit.NewVerifier(settings, reg, render.Store{St: st})
		kv, err := base.JS.KeyValue(ctx, builders.Bucket)
		if err != nil {
			return v, nil // no builder registry: a built record says it cannot be run again
		}
		obj, err := builders.OpenStore(ctx, base.JS, builders.ReleasesConfig(cfg.StreamReplicas), false) // what production ran
		if errors.Is(err, builders.ErrNoStore) {
			return v, nil
		}
		if err != nil {
			return nil, err
		}
		return v.WithBuilders(builders.Source(kv, &builders.Loader{Engine: engine, Modules: obj}, cfg.ComposersRenderTimeout)), nil
	}
	con, err := console.New(console.Deps{
		Log: log, Reg: base.Reg, NC: base.NC, JS: base.JS, Store: st, Builtin: lib.Templates(),
		Verify: func(ctx context.Context, rec audit.Record) error {
			v, err := verifier(ctx)
			if err != nil {
				return err
			}
			return v.Verify(ctx, rec)
		},
		Try: func(ctx context.Context, ref string, recs []audit.Record) ([]audit.Trial, error) {
			v, err := verifier(ctx)
			if err != nil {
				return nil, err
			}
			trials := make([]audit.Trial, 0, len(recs))
			for _, rec := range recs {
				t, err := v.Try(ctx, rec, ref)
				if err != nil {
					return nil, err
				}
				trials = append(trials, t)
			}
			return trials, nil
		},
		MaxViewers: cfg.MaxViewers, CacheExecutions: cfg.CacheExecutions,
	})
	if err != nil {
		base.Close()
		return err
	}
	url := "http://" + cfg.Addr
	if strings.HasPrefix(cfg.Addr, ":") {
		url = "http://localhost" + cfg.Addr
	}
	base.Health.Probe("clickhouse", st.Ping)
	base.Health.Probe("live", con.Ready)
	return base.Run(ctx, service.Serving{
		HTTPAddr:        cfg.Addr,
		API:             con.Handler(),
		Guard:           cfg.door().Guard(cfg.Addr),
		ShutdownTimeout: 5 * time.Second,
		Started:         []any{"url", url, "clickhouse", cfg.ClickHouseAddr, "database", cfg.ClickHouseDatabase, "auth", cfg.AuthToken != "" || cfg.BasicUser != ""},
		Consume: func(stop, _ context.Context) error {
			// Nothing is consumed: "consuming" is the live subscriptions, up until the stop.
			base.Consuming(nil)
			<-stop.Done()
			base.Consuming(consume.ErrNotConsuming)
			con.Close() // ends every live response, so the HTTP shutdown does not wait for viewers
			return nil
		},
	})
}
