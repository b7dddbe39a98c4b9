package registry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/compose"
)

// VersionsOf are the versions of one name, ascending.
func (s State) VersionsOf(name string) []compose.Version {
	var found []compose.Version
	for _, v := range s.Versions {
		if v.Name == name {
			found = append(found, v)
		}
	}
	slices.SortFunc(found, func(a, b compose.Version) int { return a.Version - b.Version })
	return found
}

// Names are the registry's template names, sorted.
func (s State) Names() []string {
	names := map[string]bool{}
	for _, v := range s.Versions {
		names[v.Name] = true
	}
	return slices.Sorted(maps.Keys(names))
}

// Source is a version's files, each under a header, in path order: what a diff of two versions
// compares.
func Source(v compose.Version) string {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(v.Files)) {
		fmt.Fprintf(&b, "== %s ==\n%s", p, v.Files[p])
		if !strings.HasSuffix(string(v.Files[p]), "\n") {
			b.WriteString("\n")
		}
	}
	return b.String()
}

// Change is one entry of a name's history: a version pushed (or written again, or deleted), or
// a label moved.
type Change struct {
	Revision uint64
	Time     time.Time
	Version  int    // the version pushed, or the first one the label now names
	Label    string // empty for a version
	Target   string // what the label names, as stored ("5@<sha256>", or a split)
	Again    bool   // the version's key was written before: this write is never served
	Deleted  bool
}

// What says what the change did, as the CLI and the console list it.
func (c Change) What() string {
	switch {
	case c.Label != "" && c.Deleted:
		return fmt.Sprintf("label %s deleted", c.Label)
	case c.Label != "":
		return fmt.Sprintf("label %s -> %s", c.Label, c.Target)
	case c.Again && c.Deleted:
		return fmt.Sprintf("version %d deleted (written again: never served from its key)", c.Version)
	case c.Deleted:
		return fmt.Sprintf("version %d deleted", c.Version)
	case c.Again:
		return fmt.Sprintf("version %d written again (never served from its key)", c.Version)
	}
	return "pushed version " + strconv.Itoa(c.Version)
}

// History lists every version written and label moved of name, in the order they happened; a
// label's copies (pin keys) are left out, as they follow its moves.
func History(ctx context.Context, kv jetstream.KeyValue, name string) ([]Change, error) {
	watcher, err := kv.Watch(ctx, name+".>", jetstream.IncludeHistory())
	if err != nil {
		return nil, fmt.Errorf("registry: history of %s: %w", name, err)
	}
	defer watcher.Stop()
	var out []Change
	written := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case entry := <-watcher.Updates():
			if entry == nil {
				return out, nil // the history is read: what follows would be live changes
			}
			c := Change{Revision: entry.Revision(), Time: entry.Created().UTC(), Deleted: entry.Operation() != jetstream.KeyValuePut}
			rest := strings.TrimPrefix(entry.Key(), name+".")
			switch {
			case strings.HasPrefix(rest, "label."):
				c.Label, c.Target = strings.TrimPrefix(rest, "label."), string(entry.Value())
				if t, err := ParseTarget(c.Target); err == nil {
					c.Version = t[0].Version
				}
			case strings.HasPrefix(rest, "v"):
				c.Version, _ = strconv.Atoi(strings.TrimPrefix(rest, "v"))
				c.Again = written[entry.Key()]
				written[entry.Key()] = true
			default:
				continue
			}
			out = append(out, c)
		}
	}
}

// ProductionOf is the version the production label of name gives (a split's first version, the
// one whose share came first); 0 when name has no production label. `templates compare` measures
// every other version against it.
func (s State) ProductionOf(name string) int {
	if split := s.Splits[name]["production"]; len(split) > 0 {
		return split[0].Version
	}
	return s.Labels[name]["production"]
}
