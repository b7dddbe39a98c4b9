package service

import (
	"errors"
	"fmt"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// Streams is how a service makes and keeps its streams: whether it manages them, their replicas
// and retention.
type Streams struct {
	ManageStreams  bool `envconfig:"MANAGE_STREAMS" default:"true" desc:"make the streams and buckets that are missing at start, never changing one that exists (podium streams apply does, as the operator); false where an operator makes them"`
	StreamReplicas int  `envconfig:"STREAM_REPLICAS" default:"1" desc:"JetStream replicas of every stream (3 in a cluster)"`
	// Retention: unset leaves what the stream has on the server (an operator's own edit stands;
	// a new stream keeps everything); set, a service makes a missing stream with it, and an
	// operator applies it to one that exists (podium streams apply).
	PromptsMaxAge       *time.Duration `envconfig:"PROMPTS_MAX_AGE" desc:"retention of the PROMPTS audit stream (0 = for ever, else at least 1h, above the archive's worst lag); unset: what the stream has is left alone"`
	PromptsMaxBytes     *int64         `envconfig:"PROMPTS_MAX_BYTES" desc:"bytes PROMPTS keeps at most, the oldest records removed first (0 = no bound, else at least 64 MiB); unset: left alone"`
	EvaluationsMaxAge   *time.Duration `envconfig:"EVALUATIONS_MAX_AGE" desc:"retention of EVALUATIONS (0 = for ever, else at least 1h); a store refilled after a trim holds what the stream kept; unset: left alone"`
	EvaluationsMaxBytes *int64         `envconfig:"EVALUATIONS_MAX_BYTES" desc:"bytes EVALUATIONS keeps at most (0 = no bound, else at least 64 MiB); unset: left alone"`
	StateMaxIdle        time.Duration  `envconfig:"STATE_MAX_IDLE" default:"168h" desc:"how long an execution's score snapshot (SCORES) and last leaderboard.updated (LEADERBOARDS) stay after its last commit; readers then use ClickHouse; 0 = for ever"`
}

// The least retention a stream may be given: PROMPTS must keep a record until the archive has it,
// and EVALUATIONS until the store does (both are seconds behind when healthy; the alert on the
// archive's lag fires at five minutes).
const (
	minRetention      = time.Hour
	minRetentionBytes = 64 << 20
)

// Validate checks the stream settings; prefix is the service's, for the messages.
func (s *Streams) Validate(prefix string) error {
	var errs []error
	if s.StreamReplicas < 1 || s.StreamReplicas > 5 {
		errs = append(errs, fmt.Errorf("%s must be 1 to 5, got %d", variable("STREAM_REPLICAS", prefix), s.StreamReplicas))
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
	}{{"PROMPTS_MAX_AGE", s.PromptsMaxAge}, {"EVALUATIONS_MAX_AGE", s.EvaluationsMaxAge}} {
		if d.v != nil && *d.v != 0 && *d.v < minRetention {
			errs = append(errs, fmt.Errorf("%s must be 0 (for ever) or at least %s, got %s: a shorter retention trims records before the archive or the store can be refilled from them", variable(d.name, prefix), minRetention, *d.v))
		}
	}
	for _, b := range []struct {
		name string
		v    *int64
	}{{"PROMPTS_MAX_BYTES", s.PromptsMaxBytes}, {"EVALUATIONS_MAX_BYTES", s.EvaluationsMaxBytes}} {
		if b.v != nil && *b.v != 0 && *b.v != -1 && *b.v < minRetentionBytes {
			errs = append(errs, fmt.Errorf("%s must be 0 (no bound) or at least %d (64 MiB), got %d", variable(b.name, prefix), minRetentionBytes, *b.v))
		}
	}
	if s.StateMaxIdle < 0 {
		errs = append(errs, fmt.Errorf("%s must be 0 (for ever) or positive, got %s", variable("STATE_MAX_IDLE", prefix), s.StateMaxIdle))
	}
	return errors.Join(errs...)
}

// Options are the stream options the settings ask for.
func (s *Streams) Options() events.StreamOptions {
	return events.StreamOptions{Replicas: s.StreamReplicas, StateMaxIdle: s.StateMaxIdle,
		Prompts:     events.Retention{MaxAge: s.PromptsMaxAge, MaxBytes: s.PromptsMaxBytes},
		Evaluations: events.Retention{MaxAge: s.EvaluationsMaxAge, MaxBytes: s.EvaluationsMaxBytes}}
}
