package compose

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/podium-llm/podium/pkg/events"
)

// Version is one immutable version of a template from the template registry: the files of a
// folder template (manifest.json, prompt.mustache or one <role>.mustache per role, partials/,
// variants/), by their path inside the folder. Its number is the registry's, whatever the
// manifest says.
type Version struct {
	Name    string
	Version int
	Files   map[string][]byte
}

// registered is what the registry holds of one template name.
type registered struct {
	versions map[int]*Template
	labels   map[string]int   // label -> version ("latest" is not stored: it is the highest)
	splits   map[string]Split // label -> versions and weights (split.go)
	latest   int
}

// LoadVersion parses and checks a registry version exactly as templates are checked at start
// (syntax, unknown variables, optional values outside their section, partials): the error names
// the template, the line and the variable.
func LoadVersion(v Version) (*Template, error) {
	if !events.ValidIdentifier(v.Name) || v.Version < 1 {
		return nil, fmt.Errorf("compose: registry version %q@%d: bad name or version", v.Name, v.Version)
	}
	// The files as a folder in memory: the loader reads any fs.FS (fstest.MapFS is the standard
	// library's in-memory one).
	fsys := fstest.MapFS{}
	for p, b := range v.Files {
		fsys[p] = &fstest.MapFile{Data: b}
	}
	t, err := loadFolderTemplate(fsys, v.Name, variables())
	if err != nil {
		return nil, fmt.Errorf("compose: %s@%d: %w", v.Name, v.Version, err)
	}
	t.Version = v.Version
	return t, nil
}

// LoadFiles makes a template again from its Files, as version version, whatever it was loaded
// from first (built in, a directory, the registry): the same files give the same SHA256. A
// single-file template is <name>.mustache with its optional <name>.json; anything else is a folder.
func LoadFiles(name string, version int, files map[string][]byte) (*Template, error) {
	if !events.ValidIdentifier(name) || version < 1 {
		return nil, fmt.Errorf("compose: template %q@%d: bad name or version", name, version)
	}
	fsys := fstest.MapFS{}
	for p, b := range files {
		fsys[p] = &fstest.MapFile{Data: b}
	}
	var t *Template
	var err error
	if _, single := files[name+".mustache"]; single {
		t, err = loadFileTemplate(fsys, name, variables())
	} else {
		t, err = loadFolderTemplate(fsys, name, variables())
	}
	if err != nil {
		return nil, fmt.Errorf("compose: %s@%d: %w", name, version, err)
	}
	t.Version = version
	return t, nil
}

// WithTemplates returns a library that serves, besides l's templates and registry, these
// templates by name@version (an export bundle's): a reference name@V finds them first.
func (l *Library) WithTemplates(ts []*Template) *Library {
	out := *l
	out.registry = make(map[string]*registered, len(l.registry))
	for name, r := range l.registry {
		out.registry[name] = &registered{versions: maps.Clone(r.versions), labels: maps.Clone(r.labels), splits: maps.Clone(r.splits), latest: r.latest}
	}
	for _, t := range ts {
		out.register(t)
	}
	return &out
}

// register adds t to the registry's versions of its name.
func (l *Library) register(t *Template) {
	r := l.registry[t.Name]
	if r == nil {
		r = &registered{versions: map[int]*Template{}, labels: map[string]int{}, splits: map[string]Split{}}
		l.registry[t.Name] = r
	}
	r.versions[t.Version] = t
	r.latest = max(r.latest, t.Version)
}

// WithRegistry returns a library that serves, besides l's templates, the registry's versions
// and labels (labels: name -> label -> version). A version that fails its check is left out,
// never served, and returned among the errors; l itself does not change, so a composer swaps
// libraries whole and every request renders with one.
func (l *Library) WithRegistry(versions []Version, labels map[string]map[string]int) (*Library, []error) {
	out := *l
	out.registry = map[string]*registered{}
	var errs []error
	for _, v := range versions {
		t, err := LoadVersion(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.register(t)
	}
	for name, ls := range labels {
		r := out.registry[name]
		if r == nil {
			continue // labels of a name without a good version: nothing to point at
		}
		maps.Copy(r.labels, ls)
	}
	return &out, errs
}

// lookupRegistered resolves a reference against the registry: found reports whether the registry
// decides it (ok or failed); when it does not, the built-in or directory template answers.
func (l *Library) lookupRegistered(ref events.Reference) (t *Template, found bool, err error) {
	r := l.registry[ref.Name]
	if r == nil {
		return nil, false, nil
	}
	version := func(n int, why string) (*Template, bool, error) {
		if t, ok := r.versions[n]; ok {
			return t, true, nil
		}
		return nil, true, events.Failf(events.CodeUnknownTemplate, "template %q %s version %d, which is not loaded (a bad version is never served)", ref.Name, why, n)
	}
	switch {
	case ref.Version > 0:
		if t, ok := r.versions[ref.Version]; ok {
			return t, true, nil
		}
	case ref.Label == "latest":
		return r.versions[r.latest], true, nil
	case ref.Label != "":
		if n, ok := r.labels[ref.Label]; ok {
			return version(n, "is labelled "+ref.Label+" at")
		}
		if s, ok := r.splits[ref.Label]; ok {
			return nil, true, splitUnresolved(ref.Name, ref.Label, s)
		}
	default:
		if n, ok := r.labels["production"]; ok {
			return version(n, "is labelled production at")
		}
		if s, ok := r.splits["production"]; ok {
			return nil, true, splitUnresolved(ref.Name, "production", s)
		}
	}
	return nil, false, nil
}

// splitUnresolved is a split label looked up without a request to choose for (split.go: the
// composer chooses, per execution and team).
func splitUnresolved(name, label string, s Split) error {
	return events.Failf(events.CodeUnknownTemplate, "template %q: label %q splits between versions %s: name a version (%s@V), or let a request's execution and team choose", name, label, s, name)
}

// describe lists the registered versions and labels of a name, for error messages.
func (r *registered) describe() string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(r.versions)) {
		parts = append(parts, strconv.Itoa(n))
	}
	labels := slices.Sorted(maps.Keys(r.labels))
	return fmt.Sprintf("registry versions %s, labels %s", strings.Join(parts, " "), strings.Join(labels, " "))
}

// what names a reference's version or label for error messages.
func what(ref events.Reference) string {
	switch {
	case ref.Version > 0:
		return "version " + strconv.Itoa(ref.Version)
	case ref.Label != "":
		return "label " + strconv.Quote(ref.Label)
	}
	return "production label"
}

// Registered lists the registry's loaded versions, by name then version.
func (l *Library) Registered() []*Template {
	var out []*Template
	for _, name := range slices.Sorted(maps.Keys(l.registry)) {
		r := l.registry[name]
		for _, n := range slices.Sorted(maps.Keys(r.versions)) {
			out = append(out, r.versions[n])
		}
	}
	return out
}
