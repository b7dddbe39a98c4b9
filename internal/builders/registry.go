// Package builders is the registry of prompt builders (docs/builders.md) in JetStream. A module's
// bytes are an object of the object store BUILDER_MODULES named by their sha256: the store cuts
// them into chunks, so a module of megabytes (a Go builder is about 3 MiB) fits however small the
// server's max payload, and a module pushed twice is stored once. Versions and labels are keys of
// the key-value bucket BUILDERS, every change kept, as the template registry keeps its own:
//
//	<name>.v<N>            a version: JSON {"name", "version", "sha256", "size", "models", "priority"}
//	<name>.label.<label>   the version a label points at and the sha256 of its document: "<N>:<hex>"
//
// A pushed version serves nothing: a request is built by the version its name's production label
// points at, and only when its model matches that version's globs. The label pins the version's
// document as it was labelled: whoever may write versions but not production (an author) cannot
// change what production serves by writing the version's key again (Pinned).
package builders

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Bucket and Modules are the key-value bucket of versions and labels and the object store of the
// modules' bytes.
const (
	Bucket  = "BUILDERS"
	Modules = "BUILDER_MODULES"
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

// ModulesConfig is the object store of the modules.
func ModulesConfig(replicas int) jetstream.ObjectStoreConfig {
	return jetstream.ObjectStoreConfig{Bucket: Modules, Description: "podium prompt builders: the modules' bytes, named by sha256",
		Replicas: max(replicas, 1), Storage: jetstream.FileStorage}
}

// Version is one pushed version of a builder.
type Version struct {
	Name     string   `json:"name"`
	Version  int      `json:"version"`
	SHA256   string   `json:"sha256"`
	Size     int64    `json:"size"`
	Models   []string `json:"models"`   // globs (path.Match), matched case-insensitively
	Priority int      `json:"priority"` // the highest wins among the builders of a model; then the name
	// Digest is the sha256 of the version's stored document, what a label pins (not stored in it).
	Digest string `json:"-"`
}

// Serves reports whether the version's globs match model, as a template variant's do.
func (v Version) Serves(model string) bool { return compose.ModelMatches(v.Models, model) }

// State is the registry's content.
type State struct {
	Versions []Version
	Labels   map[string]map[string]int    // name -> label -> version
	Pins     map[string]map[string]string // name -> label -> the digest of the version it was moved to
}

// Pinned says whether label still names v's document as it was when the label was moved to it: an
// error when the label holds no digest (written by hand) or v's key was written again since.
func (s State) Pinned(v Version, label string) error {
	switch pin := s.Pins[v.Name][label]; pin {
	case "":
		return fmt.Errorf("label %s of builder %s holds no digest of version %d (not moved by podium builders label): label it again", label, v.Name, v.Version)
	case v.Digest:
		return nil
	default:
		return fmt.Errorf("version %d of builder %s was written again since it was labelled %s: label it again once checked", v.Version, v.Name, label)
	}
}

// Labelled is the version a label of name points at.
func (s State) Labelled(name, label string) (Version, bool) {
	n, ok := s.Labels[name][label]
	if !ok {
		return Version{}, false
	}
	return s.Version(name, n)
}

// LabelsOf are the labels that point at v, sorted; one that no longer pins v's document says so.
func (s State) LabelsOf(v Version) []string {
	var out []string
	for label, n := range s.Labels[v.Name] {
		if n == v.Version {
			if s.Pinned(v, label) != nil {
				label += " (not pinned: label it again)"
			}
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

func versionKey(name string, version int) string { return name + ".v" + strconv.Itoa(version) }

func labelKey(name, label string) string { return name + ".label." + label }

// Parse reads the bucket's current entries; an entry of another layout is an error, left out.
func Parse(entries map[string][]byte) (State, []error) {
	s := State{Labels: map[string]map[string]int{}, Pins: map[string]map[string]string{}}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(entries)) {
		value := entries[key]
		name, rest, _ := strings.Cut(key, ".")
		switch {
		case strings.HasPrefix(rest, "label."):
			number, pin, _ := strings.Cut(string(value), ":")
			n, err := strconv.Atoi(number)
			if err != nil || n < 1 {
				errs = append(errs, fmt.Errorf("builders: label %s holds %s, not a version", key, events.Quote(string(value))))
				continue
			}
			label := strings.TrimPrefix(rest, "label.")
			if s.Labels[name] == nil {
				s.Labels[name], s.Pins[name] = map[string]int{}, map[string]string{}
			}
			s.Labels[name][label], s.Pins[name][label] = n, pin
		case strings.HasPrefix(rest, "v"):
			var v Version
			n, err := strconv.Atoi(rest[1:])
			if err == nil {
				err = json.Unmarshal(value, &v)
			}
			if err != nil || v.Name != name || v.Version != n || len(v.SHA256) != 64 {
				errs = append(errs, fmt.Errorf("builders: %s is not a version of %s (%v)", key, name, err))
				continue
			}
			v.Digest = hexSHA256(value)
			s.Versions = append(s.Versions, v)
		default:
			errs = append(errs, fmt.Errorf("builders: unknown key %s", key))
		}
	}
	slices.SortFunc(s.Versions, func(a, b Version) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return a.Version - b.Version
	})
	return s, errs
}

// Load reads the bucket and parses it: the state, and the entries it had to leave out.
func Load(ctx context.Context, kv jetstream.KeyValue) (State, []error, error) {
	entries, err := registry.Read(ctx, kv)
	if err != nil {
		return State{}, nil, err
	}
	s, bad := Parse(entries)
	return s, bad, nil
}

// Push stores module as the next version of name, serving models with priority. check runs
// first (the CLI loads the module as composers will): a module that cannot load is refused here.
// The bytes are stored before the version that names them, so no version ever names bytes that
// are missing; the version number is claimed with a create, so two pushes never share one.
func Push(ctx context.Context, kv jetstream.KeyValue, obj jetstream.ObjectStore, name string, module []byte, models []string, priority int, check func([]byte) error) (Version, error) {
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
	// Bytes already stored whole are not written again (a write over an object purges its old
	// chunks, which authors need not be allowed); bytes that differ under their name are.
	if info, err := obj.GetInfo(ctx, sum); err != nil || info.Digest != objectDigest(module) {
		if _, err := obj.PutBytes(ctx, sum, module); err != nil {
			return Version{}, fmt.Errorf("builders: store the module: %w", err)
		}
	}
	s, _, err := Load(ctx, kv)
	if err != nil {
		return Version{}, err
	}
	next := 1
	for _, v := range s.Versions {
		if v.Name == name {
			next = max(next, v.Version+1)
		}
	}
	for ; ; next++ {
		v := Version{Name: name, Version: next, SHA256: sum, Size: int64(len(module)), Models: models, Priority: priority}
		doc, err := json.Marshal(v)
		if err != nil {
			return Version{}, err
		}
		_, err = kv.Create(ctx, versionKey(name, next), doc)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // pushed by someone else meanwhile: take the next number
		}
		if err != nil {
			return Version{}, fmt.Errorf("builders: push %s: %w", name, err)
		}
		return v, nil
	}
}

// Label points a label of name at one of its versions (a release, or a rollback), pinning the
// version's document as it is now.
func Label(ctx context.Context, kv jetstream.KeyValue, name, label string, version int) error {
	if !events.ValidIdentifier(label) || label == "latest" {
		return fmt.Errorf("builders: label %s must be an identifier other than latest", events.Quote(label))
	}
	doc, err := kv.Get(ctx, versionKey(name, version))
	if err != nil {
		return fmt.Errorf("builders: %s has no version %d: %w", name, version, err)
	}
	if _, err := kv.Put(ctx, labelKey(name, label), []byte(strconv.Itoa(version)+":"+hexSHA256(doc.Value()))); err != nil {
		return fmt.Errorf("builders: label %s: %w", label, err)
	}
	return nil
}

// Module reads a version's bytes and checks them against its size (before reading them) and its
// sha256.
func Module(ctx context.Context, obj jetstream.ObjectStore, v Version) ([]byte, error) {
	info, err := obj.GetInfo(ctx, v.SHA256)
	if err != nil {
		return nil, fmt.Errorf("builders: the module of %s@%d: %w", v.Name, v.Version, err)
	}
	if int64(info.Size) != v.Size {
		return nil, fmt.Errorf("builders: the module of %s@%d is %d bytes, not %d", v.Name, v.Version, info.Size, v.Size)
	}
	b, err := obj.GetBytes(ctx, v.SHA256)
	if err != nil {
		return nil, fmt.Errorf("builders: the module of %s@%d: %w", v.Name, v.Version, err)
	}
	if got := wasm.SHA256(b); got != v.SHA256 {
		return nil, fmt.Errorf("builders: the module of %s@%d has sha256 %s, not %s", v.Name, v.Version, got, v.SHA256)
	}
	return b, nil
}

// hexSHA256 is the hex sha256 of b.
func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// objectDigest is the object store's digest of b: "SHA-256=" and the base64url sha256.
func objectDigest(b []byte) string {
	sum := sha256.Sum256(b)
	return "SHA-256=" + base64.URLEncoding.EncodeToString(sum[:])
}
