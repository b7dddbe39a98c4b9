package inputs

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/podium-llm/podium/pkg/rank"
)

const (
	// maxKeptBytes bounds the memory of kept reads. They hold scores only (about 128 bytes a
	// row, plus the reductions made of them): an execution of 10 teams and 40 rounds is about
	// 100 KiB, so this keeps hundreds of executions.
	maxKeptBytes = 64 << 20
	// maxQueries is how many ClickHouse reads of one kind run at once; requests arriving
	// meanwhile queue for the next one, which reads all their keys together.
	maxQueries = 2
	// maxBatch bounds the executions (or teams) of one read, and so its memory.
	maxBatch = 16
)

// storeReads is how the composer reads the scores of executions from ClickHouse (each request
// then reads its own team's content alone): requests of one execution share one read, requests
// of several executions waiting together are read with one query (the batcher), and a finished
// read serves later requests of its execution for ttl.
//
// A read may serve a request only if it started after the ranker had committed every evaluation
// the request waits for (docs/contract.md#read-your-writes). A request finishes that wait before it asks, so a
// read started after it asked serves it; and a read started for requests that waited up to
// position S serves any request that waited up to S or before. That rule lets a request join a
// read already running (covers), or take a kept one.
type storeReads struct {
	read    func(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
	snaps   *snapshots // nil: ClickHouse only
	ttl     time.Duration
	maxKept int // bytes of kept reads
	m       *Metrics
	now     func() time.Time
	b       *batcher[string, rank.Pos, *rank.Evaluations]

	mu    sync.Mutex // guards kept, bytes and gen; never held across a read
	kept  map[string]keptRead
	bytes int    // of kept reads, as of the last keep
	gen   uint64 // moved by forget: a read started before is not kept after
}

type keptRead struct {
	ev      *rank.Evaluations
	pos     rank.Pos
	expires time.Time
}

func newStoreReads(read func(context.Context, []string) (map[string]*rank.Evaluations, error), ttl time.Duration, maxKept int, m *Metrics, now func() time.Time) *storeReads {
	s := &storeReads{read: read, ttl: ttl, maxKept: maxKept, m: m, now: now, kept: map[string]keptRead{}}
	s.b = newBatcher(maxQueries, maxBatch, s.fetch)
	s.b.now = now
	s.b.covers = func(running []rank.Pos, pos rank.Pos) bool { return !pos.After(latest(running)) }
	return s
}

// latest is the last of positions.
func latest(ps []rank.Pos) rank.Pos {
	return slices.MaxFunc(ps, rank.Pos.Compare)
}

// get returns the evaluations of an execution, read after the ranker committed up to pos.
func (s *storeReads) get(ctx context.Context, executionID string, pos rank.Pos) (*rank.Evaluations, error) {
	s.mu.Lock()
	k, ok := s.kept[executionID]
	s.mu.Unlock()
	if ok && !pos.After(k.pos) && s.now().Before(k.expires) {
		s.m.storeReads.WithLabelValues("cached").Inc()
		return k.ev, nil
	}
	ev, joined, err := s.b.get(ctx, executionID, pos)
	if joined {
		s.m.storeReads.WithLabelValues("shared").Inc()
	}
	return ev, err
}

// fetch is one read of the executions of a batch: from the ranker's snapshots those complete
// through the position their requests wait for, the rest from ClickHouse in one query. Each is
// kept for the last position its requests waited for.
func (s *storeReads) fetch(ctx context.Context, batch map[string][]rank.Pos) (map[string]*rank.Evaluations, error) {
	s.mu.Lock()
	gen := s.gen
	s.mu.Unlock()
	need := make(map[string]rank.Pos, len(batch))
	for exec, poss := range batch {
		need[exec] = latest(poss)
	}
	evs := map[string]*rank.Evaluations{}
	if s.snaps != nil {
		evs = s.snaps.read(ctx, need)
		if evs == nil {
			evs = map[string]*rank.Evaluations{}
		}
	}
	var rest []string
	for exec, seqs := range batch {
		result := "snapshot"
		if evs[exec] == nil {
			rest, result = append(rest, exec), "queried"
		}
		s.m.storeReads.WithLabelValues(result).Inc()
		s.m.storeReads.WithLabelValues("shared").Add(float64(len(seqs) - 1))
	}
	if len(rest) > 0 {
		slices.Sort(rest)
		start := s.now()
		read, err := s.read(ctx, rest)
		s.m.storeRead.Observe(s.now().Sub(start).Seconds())
		if err != nil {
			return nil, err
		}
		maps.Copy(evs, read)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return evs, nil // the lineage moved while it was read: it serves its requests only
	}
	for exec, pos := range need {
		s.keep(exec, evs[exec], pos)
	}
	return evs, nil
}

// keep remembers a read for ttl, within maxKept bytes; s.mu is held. Kept reads live seconds, so
// dropping the expired ones on every keep scans few.
// forget drops every kept read: the store's lineage moved, and they may be of a store that was
// not whole.
func (s *storeReads) forget() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.kept)
	s.bytes = 0
	s.gen++
}

func (s *storeReads) keep(exec string, ev *rank.Evaluations, pos rank.Pos) {
	if s.ttl <= 0 || ev == nil {
		return
	}
	now := s.now()
	if old, ok := s.kept[exec]; ok && old.pos.After(pos) && now.Before(old.expires) {
		return // a read that finished earlier reflects more
	}
	// Counted afresh: a kept read grows by the reductions later requests make of it. Reads that
	// grew past the cap are dropped, soonest to expire first, so the cap holds at every keep.
	s.bytes = 0
	for e, k := range s.kept {
		if e == exec || !now.Before(k.expires) {
			delete(s.kept, e)
			continue
		}
		s.bytes += k.ev.Bytes()
	}
	for s.bytes > s.maxKept {
		var first string
		for e, k := range s.kept {
			if first == "" || k.expires.Before(s.kept[first].expires) || k.expires.Equal(s.kept[first].expires) && e < first {
				first = e
			}
		}
		s.bytes -= s.kept[first].ev.Bytes()
		delete(s.kept, first)
	}
	if s.bytes+ev.Bytes() > s.maxKept {
		return // full of fresh reads: this one serves only the requests that joined it
	}
	s.kept[exec] = keptRead{ev: ev, pos: pos, expires: now.Add(s.ttl)}
	s.bytes += ev.Bytes()
}
