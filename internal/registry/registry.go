// Package registry is the template registry in JetStream key-value (bucket TEMPLATES, history
// kept): immutable versions of each template, numbered per name, and movable labels. Composers
// watch it; the podium CLI pushes versions and moves labels. Keys:
//
//	<name>.v<N>            a version: JSON {"name", "version", "files": {path: text}}
//	<name>.label.<label>   the version a label points at, in decimal
//
// "latest" is never stored: it is the highest version.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Bucket is the key-value bucket of the registry.
const Bucket = "TEMPLATES"

// Config is the bucket's configuration: every change is kept (History) so a label's moves and a
// name's versions can be listed, and nothing expires.
func Config(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: Bucket, Description: "podium template registry: versions and labels",
		History: 64, Replicas: max(replicas, 1), Storage: jetstream.FileStorage}
}

// VersionKey is the key of a version.
func VersionKey(name string, version int) string { return name + ".v" + strconv.Itoa(version) }

// LabelKey is the key of a label.
func LabelKey(name, label string) string { return name + ".label." + label }

type document struct {
	Name    string            `json:"name"`
	Version int               `json:"version"`
	Files   map[string]string `json:"files"`
}

// Encode is the stored form of a version.
func Encode(v compose.Version) ([]byte, error) {
	d := document{Name: v.Name, Version: v.Version, Files: map[string]string{}}
	for p, b := range v.Files {
		d.Files[p] = string(b)
	}
	return json.Marshal(d)
}

// State is the registry's content: its versions and, by name, its labels: those that point at one
// version, and those that split between several by weight.
type State struct {
	Versions []compose.Version
	Labels   map[string]map[string]int
	Splits   map[string]map[string]compose.Split
}

// Parse reads the registry's current entries (key -> value). An entry that is not a version or
// a label of the layout above is returned as an error and left out.
func Parse(entries map[string][]byte) (State, []error) {
	s := State{Labels: map[string]map[string]int{}, Splits: map[string]map[string]compose.Split{}}
	var errs []error
	for key, value := range entries {
		name, rest, _ := strings.Cut(key, ".")
		switch {
		case strings.HasPrefix(rest, "label."):
			label := strings.TrimPrefix(rest, "label.")
			split, err := ParseSplit(string(value))
			if err != nil {
				errs = append(errs, fmt.Errorf("registry: label %s holds %s: %v", key, events.Quote(string(value)), err))
				continue
			}
			if len(split) == 1 {
				if s.Labels[name] == nil {
					s.Labels[name] = map[string]int{}
				}
				s.Labels[name][label] = split[0].Version
				continue
			}
			if s.Splits[name] == nil {
				s.Splits[name] = map[string]compose.Split{}
			}
			s.Splits[name][label] = split
		case strings.HasPrefix(rest, "v"):
			var d document
			n, err := strconv.Atoi(rest[1:])
			if err == nil {
				err = json.Unmarshal(value, &d)
			}
			if err != nil || d.Name != name || d.Version != n {
				errs = append(errs, fmt.Errorf("registry: %s is not a version of %s (%v)", key, name, err))
				continue
			}
			v := compose.Version{Name: name, Version: n, Files: map[string][]byte{}}
			for p, text := range d.Files {
				v.Files[p] = []byte(text)
			}
			s.Versions = append(s.Versions, v)
		default:
			errs = append(errs, fmt.Errorf("registry: unknown key %s", key))
		}
	}
	return s, errs
}

// Read returns every current entry of the bucket.
func Read(ctx context.Context, kv jetstream.KeyValue) (map[string][]byte, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("registry: list: %w", err)
	}
	out := map[string][]byte{}
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("registry: get %s: %w", key, err)
		}
		out[key] = e.Value()
	}
	return out, nil
}

// Load reads the bucket and parses it: the state, and the entries it had to leave out.
func Load(ctx context.Context, kv jetstream.KeyValue) (State, []error, error) {
	entries, err := Read(ctx, kv)
	if err != nil {
		return State{}, nil, err
	}
	s, bad := Parse(entries)
	return s, bad, nil
}

// Push stores files as the next version of name, after checking them exactly as composers will
// (compose.LoadVersion): a bad template is refused here with its name, line and variable. The
// version number is claimed with a create, so two pushes never get the same one.
func Push(ctx context.Context, kv jetstream.KeyValue, name string, files map[string][]byte) (int, error) {
	entries, err := Read(ctx, kv)
	if err != nil {
		return 0, err
	}
	next := 1
	for key := range entries {
		if n, err := strconv.Atoi(strings.TrimPrefix(key, name+".v")); err == nil && strings.HasPrefix(key, name+".v") {
			next = max(next, n+1)
		}
	}
	for ; ; next++ {
		v := compose.Version{Name: name, Version: next, Files: files}
		if _, err := compose.LoadVersion(v); err != nil {
			return 0, err
		}
		doc, err := Encode(v)
		if err != nil {
			return 0, err
		}
		_, err = kv.Create(ctx, VersionKey(name, next), doc)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // pushed by someone else meanwhile: take the next number
		}
		if err != nil {
			return 0, fmt.Errorf("registry: push %s: %w", name, err)
		}
		return next, nil
	}
}

// ParseSplit reads a label's value: one version ("5"), or versions with weights ("5=50,6=50"),
// each version once, each weight positive.
func ParseSplit(value string) (compose.Split, error) {
	var split compose.Split
	for part := range strings.SplitSeq(value, ",") {
		v, w, weighted := strings.Cut(part, "=")
		version, err := strconv.Atoi(v)
		if err != nil || version < 1 {
			return nil, fmt.Errorf("%s is not a version", events.Quote(v))
		}
		weight := 1
		if weighted {
			if weight, err = strconv.Atoi(w); err != nil || weight < 1 {
				return nil, fmt.Errorf("the weight of version %d must be a positive number, got %s", version, events.Quote(w))
			}
		} else if strings.Contains(value, ",") {
			return nil, fmt.Errorf("version %d has no weight: a split gives every version one (5=50,6=50)", version)
		}
		if slices.ContainsFunc(split, func(sh compose.Share) bool { return sh.Version == version }) {
			return nil, fmt.Errorf("version %d twice", version)
		}
		split = append(split, compose.Share{Version: version, Weight: weight})
	}
	slices.SortFunc(split, func(a, b compose.Share) int { return a.Version - b.Version })
	return split, nil
}

// Label points a label of name at one of its versions, or splits it between several by weight
// (split: their versions and weights; one share is a plain label), each of which must exist.
// Moving a label, or its weights, is one write of one key: a rollback, a release, an experiment.
func Label(ctx context.Context, kv jetstream.KeyValue, name, label string, split compose.Split) error {
	if !events.ValidIdentifier(label) || label == "latest" {
		return fmt.Errorf("registry: label %s must be an identifier other than latest", events.Quote(label))
	}
	if len(split) == 0 {
		return fmt.Errorf("registry: label %s: no version", label)
	}
	value := strconv.Itoa(split[0].Version)
	if len(split) > 1 {
		value = split.String()
	}
	if _, err := ParseSplit(value); err != nil {
		return fmt.Errorf("registry: label %s: %w", label, err)
	}
	for _, sh := range split {
		if _, err := kv.Get(ctx, VersionKey(name, sh.Version)); err != nil {
			return fmt.Errorf("registry: %s has no version %d: %w", name, sh.Version, err)
		}
	}
	if _, err := kv.Put(ctx, LabelKey(name, label), []byte(value)); err != nil {
		return fmt.Errorf("registry: label %s: %w", label, err)
	}
	return nil
}
