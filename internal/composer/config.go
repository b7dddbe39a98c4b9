package composer

import (
	"errors"
	"fmt"
	"time"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/library"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/replies"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/compose"
)

// Config is docs/operating.md#configuration plus the composer's own tuning.
type Config struct {
	service.Common
	service.ClickHouse
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8081" desc:"address of /metrics, /healthz, /readyz and POST /v1/render"`
	APIToken        string        `envconfig:"API_TOKEN" desc:"token of POST /v1/render (COMPOSER_API_TOKEN), sent as Authorization: Bearer or the basic-auth password; without it renders answer only loopback requests"`
	TZ              string        `envconfig:"TZ" desc:"default timezone of current_datetime (IANA name), UTC when empty"`
	TemplatesDir    string        `envconfig:"TEMPLATES_DIR" desc:"extra template directory (COMPOSER_TEMPLATES_DIR), loaded and checked at start"`
	DefaultTemplate string        `envconfig:"DEFAULT_TEMPLATE" default:"team-round" desc:"template of requests that name none (COMPOSER_DEFAULT_TEMPLATE)"`
	TokenEncoding   string        `envconfig:"TOKEN_ENCODING" default:"o200k_base" desc:"how token_estimate counts: o200k_base, cl100k_base (BPE, offline) or approx-cjk-v1"`
	InputsTimeout   time.Duration `envconfig:"INPUTS_TIMEOUT" default:"10s" desc:"longest wait for the ranker to commit evaluations acknowledged before a request (COMPOSER_INPUTS_TIMEOUT)"`
	ReadCacheTTL    time.Duration `envconfig:"READ_CACHE_TTL" default:"2s" desc:"how long a read of an execution serves later requests that wait for no newer evaluation; 0 shares only reads in flight"`
	Workers         int           `envconfig:"WORKERS" default:"32" desc:"requests composed at once by this replica (mostly waiting on NATS and ClickHouse, so more than cores)"`
	AckWait         time.Duration `envconfig:"ACK_WAIT" default:"30s" desc:"redelivery timeout of the composer consumer (kept alive with InProgress while waiting)"`
	MaxDeliver      int           `envconfig:"MAX_DELIVER" default:"10" desc:"deliveries of one request that meet a retryable failure; the last one answers prompt.failed instead of retrying (the consumer allows 3 more, for a composer that dies holding one)"`
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"time to finish requests in hand after SIGTERM"`
	RenderTimeout   time.Duration `envconfig:"RENDER_TIMEOUT" default:"10s" desc:"longest render of one prompt (counting a hostile text may take long); past it the request answers budget_exceeded"`
	RenderAPILimit  int           `envconfig:"RENDER_CONCURRENCY" default:"4" desc:"POST /v1/render requests served at once, and as many podium.parse; more answer 429"`
	// The connection that serves podium.render, podium.parse and the micro service's $SRV
	// endpoints is a user of its own where the deployment gives one, which may publish on callers'
	// inboxes only: the server itself then refuses an answer sent anywhere else (docs/security.md).
	APINATSUser     string `envconfig:"API_NATS_USER" desc:"NATS user of the connection that answers podium.render and podium.parse (COMPOSER_API_NATS_USER); empty: NATS_USER"`
	APINATSPassword string `envconfig:"API_NATS_PASSWORD" desc:"its password (COMPOSER_API_NATS_PASSWORD)"`
	APINATSCreds    string `envconfig:"API_NATS_CREDS" desc:"its credentials file (COMPOSER_API_NATS_CREDS); empty: NATS_CREDS unless COMPOSER_API_NATS_USER is set"`
	ReplyPrefixes   string `envconfig:"REPLY_PREFIXES" default:"_INBOX." desc:"comma-separated reply subject prefixes that podium.render and podium.parse answer on (the inbox spaces of the callers' NATS users); a request with another reply subject is refused"`
	builders.Limits
}

// Validate checks every setting; the error names each bad variable.
func (c *Config) Validate() error {
	errs := []error{c.ValidateShared("COMPOSER"), c.ClickHouse.Validate("COMPOSER"), c.Limits.Validate("COMPOSER")}
	if c.InputsTimeout <= 0 {
		errs = append(errs, fmt.Errorf("COMPOSER_INPUTS_TIMEOUT must be positive, got %s", c.InputsTimeout))
	}
	if c.ReadCacheTTL < 0 {
		errs = append(errs, fmt.Errorf("COMPOSER_READ_CACHE_TTL must not be negative, got %s", c.ReadCacheTTL))
	}
	if c.Workers < 1 || c.Workers > 1024 {
		errs = append(errs, fmt.Errorf("COMPOSER_WORKERS must be 1 to 1024, got %d", c.Workers))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("COMPOSER_ACK_WAIT must be at least 1s, got %s", c.AckWait))
	}
	if c.MaxDeliver < 1 {
		errs = append(errs, fmt.Errorf("COMPOSER_MAX_DELIVER must be positive, got %d", c.MaxDeliver))
	}
	if c.RenderTimeout <= 0 {
		errs = append(errs, fmt.Errorf("COMPOSER_RENDER_TIMEOUT must be positive, got %s", c.RenderTimeout))
	}
	if c.RenderAPILimit < 1 {
		errs = append(errs, fmt.Errorf("COMPOSER_RENDER_CONCURRENCY must be at least 1, got %d", c.RenderAPILimit))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("COMPOSER_SHUTDOWN_TIMEOUT must be positive, got %s", c.ShutdownTimeout))
	}
	if _, err := replies.Parse(c.ReplyPrefixes); err != nil {
		errs = append(errs, fmt.Errorf("COMPOSER_REPLY_PREFIXES: %w", err))
	}
	if err := c.templates().Check(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// apiNATS is how the connection that answers requests reaches NATS: as the composer does, under
// the API user or credentials when they are set.
func (c *Config) apiNATS() *service.NATS {
	return c.NATS.As(c.APINATSCreds, c.APINATSUser, c.APINATSPassword)
}

// templates are the template settings the composer reads (internal/library owns them for every
// reader of templates).
func (c *Config) templates() library.Settings {
	return library.Settings{Dir: c.TemplatesDir, TZ: c.TZ, DefaultTemplate: c.DefaultTemplate, TokenEncoding: c.TokenEncoding}
}

// library loads the templates the configuration names, with its token counter and timezone; the
// registry's versions come later (the composer follows the registry).
func (c *Config) library() (*compose.Library, error) {
	return c.templates().Load("", registry.State{})
}
