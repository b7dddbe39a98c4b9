package compose

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/cbroglie/mustache"

	"github.com/podium-llm/podium/pkg/events"
)

// Limits shape the structured variables and the budget of one prompt.
type Limits struct {
	HistoryRounds    int `json:"history_rounds"`
	LeaderboardTeams int `json:"leaderboard_teams"`
	PreviewChars     int `json:"preview_chars"`
	MaxPromptTokens  int `json:"max_prompt_tokens"`
}

// defaultLimits apply when neither the template's manifest nor the request says otherwise.
func defaultLimits() Limits {
	return Limits{HistoryRounds: 5, LeaderboardTeams: 10, PreviewChars: 200, MaxPromptTokens: 3000}
}

// Kinds of template: a round prompt of a tournament, or a task prompt for a coding agent. The
// kind is informational (check-templates prints it); what a template may use is the same.
const (
	KindRound = "round"
	KindTask  = "task"
)

// Template is one loaded, checked template: its parts (one per message role, or a single
// prompt), its model variants, and the manifest's defaults.
type Template struct {
	Name        string
	Version     int
	SHA256      string // of every file the template is made of, so a prompt names exactly what rendered it
	Description string
	Labels      []string
	Kind        string
	Limits      Limits
	Variants    []*Variant // in match order: priority descending, then name

	parts         []part            // base parts in message order
	relativePaths []string          // names under vars that must hold workspace-relative paths
	files         map[string][]byte // what SHA256 is of: the files as read, by path in the template
}

// Files are the files the template was loaded from (the ones SHA256 is of), by their path in the
// template's folder (or <name>.mustache and <name>.json for a single-file template): with
// LoadFiles they make the same template again anywhere, as an export bundle does.
func (t *Template) Files() map[string][]byte { return maps.Clone(t.files) }

// part is one rendered piece: a message of a role, or the whole prompt (role "").
type part struct {
	role string
	src  string // after partial expansion
	tmpl *mustache.Template
	uses map[string]bool // first segment of every tag name, at any depth
	tags []tagNode       // tmpl's tags, read once (renderWork walks them on every render)
}

// tagNames adds the first segment of every tag name under tags to into.
func tagNames(tags []mustache.Tag, into map[string]bool) {
	for _, t := range tags {
		first, _, _ := strings.Cut(t.Name(), ".")
		into[first] = true
		if t.Type() == mustache.Section || t.Type() == mustache.InvertedSection {
			tagNames(t.Tags(), into)
		}
	}
}

// anyUses reports whether a part names the variable: values no part names are not computed.
func anyUses(parts []part, name string) bool {
	for _, p := range parts {
		if p.uses[name] {
			return true
		}
	}
	return false
}

// Roles reports whether the template renders messages (it declares roles).
func (t *Template) Roles() bool { return len(t.parts) > 0 && t.parts[0].role != "" }

// Variant is a model-specific form of a template: a chat format, and optionally its own parts.
type Variant struct {
	Name     string
	Models   []string // glob patterns (path.Match), matched case-insensitively against the request's model
	Priority int
	Format   string // a chat format: phi, chatml, llama3
	parts    []part // nil: the base template's parts
}

// manifest is the optional JSON beside a template: <name>.json, or manifest.json in its folder.
type manifest struct {
	Version       int               `json:"version"`
	Description   string            `json:"description"`
	Labels        []string          `json:"labels"`
	Kind          string            `json:"kind"`
	Roles         []string          `json:"roles"`
	Limits        *Limits           `json:"limits"`
	Variants      []variantManifest `json:"variants"`
	RelativePaths []string          `json:"relative_paths"`
}

type variantManifest struct {
	Name     string   `json:"name"`
	Models   []string `json:"models"`
	Priority int      `json:"priority"`
	Format   string   `json:"format"`
}

// Options configure a Library.
type Options struct {
	Dir             string         // COMPOSER_TEMPLATES_DIR: adds or overrides templates
	DefaultTemplate string         // COMPOSER_DEFAULT_TEMPLATE
	DefaultLocation *time.Location // TZ: the timezone of requests that name none
	Tokens          TokenCounter   // nil: the approx-cjk-v1 approximation
}

// Library holds every template, checked, ready to render.
type Library struct {
	templates       map[string]*Template   // built-in and directory templates
	registry        map[string]*registered // versions pushed to the template registry
	defaultName     string
	defaultLocation *time.Location
	tokens          TokenCounter
}

