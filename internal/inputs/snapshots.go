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
// through a sequence, written after its last commit. Every composer replica reads the same value
// from JetStream instead of the same rows from ClickHouse; a snapshot that is missing, or not
// complete through the sequence a request waits for, leaves that execution to ClickHouse.
type snapshots struct {
	js    jetstream.JetStream
	clock Clock

	mu      sync.Mutex // guards kv and retryAt; never held across I/O
	kv      jetstream.KeyValue
	retryAt time.Time // no bucket: look again after this
}

// noBucketFor is how long a composer goes without looking for a bucket it did not find.
const noBucketFor = 10 * time.Second

func newSnapshots(js jetstream.JetStream, clock Clock) *snapshots {
	return &snapshots{js: js, clock: clock}
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

// read returns, of the executions asked (each with the sequence its requests wait for), those
// whose snapshot is complete through it. The gets run at once.
func (s *snapshots) read(ctx context.Context, need map[string]uint64) map[string]*rank.Evaluations {
	kv := s.bucket(ctx)
	if kv == nil {
		return nil
	}
	got := make(map[string]*rank.Evaluations, len(need))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for exec, seq := range need {
		g.Go(func() error {
			e, err := kv.Get(gctx, exec)
			if err != nil {
				if !errors.Is(err, jetstream.ErrKeyNotFound) {
					s.forget()
				}
				return nil // ClickHouse serves it
			}
			ev, through, err := rank.ParseSnapshot(e.Value())
			if err != nil || through < seq {
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

// forget drops the bucket handle after a failed get, so the next read looks it up again.
func (s *snapshots) forget() {
	s.mu.Lock()
	s.kv = nil
	s.mu.Unlock()
}
