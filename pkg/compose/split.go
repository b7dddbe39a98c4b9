package compose

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"github.com/podium-llm/podium/pkg/events"
)

// A label may split its traffic between versions by weight (`podium templates label team-round
// 5=50 6=50 production`). Which version a request gets is chosen from its execution and team, so a
// team keeps its version for the whole execution:
//   - a team that was served under the label in this execution before keeps that version (its
//     record says which), as long as the label still gives it weight: a change of weights while
//     the execution runs moves no team that has started;
//   - a team's first request takes the version its hash falls on against the cumulative weights:
//     FNV-1a of execution, team, name and label, so every composer replica chooses the same
//     without asking any other.
// The hash alone would keep a team's version while the weights stay, but a change of weights moves
// the boundaries and with them some teams: the record of the team's first prompt is what makes the
// choice sticky across weight changes.

// Share is one version of a split label and its weight.
type Share struct {
	Version, Weight int
}

// Split is a label's versions and weights, by version.
type Split []Share

// String writes a split as the registry stores it: "5=50,6=50".
func (s Split) String() string {
	parts := make([]string, len(s))
	for i, sh := range s {
		parts[i] = fmt.Sprintf("%d=%d", sh.Version, sh.Weight)
	}
	return strings.Join(parts, ",")
}

// WithSplits returns a library whose registry labels also split between versions (name -> label
// -> split). A split label of a name without a loaded version is left out.
func (l *Library) WithSplits(splits map[string]map[string]Split) *Library {
	out := *l
	out.registry = make(map[string]*registered, len(l.registry))
	for name, r := range l.registry {
		c := *r
		c.splits = map[string]Split{}
		for label, s := range r.splits {
			c.splits[label] = s
		}
		out.registry[name] = &c
	}
	for name, ls := range splits {
		r := out.registry[name]
		if r == nil {
			continue
		}
		for label, s := range ls {
			r.splits[label] = slices.Clone(s)
		}
	}
	return &out
}

// Assignment is what chooses a version of a split label for a request.
type Assignment struct {
	ExecutionID, TeamID string
	// Previous is the version the team was served under the same name and label earlier in the
	// execution (0: none, or unknown).
	Previous int
}

// Label is the registry label a reference resolves through: the label (a bare name's is
// production; "" when the reference resolves through no registry label: a version, latest, or a
// built-in or directory template), and the label's split when it splits between versions (nil
// for a label of one version).
func (l *Library) Label(ref events.Reference) (label string, split Split) {
	if ref.Version > 0 || ref.Label == "latest" {
		return "", nil
	}
	label = cmp.Or(ref.Label, "production")
	r := l.registry[cmp.Or(ref.Name, l.defaultName)]
	if r == nil {
		return "", nil
	}
	if split, ok := r.splits[label]; ok {
		return label, split
	}
	if _, ok := r.labels[label]; ok {
		return label, nil
	}
	return "", nil
}

// Choose is the version of split a request gets (see the top of this file).
func Choose(split Split, name, label string, a Assignment) (int, error) {
	total := 0
	for _, sh := range split {
		total += sh.Weight
		if sh.Version == a.Previous && sh.Weight > 0 {
			return a.Previous, nil
		}
	}
	if total <= 0 {
		return 0, events.Failf(events.CodeUnknownTemplate, "template %q: label %q gives no version any weight", name, label)
	}
	h := fnv.New64a()
	for _, part := range []string{a.ExecutionID, a.TeamID, name, label} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	point := int(h.Sum64() % uint64(total))
	for _, sh := range split {
		if point < sh.Weight {
			return sh.Version, nil
		}
		point -= sh.Weight
	}
	return split[len(split)-1].Version, nil // unreachable: point < total
}
