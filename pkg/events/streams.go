package events

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
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
	StreamAudit        = "AUDIT"
)

// StreamNames are the contract's streams, in the order the docs list them.
func StreamNames() []string {
	return []string{StreamEvaluations, StreamRounds, StreamPrompts, StreamLeaderboards, StreamDeadLetter, StreamAudit}
}

// Durable consumer names: every replica of a service shares its durable.
const (
	ConsumerRanker   = "ranker"
	ConsumerComposer = "composer"
	ConsumerArchiver = "archiver"
)

// StreamOptions are the operator's choices that shape the streams.
type StreamOptions struct {
	Replicas    int       // STREAM_REPLICAS
	Prompts     Retention // PROMPTS_MAX_AGE, PROMPTS_MAX_BYTES
	Evaluations Retention // EVALUATIONS_MAX_AGE, EVALUATIONS_MAX_BYTES
	// StateMaxIdle is how long the last leaderboard.updated of an execution stays in
	// LEADERBOARDS after its last update (STATE_MAX_IDLE); 0 keeps it for ever.
	StateMaxIdle time.Duration
}

// Retention is the retention of one stream as the configuration sets it. A nil field is not the
// configuration's: EnsureStreams leaves what the stream has (an operator's `nats stream edit`
// stands), and a new stream has no such limit.
type Retention struct {
	MaxAge   *time.Duration // 0: for ever
	MaxBytes *int64         // 0 or -1: no bound
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
		MaxBytes:   -1,
		// Every stream is read by direct gets, answered by any replica without its leader:
		// composers read each evaluation's content so, and every scan (refills, audits, the
		// console) reads without a consumer, so a role that may read a stream need not be
		// one that may touch its consumers (docs/operating.md, the roles table).
		AllowDirect: true,
	}
	switch name {
	case StreamEvaluations:
		cfg.Description = "evaluation.completed events: the ranker's input and the replay source of every leaderboard"
		cfg.Subjects = []string{TypeEvaluationCompleted + ".>"}
		o.Evaluations.apply(&cfg)
	case StreamRounds:
		cfg.Description = "round.requested events: the composer's input"
		cfg.Subjects = []string{TypeRoundRequested + ".>"}
	case StreamPrompts:
		cfg.Description = "prompt.composed and prompt.failed: the audit log of every prompt"
		cfg.Subjects = []string{TypePromptComposed + ".>", TypePromptFailed + ".>"}
		cfg.DenyDelete = true
		cfg.DenyPurge = true
		// Longer than any redelivery of a request, so a prompt composed twice is stored once.
		cfg.Duplicates = 10 * time.Minute
		// Each round's prompt repeats most of the last one: compressed blocks take a fraction of
		// the disk (docs/operating.md, "Disk plan").
		cfg.Compression = jetstream.S2Compression
		o.Prompts.apply(&cfg)
	case StreamLeaderboards:
		cfg.Description = "leaderboard.updated: the last leaderboard of each execution"
		cfg.Subjects = []string{TypeLeaderboardUpdated + ".>"}
		cfg.MaxMsgsPerSubject = 1
		// An execution's last board goes once it has been idle this long: the ranker's API and
		// ClickHouse keep every board.
		cfg.MaxAge = o.StateMaxIdle
	case StreamDeadLetter:
		cfg.Description = "events that can never be processed, byte for byte, with Dead-Reason, Dead-Stream and Dead-Sequence headers"
		cfg.Subjects = []string{"deadletter.>"}
	case StreamAudit:
		cfg.Description = "signed checkpoints of the audit log over PROMPTS (docs/audit.md), and the losses of evaluations operators accepted (docs/operating.md)"
		cfg.Subjects = []string{"audit.>"}
		// What was signed stays: an auditor checks each checkpoint against the next.
		cfg.DenyDelete = true
		cfg.DenyPurge = true
	default:
		return jetstream.StreamConfig{}, fmt.Errorf("events: unknown stream %q", name)
	}
	cfg.Duplicates = window(cfg.Duplicates, cfg.MaxAge)
	return cfg, nil
}

