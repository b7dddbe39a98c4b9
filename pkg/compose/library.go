package compose

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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

// Template is one loaded, checked template.
type Template struct {
	Name        string
	Version     int
	SHA256      string // of the source, so a prompt names exactly what rendered it
	Description string
	Labels      []string
	Limits      Limits
	Source      string
	tmpl        *mustache.Template
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

// manifest is the optional <name>.json beside <name>.mustache.
type manifest struct {
	Version     int      `json:"version"`
	Description string   `json:"description"`
	Labels      []string `json:"labels"`
	Limits      *Limits  `json:"limits"`
}

// Options configure a Library.
type Options struct {
	Dir             string         // COMPOSER_TEMPLATES_DIR: adds or overrides templates
	DefaultTemplate string         // COMPOSER_DEFAULT_TEMPLATE
	DefaultLocation *time.Location // TZ: the timezone of requests that name none
}

// Library holds every template, checked, ready to render.
type Library struct {
	templates       map[string]*Template
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
		tokens:          approxCounter{},
	}
	if l.defaultName == "" {
		l.defaultName = "team-round"
	}
	if l.defaultLocation == nil {
		l.defaultLocation = time.UTC
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

func (l *Library) loadDir(fsys fs.FS, where string, schema *node) error {
	files, err := fs.Glob(fsys, "*.mustache")
	if err != nil {
		return fmt.Errorf("compose: %s templates: %w", where, err)
	}
	var errs []error
	for _, file := range files {
		name := strings.TrimSuffix(file, ".mustache")
		t, err := loadTemplate(fsys, name, schema)
		if err != nil {
			errs = append(errs, fmt.Errorf("compose: %s: %w", path.Join(where, file), err))
			continue
		}
		l.templates[name] = t
	}
	return errors.Join(errs...)
}

func loadTemplate(fsys fs.FS, name string, schema *node) (*Template, error) {
	if !events.ValidIdentifier(name) {
		return nil, fmt.Errorf("template name %q must be letters, digits, '_' and '-'", name)
	}
	src, err := fs.ReadFile(fsys, name+".mustache")
	if err != nil {
		return nil, err
	}
	t := &Template{Name: name, Version: 1, Limits: defaultLimits(), Source: string(src)}
	if b, err := fs.ReadFile(fsys, name+".json"); err == nil {
		var m manifest
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&m); err != nil {
			return nil, fmt.Errorf("manifest %s.json: %w", name, err)
		}
		if m.Version < 0 {
			return nil, fmt.Errorf("manifest %s.json: version must be positive", name)
		}
		if m.Version > 0 {
			t.Version = m.Version
		}
		t.Description, t.Labels = m.Description, m.Labels
		if m.Limits != nil {
			t.Limits = *m.Limits
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	sum := sha256.Sum256(src)
	t.SHA256 = hex.EncodeToString(sum[:])
	// Raw: prompts carry code, '<', '&' and quotes, which HTML escaping would corrupt.
	t.tmpl, err = mustache.ParseStringRaw(t.Source, true)
	if err != nil {
		return nil, fmt.Errorf("template %q: %w", name, err)
	}
	if err := checkTags(name, t.Source, t.tmpl.Tags(), schema); err != nil {
		return nil, err
	}
	return t, nil
}

// Lookup resolves "", "name", "name@<version>" or "name:<label>".
func (l *Library) Lookup(ref string) (*Template, error) {
	if ref == "" {
		ref = l.defaultName
	}
	name, rest, sep := ref, "", byte(0)
	if i := strings.IndexAny(ref, "@:"); i >= 0 {
		name, rest, sep = ref[:i], ref[i+1:], ref[i]
	}
	t, ok := l.templates[name]
	if !ok {
		return nil, failf(events.CodeUnknownTemplate, "template %q not found (have %s)", name, strings.Join(l.names(), ", "))
	}
	switch sep {
	case '@':
		if v, err := strconv.Atoi(rest); err != nil || v != t.Version {
			return nil, failf(events.CodeUnknownTemplate, "template %q has no version %s (loaded: version %d)", name, rest, t.Version)
		}
	case ':':
		if rest != "latest" && !slices.Contains(t.Labels, rest) {
			return nil, failf(events.CodeUnknownTemplate, "template %q has no label %q (labels: latest %s)", name, rest, strings.Join(t.Labels, " "))
		}
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

func (l *Library) names() []string {
	names := make([]string, 0, len(l.templates))
	for n := range l.templates {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TokenCounter estimates how many tokens a model will see in a prompt.
type TokenCounter interface {
	Count(s string) int
	Name() string
}

// approxCounter is the documented deterministic approximation: every CJK character (Han,
// Hiragana, Katakana, Hangul) is one token, and every other run of text costs one token per four
// bytes, rounded up.
type approxCounter struct{}

func (approxCounter) Name() string { return "approx-cjk-v1" }

func (approxCounter) Count(s string) int {
	tokens, run := 0, 0
	for _, r := range s {
		if unicode.In(r, unicode.Han, unicode.Hiragana, unicode.Katakana, unicode.Hangul) {
			tokens += (run+3)/4 + 1
			run = 0
			continue
		}
		run += utf8.RuneLen(r)
	}
	return tokens + (run+3)/4
}