// Load reads the built-in templates and then opts.Dir, parses and checks every one, and fails
// with every problem found (template name, line, variable) if any template is bad.
func Load(opts Options) (*Library, error) {
	l := &Library{
		templates:       map[string]*Template{},
		defaultName:     opts.DefaultTemplate,
		defaultLocation: opts.DefaultLocation,
		tokens:          opts.Tokens,
	}
	if l.defaultName == "" {
		l.defaultName = "team-round"
	}
	if l.defaultLocation == nil {
		l.defaultLocation = time.UTC
	}
	if l.tokens == nil {
		l.tokens = approxCounter{}
	}
	schema := variables()
	sub, err := fs.Sub(builtin, "templates")
	if err != nil {
		return nil, err
	}
	errs := []error{l.loadDir(sub, "built-in", schema)}
	if opts.Dir != "" {
		if st, err := os.Stat(opts.Dir); err != nil || !st.IsDir() {
			return nil, fmt.Errorf("compose: templates directory %q: not a readable directory", opts.Dir)
		}
		errs = append(errs, l.loadDir(os.DirFS(opts.Dir), opts.Dir, schema))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if _, ok := l.templates[l.defaultName]; !ok {
		return nil, fmt.Errorf("compose: default template %q does not exist (have %s)", l.defaultName, strings.Join(l.names(), ", "))
	}
	return l, nil
}

// loadDir loads every template of a directory: a file <name>.mustache (with an optional
// <name>.json manifest), or a folder <name>/ (see README "Templates").
func (l *Library) loadDir(fsys fs.FS, where string, schema *node) error {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return fmt.Errorf("compose: %s templates: %w", where, err)
	}
	var errs []error
	for _, e := range entries {
		var t *Template
		var err error
		switch name, isFile := strings.CutSuffix(e.Name(), ".mustache"); {
		case isFile && !e.IsDir():
			t, err = loadFileTemplate(fsys, name, schema)
		case e.IsDir() && !strings.HasPrefix(e.Name(), "."):
			sub, _ := fs.Sub(fsys, e.Name())
			t, err = loadFolderTemplate(sub, e.Name(), schema)
		default:
			continue // manifests of file templates, notes, dotfiles
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("compose: %s: %w", path.Join(where, e.Name()), err))
			continue
		}
		l.templates[t.Name] = t
	}
	return errors.Join(errs...)
}

// source accumulates the files of a template for its hash, in a fixed order.
type source struct {
	files map[string][]byte
}

func (s *source) read(fsys fs.FS, name string) ([]byte, error) {
	b, err := fs.ReadFile(fsys, name)
	if err == nil {
		s.files[name] = b
	}
	return b, err
}

func (s *source) sum() string {
	names := make([]string, 0, len(s.files))
	for n := range s.files {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(s.files[n]))
		h.Write(s.files[n])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// loadFileTemplate loads <name>.mustache and its optional <name>.json. A file template has no
// roles and no partials; its manifest may still declare variants (chat formats) and limits.
func loadFileTemplate(fsys fs.FS, name string, schema *node) (*Template, error) {
	src := &source{files: map[string][]byte{}}
	m, err := readManifest(fsys, src, name+".json")
	if err != nil {
		return nil, err
	}
	if len(m.Roles) > 0 {
		return nil, fmt.Errorf("manifest %s.json: roles need the folder form (%s/system.mustache, %s/user.mustache)", name, name, name)
	}
	t, err := newTemplate(name, m)
	if err != nil {
		return nil, err
	}
	body, err := src.read(fsys, name+".mustache")
	if err != nil {
		return nil, err
	}
	p, err := parsePart(name, "", string(body), schema)
	if err != nil {
		return nil, err
	}
	t.parts = []part{p}
	if t.Variants, err = loadVariants(nil, src, name, m, t.parts, schema); err != nil {
		return nil, err
	}
	t.SHA256, t.files = src.sum(), src.files
	return t, nil
}

// loadFolderTemplate loads a template folder: manifest.json (optional), prompt.mustache or one
// <role>.mustache per declared role, variants/<variant>/<role|prompt>.mustache overrides, and
// partials/<name>.mustache expanded into every part at load.
func loadFolderTemplate(fsys fs.FS, name string, schema *node) (*Template, error) {
	src := &source{files: map[string][]byte{}}
	m, err := readManifest(fsys, src, "manifest.json")
	if err != nil {
		return nil, err
	}
	t, err := newTemplate(name, m)
	if err != nil {
		return nil, err
	}
	roles := m.Roles
	if len(roles) == 0 {
		roles = []string{""}
	}
	t.parts, err = loadParts(fsys, src, name, ".", roles, schema, true)
	if err != nil {
		return nil, err
	}
	if t.Variants, err = loadVariants(fsys, src, name, m, t.parts, schema); err != nil {
		return nil, err
	}
	t.SHA256, t.files = src.sum(), src.files
	return t, nil
}

func readManifest(fsys fs.FS, src *source, file string) (manifest, error) {
	var m manifest
	b, err := src.read(fsys, file)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, fmt.Errorf("manifest %s: %w", file, err)
	}
	return m, nil
}