// apply sets the limits the configuration holds.
func (l Retention) apply(cfg *jetstream.StreamConfig) {
	if l.MaxAge != nil {
		cfg.MaxAge = *l.MaxAge
	}
	if l.MaxBytes != nil {
		cfg.MaxBytes = *l.MaxBytes
		if cfg.MaxBytes == 0 {
			cfg.MaxBytes = -1
		}
	}
}

// window is a duplicate window that fits a stream's MaxAge, as the server requires.
func window(dup, maxAge time.Duration) time.Duration {
	if maxAge > 0 && dup > maxAge {
		return maxAge
	}
	return dup
}

// EnsureStreams creates the named streams, or updates what the configuration owns of those that
// exist; running it again changes nothing. What it owns: subjects, description, replicas, the
// duplicate window, deny-delete and deny-purge (PROMPTS, AUDIT), PROMPTS' compression (other
// streams' compression is an operator's choice), direct gets,
// LEADERBOARDS' one message per subject and age (STATE_MAX_IDLE), and the limits of Retention that
// are set. Everything else an operator set on the server (a limit the configuration leaves unset,
// discard policy, placement, sources) is left as it is, so a restart never reverts it.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions, names ...string) error {
	for _, name := range names {
		want, err := StreamConfig(name, o)
		if err != nil {
			return err
		}
		if err := ensureStream(ctx, js, want, o); err != nil {
			return fmt.Errorf("events: ensure stream %s: %w", name, err)
		}
	}
	return nil
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig, o StreamOptions) error {
	for range 3 {
		st, err := js.Stream(ctx, want.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			_, err = js.CreateStream(ctx, want)
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				continue // another service made it meanwhile: update it as it is
			}
			return err
		}
		if err != nil {
			return err
		}
		have := st.CachedInfo().Config
		next := Owned(have, want, o)
		if reflect.DeepEqual(next, have) {
			return nil
		}
		_, err = js.UpdateStream(ctx, next)
		return err
	}
	return errors.New("created and deleted again while it was being made")
}

// Drift is how an existing stream differs from what the configuration owns of it: one line a
// field, "field: have → want".
type Drift struct {
	Stream string
	Fields []string
	Next   jetstream.StreamConfig // the configuration an operator's apply sets
}

// MakeStreams creates the named streams that are missing, with their configuration, and changes
// no stream that exists (a service: changing a stream's limits is the operator's, `podium streams
// apply`); it returns how each existing one differs from the configuration, for the service to say.
func MakeStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions, names ...string) ([]Drift, error) {
	var drifts []Drift
	for _, name := range names {
		want, err := StreamConfig(name, o)
		if err != nil {
			return nil, err
		}
		st, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err = js.CreateStream(ctx, want); errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				err = nil // another service made it meanwhile
			}
			if err != nil {
				return nil, fmt.Errorf("events: make stream %s: %w", name, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("events: stream %s: %w", name, err)
		}
		if d := StreamDrift(st.CachedInfo().Config, want, o); len(d.Fields) > 0 {
			drifts = append(drifts, d)
		}
	}
	return drifts, nil
}

// StreamDrift says how have differs from what the configuration owns (Owned).
func StreamDrift(have, want jetstream.StreamConfig, o StreamOptions) Drift {
	next := Owned(have, want, o)
	return Drift{Stream: have.Name, Fields: ConfigDiff(have, next), Next: next}
}

