package ranker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/pkg/events"
)

// Ranker replicas share one consumer, and each knows only its own runtime. When EVALUATIONS is
// deleted and made again, the ranker that begins the new stream's era must know that no replica
// can still commit a batch of the stream before: a request composed as of the new era would lack
// that batch, committed after it in the era before (lineage.go). So each ranker notes its pass in
// events.BucketRankerPasses every passEvery, and as each pass of its consumer begins, before it
// pulls: the stream its consumer's pass reads and the batches it has in hand. The era begins once
// every other ranker's note says its pass reads the new stream, or that it is in no pass, with
// nothing in hand.
//
// A ranker that died leaves a note that never changes again. A note that stood still for
// refillStale as the switching ranker watched it (its own clock, never the noter's) is fenced: the
// note is replaced, expecting its revision, by one naming the fencer (FencedBy), and no longer
// waited for. A ranker that was only paused finds, at its next note (expecting its own last
// revision), that it was fenced, and says so loudly (ranker_replica_fenced_total, an error in its
// log): a batch of the stream before that it commits from then on may be missing from prompts
// composed as of the new era. What it has in hand is never dropped: acknowledged evaluations are
// stored late rather than lost.

// passEvery is how often a ranker notes its pass: a switch waits at most about that long for a
// replica that has finished with the stream before.
const passEvery = time.Second

// passes notes this ranker's pass and reads the other replicas'.
type passes struct {
	kv  jetstream.KeyValue
	js  jetstream.JetStream
	id  string
	log *slog.Logger
	// state is this ranker's pass as it is now.
	state func() events.RankerPass
	// stale is how long another's note may stand still before it is fenced.
	stale func() time.Duration
	// fenced counts the times this ranker found itself fenced; fencedOthers the replicas it fenced.
	fenced, fencedOthers prometheus.Counter

	mu   sync.Mutex
	rev  uint64              // the revision of this ranker's last note; 0 before the first
	seen map[string]sighting // the other replicas' notes as this one last saw them
}

// sighting is a note's revision, and when this ranker first saw it at that revision (its own
// monotonic clock).
type sighting struct {
	rev   uint64
	since time.Time
}

// newPasses is a ranker's notes in kv, under a random id of its own.
func newPasses(kv jetstream.KeyValue, js jetstream.JetStream, log *slog.Logger, state func() events.RankerPass, stale func() time.Duration, m *metrics) *passes {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	id := hex.EncodeToString(b)
	return &passes{kv: kv, js: js, id: id, log: log.With("ranker_id", id), state: state, stale: stale,
		fenced: m.replicaFenced, fencedOthers: m.replicasFenced, seen: map[string]sighting{}}
}

// note writes this ranker's pass as it is now, expecting its last note to be the newest: fenced
// reports that another ranker had taken it for gone (the note is written anew all the same).
func (p *passes) note(ctx context.Context) (fenced bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := json.Marshal(p.state())
	if err != nil {
		return false, err
	}
	if p.rev == 0 {
		// Put, not Create: the key is this ranker's alone, and a Create whose answer was lost
		// would refuse every later try until the key's TTL.
		p.rev, err = p.kv.Put(ctx, p.id, b)
		return false, err
	}
	rev, err := p.kv.Update(ctx, p.id, b, p.rev)
	if err == nil {
		p.rev = rev
		return false, nil
	}
	if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, err
	}
	// Not the last note it wrote: fenced; or gone (the bucket's TTL passed while this ranker was
	// paused, or an operator deleted it), which the others may have taken for gone too; or its
	// last note was written although its answer was lost.
	was, err := p.kv.Get(ctx, p.id)
	var n events.RankerPass
	switch {
	case err == nil && json.Unmarshal(was.Value(), &n) == nil && n.FencedBy == "":
		// Its own note, whose answer was lost: written once more, now, so that the note is this
		// pass's and not the one before (a pass must be noted before it pulls).
		rev, err := p.kv.Update(ctx, p.id, b, was.Revision())
		if err == nil {
			p.rev = rev
		}
		return false, err
	case err == nil, errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		fenced = true
		p.fenced.Inc()
		p.log.Error("another ranker may have taken this one for gone (its note was fenced, or is gone) and begun a new era without waiting for it: a batch of the EVALUATIONS stream before that this ranker committed since its last note may be missing from prompts composed as of the new era; paused too long, or cut off from NATS?",
			"fenced_by", n.FencedBy)
	default:
		return false, err
	}
	// Noted anew (Put: the key is this ranker's alone).
	p.rev, err = p.kv.Put(ctx, p.id, b)
	return fenced, err
}

// run notes the pass every passEvery until ctx ends.
func (p *passes) run(ctx context.Context) {
	failing := false
	retry.Every(ctx, passEvery, func(ctx context.Context) {
		_, err := p.note(ctx)
		switch {
		case err == nil:
			failing = false
		case ctx.Err() != nil:
		case !failing:
			failing = true
			p.log.Warn("the ranker's pass could not be noted in "+events.BucketRankerPasses+"; trying every second (the other replicas fence it if this lasts)", "error", err)
		}
	})
}

