package main

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/podium-llm/podium/pkg/rank"
)

// contentReads is how the composer reads its teams' own content (submissions, feedback,
// metrics) from ClickHouse: at most maxQueries reads run at once, and the requests that arrive
// meanwhile are read together by the next one (at most maxBatch teams), so a round of ten teams
// costs one or two queries rather than ten, while no request ever reads another team's content.
//
// A request joins only a read that starts after it asked, after its read-your-writes wait: the
// read then holds every evaluation the request's pinned reduction can choose. Content is never
// kept, so nothing else needs a rule.
type contentReads struct {
	read func(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error)
	m    *metrics

	mu      sync.Mutex
	waiting []*contentWaiter
	running int
}

type contentWaiter struct {
	key          rank.TeamKey
	from, before int
	done         chan contentResult
}

type contentResult struct {
	content *rank.Content
	err     error
}

func newContentReads(read func(context.Context, []rank.TeamKey, int, int) (map[rank.TeamKey]*rank.Content, error), m *metrics) *contentReads {
	return &contentReads{read: read, m: m}
}

// get returns the content of one team in rounds from to before-1 (a batch may hold more rounds:
// more content than a prompt prints changes nothing in it).
func (r *contentReads) get(ctx context.Context, key rank.TeamKey, from, before int) (*rank.Content, error) {
	w := &contentWaiter{key: key, from: from, before: before, done: make(chan contentResult, 1)}
	r.mu.Lock()
	r.waiting = append(r.waiting, w)
	if r.running < maxQueries {
		r.running++
		go r.drain()
	}
	r.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err() // the read still runs and serves the others
	case res := <-w.done:
		return res.content, res.err
	}
}

// drain runs reads until no request waits.
func (r *contentReads) drain() {
	for {
		r.mu.Lock()
		if len(r.waiting) == 0 {
			r.running--
			r.mu.Unlock()
			return
		}
		var batch []*contentWaiter
		var keys []rank.TeamKey
		rest := r.waiting[:0]
		for _, w := range r.waiting {
			if len(keys) < maxBatch || slices.Contains(keys, w.key) {
				batch = append(batch, w)
				if !slices.Contains(keys, w.key) {
					keys = append(keys, w.key)
				}
			} else {
				rest = append(rest, w)
			}
		}
		r.waiting = rest
		r.mu.Unlock()

		from, before := batch[0].from, batch[0].before
		for _, w := range batch {
			from, before = min(from, w.from), max(before, w.before)
		}
		start := time.Now()
		// Detached from any one request: a caller giving up must not fail the others. The
		// store's read timeout bounds it.
		cs, err := r.read(context.Background(), keys, from, before)
		r.m.contentRead.Observe(time.Since(start).Seconds())
		for _, w := range batch {
			w.done <- contentResult{content: cs[w.key], err: err}
		}
	}
}
