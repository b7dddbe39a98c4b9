package archiver

import (
	"errors"
	"fmt"
	"time"

	"github.com/podium-llm/podium/internal/consume"
	"github.com/podium-llm/podium/internal/service"
)

// Config is docs/operating.md#configuration plus the archiver's own tuning.
type Config struct {
	service.Common
	service.ClickHouseWriter
	HTTPAddr        string        `envconfig:"HTTP_ADDR" default:":8083" desc:"address of /metrics, /healthz and /readyz"`
	BatchSize       int           `envconfig:"BATCH_SIZE" default:"500" desc:"records per ClickHouse insert at most"`
	BatchBytes      int           `envconfig:"BATCH_BYTES" default:"8388608" desc:"bytes of records per ClickHouse insert at most (and of the pull buffer): bounds memory, as prompts reach the max payload"`
	FlushInterval   time.Duration `envconfig:"FLUSH_INTERVAL" default:"200ms" desc:"longest a batch keeps filling while the one before is still being written"`
	Linger          time.Duration `envconfig:"LINGER" default:"5ms" desc:"gap between records that ends a batch when nothing is being written"`
	AckWait         time.Duration `envconfig:"ACK_WAIT" default:"30s" desc:"redelivery timeout of the archiver consumer; batches in hand are kept alive"`
	ShutdownTimeout time.Duration `envconfig:"SHUTDOWN_TIMEOUT" default:"30s" desc:"time to finish the batch in hand after SIGTERM"`
	AuditLog
}

// AuditLog is the tamper-evident log over PROMPTS the archiver keeps (docs/audit.md).
type AuditLog struct {
	KeyFile  string        `envconfig:"AUDIT_SIGNING_KEY_FILE" desc:"file holding the audit log's ed25519 signing key (podium audit keygen); empty: no audit log is kept"`
	Every    int64         `envconfig:"AUDIT_CHECKPOINT_EVERY" default:"1000" desc:"records between two signed checkpoints at most"`
	Interval time.Duration `envconfig:"AUDIT_CHECKPOINT_INTERVAL" default:"10s" desc:"longest a record waits for a signed checkpoint that holds it"`
}

// batching is how the archiver cuts its batches.
func (c *Config) batching() consume.Batching {
	return consume.Batching{Size: c.BatchSize, Bytes: c.BatchBytes, Flush: c.FlushInterval, Linger: c.Linger}
}

// Validate checks every setting; the error names each bad variable.
func (c *Config) Validate() error {
	errs := []error{c.ValidateShared("ARCHIVER"), c.ClickHouseWriter.Validate("ARCHIVER"), c.batching().Validate("ARCHIVER", c.MaxEventBytes)}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("ARCHIVER_ACK_WAIT must be at least 1s, got %s", c.AckWait))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("ARCHIVER_SHUTDOWN_TIMEOUT must be positive, got %s", c.ShutdownTimeout))
	}
	if c.AuditLog.Every < 1 {
		errs = append(errs, fmt.Errorf("ARCHIVER_AUDIT_CHECKPOINT_EVERY must be at least 1, got %d", c.AuditLog.Every))
	}
	if c.AuditLog.Interval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("ARCHIVER_AUDIT_CHECKPOINT_INTERVAL must be at least 100ms, got %s", c.AuditLog.Interval))
	}
	return errors.Join(errs...)
}
