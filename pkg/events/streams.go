package events

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream names of docs/contract.md#subjects-and-streams.
const (
	StreamEvaluations  = "EVALUATIONS"
	StreamRounds       = "ROUNDS"
	StreamPrompts      = "PROMPTS"
	StreamLeaderboards = "LEADERBOARDS"
	StreamDeadLetter   = "DEADLETTER"
)

// Durable consumer names: every replica of a service shares its durable.
const (
	ConsumerRanker   = "ranker"
	ConsumerComposer = "composer"
	ConsumerArchiver = "archiver"
)

// StreamOptions are the operator's choices that shape the streams.
type StreamOptions struct {
	Replicas      int           // STREAM_REPLICAS
	PromptsMaxAge time.Duration // PROMPTS_MAX_AGE, 0 keeps the audit log forever
}

// StreamConfig returns the configuration of one contract stream.
func StreamConfig(name string, o StreamOptions) (jetstream.StreamConfig, error) {
	replicas := max(o.Replicas, 1)
	cfg := jetstream.StreamConfig{
		Name:       name,
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Replicas:   replicas,
		Duplicates: 2 * time.Minute,
	}
	switch name {
	case StreamEvaluations:
		cfg.Description = "evaluation.completed events: the ranker's input and the replay source of every leaderboard"
		cfg.Subjects = []string{TypeEvaluationCompleted + ".>"}
		// Composers read each evaluation's content here by sequence; a direct get is answered
		// by any replica of the stream, without its leader.
		cfg.AllowDirect = true
	case StreamRounds:
		cfg.Description = "round.requested events: the composer's input"
		cfg.Subjects = []string{TypeRoundRequested + ".>"}
	case StreamPrompts:
		cfg.Description = "prompt.composed and prompt.failed: the audit log of every prompt"
		cfg.Subjects = []string{TypePromptComposed + ".>", TypePromptFailed + ".>"}
		cfg.DenyDelete = true
		cfg.DenyPurge = true
		cfg.MaxAge = o.PromptsMaxAge
		// Longer than any redelivery of a request, so a prompt composed twice is stored once.
		cfg.Duplicates = 10 * time.Minute
	case StreamLeaderboards:
		cfg.Description = "leaderboard.updated: the last leaderboard of each execution"
		cfg.Subjects = []string{TypeLeaderboardUpdated + ".>"}
		cfg.MaxMsgsPerSubject = 1
	case StreamDeadLetter:
		cfg.Description = "events that can never be processed, byte for byte, with Dead-Reason, Dead-Stream and Dead-Sequence headers"
		cfg.Subjects = []string{"deadletter.>"}
	default:
		return jetstream.StreamConfig{}, fmt.Errorf("events: unknown stream %q", name)
	}
	return cfg, nil
}

// EnsureStreams creates or updates the named streams; running it again changes nothing.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions, names ...string) error {
	for _, name := range names {
		cfg, err := StreamConfig(name, o)
		if err != nil {
			return err
		}
		if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("events: ensure stream %s: %w", name, err)
		}
	}
	return nil
}

// ConsumerOptions shape a service's durable pull consumer.
type ConsumerOptions struct {
	AckWait       time.Duration // how long a delivered message may stay unacked before redelivery
	MaxAckPending int           // across all replicas; keep it near the total worker count
	MaxDeliver    int           // deliveries before the broker gives up (-1 unlimited)
}

// ConsumerConfig returns the durable consumer of a service on its input stream.
func ConsumerConfig(durable string, o ConsumerOptions) (jetstream.ConsumerConfig, error) {
	cfg := jetstream.ConsumerConfig{
		Durable:       durable,
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       o.AckWait,
		MaxAckPending: o.MaxAckPending,
		MaxDeliver:    o.MaxDeliver,
	}
	switch durable {
	case ConsumerRanker:
		cfg.Description = "ranker: stores evaluations in ClickHouse, acks only after they are committed"
		cfg.FilterSubject = TypeEvaluationCompleted + ".>"
	case ConsumerComposer:
		cfg.Description = "composer: answers every round.requested with prompt.composed or prompt.failed"
		cfg.FilterSubject = TypeRoundRequested + ".>"
	case ConsumerArchiver:
		cfg.Description = "archiver: copies every PROMPTS record into ClickHouse, acks only after it is stored"
	default:
		return jetstream.ConsumerConfig{}, fmt.Errorf("events: unknown consumer %q", durable)
	}
	return cfg, nil
}

// The ranker's consumer carries the state of the store in its metadata, which every composer's
// commit probe reads with the ack floor (no extra call): which lineage the store's rows are of
// (rank.Lineage.ID; score snapshots of another lineage are stale), and whether the ranker is
// refilling the store from the stream (then nothing read from ClickHouse is whole, and requests
// wait as they wait for a commit).
const (
	MetaStoreLineage   = "podium_store_lineage"
	MetaStoreRefilling = "podium_store_refilling"
)

// The archiver's consumer names the fill of the prompts archive that its ack floor speaks of
// (rank.Store.NoteArchiveEpoch): readers take archived records from ClickHouse only while the
// table holds that epoch's marker, and read the stream alone otherwise.
const MetaArchiveEpoch = "podium_archive_epoch"

// BucketScores is the key-value bucket of score snapshots: one key per execution, the
// rank.Evaluations.Snapshot the ranker wrote after its last commit of that execution. Only the
// latest value of a key is kept; an execution larger than the server's max payload has none,
// and composers read ClickHouse for it.
const BucketScores = "SCORES"

// ScoresBucketConfig is the configuration of BucketScores.
func ScoresBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: BucketScores, Description: "podium: each execution's score rows as of the ranker's last commit of it, so composer replicas share one ClickHouse read",
		History: 1, Replicas: max(replicas, 1), Storage: jetstream.FileStorage}
}
