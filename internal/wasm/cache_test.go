package wasm_test

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// version is the example module made a distinct version: a custom section naming n appended
// (another sha256, the same code), as an author's rebuild with one line changed would be.
func version(module []byte, n int) []byte {
	name := "podium-version"
	payload := append([]byte{byte(len(name))}, name...)
	payload = append(payload, []byte(strconv.Itoa(n))...)
	out := append([]byte{}, module...)
	out = append(out, 0x00, byte(len(payload))) // custom section, its size (under 128: one byte)
	return append(out, payload...)
}

// rss is the process's resident memory in bytes, after a collection that returns what it can.
func rss(t *testing.T) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	pages, err := strconv.ParseInt(strings.Fields(string(b))[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

// TestLabellingVersionsInTurnDoesNotPileUp: 50 versions of the example builder, a reactor as
// production serves it, labelled one after another (each kept while it is served, run once): the
// engine holds the one served and its bounded cache, not 50 compiled modules with their snapshots
// and instances, and the process's memory comes back near where it was with the first version; a
// module freed by the cache while a runner still holds it compiles (and starts) again on its next
// call.
func TestLabellingVersionsInTurnDoesNotPileUp(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles 50 modules (about a minute and a half on two cores)")
	}
	ctx := context.Background()
	e, err := wasm.NewEngine(ctx, wasm.Limits{MemoryPages: 512, OutputBytes: 1 << 20, StderrBytes: 2048, CacheModules: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(ctx)
	example := testenv.BuildWasmReactor(t, "../../builders/phi4mini")
	serve := func(n int) *wasm.Module {
		m, err := e.Load(ctx, version(example, n))
		if err != nil {
			t.Fatalf("version %d: %v", n, err)
		}
		e.Keep(ctx, []string{m.SHA256})
		if _, err := m.Run(ctx, []byte(buildInput), requestTime); err != nil {
			t.Fatalf("version %d: %v", n, err)
		}
		return m
	}
	first := serve(0)
	base := rss(t)
	var perModule int64
	for n := 1; n < 50; n++ {
		serve(n)
		if n == 3 { // the first, served, plus the cache's two: what each more costs
			perModule = max((rss(t)-base)/3, 1)
		}
	}
	if got := e.Compiled(); got != 3 {
		t.Errorf("%d modules compiled after 50 versions served in turn, want 3 (the served one and a cache of 2)", got)
	}
	after := rss(t)
	t.Logf("RSS: %d MiB with the first version, %d MiB after 50 (%d KiB a compiled module)", base>>20, after>>20, perModule>>10)
	if limit := base + 4*perModule + 16<<20; after > limit {
		t.Errorf("RSS %d MiB after 50 versions, over %d MiB: compiled modules pile up", after>>20, limit>>20)
	}
	// The first version was freed long ago: a runner that still holds it compiles it again.
	if out, err := first.Run(ctx, []byte(buildInput), requestTime); err != nil || len(out) == 0 {
		t.Fatalf("a call on a module the cache freed: %v", err)
	}
	if got := e.Compiled(); got != 3 {
		t.Errorf("%d modules compiled after the old one came back, want 3", got)
	}
}
