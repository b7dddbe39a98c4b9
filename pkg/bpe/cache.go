package bpe

import (
	"hash/maphash"
	"strings"
	"sync"
)

// pieceCache remembers the token count of short pieces. A nil cache remembers nothing (the
// benchmarks measure the counter without it). Texts of a tournament are distinct, but
// their words are not: a language repeats a few thousand words most of the time (Zipf), and a
// word's count costs a dozen lookups in the rank table (which does not fit in a CPU cache) where
// a hit costs one in a small map. Shards keep the composer's workers from queuing on one lock.
type pieceCache struct {
	seed   maphash.Seed
	shards [pieceShards]pieceShard
}

const (
	pieceShards     = 16
	maxPieceLen     = 32      // longer pieces are rare and cost little next to their length
	maxShardEntries = 1 << 13 // 128k pieces in all, a few MiB
)

type pieceShard struct {
	mu sync.Mutex
	m  map[string]int
}

func newPieceCache() *pieceCache {
	c := &pieceCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string]int)
	}
	return c
}

func (c *pieceCache) shard(piece string) *pieceShard {
	return &c.shards[maphash.String(c.seed, piece)%pieceShards]
}

func (c *pieceCache) get(piece string) (int, bool) {
	if c == nil || len(piece) > maxPieceLen {
		return 0, false
	}
	sh := c.shard(piece)
	sh.mu.Lock()
	n, ok := sh.m[piece]
	sh.mu.Unlock()
	return n, ok
}

func (c *pieceCache) put(piece string, n int) {
	if c == nil || len(piece) > maxPieceLen {
		return
	}
	sh := c.shard(piece)
	sh.mu.Lock()
	if len(sh.m) >= maxShardEntries {
		clear(sh.m) // bounded; a full shard starts over rather than tracking recency
	}
	sh.m[strings.Clone(piece)] = n // a substring would keep its whole prompt alive
	sh.mu.Unlock()
}
