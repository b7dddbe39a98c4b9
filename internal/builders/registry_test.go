package builders_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// TestRegistry on a real JetStream: a push stores the bytes once per content and the version
// with its globs; only a production label serves; the highest priority, then the name, builds a
// model; a label moves back for a rollback; a module whose bytes changed under its version is
// refused by its sha256.
func TestRegistry(t *testing.T) {
	ctx := context.Background()
	_, js := testenv.JetStream(t, testenv.NATS(t))
	kv, err := js.CreateKeyValue(ctx, builders.BucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	obj, err := js.CreateObjectStore(ctx, builders.ModulesConfig(1))
	if err != nil {
		t.Fatal(err)
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
		if err := builders.Label(ctx, kv, l.name, l.label, l.v); err != nil {
			t.Fatal(err)
		}
	}
	if err := builders.Label(ctx, kv, "alpha", "production", 9); err == nil {
		t.Fatal("a label moved to a version that does not exist")
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
	if m, err := builders.Module(ctx, obj, beta); err != nil || string(m) != "module a1" {
		t.Fatalf("beta's module: %q %v", m, err)
	}
	// A higher priority wins; a rollback is a label move.
	b2, err := builders.Push(ctx, kv, obj, "beta", []byte("module b2"), []string{"phi-*"}, 9, accept)
	if err != nil {
		t.Fatal(err)
	}
	if err := builders.Label(ctx, kv, "beta", "production", b2.Version); err != nil {
		t.Fatal(err)
	}
	if v, _ := load().For("phi-4-mini"); v.Name != "beta" || v.Version != 2 {
		t.Fatalf("after beta@2 with priority 9: %+v", v)
	}
	if err := builders.Label(ctx, kv, "beta", "production", 1); err != nil {
		t.Fatal(err)
	}
	if v, _ := load().For("phi-4-mini"); v.Name != "alpha" {
		t.Fatalf("after the rollback of beta to 1 (priority 5): %+v", v)
	}
	// A version's key written again after its label moved (an author may write versions, not
	// production): the label no longer pins it, and nothing of it is served.
	alpha, _ := load().Labelled("alpha", "production")
	if err := load().Pinned(alpha, "production"); err != nil {
		t.Fatalf("alpha@2 as labelled: %v", err)
	}
	if _, err := kv.Put(ctx, "alpha.v2", []byte(`{"name":"alpha","version":2,"sha256":"`+b2.SHA256+`","models":["*"],"priority":99}`)); err != nil {
		t.Fatal(err)
	}
	s = load()
	alpha, _ = s.Labelled("alpha", "production")
	if err := s.Pinned(alpha, "production"); err == nil || !strings.Contains(err.Error(), "written again since it was labelled production") {
		t.Fatalf("alpha@2 rewritten: %v", err)
	}
	if got := s.LabelsOf(alpha); len(got) != 1 || !strings.Contains(got[0], "not pinned") {
		t.Fatalf("labels of the rewritten version: %v", got)
	}
	// Bytes that are not the version's: refused by the sha256.
	for tampered, want := range map[string]string{"module x2": "has sha256", "a longer module": "is 15 bytes, not 9"} {
		if _, err := obj.PutBytes(ctx, b2.SHA256, []byte(tampered)); err != nil {
			t.Fatal(err)
		}
		if _, err := builders.Module(ctx, obj, b2); err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("module %q under b2's name: %v, want %q", tampered, err, want)
		}
	}
}

// TestParseLeavesOutWhatIsNotTheLayout: entries of another layout are reported, not served.
func TestParseLeavesOutWhatIsNotTheLayout(t *testing.T) {
	s, errs := builders.Parse(map[string][]byte{
		"alpha.v1":               []byte(`{"name":"alpha","version":1,"sha256":"` + strings.Repeat("a", 64) + `","models":["x"]}`),
		"alpha.v2":               []byte(`{"name":"alpha","version":3,"sha256":"` + strings.Repeat("a", 64) + `"}`),
		"alpha.label.production": []byte("one"),
		"alpha.other":            []byte("x"),
	})
	if len(s.Versions) != 1 || len(s.Labels) != 0 || len(errs) != 3 {
		t.Fatalf("versions %+v, labels %v, errors %v", s.Versions, s.Labels, errs)
	}
}
