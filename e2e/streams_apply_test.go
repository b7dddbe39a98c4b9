package e2e

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/events"
)

// TestOnlyTheOperatorChangesStreams: a service makes what is missing and changes nothing that
// exists; it says how a stream differs from its configuration (here PROMPTS_MAX_AGE, and a registry
// bucket made before buckets were sealed), and `podium streams apply` shows the differences
// (--dry-run changes nothing) and applies them, copying the released modules an older Podium kept
// in an object store.
func TestOnlyTheOperatorChangesStreams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := t.Context()
	// A registry bucket as an older Podium made it: rollups allowed; and the object store of
	// released modules it kept.
	if _, err := e.js.CreateKeyValue(ctx, registry.Config(1)); err != nil {
		t.Fatal(err)
	}
	legacy, err := e.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: builders.LegacyReleases})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := legacy.PutBytes(ctx, wasm.SHA256(trapWasm), trapWasm); err != nil {
		t.Fatal(err)
	}
	e.start("ranker")
	composer := e.start("composer", "PROMPTS_MAX_AGE=2h")
	maxAge := func(name string) time.Duration {
		st, err := e.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config.MaxAge
	}
	rollups := func() bool {
		st, err := e.js.Stream(ctx, "KV_"+registry.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		return st.CachedInfo().Config.AllowRollup
	}
	if got := maxAge(events.StreamPrompts); got != 2*time.Hour {
		t.Fatalf("PROMPTS made by the composer with PROMPTS_MAX_AGE=2h: max age %s", got)
	}
	// A second composer with another retention changes nothing, and says so.
	other := e.start("composer", "PROMPTS_MAX_AGE=3h")
	if got := maxAge(events.StreamPrompts); got != 2*time.Hour {
		t.Errorf("a composer started with PROMPTS_MAX_AGE=3h changed PROMPTS: max age %s", got)
	}
	testenv.WaitFor(t, 5*time.Second, "the composer to say how PROMPTS differs", func() (bool, string) {
		logs := other.logs.String()
		return strings.Contains(logs, "stream differs from the configuration") && strings.Contains(logs, `"stream":"PROMPTS"`) &&
			strings.Contains(logs, "max_age: 2h0m0s → 3h0m0s"), logs
	})
	if !rollups() {
		t.Fatal("the test's old bucket is sealed already")
	}
	if !strings.Contains(composer.logs.String(), `"stream":"KV_TEMPLATES"`) {
		t.Errorf("the composer did not say that TEMPLATES is not sealed:\n%s", composer.logs)
	}

	out, code := e.podium(t, []string{"PROMPTS_MAX_AGE=3h"}, "streams", "apply", "--dry-run")
	if code != 0 || !strings.Contains(out, "PROMPTS:\n  max_age: 2h0m0s → 3h0m0s") || !strings.Contains(out, "allow_rollup_hdrs: true → false") ||
		!strings.Contains(out, "BUILDER_RELEASES:\n  1 module(s) of the object store BUILDER_RELEASES to copy") || !strings.Contains(out, "dry run: nothing changed") {
		t.Errorf("streams apply --dry-run: exit %d\n%s", code, out)
	}
	if maxAge(events.StreamPrompts) != 2*time.Hour || !rollups() {
		t.Errorf("--dry-run changed something")
	}
	out, code = e.podium(t, []string{"PROMPTS_MAX_AGE=3h"}, "streams", "apply")
	if code != 0 || !strings.Contains(out, "stream(s) changed") || !strings.Contains(out, "  1 copied") {
		t.Errorf("streams apply: exit %d\n%s", code, out)
	}
	releases, err := builders.OpenStore(ctx, e.js, builders.ReleasesConfig(1), false)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := releases.Module(ctx, builders.Version{Name: "trap", SHA256: wasm.SHA256(trapWasm), Size: int64(len(trapWasm))}); err != nil || !bytes.Equal(m, trapWasm) {
		t.Errorf("the released module copied from the object store: %v", err)
	}
	if got := maxAge(events.StreamPrompts); got != 3*time.Hour || rollups() {
		t.Errorf("after streams apply: PROMPTS max age %s, TEMPLATES rollups %v; want 3h and sealed", got, rollups())
	}
	kv, err := e.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "greet.label.staging", []byte("1")); err != nil {
		t.Errorf("a put after the seal: %v", err)
	}
	if out, code := e.podium(t, []string{"PROMPTS_MAX_AGE=3h"}, "streams", "apply"); code != 0 || !strings.Contains(out, "PROMPTS: as configured") || !strings.Contains(out, "0 stream(s) changed") ||
		!strings.Contains(out, "BUILDER_RELEASES: holds every module of the object store BUILDER_RELEASES") {
		t.Errorf("streams apply again: exit %d\n%s", code, out)
	}
}
