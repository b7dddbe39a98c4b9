package inputs

import (
	"context"
	"sync"
	"time"
)

// batcher gathers the requests that arrive while earlier ones are being fetched into one fetch
// of every key asked for: at most maxRuns fetches run at once, each of at most maxKeys keys, and
// every request of a key fetched gets that fetch's value. It is the one way the composer batches
// its reads (the commit probe, the scores, the content).
//
// A request waits for a fetch that starts after it was made, so what the fetch reads is at least
// as new as the request: the read-your-writes rule needs that. With covers set, a request may
// also join the fetch of its key already running, when covers says that fetch's requests cover
// it (a scores read started for a later sequence serves an earlier one).
//
// Fetches run detached from any one request (a caller giving up must not fail the others) and
// no lock is held while one runs.
type batcher[K comparable, Q, V any] struct {
	fetch   func(ctx context.Context, batch map[K][]Q) (map[K]V, error)
	maxRuns int
	maxKeys int
	covers  func(running []Q, q Q) bool // nil: never join a running fetch
	ran     func(batch map[K][]Q, took time.Duration)
	now     func() time.Time

	mu       sync.Mutex
	order    []K // keys waiting, first come first
	waiting  map[K]*pending[Q, V]
	inflight map[K]*pending[Q, V]
	running  int
}

// pending are the requests of one key for one fetch.
type pending[Q, V any] struct {
	qs   []Q
	done []chan result[V]
}

type result[V any] struct {
	v   V
	err error
}

func newBatcher[K comparable, Q, V any](maxRuns, maxKeys int, fetch func(context.Context, map[K][]Q) (map[K]V, error)) *batcher[K, Q, V] {
	return &batcher[K, Q, V]{fetch: fetch, maxRuns: max(maxRuns, 1), maxKeys: max(maxKeys, 1), now: time.Now,
		waiting: map[K]*pending[Q, V]{}, inflight: map[K]*pending[Q, V]{}}
}

// get returns the value of key from a fetch that started after the call (or one running that
// covers q); joined says it joined a running fetch.
func (b *batcher[K, Q, V]) get(ctx context.Context, key K, q Q) (v V, joined bool, err error) {
	done := make(chan result[V], 1)
	b.mu.Lock()
	if p := b.inflight[key]; p != nil && b.covers != nil && b.covers(p.qs, q) {
		p.done = append(p.done, done)
		joined = true
	} else {
		p := b.waiting[key]
		if p == nil {
			p = &pending[Q, V]{}
			b.waiting[key] = p
			b.order = append(b.order, key)
		}
		p.qs, p.done = append(p.qs, q), append(p.done, done)
		if b.running < b.maxRuns {
			b.running++
			go b.drain()
		}
	}
	b.mu.Unlock()
	select {
	case <-ctx.Done():
		return v, joined, ctx.Err() // the fetch still runs and serves the others
	case r := <-done:
		return r.v, joined, r.err
	}
}

// drain runs fetches until no request waits.
func (b *batcher[K, Q, V]) drain() {
	for {
		b.mu.Lock()
		if len(b.order) == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		n := min(len(b.order), b.maxKeys)
		batch := make(map[K][]Q, n)
		taken := make(map[K]*pending[Q, V], n)
		for _, k := range b.order[:n] {
			p := b.waiting[k]
			delete(b.waiting, k)
			batch[k], taken[k] = p.qs, p
			b.inflight[k] = p
		}
		b.order = append(b.order[:0], b.order[n:]...)
		b.mu.Unlock()

		start := b.now()
		vals, err := b.fetch(context.Background(), batch)
		if b.ran != nil {
			b.ran(batch, b.now().Sub(start))
		}

		b.mu.Lock()
		for k, p := range taken {
			if b.inflight[k] == p {
				delete(b.inflight, k)
			}
			for _, d := range p.done {
				d <- result[V]{v: vals[k], err: err}
			}
		}
		b.mu.Unlock()
	}
}

// runningFor is the running fetch of key: the requests it started for and how many are on it
// now, joiners included (tests watch it).
func (b *batcher[K, Q, V]) runningFor(key K) (started []Q, requests int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.inflight[key]; p != nil {
		return p.qs, len(p.done)
	}
	return nil, 0
}

// queuedFor is the number of requests of key waiting for the next fetch, and of keys waiting.
func (b *batcher[K, Q, V]) queuedFor(key K) (requests, keys int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p := b.waiting[key]; p != nil {
		requests = len(p.done)
	}
	return requests, len(b.order)
}
