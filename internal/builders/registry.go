// Package builders is the registry of prompt builders (docs/builders.md) in JetStream, and their
// runtime. Versions and labels are keys of the key-value bucket BUILDERS, kept by the rules every
// registry shares (internal/registry: a label names a version with its digest, a version key
// written again is never served). A version's document is JSON {"name", "version", "sha256",
// "size", "models", "priority"}; the module's bytes are stored under their sha256 in a stream that
// only grows (store.go): cut into chunks, so a module of megabytes (a Go builder is about 3 MiB)
// fits however small the server's max payload, and a module pushed twice is stored once. Authors
// push modules into BUILDER_MODULES; moving the production label copies the module into
// BUILDER_RELEASES, which only the release role writes, and composers load modules from there
// alone. Neither store can be rolled up, purged or have a message deleted, by anyone.
//
// A pushed version serves nothing: a request is built by the version its name's production label
// names, and only when its model matches that version's globs.
package builders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Bucket is the key-value bucket of versions and labels.
const Bucket = "BUILDERS"

// Legacy object stores: where Podium kept modules before they moved to streams that cannot be
// rolled up (store.go); `podium streams apply` copies what they hold.
const (
	LegacyModules  = "BUILDER_MODULES"
	LegacyReleases = "BUILDER_RELEASES"
)

// MaxModuleBytes bounds a module's size: every composer holds the bytes of what it serves.
const MaxModuleBytes = 64 << 20

// Production is the label that serves requests.
const Production = "production"

// Sees is what every builder is handed, said before anyone labels one (docs/builders.md, "What a
// builder sees").
const Sees = "a team's whole context: its task, its submissions and the evaluator's feedback of the rounds its template would print, the leaderboard, and the request's vars"

// BucketConfig keeps every change (a label's moves, a name's versions) and expires nothing.
func BucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: Bucket, Description: "podium prompt builders: versions and labels",
		History: 64, Replicas: max(replicas, 1), Storage: jetstream.FileStorage}
}

// Version is one pushed version of a builder.
type Version struct {
	Name     string   `json:"name"`
	Version  int      `json:"version"`
	SHA256   string   `json:"sha256"`
	Size     int64    `json:"size"`
	Models   []string `json:"models"`   // globs (path.Match), matched case-insensitively
	Priority int      `json:"priority"` // the highest wins among the builders of a model; then the name
	// Digest is the sha256 of the version's stored document, what a label names (not stored in it).
	Digest string `json:"-"`
}

// Serves reports whether the version's globs match model, as a template variant's do.
func (v Version) Serves(model string) bool { return compose.ModelMatches(v.Models, model) }

// State is the registry's content as the rules serve it: its versions, its labels (each naming a
// served version with its digest), and the version keys written again, never served.
type State struct {
	Versions  []Version
	Labels    map[string]map[string]int // name -> label -> version
	Rewritten map[string][]int
}

// Labelled is the version a label of name points at.
func (s State) Labelled(name, label string) (Version, bool) {
	n, ok := s.Labels[name][label]
	if !ok {
		return Version{}, false
	}
	return s.Version(name, n)
}

// LabelsOf are the labels that name v, sorted.
func (s State) LabelsOf(v Version) []string {
	var out []string
	for label, n := range s.Labels[v.Name] {
		if n == v.Version {
			out = append(out, label)
		}
	}
	slices.Sort(out)
	return out
}

// Version is name's version n.
func (s State) Version(name string, n int) (Version, bool) {
	i := slices.IndexFunc(s.Versions, func(v Version) bool { return v.Name == name && v.Version == n })
	if i < 0 {
		return Version{}, false
	}
	return s.Versions[i], true
}

