package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
)

// A Keeper keeps a table a whole view of its stream: the check, the anchor, the era, the refill
// and the loss (check.go, refill.go, loss.go), for whichever service writes the table. What differs
// between tables is what it is given: the store of the table's lineage and anchor (Table), how a
// message becomes a row (Rows), and the service's hooks (Config).
//
// Commits and the keeper take turns (Serial): no commit moves the consumer's ack floor while the
// table is checked or refilled, so what the ack floor says is stored is always in a whole table.

// Table is what a keeper reads and notes of the ClickHouse store that holds the table.
type Table interface {
	// Lineage is the newest lineage noted; false when none was.
	Lineage(ctx context.Context) (chstore.Lineage, bool, error)
	NoteLineage(ctx context.Context, l chstore.Lineage) error
	// NextEpoch is the epoch of a new derivation, after every one noted.
	NextEpoch(ctx context.Context, now time.Time) (uint64, error)
	// Holds reports whether the table holds the row an anchor names, at its position.
	Holds(ctx context.Context, k chstore.RowKey) (bool, error)
	// NewestRow, OldestEra and RowStreams tell what a table found without a lineage holds.
	NewestRow(ctx context.Context) (chstore.RowKey, bool, error)
	OldestEra(ctx context.Context) (uint32, error)
	RowStreams(ctx context.Context, row chstore.RowKey, stream string) (chstore.RowStreams, error)
}

// Rows is how the stream's messages become the table's rows: one way for live writes, refills and
// rebuilds alike.
type Rows[R any] struct {
	// Filter is the subjects of the stream the table holds.
	Filter string
	// Of is a message's row, read from the stream at o; an error for a message that is not one
	// (the service dead-lettered it when it came: a refill skips it).
	Of func(msg jetstream.Msg, o Origin) (R, error)
	// Key is a row's key and position: what an anchor names.
	Key func(R) chstore.RowKey
}

// Origin is the stream a message was read from: its creation time (its identity) and its era.
type Origin struct {
	Created time.Time
	Era     uint32
}

// State is what a keeper publishes on its service's consumer, where readers and what was derived
// from the table hear of it: the lineage, why a refill runs (empty: none), and a loss waited on.
type State struct {
	Lineage   chstore.Lineage
	Refilling string
	Loss      *events.StoreLoss
}

// Losses is how a service names what its lost table lost (loss.go).
type Losses interface {
	// Of is what a table derived as lin lost, the stream now being stream: nil when the stream
	// holds everything the table held.
	Of(ctx context.Context, lin chstore.Lineage, stream string) (*events.StoreLoss, error)
	// Accepted reports whether an operator accepted the loss of the lineage.
	Accepted(ctx context.Context, lineage string) (bool, error)
	// Text is the loss as the service names it (its log, its readiness, its consumer).
	Text(l events.StoreLoss) string
}

// Config is what a keeper is given.
type Config[R any] struct {
	JS    jetstream.JetStream
	Table Table
	Rows  Rows[R]
	// Write stores rows (a Writer's Write, and whatever the service adds): the refused ones by
	// their place, ErrTableLost when the table is missing.
	Write func(ctx context.Context, rows []R) (map[int]error, error)
	// Repair makes the database and the tables the migrations own again.
	Repair func(ctx context.Context) error
	// View names the table and its stream, holds the "whole" condition and tries refills.
	View *View
	Log  *slog.Logger
	// Keys name the keeper's State in the metadata of the service's durable Consumer of the
	// stream (state.go); SetMetadata sets that metadata (consume.Runtime.SetMetadata; nil: nothing
	// is published, as in some tests). What the consumer carries outlives the table's lineage.
	Keys        Keys
	Consumer    string
	SetMetadata func(ctx context.Context, md map[string]string) error
	// Consumes reports whether batches of the stream created then are all that can still come
	// (consume.Runtime.Consumes; nil: no consumer runs, as in some tests).
	Consumes func(created time.Time) bool
	// Replicas is ErrBeforeInHand naming the other replicas that may still commit a batch of a
	// stream before stream (nil: one replica).
	Replicas func(ctx context.Context, stream string) error
	// Losses names what a lost table lost (nil: a loss is never named).
	Losses Losses
	// EraFloor is the least era a lineage takes when nothing remembers the one before (the table's
	// lineage and the consumer's metadata both lost): the highest era what was derived from the
	// table names (nil: 0). Eras then never go back, though a stream made again meanwhile is not
	// told from the one before.
	EraFloor func(ctx context.Context) (uint32, error)
	// Refilling is held for the whole of a refill (the ranker's boards are not read meanwhile);
	// it returns what ends it. nil: nothing is.
	Refilling func() (done func())
	// Now is the clock of epochs (time.Now).
	Now func() time.Time
	// Batch and BatchBytes bound one write of a refill (defaults 1000 rows, 8 MiB).
	Batch, BatchBytes int
	// StaleAfter replaces RefillStale and Grace chstore.RefillGrace in tests; 0 in the services.
	StaleAfter, Grace time.Duration
	// BeforeRepublish forces an interleaving in tests: asPublished calls it once it found the
	// table as published; nil in the services.
	BeforeRepublish func()
}