// newTemplate checks a manifest and builds the template's metadata from it.
func newTemplate(name string, m manifest) (*Template, error) {
	if !events.ValidIdentifier(name) {
		return nil, fmt.Errorf("template name %q must be letters, digits, '_' and '-'", name)
	}
	t := &Template{Name: name, Version: 1, Kind: KindRound, Limits: defaultLimits(),
		Description: m.Description, Labels: m.Labels, relativePaths: m.RelativePaths}
	if m.Version < 0 {
		return nil, fmt.Errorf("manifest: version must be positive, got %d", m.Version)
	}
	if m.Version > 0 {
		t.Version = m.Version
	}
	switch m.Kind {
	case "":
	case KindRound, KindTask:
		t.Kind = m.Kind
	default:
		return nil, fmt.Errorf("manifest: kind must be %q or %q, got %q", KindRound, KindTask, m.Kind)
	}
	for _, r := range m.Roles {
		if r != "system" && r != "user" {
			return nil, fmt.Errorf("manifest: role %q is not one of system, user", r)
		}
	}
	users := 0
	for _, r := range m.Roles {
		if r == "user" {
			users++
		}
	}
	if len(m.Roles) > 0 && (m.Roles[len(m.Roles)-1] != "user" || users != 1) {
		return nil, fmt.Errorf("manifest: roles %v must end with one \"user\"", m.Roles)
	}
	if m.Limits != nil {
		t.Limits = *m.Limits
	}
	if l := t.Limits; l.HistoryRounds < 0 || l.LeaderboardTeams < 0 || l.PreviewChars < 0 || l.MaxPromptTokens < 0 {
		return nil, fmt.Errorf("manifest: limits must not be negative, got %+v", l)
	}
	for _, p := range m.RelativePaths {
		if p == "" || strings.HasPrefix(p, "vars.") {
			return nil, fmt.Errorf("manifest: relative_paths entries name a key under vars without the \"vars.\" prefix, got %q", p)
		}
	}
	return t, nil
}

// loadParts reads one file per role under dir ("prompt.mustache" for the role-less form).
// Missing files are an error when required, and nil parts otherwise (a variant overrides only
// what it has).
func loadParts(fsys fs.FS, src *source, name, dir string, roles []string, schema *node, required bool) ([]part, error) {
	parts := make([]part, 0, len(roles))
	found := 0
	for _, role := range roles {
		file := role + ".mustache"
		if role == "" {
			file = "prompt.mustache"
		}
		b, err := src.read(fsys, path.Join(dir, file))
		if errors.Is(err, fs.ErrNotExist) && !required {
			parts = append(parts, part{role: role})
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("template %q: %s: %w", name, path.Join(dir, file), err)
		}
		expanded, err := expandPartials(fsys, src, name, string(b), nil)
		if err != nil {
			return nil, err
		}
		p, err := parsePart(name, role, expanded, schema)
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
		found++
	}
	if found == 0 {
		return nil, nil
	}
	return parts, nil
}

var partialTag = regexp.MustCompile(`\{\{>\s*([^}\s]+)\s*\}\}`)

// MaxExpandedBytes bounds a template part after its partials are expanded. Partials have a cycle
// check, but a partial that includes the next twice, n deep, is 2^n times its size: the bound
// keeps a registry push from costing every composer its memory at load.
const MaxExpandedBytes = 1 << 20

