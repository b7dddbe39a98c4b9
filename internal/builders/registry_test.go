package builders_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// TestRegistry on a real JetStream: a push stores the bytes once per content and the version
// with its globs; only a production label serves; the highest priority, then the name, builds a
// model; a label moves back for a rollback; bytes appended under a module's sha256 are never read
// as it; a version's key rewritten changes nothing production serves.
func TestRegistry(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	kv, err := js.CreateKeyValue(ctx, builders.BucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := builders.OpenStore(ctx, js, builders.ModulesConfig(1), true)
	if err != nil {
		t.Fatal(err)
	}
	releases, err := builders.OpenStore(ctx, js, builders.ReleasesConfig(1), true)
	if err != nil {
		t.Fatal(err)
	}
	label := func(name, label string, v int, digest string) error {
		_, err := builders.Label(ctx, kv, obj, releases, name, label, v, digest)
		return err
	}
	accept := func([]byte) error { return nil }
	a1, err := builders.Push(ctx, kv, obj, "alpha", []byte("module a1"), []string{"phi-*"}, 5, accept)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := builders.Push(ctx, kv, obj, "alpha", []byte("module a2"), []string{"phi-*", "qwen*"}, 5, accept)
	if err != nil {
		t.Fatal(err)
	}
	b1, err := builders.Push(ctx, kv, obj, "beta", []byte("module a1"), []string{"PHI-4*"}, 5, accept) // the same bytes as alpha@1
	if err != nil {
		t.Fatal(err)
	}
	if a1.Version != 1 || a2.Version != 2 || b1.Version != 1 || b1.SHA256 != a1.SHA256 || a1.SHA256 != wasm.SHA256([]byte("module a1")) {
		t.Fatalf("pushed %+v %+v %+v", a1, a2, b1)
	}
	if _, err := builders.Push(ctx, kv, obj, "gamma", []byte("x"), []string{"*"}, 0, func([]byte) error { return errors.New("does not load") }); err == nil {
		t.Fatal("a module the check refused was pushed")
	}
	if _, err := builders.Push(ctx, kv, obj, "gamma", []byte("x"), nil, 0, accept); err == nil {
		t.Fatal("a builder without models was pushed")
	}
	load := func() builders.State {
		t.Helper()
		s, bad, err := builders.Load(ctx, kv)
		if err != nil || len(bad) > 0 {
			t.Fatalf("load: %v %v", err, bad)
		}
		return s
	}
	if _, ok := load().For("phi-4-mini"); ok {
		t.Fatal("a builder serves without a production label")
	}
	for _, l := range []struct {
		name  string
		label string
		v     int
	}{{"alpha", "production", 2}, {"beta", "production", 1}, {"alpha", "staging", 1}} {
		if err := label(l.name, l.label, l.v, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := label("alpha", "production", 9, ""); err == nil {
		t.Fatal("a label moved to a version that does not exist")
	}
	if err := label("alpha", "production", 2, strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "not what was reviewed") {
		t.Fatalf("a label moved to a version by another digest: %v", err)
	}
	s := load()
	// Equal priorities: the name decides, case-insensitively matched globs.
	if v, ok := s.For("Phi-4-Mini"); !ok || v.Name != "alpha" || v.Version != 2 {
		t.Fatalf("phi-4-mini is built by %+v", v)
	}
	if v, ok := s.For("qwen2"); !ok || v.Name != "alpha" {
		t.Fatalf("qwen2 is built by %+v", v)
	}
	if _, ok := s.For("llama-3"); ok {
		t.Fatal("llama-3 has a builder")
	}
	beta, _ := s.Labelled("beta", "production")
	if m, err := releases.Module(ctx, beta); err != nil || string(m) != "module a1" {
		t.Fatalf("beta's module, copied for release: %q %v", m, err)
	}
	// A higher priority wins; a rollback is a label move.
	b2, err := builders.Push(ctx, kv, obj, "beta", []byte("module b2"), []string{"phi-*"}, 9, accept)
	if err != nil {
		t.Fatal(err)
	}
	if err := label("beta", "production", b2.Version, b2.Digest); err != nil { // as reviewed
		t.Fatal(err)
	}
	if v, _ := load().For("phi-4-mini"); v.Name != "beta" || v.Version != 2 {
		t.Fatalf("after beta@2 with priority 9: %+v", v)
	}
	if err := label("beta", "production", 1, ""); err != nil {
		t.Fatal(err)
	}
	if v, _ := load().For("phi-4-mini"); v.Name != "alpha" {
		t.Fatalf("after the rollback of beta to 1 (priority 5): %+v", v)
	}
	// A version's key written again after its label moved (an author may write versions, not
	// production): the label still serves the document it named, from its copy; the key is named.
	before, _ := load().Labelled("alpha", "production")
	if _, err := kv.Put(ctx, "alpha.v2", []byte(`{"name":"alpha","version":2,"sha256":"`+b2.SHA256+`","models":["*"],"priority":99}`)); err != nil {
		t.Fatal(err)
	}
	s = load()
	after, _ := s.Labelled("alpha", "production")
	if after.Digest != before.Digest || after.Priority != 5 || len(s.Rewritten["alpha"]) != 1 {
		t.Fatalf("alpha@2 rewritten: serves %+v (was %+v), rewritten %v", after, before, s.Rewritten)
	}
	if err := label("alpha", "staging", 2, ""); err != nil {
		t.Fatalf("alpha@2 has production's copy, so it can be labelled: %v", err)
	}
	if _, err := kv.Put(ctx, "beta.v2", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := label("beta", "staging", 2, ""); err == nil || !strings.Contains(err.Error(), "written again") {
		t.Fatalf("beta@2 rewritten, never labelled before: %v", err)
	}
	// Bytes appended under a version's sha256 that are not its module are never read as it
	// (store_test.go tries more).
	for _, tampered := range []string{"module x2", "a longer module"} {
		forged := nats.NewMsg("builders.modules." + b2.SHA256)
		forged.Data = []byte(tampered)
		forged.Header.Set("Podium-Module-Chunk", "0/1")
		forged.Header.Set("Podium-Module-Size", strconv.Itoa(len(tampered)))
		if _, err := js.PublishMsg(ctx, forged); err != nil {
			t.Fatal(err)
		}
		if m, err := obj.Module(ctx, b2); err != nil || string(m) != "module b2" {
			t.Fatalf("module %q appended under b2's name: read %q %v", tampered, m, err)
		}
	}
	if m, err := releases.Module(ctx, b2); err != nil || string(m) != "module b2" {
		t.Fatalf("b2's released module: %q %v", m, err)
	}
}

// TestParseLeavesOutWhatIsNotTheLayout: entries of another layout are reported, not served.
func TestParseLeavesOutWhatIsNotTheLayout(t *testing.T) {
	c := registry.NewContent()
	for k, v := range map[string]string{
		"alpha.v1":               `{"name":"alpha","version":1,"sha256":"` + strings.Repeat("a", 64) + `","models":["x"]}`,
		"alpha.v2":               `{"name":"alpha","version":3,"sha256":"` + strings.Repeat("a", 64) + `"}`,
		"alpha.label.production": "one",
		"alpha.other":            "x",
	} {
		c.Values[k], c.Writes[k] = []byte(v), 1
	}
	s, errs := builders.Parse(c)
	if len(s.Versions) != 1 || len(s.Labels) != 0 || len(errs) != 3 {
		t.Fatalf("versions %+v, labels %v, errors %v", s.Versions, s.Labels, errs)
	}
}
