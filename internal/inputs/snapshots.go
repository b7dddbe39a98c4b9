package inputs

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// snapshots read the ranker's score snapshots (events.BucketScores): an execution's rows, complete
// through a sequence T (the ranker's ack floor before it read them), written after its commits.
// Every composer replica reads the same value from JetStream instead of the same rows from
// ClickHouse.
//
// A request waits for a sequence S, usually past T: other executions' evaluations arrived since.
// The snapshot still holds every evaluation of its execution up to S when the EVALUATIONS stream
// has none of that execution's after T up to S; one direct get (the next message of the
// execution's subjects from T+1) tells. A snapshot that is missing, or stale by that rule, leaves
// the execution to ClickHouse.
//
// A snapshot also names the store lineage it was read from: one of another lineage than the
// ranker publishes now was read from a store since refilled, rebuilt or recreated, and is stale
// whatever its sequence says.
type snapshots struct {
	js      jetstream.JetStream
	clock   Clock
	lineage *lineage

	stream  *evaluationsStream
	mu      sync.Mutex // guards kv and retryAt; never held across I/O
	kv      jetstream.KeyValue
	retryAt time.Time // no bucket: look again after this
}

// noBucketFor is how long a composer goes without looking for a bucket it did not find.
const noBucketFor = 10 * time.Second

func newSnapshots(js jetstream.JetStream, stream *evaluationsStream, clock Clock, l *lineage) *snapshots {
	return &snapshots{js: js, clock: clock, stream: stream, lineage: l}
}

func (s *snapshots) bucket(ctx context.Context) jetstream.KeyValue {
	s.mu.Lock()
	kv, retryAt := s.kv, s.retryAt
	s.mu.Unlock()
	if kv != nil || s.clock.Now().Before(retryAt) {
		return kv
	}
	kv, err := s.js.KeyValue(ctx, events.BucketScores)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.retryAt = s.clock.Now().Add(noBucketFor)
		return nil
	}
	s.kv = kv
	return kv
}

// read returns, of the executions asked (each with the position its requests wait for), those
// whose snapshot is complete through it. The gets run at once.
func (s *snapshots) read(ctx context.Context, need map[string]rank.Pos) map[string]*rank.Evaluations {
	kv := s.bucket(ctx)
	if kv == nil {
		return nil
	}
	got := make(map[string]*rank.Evaluations, len(need))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for exec, pos := range need {
		g.Go(func() error {
			e, err := kv.Get(gctx, exec)
			if err != nil {
				if !errors.Is(err, jetstream.ErrKeyNotFound) {
					s.forget()
				}
				return nil // ClickHouse serves it
			}
			ev, d, err := rank.ParseSnapshot(e.Value())
			if err != nil || !s.complete(gctx, exec, d, pos) {
				return nil
			}
			mu.Lock()
			got[exec] = ev
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	return got
}

// complete reports whether a snapshot holds every evaluation of exec up to pos: it is of the
// lineage the ranker publishes, and pos is of an earlier era than its stream's (the snapshot holds
// every row of those), or its rows are complete through pos's sequence.
func (s *snapshots) complete(ctx context.Context, exec string, d rank.Derivation, pos rank.Pos) bool {
	era, serves := s.lineage.serves(d.Lineage)
	switch {
	case !serves || pos.Era > era:
		return false
	case pos.Era < era:
		return true
	}
	return d.Through >= pos.Seq || s.nothingSince(ctx, exec, d.Through, pos.Seq)
}

// nothingSince reports whether EVALUATIONS holds no message of the execution's subjects after
// sequence from, up to to: then a snapshot complete through from is complete through to.
func (s *snapshots) nothingSince(ctx context.Context, exec string, from, to uint64) bool {
	next, err := s.stream.next(ctx, events.TypeEvaluationCompleted+"."+exec+".*", from+1)
	if err != nil {
		s.forget()
		return false
	}
	return next == 0 || next > to // nothing of it since from, or only after to
}

// forget drops the handles after a failed read, so the next read looks them up again.
func (s *snapshots) forget() {
	s.mu.Lock()
	s.kv = nil
	s.mu.Unlock()
	s.stream.forget()
}