// expandPartials replaces every {{> name}} with partials/<name>.mustache, recursively, before
// parsing. Expanding at load keeps partials raw (the library re-escapes partials it resolves
// itself) and keeps a partial inside a loop from being re-parsed on every item.
func expandPartials(fsys fs.FS, src *source, name, text string, stack []string) (string, error) {
	var firstErr error
	size := len(text) // of the expansion so far; each inner expansion is bounded on its own
	out := partialTag.ReplaceAllStringFunc(text, func(tag string) string {
		if firstErr != nil {
			return tag
		}
		p := partialTag.FindStringSubmatch(tag)[1]
		line := strings.Count(text[:strings.Index(text, tag)], "\n") + 1
		if fsys == nil {
			firstErr = fmt.Errorf("template %q line %d: partial %q: partials need the folder form (%s/partials/%s.mustache)", name, line, p, name, p)
			return tag
		}
		if slices.Contains(stack, p) {
			firstErr = fmt.Errorf("template %q line %d: partial %q includes itself (%s)", name, line, p, strings.Join(append(stack, p), " > "))
			return tag
		}
		if !events.ValidIdentifier(p) {
			firstErr = fmt.Errorf("template %q line %d: partial name %q must be letters, digits, '_' and '-'", name, line, p)
			return tag
		}
		b, err := src.read(fsys, path.Join("partials", p+".mustache"))
		if err != nil {
			firstErr = fmt.Errorf("template %q line %d: partial %q not found (partials/%s.mustache)", name, line, p, p)
			return tag
		}
		// The newline that ends the partial's file is not content: "{{> p}}" on a line of its own
		// then stands for exactly the partial's lines.
		inner, err := expandPartials(fsys, src, name, strings.TrimSuffix(string(b), "\n"), append(stack, p))
		if err != nil {
			firstErr = err
			return tag
		}
		if size += len(inner) - len(tag); size > MaxExpandedBytes {
			firstErr = fmt.Errorf("template %q line %d: with partial %q expanded it grows past %d bytes (a partial counts every time it is included)", name, line, p, MaxExpandedBytes)
			return tag
		}
		return inner
	})
	return out, firstErr
}

// parsePart parses one part raw and checks its tags against the variable schema.
func parsePart(name, role, text string, schema *node) (part, error) {
	label := name
	if role != "" {
		label = name + " (" + role + ")"
	}
	// File templates cannot resolve partials; say so rather than leave the tag to the library.
	if m := partialTag.FindStringSubmatchIndex(text); m != nil {
		return part{}, fmt.Errorf("template %q line %d: partial %q: partials need the folder form (%s/partials/%s.mustache)",
			label, strings.Count(text[:m[0]], "\n")+1, text[m[2]:m[3]], name, text[m[2]:m[3]])
	}
	// Raw: prompts carry code, '<', '&' and quotes, which HTML escaping would corrupt.
	tmpl, err := mustache.ParseStringRaw(text, true)
	if err != nil {
		return part{}, fmt.Errorf("template %q: %w", label, err)
	}
	if err := checkTags(label, text, tmpl.Tags(), schema); err != nil {
		return part{}, err
	}
	uses := map[string]bool{}
	tagNames(tmpl.Tags(), uses)
	return part{role: role, src: text, tmpl: tmpl, uses: uses, tags: tagTree(tmpl.Tags())}, nil
}

