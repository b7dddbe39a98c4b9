package main

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
	// row): an execution of 10 teams and 40 rounds is about 50 KiB, so this keeps over a
	// thousand executions.
	maxKeptBytes = 64 << 20
	// maxQueries is how many ClickHouse reads one replica runs at once; requests arriving
	// meanwhile queue for the next one, which reads all their executions together.
	maxQueries = 2
	// maxBatch bounds the executions of one read, and so its memory: a read holds every round of
	// its executions with their submissions.
	maxBatch = 16
)

// storeReads is how the composer reads the scores of executions from ClickHouse (each request
// then reads its own team's content alone): requests of one execution share one read,
// requests of several executions waiting together are read with one query, and a finished read
// serves later requests of its execution for ttl.
//
// A read may serve a request only if it started after the ranker had committed every evaluation
// the request waits for (CONTRACT section 5). A request finishes that wait before it asks, so a
// read started after it asked serves it; and a read started for requests that waited up to
// sequence S serves any request that waited up to S or less. That rule lets a request join a
// read already running, or take a kept one.
type storeReads struct {
	read    func(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
	ttl     time.Duration
	maxKept int // bytes of kept reads
	m       *metrics

	mu       sync.Mutex
	waiting  map[string][]*waiter // by execution, for the next read
	inflight map[string]*flight   // by execution, the read last started
	running  int
	kept     map[string]keptRead // by execution
	bytes    int                 // of kept reads
}

type waiter struct {
	seq  uint64 // the EVALUATIONS sequence the request waited for
	done chan readResult
}

// flight is the part of a running read for one execution.
type flight struct {
	seq uint64 // the highest sequence its requests waited for when it started
	ws  []*waiter
}

type readResult struct {
	ev  *rank.Evaluations
	err error
}

type keptRead struct {
	ev      *rank.Evaluations
	seq     uint64
	expires time.Time
}

func newStoreReads(read func(context.Context, []string) (map[string]*rank.Evaluations, error), ttl time.Duration, maxKept int, m *metrics) *storeReads {
	return &storeReads{read: read, ttl: ttl, maxKept: maxKept, m: m, waiting: map[string][]*waiter{}, inflight: map[string]*flight{}, kept: map[string]keptRead{}}
}

// get returns the evaluations of an execution, read after the ranker committed sequence seq.
func (s *storeReads) get(ctx context.Context, executionID string, seq uint64) (*rank.Evaluations, error) {
	s.mu.Lock()
	if k, ok := s.kept[executionID]; ok && seq <= k.seq && time.Now().Before(k.expires) {
		s.mu.Unlock()
		s.m.storeReads.WithLabelValues("cached").Inc()
		return k.ev, nil
	}
	w := &waiter{seq: seq, done: make(chan readResult, 1)}
	if f, ok := s.inflight[executionID]; ok && seq <= f.seq {
		f.ws = append(f.ws, w)
		s.m.storeReads.WithLabelValues("shared").Inc()
	} else {
		s.waiting[executionID] = append(s.waiting[executionID], w)
	}
	if len(s.waiting) > 0 && s.running < maxQueries {
		s.running++
		go s.drain()
	}
	s.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err() // the read still runs and serves the others
	case res := <-w.done:
		return res.ev, res.err
	}
}

// drain runs reads until no request waits.
func (s *storeReads) drain() {
	for {
		s.mu.Lock()
		if len(s.waiting) == 0 {
			s.running--
			s.mu.Unlock()
			return
		}
		batch := make(map[string]*flight, min(len(s.waiting), maxBatch))
		for exec, ws := range s.waiting {
			if len(batch) == maxBatch {
				break
			}
			f := &flight{ws: ws}
			for _, w := range ws {
				f.seq = max(f.seq, w.seq)
			}
			batch[exec] = f
			s.inflight[exec] = f
			delete(s.waiting, exec)
			s.m.storeReads.WithLabelValues("queried").Inc()
			s.m.storeReads.WithLabelValues("shared").Add(float64(len(ws) - 1))
		}
		s.mu.Unlock()

		ids := slices.Sorted(maps.Keys(batch))
		start := time.Now()
		// Detached from any one request: a caller giving up must not fail the others. The
		// store's read timeout bounds it.
		evs, err := s.read(context.Background(), ids)
		s.m.storeRead.Observe(time.Since(start).Seconds())

		s.mu.Lock()
		for exec, f := range batch {
			if s.inflight[exec] == f {
				delete(s.inflight, exec)
			}
			res := readResult{ev: evs[exec], err: err}
			if err == nil {
				s.keep(exec, res.ev, f.seq)
			}
			for _, w := range f.ws {
				w.done <- res
			}
		}
		s.mu.Unlock()
	}
}

// keep remembers a read for ttl, within maxKept bytes; s.mu is held. Kept reads live seconds, so
// dropping the expired ones on every keep scans few.
func (s *storeReads) keep(exec string, ev *rank.Evaluations, seq uint64) {
	if s.ttl <= 0 {
		return
	}
	now := time.Now()
	if old, ok := s.kept[exec]; ok && old.seq > seq && now.Before(old.expires) {
		return // a read that finished earlier reflects more
	}
	for e, k := range s.kept {
		if e == exec || !now.Before(k.expires) {
			s.bytes -= k.ev.Bytes()
			delete(s.kept, e)
		}
	}
	if s.bytes+ev.Bytes() > s.maxKept {
		return // full of fresh reads: this one serves only the requests that joined it
	}
	s.kept[exec] = keptRead{ev: ev, seq: seq, expires: now.Add(s.ttl)}
	s.bytes += ev.Bytes()
}
