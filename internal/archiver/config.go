package archiver

import (
	"errors"
	"fmt"
	"time"

	"github.com/podium-llm/podium/internal/service"
)

// Config is docs/operating.md#configuration plus the archiver's own tuning.
type Config struct {
	service.Common
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8083" desc:"address of /metrics, /healthz and /readyz"`
	BatchSize       int           `envconfig:"BATCH_SIZE" default:"500" desc:"records per ClickHouse insert at most"`
	BatchBytes      int           `envconfig:"BATCH_BYTES" default:"8388608" desc:"bytes of records per ClickHouse insert at most (and of the pull buffer): bounds memory, as prompts reach the max payload"`
	FlushInterval   time.Duration `envconfig:"FLUSH_INTERVAL" default:"200ms" desc:"longest a batch keeps filling while the one before is still being written"`
	Linger          time.Duration `envconfig:"LINGER" default:"5ms" desc:"gap between records that ends a batch when nothing is being written"`
	AckWait         time.Duration `envconfig:"ACK_WAIT" default:"30s" desc:"redelivery timeout of the archiver consumer; batches in hand are kept alive"`
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"time to finish the batch in hand after SIGTERM"`
}

// Validate checks every setting; the error names each bad variable.
func (c *Config) Validate() error {
	errs := []error{c.ValidateShared("ARCHIVER")}
	if c.BatchSize < 1 || c.BatchSize > 100000 {
		errs = append(errs, fmt.Errorf("ARCHIVER_BATCH_SIZE must be 1 to 100000, got %d", c.BatchSize))
	}
	if minBytes := c.MaxEventBytes + 64<<10; c.BatchBytes < minBytes {
		errs = append(errs, fmt.Errorf("ARCHIVER_BATCH_BYTES must hold the largest record with its headers (MAX_EVENT_BYTES + 64 KiB = %d), got %d", minBytes, c.BatchBytes))
	}
	if c.FlushInterval <= 0 {
		errs = append(errs, fmt.Errorf("ARCHIVER_FLUSH_INTERVAL must be positive, got %s", c.FlushInterval))
	}
	if c.Linger <= 0 || c.Linger > c.FlushInterval {
		errs = append(errs, fmt.Errorf("ARCHIVER_LINGER must be positive and at most ARCHIVER_FLUSH_INTERVAL, got %s", c.Linger))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("ARCHIVER_ACK_WAIT must be at least 1s, got %s", c.AckWait))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ARCHIVER_SHUTDOWN_TIMEOUT must be positive, got %s", c.ShutdownTimeout))
	}
	return errors.Join(errs...)
}
