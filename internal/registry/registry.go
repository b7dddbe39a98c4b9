// Package registry keeps versions and labels in JetStream key-value buckets, for templates
// (bucket TEMPLATES, this file) and prompt builders (BUILDERS, internal/builders) alike: one key
// layout and one set of rules (versions.go) decide what a version is, what a label names and
// which document is served. Composers watch the buckets; the podium CLI pushes versions and moves
// labels. A template version's document is JSON {"name", "version", "files": {path: text}}.
//
// "latest" is never stored: it is the highest version served.
package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/compose"
)

// Bucket is the key-value bucket of the registry.
const Bucket = "TEMPLATES"

// Config is the bucket's configuration: every change is kept (History) so a label's moves and a
// name's versions can be listed, and nothing expires.
func Config(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: Bucket, Description: "podium template registry: versions and labels",
		History: 64, Replicas: max(replicas, 1), Storage: jetstream.FileStorage}
}

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

// State is the template registry's content as the rules serve it (versions.go): its versions;
// by name, its labels (those that name one version, and those that split between several by
// weight); each served version's digest; and the version keys written again, never served.
type State struct {
	Versions  []compose.Version
	Labels    map[string]map[string]int
	Splits    map[string]map[string]compose.Split
	Digests   map[string]map[int]string
	Rewritten map[string][]int
}

// Parse reads the registry's content (every key's value and writes). An entry the rules leave out
// (not of the layout, a document that is not a version, a label whose version is not served with
// its digest) is returned as an error.
func Parse(c Content) (State, []error) {
	en := Resolve(c)
	s := State{Labels: map[string]map[string]int{}, Splits: map[string]map[string]compose.Split{},
		Digests: map[string]map[int]string{}, Rewritten: en.Rewritten}
	errs := en.Problems
	for _, name := range slices.Sorted(maps.Keys(en.Docs)) {
		for _, n := range slices.Sorted(maps.Keys(en.Docs[name])) {
			var d document
			if err := json.Unmarshal(en.Docs[name][n].Value, &d); err != nil {
				errs = append(errs, fmt.Errorf("registry: version %d of %s is not a template (%v)", n, name, err))
				continue
			}
			v := compose.Version{Name: name, Version: n, Files: map[string][]byte{}}
			for p, text := range d.Files {
				v.Files[p] = []byte(text)
			}
			s.Versions = append(s.Versions, v)
			setIn(s.Digests, name, n, en.Docs[name][n].Digest)
		}
	}
	for name, labels := range en.Labels {
		for label, l := range labels {
			if len(l) == 1 {
				setIn(s.Labels, name, label, l[0].Version)
				continue
			}
			split := make(compose.Split, len(l))
			for i, sh := range l {
				split[i] = compose.Share{Version: sh.Version, Weight: sh.Weight}
			}
			setIn(s.Splits, name, label, split)
		}
	}
	return s, errs
}

// Load reads the bucket and parses it: the state, and the entries it had to leave out.
func Load(ctx context.Context, kv jetstream.KeyValue) (State, []error, error) {
	c, err := Read(ctx, kv)
	if err != nil {
		return State{}, nil, err
	}
	s, bad := Parse(c)
	return s, bad, nil
}

// Push stores files as the next version of name, after checking them exactly as composers will
// (compose.LoadVersion): a bad template is refused here with its name, line and variable.
func Push(ctx context.Context, kv jetstream.KeyValue, name string, files map[string][]byte) (int, error) {
	return Next(ctx, kv, name, func(n int) ([]byte, error) {
		v := compose.Version{Name: name, Version: n, Files: files}
		if _, err := compose.LoadVersion(v); err != nil {
			return nil, err
		}
		return Encode(v)
	})
}

// Label points a label of name at one of its versions, or splits it between several by weight,
// each as the rules serve it and, where the share names one, with that digest (versions.go,
// Move). Moving a label, or its weights, is one write of one key: a rollback, a release, an
// experiment. What the label names now, digests included, is returned.
func Label(ctx context.Context, kv jetstream.KeyValue, name, label string, l Target) (Target, error) {
	return Move(ctx, kv, name, label, l, nil)
}
