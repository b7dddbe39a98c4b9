package archiver

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/auditlog"
	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/pkg/events"
)

// newKeeper is the keeper of the audit log over PROMPTS (internal/auditlog), when a signing key
// is configured; nil when none is. Its readiness condition, audit_log, fails until the log has
// caught up with PROMPTS and whenever it cannot grow.
func newKeeper(cfg AuditLog, js jetstream.JetStream, st *chstore.Store, h *health.Health, m *metrics, log *slog.Logger) (*auditlog.Keeper, error) {
	if cfg.KeyFile == "" {
		return nil, nil
	}
	signer, verifier, err := auditlog.LoadKey(cfg.KeyFile)
	if err != nil {
		return nil, err
	}
	return &auditlog.Keeper{
		JS: js, Name: signer.Name(), Signer: signer, Verifier: verifier,
		Every: cfg.Every, Interval: cfg.Interval, Poll: min(cfg.Interval, time.Second),
		Cond: h.Condition("audit_log", errors.New("the audit log has not caught up with PROMPTS yet")),
		Log:  log.With("component", "audit log"),
		Signed: func(c auditlog.Checkpoint) {
			m.checkpoints.Inc()
			m.logSize.Set(float64(c.Size))
		},
		Archived: st.ArchivedBetween,
		AckFloor: func(ctx context.Context) (uint64, error) {
			c, err := js.Consumer(ctx, events.StreamPrompts, events.ConsumerArchiver)
			if err != nil {
				return 0, err
			}
			return c.CachedInfo().AckFloor.Stream, nil
		},
	}, nil
}
