package wasm

import (
	"context"

	"github.com/tetratelabs/wazero"
)

// Defaults of the compiled modules kept beside the ones labelled now (Limits.CacheModules,
// Limits.CacheBytes): enough for verify and the console to run the versions of one execution's
// records again without compiling each twice.
const (
	defaultCacheModules = 8
	defaultCacheBytes   = 128 << 20
)

// compiled is one compiled module: in the cache while its sha256 is in Engine.compiled; freed
// once evicted and no call uses it.
type compiled struct {
	sha     string
	c       wazero.CompiledModule
	wasm    []byte // the module's bytes: what the cache's bound counts
	used    uint64 // Engine.clock at its last load or call: the least recent goes first
	calls   int    // calls running on it
	evicted bool   // out of the cache: freed when calls reaches 0
	kind    string
	reactor *reactor // a reactor's snapshot and instances; nil for a command
}

// bytes is what the cache's bound counts of a module: its bytes, and a reactor's snapshot (each
// instance a reactor keeps holds as much again, at most Limits.Concurrent of them).
func (c *compiled) bytes() int64 {
	n := int64(len(c.wasm))
	if c.reactor != nil {
		n += int64(len(c.reactor.memory))
	}
	return n
}

// free frees the module: a reactor's instances first, then its compiled code.
func (c *compiled) free(ctx context.Context) {
	if c.reactor != nil {
		c.reactor.close(ctx)
	}
	_ = c.c.Close(ctx)
}

// Keep names the modules served now (the sha256 of every version a production label names): they
// stay compiled whatever else is loaded. Every other module is kept within the cache's bounds,
// the least recently used freed first, so labelling one version after another does not pile
// compiled code up.
func (e *Engine) Keep(ctx context.Context, shas []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kept = map[string]bool{}
	for _, s := range shas {
		e.kept[s] = true
	}
	e.evictLocked(ctx)
}

// Cached is the module of sha256 sum when it is compiled now, touched: a loader need not read its
// bytes again.
func (e *Engine) Cached(sum string) (*Module, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.cachedLocked(sum)
	if c == nil {
		return nil, false
	}
	return &Module{e: e, c: c, SHA256: sum}, true
}

// Compiled is how many modules are compiled now (kept or cached).
func (e *Engine) Compiled() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.compiled)
}

// cached is the module of sha256 sum already compiled, touched; nil when there is none. e.mu held.
func (e *Engine) cachedLocked(sum string) *compiled {
	c, ok := e.compiled[sum]
	if !ok {
		return nil
	}
	e.clock++
	c.used = e.clock
	return c
}

// addLocked puts a module just compiled in the cache, then keeps the cache within its bounds.
func (e *Engine) addLocked(ctx context.Context, c *compiled) {
	e.clock++
	c.used = e.clock
	e.compiled[c.sha] = c
	e.evictLocked(ctx)
}

// evictLocked frees the least recently used modules not kept until the others fit the bounds. A
// module a call is running on leaves the cache now and is freed when the call ends.
func (e *Engine) evictLocked(ctx context.Context) {
	for {
		var n int
		var bytes int64
		var oldest *compiled
		for _, c := range e.compiled {
			if e.kept[c.sha] {
				continue
			}
			n++
			bytes += c.bytes()
			if oldest == nil || c.used < oldest.used {
				oldest = c
			}
		}
		if oldest == nil || (n <= e.limits.CacheModules && bytes <= e.limits.CacheBytes) {
			return
		}
		delete(e.compiled, oldest.sha)
		oldest.evicted = true
		if oldest.calls == 0 {
			oldest.free(ctx)
		}
	}
}

// acquire marks a call running on c; false when c was freed (evicted with no call on it).
func (e *Engine) acquire(c *compiled) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.evicted && c.calls == 0 {
		return false
	}
	c.calls++
	e.clock++
	c.used = e.clock
	return true
}

// release ends a call on c, freeing it when it was evicted meanwhile and was the last.
func (e *Engine) release(ctx context.Context, c *compiled) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c.calls--
	if c.evicted && c.calls == 0 {
		c.free(context.WithoutCancel(ctx))
	}
}