// ConfigDiff lists the fields of a stream's configuration that differ, "field: have → want", in the
// order of the type's fields (JSON names, as nats stream info shows them).
func ConfigDiff(have, want jetstream.StreamConfig) []string {
	var out []string
	hv, wv := reflect.ValueOf(have), reflect.ValueOf(want)
	for i := range hv.NumField() {
		f := hv.Type().Field(i)
		if !f.IsExported() || reflect.DeepEqual(hv.Field(i).Interface(), wv.Field(i).Interface()) {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		out = append(out, fmt.Sprintf("%s: %v → %v", name, hv.Field(i).Interface(), wv.Field(i).Interface()))
	}
	return out
}

// Owned is have (a stream's configuration on the server) with what the configuration owns set
// from want (see EnsureStreams).
func Owned(have, want jetstream.StreamConfig, o StreamOptions) jetstream.StreamConfig {
	next := have
	next.Subjects, next.Description, next.Replicas = want.Subjects, want.Description, want.Replicas
	next.DenyDelete, next.DenyPurge, next.AllowDirect = want.DenyDelete, want.DenyPurge, want.AllowDirect
	var l Retention
	switch want.Name {
	case StreamPrompts:
		l = o.Prompts
		next.Compression = want.Compression
	case StreamEvaluations:
		l = o.Evaluations
	case StreamLeaderboards:
		next.MaxAge, next.MaxMsgsPerSubject = want.MaxAge, want.MaxMsgsPerSubject
	}
	l.apply(&next)
	dup := 2 * time.Minute
	if want.Name == StreamPrompts {
		dup = 10 * time.Minute
	}
	next.Duplicates = window(dup, next.MaxAge)
	return next
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
// (chstore.Lineage.ID; score snapshots of another lineage are stale), and whether the ranker is
// refilling the store from the stream (then nothing read from ClickHouse is whole, and requests
// wait as they wait for a commit), and the era of the stream the lineage names (a decimal number;
// absent: 0): the stream deleted and made again starts a new era, whose sequences start over, and
// a prompt is composed as of a position (era, sequence) (docs/contract.md#read-your-writes), and
// the lineage's anchor row (a JSON array [execution_id, team_id, event_id, era, seq]; absent
// while the table held none), which composers read in the same query as the rows they read, so
// that a table emptied under them is found, not read short; the oldest era the table holds rows
// of (MetaStoreFloor, a decimal number), which a ranker started after its store was lost reads to
// know what was lost; and, while the store lost evaluations that no stream holds any more, that
// loss (MetaStoreLoss, a StoreLoss as JSON), waiting for an operator's `podium store
// accept-loss`.
const (
	MetaStoreLineage   = "podium_store_lineage"
	MetaStoreRefilling = "podium_store_refilling"
	MetaStoreEra       = "podium_store_era"
	MetaStoreAnchor    = "podium_store_anchor"
	MetaStoreFloor     = "podium_store_floor"
	MetaStoreLoss      = "podium_store_loss"
)

// StoreLoss is evaluations the ranker's store lost for good: its table lost (dropped, emptied)
// while it held rows of eras whose streams were deleted since. The ranker names it on its
// consumer (MetaStoreLoss) and stays unready, composing nothing, until an operator accepts it
// (`podium store accept-loss`), which records it on AUDIT (SubjectLossAccepted) with a reason.
type StoreLoss struct {
	// Lineage is the store lineage whose rows were lost (its epoch and stream).
	Lineage string `json:"lineage"`
	// FromEra and ToEra are the eras lost, both included.
	FromEra uint32 `json:"from_era"`
	ToEra   uint32 `json:"to_era"`
	// Executions are those that had evaluations of a lost era, as what was derived from the
	// store says: their score snapshots (SCORES), or their last leaderboard (LEADERBOARDS) for
	// one too large for a snapshot.
	Executions []string `json:"executions"`
	// MoreExecutions counts those left out of Executions, which names the first
	// StoreLossExecutions in order: the loss must fit in a consumer's metadata.
	MoreExecutions int `json:"more_executions,omitempty"`
	// Reason is the operator's, on an accepted loss.
	Reason string `json:"reason,omitempty"`
}

// StoreLossExecutions is the most executions a StoreLoss names.
const StoreLossExecutions = 100

// SubjectLossAccepted is the AUDIT subject of an accepted loss of evaluations (a StoreLoss with its
// reason); SubjectArchiveLossAccepted that of an accepted loss of prompt records: the prompts
// archive's table lost while it held the records of PROMPTS streams deleted since (MetaArchiveLoss).
const (
	SubjectLossAccepted        = "audit.loss.evaluations"
	SubjectArchiveLossAccepted = "audit.loss.prompts"
)

// The archiver's consumer carries the state of the prompts archive as the ranker's carries its
// store's (the same fields, read the same way: internal/sink/state.go): the lineage its ack floor
// speaks of (archive_lineage, 0006_archive_lineage.sql), the era of PROMPTS that lineage names, the
// oldest era the archive holds rows of, the anchor row, why a refill runs, and a loss waited on.
// Readers take archived records from ClickHouse only while the archive's newest lineage is the one
// named, whole, and the table holds its anchor; they read the stream alone otherwise.
const (
	MetaArchiveLineage   = "podium_archive_lineage"
	MetaArchiveRefilling = "podium_archive_refilling"
	MetaArchiveEra       = "podium_archive_era"
	MetaArchiveAnchor    = "podium_archive_anchor"
	MetaArchiveFloor     = "podium_archive_floor"
	MetaArchiveLoss      = "podium_archive_loss"
)

// BucketScores is the key-value bucket of score snapshots: one key per execution, the
// rank.Evaluations.Snapshot the ranker wrote after its last commit of that execution. Only the
// latest value of a key is kept; an execution larger than the server's max payload has none,
// and composers read ClickHouse for it.
const BucketScores = "SCORES"

// ScoresBucketConfig is the configuration of BucketScores: a key goes once its execution has had
// no commit for maxIdle (0: never), and composers then read ClickHouse for it.
func ScoresBucketConfig(replicas int, maxIdle time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: BucketScores, Description: "podium: each execution's score rows as of the ranker's last commit of it, so composer replicas share one ClickHouse read",
		History: 1, Replicas: max(replicas, 1), Storage: jetstream.FileStorage, TTL: maxIdle}
}

// BucketRankerPasses is the ranker replicas' own bucket: one key per running ranker (a random id
// it takes at start), holding what its consumer's pass reads and how many batches it has in hand
// (RankerPass), noted every second. A ranker that is to begin the era of a stream made again waits
// until no other replica can still commit a batch of the stream before (docs/reliability.md).
// Nothing outside the rankers reads it.
const BucketRankerPasses = "RANKER_PASSES"

// RankerPassesBucketConfig is the configuration of BucketRankerPasses: a key not noted again for
// ten minutes (its ranker gone) goes.
func RankerPassesBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: BucketRankerPasses, Description: "podium: each ranker replica's consumer pass and the batches it has in hand, so that an era begins only once no replica can commit a batch of the stream before",
		History: 1, Replicas: max(replicas, 1), Storage: jetstream.FileStorage, TTL: 10 * time.Minute}
}

