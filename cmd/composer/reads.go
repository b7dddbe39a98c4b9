package main

import (
	"context"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/podium-llm/podium/pkg/rank"
)

// maxSharedBytes bounds the memory of kept snapshots. A snapshot of 10 teams and 5 rounds of
// 2 KiB submissions is about 100 KiB, so this keeps a few hundred executions' rounds.
const maxSharedBytes = 64 << 20

// sharedReads lets the requests of one execution's round share one ClickHouse read: a read in
// flight is joined (singleflight), and a finished one is kept for ttl.
//
// A snapshot is keyed by the EVALUATIONS sequence the request waited for. Every request with
// the same key needs exactly the evaluations up to that sequence, and the snapshot was read
// after the ranker committed them, so sharing it never breaks read-your-writes; an evaluation
// accepted later moves the sequence and so the key.
type sharedReads struct {
	read  func(ctx context.Context, executionID string, beforeRound int) (*rank.Snapshot, error)
	ttl   time.Duration
	m     *metrics
	now   func() time.Time
	group singleflight.Group

	mu    sync.Mutex
	kept  map[readKey]keptSnapshot
	order []keptSnapshot // in the order kept, hence of expiry, for eviction
	bytes int
}

type readKey struct {
	executionID string
	beforeRound int
	seq         uint64
}

type keptSnapshot struct {
	key     readKey
	sn      *rank.Snapshot
	expires time.Time
}

func newSharedReads(read func(context.Context, string, int) (*rank.Snapshot, error), ttl time.Duration, m *metrics) *sharedReads {
	return &sharedReads{read: read, ttl: ttl, m: m, now: time.Now, kept: make(map[readKey]keptSnapshot)}
}

// get returns the snapshot of an execution before a round that reflects at least seq.
func (s *sharedReads) get(ctx context.Context, executionID string, beforeRound int, seq uint64) (*rank.Snapshot, error) {
	key := readKey{executionID, beforeRound, seq}
	if sn := s.lookup(key); sn != nil {
		s.m.storeReads.WithLabelValues("cached").Inc()
		return sn, nil
	}
	flight := executionID + "\x00" + strconv.Itoa(beforeRound) + "\x00" + strconv.FormatUint(seq, 10)
	// The read runs detached from the first caller's context so that a caller giving up does not
	// fail the others that joined it; the store's own read timeout still bounds it.
	queried := false
	ch := s.group.DoChan(flight, func() (any, error) {
		queried = true // read after the channel delivers the result, so no race
		start := time.Now()
		sn, err := s.read(context.WithoutCancel(ctx), executionID, beforeRound)
		s.m.storeRead.Observe(time.Since(start).Seconds())
		if err == nil {
			s.keep(key, sn)
		}
		return sn, err
	})
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		// Every caller of a shared flight sees res.Shared, the one that ran the query too.
		outcome := "shared"
		if queried {
			outcome = "queried"
		}
		s.m.storeReads.WithLabelValues(outcome).Inc()
		return res.Val.(*rank.Snapshot), nil
	}
}

func (s *sharedReads) lookup(key readKey) *rank.Snapshot {
	if s.ttl <= 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.kept[key]
	if !ok || !s.now().Before(k.expires) {
		return nil
	}
	return k.sn
}

func (s *sharedReads) keep(key readKey, sn *rank.Snapshot) {
	if s.ttl <= 0 || sn.Bytes() > maxSharedBytes/4 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := keptSnapshot{key: key, sn: sn, expires: now.Add(s.ttl)}
	if old, ok := s.kept[key]; ok {
		s.bytes -= old.sn.Bytes() // its entry in order is now stale and is skipped below
	}
	s.kept[key] = k
	s.order = append(s.order, k)
	s.bytes += sn.Bytes()
	// Entries are kept in order of expiry, so the expired and the oldest are at the front.
	for len(s.order) > 0 {
		first := s.order[0]
		current := s.kept[first.key]
		if current.sn == first.sn && current.expires.Equal(first.expires) {
			if now.Before(first.expires) && s.bytes <= maxSharedBytes {
				break
			}
			s.bytes -= first.sn.Bytes()
			delete(s.kept, first.key)
		}
		s.order = s.order[1:]
	}
}