// noteUntil notes the pass, trying with the shared backoff until it is noted (or stop ends): at
// start, before any batch is committed, and as each pass of the consumer begins, before it pulls
// (consume.Runtime.Starting). So a note never lags behind a pass that holds a batch: a note of no
// pass, or of the new stream, with nothing in hand, is one no batch of the stream before can follow.
func (p *passes) noteUntil(stop context.Context) error {
	return retry.Do(stop, retry.Redelivery(), func(try uint64, err error, pause time.Duration) {
		p.log.Warn("the ranker's pass is not noted in "+events.BucketRankerPasses+" yet; nothing is committed until it is", "attempt", try, "retry_in", pause.String(), "error", err)
	}, func(ctx context.Context, _ uint64) error {
		_, err := p.note(ctx)
		return err
	})
}

// inTheWay names the other rankers that may still commit a batch of a stream before stream (an
// identity, chstore.StreamID): a pass of another stream, or batches in hand.
// One whose note stood still for stale as this ranker watched it is fenced instead.
func (p *passes) inTheWay(ctx context.Context, stream string) ([]string, error) {
	notes, err := p.read(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var way []string
	for _, id := range slices.Sorted(maps.Keys(notes)) {
		n := notes[id]
		// Between two passes, or before its first, with nothing in hand: its next pass reads the
		// stream there is now (each pass is noted before it pulls: noteUntil).
		if id == p.id || n.FencedBy != "" || n.InHand == 0 && (n.Stream == "" || n.Stream == stream) {
			delete(p.seen, id)
			continue
		}
		s, ok := p.seen[id]
		if !ok || s.rev != n.rev {
			p.seen[id] = sighting{rev: n.rev, since: time.Now()}
			way = append(way, id)
			continue
		}
		if time.Since(s.since) < p.stale() {
			way = append(way, id)
			continue
		}
		fenced := n.RankerPass
		fenced.FencedBy = p.id
		b, err := json.Marshal(fenced)
		if err == nil {
			_, err = p.kv.Update(ctx, id, b, n.rev)
		}
		if err != nil {
			way = append(way, id) // it noted again meanwhile, or the fence failed: still waited for
			continue
		}
		delete(p.seen, id)
		p.fencedOthers.Inc()
		p.log.Warn("a ranker replica's notes stood still with a batch of the EVALUATIONS stream before possibly in hand; taken for gone, not waited for",
			"replica", id, "stream", n.Stream, "in_hand", n.InHand, "still_for", p.stale().String())
	}
	for id := range p.seen {
		if _, ok := notes[id]; !ok {
			delete(p.seen, id) // gone with the bucket's TTL
		}
	}
	return way, nil
}

// passNote is a note read, with its revision.
type passNote struct {
	events.RankerPass
	rev uint64
}

// read reads every ranker's note, by direct gets (the bucket keeps one message per key).
func (p *passes) read(ctx context.Context) (map[string]passNote, error) {
	stream, prefix := "KV_"+events.BucketRankerPasses, "$KV."+events.BucketRankerPasses+"."
	notes := map[string]passNote{}
	_, err := streamscan.Scan(ctx, p.js, stream, prefix+">", 0, func(m jetstream.Msg) error {
		md, err := m.Metadata()
		if err != nil {
			return err
		}
		id := strings.TrimPrefix(m.Subject(), prefix)
		if op := m.Headers().Get("KV-Operation"); op != "" {
			delete(notes, id) // deleted or purged by an operator
			return nil
		}
		var n passNote
		if err := json.Unmarshal(m.Data(), &n.RankerPass); err != nil {
			// No ranker writes it (a later version's format, or an operator's): not waited for,
			// or one such note would hold every era switch until its TTL.
			p.log.Warn("a note in "+events.BucketRankerPasses+" is not a ranker's pass; not waited for", "key", id, "error", err)
			delete(notes, id)
			return nil
		}
		n.rev = md.Sequence.Stream
		notes[id] = n
		return nil
	})
	return notes, err
}

// passNow is this ranker's pass as its runtime has it, the pass read before what is in hand
// (consume.Runtime.Pass); none once it stopped.
func (r *ranker) passNow() events.RankerPass {
	var n events.RankerPass
	if r.stopped.Load() {
		return n
	}
	var created time.Time
	if r.passOf != nil {
		if created = r.passOf(); !created.IsZero() {
			n.Stream = chstore.StreamID(created)
		}
	}
	n.InHand = r.keep.InHandBesides(created)
	return n
}

// replicasInTheWay is sink.ErrBeforeInHand naming the other rankers that may still commit a batch of a
// stream before stream; nil when none may (or no RANKER_PASSES bucket is used).
func (r *ranker) replicasInTheWay(ctx context.Context, stream string) error {
	if r.passes == nil {
		return nil
	}
	way, err := r.passes.inTheWay(ctx, stream)
	if err != nil {
		return fmt.Errorf("the other rankers' passes (%s) not read: %w", events.BucketRankerPasses, err)
	}
	if len(way) > 0 {
		return fmt.Errorf("%w: rankers %s may still commit one (their notes in %s say so)", sink.ErrBeforeInHand, strings.Join(way, ", "), events.BucketRankerPasses)
	}
	return nil
}
