// Package bpe counts the tokens of a text exactly as OpenAI's byte-pair encodings o200k_base and
// cl100k_base split it, over the rank tables tiktoken-go-loader compiles into the binary. It
// counts, it does not encode: the composer needs the number of tokens of a prompt, fast, for any
// input, and able to stop when its caller gives up.
//
// A text is cut into pieces by the encoding's pre-tokenizer (pretokenize.go), and each piece is
// merged pair by pair, the lowest rank first and the leftmost of equal ranks first, the order
// tiktoken applies. A heap of candidate pairs makes that O(n log n) in the piece's length, where
// a rescan per merge is quadratic (a 100,000-letter word took seconds).
package bpe

import (
	"context"
	"fmt"
	"path"
	"sync"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// Encoding is one loaded encoding.
type Encoding struct {
	name   string
	ranks  map[string]int
	split  splitter
	pieces *pieceCache
}

// Names lists the encodings Load knows.
func Names() []string { return []string{"o200k_base", "cl100k_base"} }

// Load reads the rank table of the named encoding from the binary; nothing is downloaded.
func Load(name string) (*Encoding, error) {
	split, ok := splitters[name]
	if !ok {
		return nil, fmt.Errorf("bpe: unknown encoding %q (known: %v)", name, Names())
	}
	ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(path.Join("offline", name+".tiktoken"))
	if err != nil {
		return nil, fmt.Errorf("bpe: load %s: %w", name, err)
	}
	return &Encoding{name: name, ranks: ranks, split: split(), pieces: newPieceCache()}, nil
}

// Name is the encoding's name.
func (e *Encoding) Name() string { return e.name }

// checkEvery is how many units of work (pieces, steps of a long piece's setup, merges) run
// between two looks at the context: a few hundred microseconds.
const checkEvery = 1 << 12

// Count returns the number of tokens of s, or ctx's error once ctx ends, however long s is.
// Special-token text ("<|endoftext|>") counts as the ordinary text it is.
func (e *Encoding) Count(ctx context.Context, s string) (int, error) {
	m := mergerPool.Get().(*merger)
	defer mergerPool.Put(m)
	m.work = 0
	total := 0
	var err error
	e.split(s, func(piece string) bool {
		if m.tick(ctx) != nil {
			return false // Count returns ctx's error below
		}
		n, cerr := e.pieceTokens(ctx, m, piece)
		if cerr != nil {
			err = cerr
			return false
		}
		total += n
		return true
	})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return 0, err
	}
	return total, nil
}

// pieceTokens is the number of tokens one piece merges into.
func (e *Encoding) pieceTokens(ctx context.Context, m *merger, piece string) (int, error) {
	if len(piece) <= 1 {
		return len(piece), nil // every single byte is a token
	}
	if n, ok := e.pieces.get(piece); ok {
		return n, nil
	}
	n := 1
	if _, ok := e.ranks[piece]; !ok {
		var err error
		if n, err = m.merge(ctx, piece, e.ranks); err != nil {
			return 0, err
		}
	}
	e.pieces.put(piece, n)
	return n, nil
}

var mergerPool = sync.Pool{New: func() any { return new(merger) }}

// merger holds the buffers of one piece's merge, reused across pieces.
type merger struct {
	next, prev []int32 // by a part's start offset: where the next part starts, where the previous one does
	rank       []int32 // by a part's start offset: rank of the pair it starts, -1 for none
	heap       []uint64
	work       int // units of work of this Count: one meter for pieces and merges alike
}

// tick counts one unit of work and looks at ctx every checkEvery units. One meter for the whole
// Count, so ctx is seen every checkEvery units however the work splits into many short pieces or
// one long one, its setup included: a cancelled count stops within checkEvery units.
func (m *merger) tick(ctx context.Context) error {
	if m.work++; m.work%checkEvery == 0 {
		return ctx.Err()
	}
	return nil
}

// noRank marks a part whose pair with the next one is not a token.
const noRank = -1

// merge counts the tokens of piece. The parts are a linked list over byte offsets (a part is
// piece[i:next[i]]); every adjacent pair that is a token sits in a heap keyed by (rank, start),
// so the pair popped first is the lowest rank and, among equal ranks, the leftmost. A popped
// entry whose pair has changed since it was pushed is stale and skipped.
func (m *merger) merge(ctx context.Context, piece string, ranks map[string]int) (int, error) {
	n := len(piece)
	m.next, m.prev, m.rank, m.heap = grow(m.next, n), grow(m.prev, n), grow(m.rank, n), m.heap[:0]
	for i := range n {
		m.next[i], m.prev[i] = int32(i+1), int32(i-1)
	}
	end := func(i int32) int32 { // where the part after the one at i ends
		if j := m.next[i]; int(j) < n {
			return m.next[j]
		}
		return int32(n + 1)
	}
	pairRank := func(i int32) int32 {
		e := end(i)
		if int(e) > n {
			return noRank
		}
		if r, ok := ranks[piece[i:e]]; ok {
			return int32(r)
		}
		return noRank
	}
	for i := range int32(n) {
		if err := m.tick(ctx); err != nil {
			return 0, err
		}
		m.rank[i] = pairRank(i)
		if m.rank[i] != noRank {
			m.heap = append(m.heap, uint64(m.rank[i])<<32|uint64(i))
		}
	}
	for i := len(m.heap)/2 - 1; i >= 0; i-- { // heapify: O(n), where n pushes are O(n log n)
		if err := m.tick(ctx); err != nil {
			return 0, err
		}
		m.down(i)
	}
	parts := n
	for len(m.heap) > 0 {
		if err := m.tick(ctx); err != nil {
			return 0, err
		}
		key := m.pop()
		r, i := int32(key>>32), int32(key&0xffffffff)
		if m.rank[i] != r {
			continue // stale: the part at i was merged away or its pair changed
		}
		// Merge the part at i with the next one.
		j := m.next[i]
		m.next[i] = m.next[j]
		if int(m.next[j]) < n {
			m.prev[m.next[j]] = i
		}
		m.rank[j] = noRank
		parts--
		if m.rank[i] = pairRank(i); m.rank[i] != noRank {
			m.push(uint64(m.rank[i])<<32 | uint64(i))
		}
		if p := m.prev[i]; p >= 0 {
			if m.rank[p] = pairRank(p); m.rank[p] != noRank {
				m.push(uint64(m.rank[p])<<32 | uint64(p))
			}
		}
	}
	return parts, nil
}

func grow(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// push and pop keep m.heap a binary min-heap.
func (m *merger) push(k uint64) {
	h := append(m.heap, k)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	m.heap = h
}

func (m *merger) pop() uint64 {
	h := m.heap
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	m.heap = h[:last]
	m.down(0)
	return top
}

// down moves the key at i down to its place.
func (m *merger) down(i int) {
	h := m.heap
	for {
		l, small := 2*i+1, i
		if l < len(h) && h[l] < h[small] {
			small = l
		}
		if r := l + 1; r < len(h) && h[r] < h[small] {
			small = r
		}
		if small == i {
			break
		}
		h[i], h[small] = h[small], h[i]
		i = small
	}
}