// loadVariants builds the manifest's variants, each with its own parts where the folder has
// variants/<name>/ files, and sorts them into match order.
func loadVariants(fsys fs.FS, src *source, name string, m manifest, base []part, schema *node) ([]*Variant, error) {
	var out []*Variant
	for _, vm := range m.Variants {
		if !events.ValidIdentifier(vm.Name) {
			return nil, fmt.Errorf("manifest: variant name %q must be letters, digits, '_' and '-'", vm.Name)
		}
		if !slices.Contains(formatNames(), vm.Format) {
			return nil, fmt.Errorf("manifest: variant %q: format %q is not one of %s", vm.Name, vm.Format, strings.Join(formatNames(), ", "))
		}
		if len(vm.Models) == 0 {
			return nil, fmt.Errorf("manifest: variant %q names no model patterns", vm.Name)
		}
		for _, pat := range vm.Models {
			if _, err := path.Match(pat, ""); err != nil {
				return nil, fmt.Errorf("manifest: variant %q: model pattern %q: %w", vm.Name, pat, err)
			}
		}
		v := &Variant{Name: vm.Name, Models: vm.Models, Priority: vm.Priority, Format: vm.Format}
		if fsys != nil {
			roles := make([]string, len(base))
			for i, p := range base {
				roles[i] = p.role
			}
			parts, err := loadParts(fsys, src, name+"/"+vm.Name, path.Join("variants", vm.Name), roles, schema, false)
			if err != nil {
				return nil, err
			}
			if parts != nil {
				for i := range parts {
					if parts[i].tmpl == nil {
						parts[i] = base[i] // overrides only the roles it has
					}
				}
				v.parts = parts
			}
		}
		out = append(out, v)
	}
	slices.SortStableFunc(out, func(a, b *Variant) int {
		if a.Priority != b.Priority {
			return b.Priority - a.Priority
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out, nil
}

// variantFor picks the variant for a model: the highest priority among those with a matching
// pattern, then the first by name, so the choice never depends on load order.
func (t *Template) variantFor(model string) *Variant {
	for _, v := range t.Variants {
		if ModelMatches(v.Models, model) {
			return v
		}
	}
	return nil
}

// ModelMatches reports whether a model name matches one of globs (path.Match), case-insensitively:
// how a variant, and a prompt builder, says which models it serves. No model matches nothing.
func ModelMatches(globs []string, model string) bool {
	if model == "" {
		return false
	}
	model = strings.ToLower(model)
	return slices.ContainsFunc(globs, func(glob string) bool {
		ok, _ := path.Match(strings.ToLower(glob), model)
		return ok
	})
}

// limits applies a request's overrides to the template's defaults.
func (t *Template) limits(o events.Limits) Limits {
	l := t.Limits
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&l.HistoryRounds, o.HistoryRounds)
	set(&l.LeaderboardTeams, o.LeaderboardTeams)
	set(&l.PreviewChars, o.PreviewChars)
	set(&l.MaxPromptTokens, o.MaxPromptTokens)
	return l
}

// Reference reads a request's template: "" is the default template, anything else a reference as
// events.ParseReference reads it. It is read once per request, and the typed reference travels
// from there (Label, Resolve); an unreadable one is unknown_template.
func (l *Library) Reference(s string) (events.Reference, error) {
	if s == "" {
		return events.Reference{Name: l.defaultName}, nil
	}
	ref, err := events.ParseReference(s)
	if err != nil {
		return events.Reference{}, events.Failf(events.CodeUnknownTemplate, "%v", err)
	}
	return ref, nil
}

// Lookup resolves a reference written as a string: Reference, then Resolve.
func (l *Library) Lookup(s string) (*Template, error) {
	ref, err := l.Reference(s)
	if err != nil {
		return nil, err
	}
	return l.Resolve(ref)
}

// Resolve finds the template a reference names. The registry decides first: a bare name is its
// production label when set, name@V its version V, name:L its label L (latest: its highest
// version); otherwise the built-in or directory template of that name answers (its own version,
// its manifest's labels and latest). A reference without a name is the default template.
func (l *Library) Resolve(ref events.Reference) (*Template, error) {
	if ref.Name == "" {
		ref.Name = l.defaultName
	}
	if t, found, err := l.lookupRegistered(ref); found {
		return t, err
	}
	t, ok := l.templates[ref.Name]
	if !ok {
		if r := l.registry[ref.Name]; r != nil {
			return nil, events.Failf(events.CodeUnknownTemplate, "template %q has no %s (%s)", ref.Name, what(ref), r.describe())
		}
		return nil, events.Failf(events.CodeUnknownTemplate, "template %q not found (loaded: %s)", ref.Name, strings.Join(l.names(), ", "))
	}
	switch {
	case ref.Version > 0 && ref.Version != t.Version:
		return nil, events.Failf(events.CodeUnknownTemplate, "template %q has no version %d (loaded: version %d)", ref.Name, ref.Version, t.Version)
	case ref.Label != "" && ref.Label != "latest" && !slices.Contains(t.Labels, ref.Label):
		return nil, events.Failf(events.CodeUnknownTemplate, "template %q has no label %q (labels: latest %s)", ref.Name, ref.Label, strings.Join(t.Labels, " "))
	}
	return t, nil
}

// Templates lists the loaded templates by name.
func (l *Library) Templates() []*Template {
	out := make([]*Template, 0, len(l.templates))
	for _, n := range l.names() {
		out = append(out, l.templates[n])
	}
	return out
}

// TokenEncoding names how token_estimate is counted.
func (l *Library) TokenEncoding() string { return l.tokens.Name() }

func (l *Library) names() []string {
	names := make([]string, 0, len(l.templates))
	for n := range l.templates {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
