package ranker

import (
	"errors"
	"fmt"
	"time"

	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/replies"
	"github.com/podium-llm/podium/internal/service"
)

// Config is docs/operating.md#configuration plus the ranker's own tuning.
type Config struct {
	service.Common
	service.ClickHouseWriter
	HTTPAddr         string        `envconfig:"HTTP_ADDR" default:":8082" desc:"address of /metrics, /healthz, /readyz and the API"`
	APIToken         string        `envconfig:"API_TOKEN" desc:"token of the API (RANKER_API_TOKEN), sent as Authorization: Bearer or the basic-auth password; without it the API answers only loopback requests"`
	APINATSUser      string        `envconfig:"API_NATS_USER" desc:"NATS user of the connection that answers podium.leaderboard (RANKER_API_NATS_USER); empty: NATS_USER"`
	APINATSPassword  string        `envconfig:"API_NATS_PASSWORD" desc:"its password (RANKER_API_NATS_PASSWORD)"`
	APINATSCreds     string        `envconfig:"API_NATS_CREDS" desc:"its credentials file (RANKER_API_NATS_CREDS); empty: NATS_CREDS unless RANKER_API_NATS_USER is set"`
	ReplyPrefixes    string        `envconfig:"REPLY_PREFIXES" default:"_INBOX." desc:"comma-separated reply subject prefixes that podium.leaderboard answers on (the inbox spaces of the callers' NATS users); a request with another reply subject is refused"`
	BatchSize        int           `envconfig:"BATCH_SIZE" default:"500" desc:"evaluations per ClickHouse insert at most"`
	BatchBytes       int           `envconfig:"BATCH_BYTES" default:"4194304" desc:"bytes of evaluations per ClickHouse insert at most (and of the pull buffer): bounds memory when submissions are large"`
	FlushInterval    time.Duration `envconfig:"FLUSH_INTERVAL" default:"100ms" desc:"longest a batch keeps filling while the one before is still being written (an idle ranker writes an evaluation as soon as it is pulled)"`
	Linger           time.Duration `envconfig:"LINGER" default:"1ms" desc:"gap between evaluations that ends a batch when nothing is being written"`
	AnnounceInterval time.Duration `envconfig:"ANNOUNCE_INTERVAL" default:"200ms" desc:"least time between two rounds of leaderboard.updated; executions committed meanwhile share the next"`
	AckWait          time.Duration `envconfig:"ACK_WAIT" default:"10s" desc:"redelivery timeout of the ranker consumer: after a crash, evaluations it held are committed by another replica (or its restart) this much later; batches in hand are kept alive with InProgress"`
	MaxDeliver       int           `envconfig:"MAX_DELIVER" default:"-1" desc:"deliveries of one evaluation before the broker gives up (-1 = never: evaluations are not dropped)"`
	ShutdownTimeout  time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"time to finish the batch in hand after SIGTERM"`
}

// batching is how the ranker cuts its batches (Busy is the committer's, set where it runs).
func (c *Config) batching() consume.Batching {
	return consume.Batching{Size: c.BatchSize, Bytes: c.BatchBytes, Flush: c.FlushInterval, Linger: c.Linger}
}

// Validate checks every setting; the error names each bad variable.
func (c *Config) Validate() error {
	errs := []error{c.ValidateShared("RANKER"), c.ClickHouseWriter.Validate("RANKER"), c.batching().Validate("RANKER", c.MaxEventBytes)}
	if c.AnnounceInterval < 0 {
		errs = append(errs, fmt.Errorf("RANKER_ANNOUNCE_INTERVAL must not be negative, got %s", c.AnnounceInterval))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("RANKER_ACK_WAIT must be at least 1s, got %s", c.AckWait))
	}
	if c.MaxDeliver == 0 || c.MaxDeliver < -1 {
		errs = append(errs, fmt.Errorf("RANKER_MAX_DELIVER must be -1 or positive, got %d", c.MaxDeliver))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("RANKER_SHUTDOWN_TIMEOUT must be positive, got %s", c.ShutdownTimeout))
	}
	if _, err := replies.Parse(c.ReplyPrefixes); err != nil {
		errs = append(errs, fmt.Errorf("RANKER_REPLY_PREFIXES: %w", err))
	}
	return errors.Join(errs...)
}

// apiNATS is how the connection that answers podium.leaderboard reaches NATS: as the ranker does,
// under the API user or credentials when they are set.
func (c *Config) apiNATS() *service.NATS {
	return c.NATS.As(c.APINATSCreds, c.APINATSUser, c.APINATSPassword)
}