// Serving is every version a production label points at, in the order a model's builder is
// chosen: the highest priority first, then the name.
func (s State) Serving() []Version {
	var out []Version
	for _, name := range s.names() {
		if v, ok := s.Labelled(name, Production); ok {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b Version) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// For is the builder of model: the first of Serving whose globs match it.
func (s State) For(model string) (Version, bool) {
	for _, v := range s.Serving() {
		if v.Serves(model) {
			return v, true
		}
	}
	return Version{}, false
}

func (s State) names() []string {
	var out []string
	for _, v := range s.Versions {
		out = append(out, v.Name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Parse reads the bucket's content by the registry's rules; an entry they leave out, or a
// document that is not a builder version, is an error.
func Parse(c registry.Content) (State, []error) {
	en := registry.Resolve(c)
	s := State{Labels: map[string]map[string]int{}, Rewritten: en.Rewritten}
	errs := en.Problems
	for _, name := range slices.Sorted(maps.Keys(en.Docs)) {
		for _, n := range slices.Sorted(maps.Keys(en.Docs[name])) {
			d := en.Docs[name][n]
			var v Version
			if err := json.Unmarshal(d.Value, &v); err != nil || len(v.SHA256) != 64 {
				errs = append(errs, fmt.Errorf("builders: version %d of %s is not a builder version (%v)", n, name, err))
				continue
			}
			v.Digest = d.Digest
			s.Versions = append(s.Versions, v)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(en.Labels)) {
		for _, label := range slices.Sorted(maps.Keys(en.Labels[name])) {
			t := en.Labels[name][label]
			if _, ok := s.Version(name, t[0].Version); len(t) != 1 || !ok {
				errs = append(errs, fmt.Errorf("builders: label %s of %s names %s: a builder label names one served version", label, name, t))
				continue
			}
			if s.Labels[name] == nil {
				s.Labels[name] = map[string]int{}
			}
			s.Labels[name][label] = t[0].Version
		}
	}
	return s, errs
}

// Load reads the bucket and parses it: the state, and the entries it had to leave out.
func Load(ctx context.Context, kv jetstream.KeyValue) (State, []error, error) {
	c, err := registry.Read(ctx, kv)
	if err != nil {
		return State{}, nil, err
	}
	s, bad := Parse(c)
	return s, bad, nil
}

// Push stores module as the next version of name, serving models with priority. check runs
// first (the CLI loads the module as composers will): a module that cannot load is refused here.
// The bytes are stored before the version that names them, so no version ever names bytes that
// are missing; the version number is claimed with a create, so two pushes never share one.
func Push(ctx context.Context, kv jetstream.KeyValue, modules *Store, name string, module []byte, models []string, priority int, check func([]byte) error) (Version, error) {
	if !events.ValidIdentifier(name) {
		return Version{}, fmt.Errorf("builders: name %s must be an identifier", events.Quote(name))
	}
	if len(models) == 0 {
		return Version{}, errors.New("builders: a builder serves at least one model glob (--models)")
	}
	for _, g := range models {
		if _, err := path.Match(g, ""); err != nil || g == "" {
			return Version{}, fmt.Errorf("builders: model glob %s is not a glob", events.Quote(g))
		}
	}
	if len(module) > MaxModuleBytes {
		return Version{}, fmt.Errorf("builders: the module is %d bytes, over %d", len(module), MaxModuleBytes)
	}
	if err := check(module); err != nil {
		return Version{}, err
	}
	sum := wasm.SHA256(module)
	if err := modules.Put(ctx, module); err != nil {
		return Version{}, err
	}
	var v Version
	_, err := registry.Next(ctx, kv, name, func(n int) ([]byte, error) {
		v = Version{Name: name, Version: n, SHA256: sum, Size: int64(len(module)), Models: models, Priority: priority}
		doc, err := json.Marshal(v)
		v.Digest = registry.Digest(doc)
		return doc, err
	})
	if err != nil {
		return Version{}, fmt.Errorf("builders: %w", err)
	}
	return v, nil
}

// Label points a label of name at one of its versions (a release, or a rollback) by the
// registry's rules (registry.Move): with its digest, refused when digest is given and the version
// is no longer that document. Moving production first copies the version's module from the
// authors' store into the releases store, checked against its sha256. What the label names now is
// returned.
func Label(ctx context.Context, kv jetstream.KeyValue, modules, releases *Store, name, label string, version int, digest string) (registry.Target, error) {
	copied := func(d registry.Doc) error {
		if label != Production {
			return nil
		}
		var v Version
		if err := json.Unmarshal(d.Value, &v); err != nil {
			return fmt.Errorf("builders: version %d of %s: %w", d.Version, name, err)
		}
		if _, err := releases.Module(ctx, v); err == nil {
			return nil // released before, and whole: a rollback needs nothing of the authors' store
		}
		module, err := modules.Module(ctx, v)
		if err != nil {
			return err
		}
		if err := releases.Put(ctx, module); err != nil { // nothing when copied before, and whole
			return fmt.Errorf("builders: copy the module of %s@%d for release: %w", name, d.Version, err)
		}
		return nil
	}
	return registry.Move(ctx, kv, name, label, registry.Target{{Version: version, Digest: digest, Weight: 1}}, copied)
}