// Keeper keeps one table whole.
type Keeper[R any] struct {
	cfg Config[R]

	// mu is held by each commit (Serial) and by a check or a refill; waiting counts the commits
	// waiting for it: a batch of a stream deleted since may be among them (a runtime hands a
	// batch over before its pass ends), so no era switch happens while one waits.
	mu      sync.Mutex
	waiting atomic.Int64
	// inHand counts the batches handed to the service's stage and not yet settled, by stream
	// (InHand): a batch handed over is in hand before it waits for the lock.
	inHand inHand
	// publishMu orders the publications of the state: a check that found the table as published
	// republishes it only while it is still the one published (asPublished).
	publishMu sync.Mutex
	published atomic.Pointer[chstore.Lineage]
	// before is the lineage the published one replaced when the stream was made again: a batch
	// consumed from the stream before and committed after keeps that stream's era (EraOf).
	before    atomic.Pointer[chstore.Lineage]
	refilling atomic.Pointer[string]           // why, while a refill runs
	loss      atomic.Pointer[events.StoreLoss] // a loss waiting for an operator (loss.go)
	recheck   chan struct{}                    // wakes Watch at once (CheckSoon)
}

// NewKeeper is a keeper of the table cfg names.
func NewKeeper[R any](cfg Config[R]) *Keeper[R] {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Keeper[R]{cfg: cfg, recheck: make(chan struct{}, 1)}
}

// Serial runs commit with the table's lock held: commits and the keeper's checks and refills take
// turns (a runtime's consume.Stage.Serial).
func (k *Keeper[R]) Serial(commit func()) {
	k.waiting.Add(1)
	k.mu.Lock()
	k.waiting.Add(-1)
	defer k.mu.Unlock()
	commit()
}

// InHand hears of each batch handed to the service's stage (n = 1) and of it settled (n = -1),
// with the stream it was consumed from (consume.Stage.InHand): no era switch while a batch of
// another stream than the new one is in hand, whether it waits for the lock yet or not.
func (k *Keeper[R]) InHand(stream time.Time, n int) { k.inHand.add(stream, n) }

// InHandBesides counts the batches in hand of other streams than pass (all of them when pass is
// zero): what a ranker tells its replicas it holds (internal/ranker/passes.go).
func (k *Keeper[R]) InHandBesides(pass time.Time) int64 { return k.inHand.besides(pass) }

// inHand counts batches in hand by the stream they were consumed from.
type inHand struct {
	mu sync.Mutex
	by map[time.Time]int
}

func (h *inHand) add(stream time.Time, n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.by == nil {
		h.by = map[time.Time]int{}
	}
	if h.by[stream] += n; h.by[stream] <= 0 {
		delete(h.by, stream)
	}
}

// besides counts the batches in hand of other streams than pass (all of them when pass is zero):
// batches of the stream a switch is to never hold it, or under load replicas would wait for each
// other's.
func (h *inHand) besides(pass time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for stream, c := range h.by {
		if pass.IsZero() || !stream.Equal(pass) {
			n += int64(c)
		}
	}
	return n
}

// Published is the lineage the keeper published last; nil before the first.
func (k *Keeper[R]) Published() *chstore.Lineage { return k.published.Load() }

// RefillReason says why a refill runs; empty when none does.
func (k *Keeper[R]) RefillReason() string {
	if why := k.refilling.Load(); why != nil {
		return *why
	}
	return ""
}

// Loss is the loss the keeper waits on for an operator; nil when none.
func (k *Keeper[R]) Loss() *events.StoreLoss { return k.loss.Load() }

