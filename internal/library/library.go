// Package library owns the composers' template library for every reader of templates: the
// template settings (COMPOSER_TEMPLATES_DIR, TZ, COMPOSER_DEFAULT_TEMPLATE, COMPOSER_TOKEN_ENCODING)
// and loading the library they name, with the registry's versions. The composer, the console, the
// podium CLI and the verifier load templates through it, so each resolves a reference
// (events.ParseReference, compose.Library.Lookup) to the same template.
package library

import (
	"fmt"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Settings are the composers' template settings.
type Settings struct {
	Dir             string // COMPOSER_TEMPLATES_DIR: templates beside the built-in ones
	TZ              string // TZ: the timezone of requests that name none (UTC when empty)
	DefaultTemplate string // COMPOSER_DEFAULT_TEMPLATE: the template of requests that name none
	TokenEncoding   string // COMPOSER_TOKEN_ENCODING: how token_estimate counts
}

// Defaults of the settings, as the composer documents them.
const (
	DefaultTemplate = "team-round"
	DefaultEncoding = "o200k_base"
)

// FromEnv reads the settings as a composer reads them from its environment (the COMPOSER_ name
// first, then the shared one, as envconfig does): for the console and the CLI, which load what
// the composers load.
func FromEnv(getenv func(string) string) Settings {
	get := func(name, shared, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		if v := getenv(shared); shared != "" && v != "" {
			return v
		}
		return def
	}
	return Settings{
		Dir:             get("COMPOSER_TEMPLATES_DIR", "TEMPLATES_DIR", ""),
		TZ:              get("COMPOSER_TZ", "TZ", ""),
		DefaultTemplate: get("COMPOSER_DEFAULT_TEMPLATE", "DEFAULT_TEMPLATE", DefaultTemplate),
		TokenEncoding:   get("COMPOSER_TOKEN_ENCODING", "TOKEN_ENCODING", DefaultEncoding),
	}
}

// With is s with a directory and a timezone given on a command line, where they are given.
func (s Settings) With(dir, tz string) Settings {
	if dir != "" {
		s.Dir = dir
	}
	if tz != "" {
		s.TZ = tz
	}
	return s
}

// Location is TZ as the C library would read it (a leading ':' is allowed).
func (s Settings) Location() (*time.Location, error) {
	tz := strings.TrimPrefix(s.TZ, ":")
	if tz == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("TZ %s is not an IANA time zone name such as UTC or Asia/Tokyo", events.Quote(tz))
	}
	return loc, nil
}

// Check reports every setting that cannot be used.
func (s Settings) Check() error {
	if _, err := s.Location(); err != nil {
		return err
	}
	if _, err := compose.NewTokenCounter(s.encoding("")); err != nil {
		return fmt.Errorf("COMPOSER_TOKEN_ENCODING: %w", err)
	}
	if s.DefaultTemplate != "" {
		if _, err := events.ParseReference(s.DefaultTemplate); err != nil {
			return fmt.Errorf("COMPOSER_DEFAULT_TEMPLATE: %w", err)
		}
	}
	return nil
}

func (s Settings) encoding(encoding string) string {
	switch {
	case encoding != "":
		return encoding
	case s.TokenEncoding != "":
		return s.TokenEncoding
	}
	return DefaultEncoding
}

// Load loads the built-in templates, those of Dir, and the registry's versions and labels,
// counting tokens with encoding ("" for the settings' own): what a composer renders with, and
// what a record made with that encoding is verified with. Versions the registry holds that do not
// load are left out, as a composer leaves them out.
func (s Settings) Load(encoding string, reg registry.State) (*compose.Library, error) {
	loc, err := s.Location()
	if err != nil {
		return nil, err
	}
	tokens, err := compose.NewTokenCounter(s.encoding(encoding))
	if err != nil {
		return nil, fmt.Errorf("token encoding: %w", err)
	}
	lib, err := compose.Load(compose.Options{Dir: s.Dir, DefaultTemplate: s.DefaultTemplate, DefaultLocation: loc, Tokens: tokens})
	if err != nil {
		return nil, fmt.Errorf("templates: %w", err)
	}
	lib, _ = lib.WithRegistry(reg.Versions, reg.Labels)
	return lib.WithSplits(reg.Splits), nil
}