// RankerPass is the value of a BucketRankerPasses key.
type RankerPass struct {
	// Stream is the identity (the creation time, as the store's lineage writes it) of the stream
	// the running pass reads; empty before the first pass and between two (a consumer lost with
	// its stream, not yet made again).
	Stream string `json:"stream,omitempty"`
	// InHand counts the batches handed over by the consumer's passes and not yet settled.
	InHand int64 `json:"in_hand"`
	// FencedBy names the ranker that found this one's notes standing still and took it for gone:
	// from then on it is not waited for, and it says so when it notes again.
	FencedBy string `json:"fenced_by,omitempty"`
}

// BucketAnswered is the key-value bucket of answered requests: one key per request whose answer
// PROMPTS took, named by the answer's event id (PromptEventID), holding the answer's PROMPTS
// sequence. PROMPTS' duplicate window keeps one answer per request for ten minutes; this bucket
// keeps the promise for as long as PROMPTS keeps the answer (docs/contract.md#one-answer-per-request).
const BucketAnswered = "ANSWERED"

// AnsweredBucketConfig is the configuration of BucketAnswered: a key lives as long as a PROMPTS
// record (promptsMaxAge, 0: for ever), so a request is answered once while its answer can be read.
func AnsweredBucketConfig(replicas int, promptsMaxAge time.Duration) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: BucketAnswered, Description: "podium: every request whose answer PROMPTS took, by the answer's event id, with its PROMPTS sequence",
		History: 1, Replicas: max(replicas, 1), Storage: jetstream.FileStorage, TTL: promptsMaxAge}
}

// Answered is the value of a BucketAnswered key.
type Answered struct {
	PromptsSeq uint64 `json:"prompts_seq"` // where PROMPTS holds the request's one answer
}