// CheckSoon has the table checked now rather than at the next checkEvery: the consumer was made
// again, perhaps on a stream made again (a new era, which requests wait for), or a read found the
// anchor gone.
func (k *Keeper[R]) CheckSoon() {
	select {
	case k.recheck <- struct{}{}:
	default: // one is due already
	}
}

// Publish tells the service's consumer lin and whether a refill runs (why, or empty), with the
// loss waited on, if any.
func (k *Keeper[R]) Publish(ctx context.Context, lin chstore.Lineage, refilling string) error {
	k.publishMu.Lock()
	defer k.publishMu.Unlock()
	return k.publishLocked(ctx, lin, refilling)
}

// publishLocked is Publish with publishMu held.
func (k *Keeper[R]) publishLocked(ctx context.Context, lin chstore.Lineage, refilling string) error {
	if k.cfg.SetMetadata != nil {
		md, err := k.cfg.Keys.Metadata(State{Lineage: lin, Refilling: refilling, Loss: k.loss.Load()})
		if err == nil {
			err = k.cfg.SetMetadata(ctx, md)
		}
		if err != nil {
			return fmt.Errorf("publish the lineage of %s on the consumer: %w", k.cfg.View.What, err)
		}
	}
	k.published.Store(&lin)
	return nil
}

// AnchorAfter gives a lineage without an anchor (noted while the table was empty) the first of
// rows a commit stored, so that losing the table from then on is seen. Commits held. An error when
// the anchor could not be noted: the commit is not acknowledged (its rows are written again when it
// comes again), for a table emptied meanwhile would be taken for whole by a lineage anchored on
// later rows.
func (k *Keeper[R]) AnchorAfter(ctx context.Context, rows []R) error {
	lin := k.published.Load()
	if lin == nil || lin.Anchor != (chstore.RowKey{}) || len(rows) == 0 {
		return nil
	}
	next := *lin
	next.Anchor = k.cfg.Rows.Key(rows[0])
	if err := k.cfg.Table.NoteLineage(ctx, next); err != nil {
		return fmt.Errorf("the anchor of %s not noted: %w", k.cfg.View.What, err)
	}
	// Readers anchor their reads on it (chstore/anchored.go); the table's lineage names it already.
	if err := k.Publish(ctx, next, ""); err != nil {
		k.cfg.Log.Warn("lineage anchor not published; the next check publishes it", "table", k.cfg.View.What, "error", err)
	}
	return nil
}

// EraOf is the era of the stream created then (a batch's, consume.StreamOf), commits held: the
// published lineage's when it names that stream. A batch of a stream made again since the lineage
// was noted has the table checked first, which notes the new stream's lineage with the next era;
// one of the stream before (consumed before the delete, committed after) keeps that stream's era.
func (k *Keeper[R]) EraOf(ctx context.Context, created time.Time) (uint32, error) {
	if created.IsZero() {
		// The runtime could not read which stream delivered it. Taking the stream as it is now
		// would give a batch of a stream deleted since the era of the new one: given back, read
		// again with its stream known.
		return 0, fmt.Errorf("the %s stream the batch was consumed from is not known", k.cfg.View.Stream)
	}
	stream := chstore.StreamID(created)
	for checked := false; ; checked = true {
		if lin := k.published.Load(); lin != nil && lin.Stream == stream {
			return lin.Era, nil
		}
		if was := k.before.Load(); was != nil && was.Stream == stream {
			return was.Era, nil
		}
		if checked {
			return 0, fmt.Errorf("the batch is of a %s stream (%s) that the lineage of %s does not name", k.cfg.View.Stream, stream, k.cfg.View.What)
		}
		if err := k.CheckLocked(ctx); err != nil {
			return 0, err
		}
	}
}

// streamInfo reads the stream's identity and state.
func (k *Keeper[R]) streamInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	st, err := k.cfg.JS.Stream(ctx, k.cfg.View.Stream)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", k.cfg.View.Stream, err)
	}
	return st.CachedInfo(), nil
}

// errorOf marks a missing table as ErrTableLost.
func errorOf(err error) error {
	if chstore.FaultOf(err) == chstore.Missing {
		return fmt.Errorf("%w: %v", ErrTableLost, err)
	}
	return err
}

// ErrBeforeInHand is an era switch put off while batches of the stream before may still come.
var ErrBeforeInHand = errors.New("the stream was made again, and batches of the one before may still be committed: its era begins once the service consumes the new stream")
