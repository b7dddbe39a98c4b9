package audit

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/testenv"
)

// TestReadBundleIsBounded: a bundle that decompresses to far more than its file (256 MiB of blanks
// in about 256 KB) is refused at the limit, having allocated a few MiB, not the 256 MiB (and more)
// it unfolds to.
func TestReadBundleIsBounded(t *testing.T) {
	bomb := testenv.BundleBomb(256)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := ReadBundle(bytes.NewReader(bomb), "bomb", bounded.Limit{Bytes: 1 << 20, Setting: "PODIUM_MAX_INPUT_BYTES"})
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "bundle bomb is larger than 1048576 bytes, the limit (raise it with PODIUM_MAX_INPUT_BYTES)") {
		t.Fatalf("ReadBundle: %v", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 16<<20 {
		t.Errorf("reading the bomb allocated %d MiB, want a few", allocated>>20)
	} else {
		t.Logf("a %d KB bomb of 256 MiB refused after %d KiB allocated", len(bomb)>>10, allocated>>10)
	}
}
