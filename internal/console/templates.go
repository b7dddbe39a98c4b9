package console

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/textdiff"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

type templatesPage struct {
	Registry    []registryName
	NoRegistry  bool
	RegistryErr []string // entries the registry holds that are not versions or labels
	Builtin     []*compose.Template
	Builders    []builders.Version
	BuilderTags map[string]string // name@version -> its labels
	BuildersErr []string
	Sees        string // what every builder is handed
}

type registryName struct {
	Name     string
	Versions []int
	Labels   []labelView
	Splits   []string // labels split between versions: "production=[5=50,6=50]"
	// Rewritten are the versions whose key was written again: never served from it.
	Rewritten []int
}

type labelView struct {
	Label   string
	Version int
}

// registryState reads the TEMPLATES bucket; ok is false when there is none.
func (c *Console) registryState(r *http.Request) (registry.State, jetstream.KeyValue, []error, bool, error) {
	kv, err := c.d.JS.KeyValue(r.Context(), registry.Bucket)
	if isNotFound(err) {
		return registry.State{}, nil, nil, false, nil
	}
	if err != nil {
		return registry.State{}, nil, nil, false, fmt.Errorf("registry: %w", err)
	}
	s, bad, err := registry.Load(r.Context(), kv)
	if err != nil {
		return registry.State{}, nil, nil, false, err
	}
	return s, kv, bad, true, nil
}

// templates is GET /templates: the registry's names, versions and labels, and the templates
// composers have without it.
func (c *Console) templates(r *http.Request, _ evaluations) (any, error) {
	s, _, bad, ok, err := c.registryState(r)
	if err != nil {
		return nil, err
	}
	p := templatesPage{NoRegistry: !ok, Builtin: c.d.Builtin}
	for _, e := range bad {
		p.RegistryErr = append(p.RegistryErr, e.Error())
	}
	if err := c.addBuilders(r, &p); err != nil {
		return nil, err
	}
	names := s.Names()
	for name := range s.Rewritten { // a name whose every version was written again is named too
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		n := registryName{Name: name}
		for _, v := range s.VersionsOf(name) {
			n.Versions = append(n.Versions, v.Version)
		}
		n.Labels, n.Splits, n.Rewritten = sortedLabels(s.Labels[name]), splitsOf(s, name), s.Rewritten[name]
		p.Registry = append(p.Registry, n)
	}
	return p, nil
}

// addBuilders lists the prompt builders' versions and labels, when there is a registry of them.
func (c *Console) addBuilders(r *http.Request, p *templatesPage) error {
	kv, err := c.d.JS.KeyValue(r.Context(), builders.Bucket)
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("builders: %w", err)
	}
	s, bad, err := builders.Load(r.Context(), kv)
	if err != nil {
		return err
	}
	p.Builders, p.BuilderTags, p.Sees = s.Versions, map[string]string{}, builders.Sees
	for _, v := range s.Versions {
		p.BuilderTags[fmt.Sprintf("%s@%d", v.Name, v.Version)] = strings.Join(s.LabelsOf(v), " ")
	}
	for _, e := range bad {
		p.BuildersErr = append(p.BuildersErr, e.Error())
	}
	return nil
}

// splitsOf are a name's labels split between versions, as `podium templates list` writes them.
func splitsOf(s registry.State, name string) []string {
	var out []string
	for _, l := range slices.Sorted(maps.Keys(s.Splits[name])) {
		out = append(out, fmt.Sprintf("%s=[%s]", l, s.Splits[name][l]))
	}
	return out
}

func sortedLabels(m map[string]int) []labelView {
	out := make([]labelView, 0, len(m))
	for l, v := range m {
		out = append(out, labelView{l, v})
	}
	slices.SortFunc(out, func(a, b labelView) int { return strings.Compare(a.Label, b.Label) })
	return out
}

type templatePage struct {
	Name       string
	Versions   []int
	Labels     []labelView
	Splits     []string // labels split between versions: "production=[5=50,6=50]"
	Rewritten  []int    // versions whose key was written again: never served from it
	History    []registry.Change
	A, B       int
	Diff       *diffView
	Show       int
	Source     clipped
	Experiment *experimentView
	Try        *tryView
}

// template is GET /templates/{name}[?a=V&b=W][&show=V]: a name's versions, labels and history,
// the diff of two versions and the source of one.
func (c *Console) template(r *http.Request, ev evaluations) (any, error) {
	name := r.PathValue("name")
	if !events.ValidIdentifier(name) {
		return nil, badRequest("template name %s is not an identifier", events.Quote(name))
	}
	s, kv, _, ok, err := c.registryState(r)
	if err != nil {
		return nil, err
	}
	versions := s.VersionsOf(name)
	if !ok || len(versions) == 0 {
		return nil, notFound("the registry has no template %s", events.Quote(name))
	}
	p := templatePage{Name: name, Labels: sortedLabels(s.Labels[name]), Splits: splitsOf(s, name), Rewritten: s.Rewritten[name]}
	byVersion := map[int]compose.Version{}
	for _, v := range versions {
		p.Versions = append(p.Versions, v.Version)
		byVersion[v.Version] = v
	}
	if p.History, err = registry.History(r.Context(), kv, name); err != nil {
		return nil, err
	}
	q := r.URL.Query()
	pick := func(param string, def int) (int, error) {
		if q.Get(param) == "" {
			return def, nil
		}
		n, err := strconv.Atoi(q.Get(param))
		if _, ok := byVersion[n]; err != nil || !ok {
			return 0, badRequest("%s: %s has no version %s", param, name, events.Quote(q.Get(param)))
		}
		return n, nil
	}
	latest := p.Versions[len(p.Versions)-1]
	if p.A, err = pick("a", max(latest-1, p.Versions[0])); err != nil {
		return nil, err
	}
	if p.B, err = pick("b", latest); err != nil {
		return nil, err
	}
	if p.Show, err = pick("show", latest); err != nil {
		return nil, err
	}
	a, b := byVersion[p.A], byVersion[p.B]
	var out strings.Builder
	textdiff.Unified(&out, fmt.Sprintf("%s@%d", name, p.A), fmt.Sprintf("%s@%d", name, p.B), registry.Source(a), registry.Source(b), 3)
	p.Diff = linesOf(out.String())
	p.Source = clip(registry.Source(byVersion[p.Show]), shownBytes)
	if p.Experiment, err = c.experimentOf(r.Context(), ev, name, s.ProductionOf(name)); err != nil {
		return nil, err
	}
	if p.Try, err = c.tryOf(r, name); err != nil {
		return nil, err
	}
	return p, nil
}
