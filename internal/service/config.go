package service

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"text/tabwriter"
	"text/template"

	"github.com/kelseyhightower/envconfig"

	"github.com/podium-llm/podium/internal/tracing"
)

// Common is what every service and the CLI read, each part owned by what it configures: NATS
// (nats.go), the streams (streams.go), HTTP (http.go), the largest event and the log level. A
// service's Config embeds it, the ClickHouse part it uses (store.go: a reader, or a writer) and
// its own settings. Each variable may be prefixed with the service name (COMPOSER_NATS_URL) to
// override the shared one (NATS_URL).
type Common struct {
	NATS
	Streams
	HTTP
	MaxEventBytes int      `envconfig:"MAX_EVENT_BYTES" default:"1048576" desc:"largest accepted event body in bytes"`
	LogLevel      LogLevel `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error; logs are JSON on stderr"`
}

// Shared returns the shared part of a service's configuration.
func (c *Common) Shared() *Common { return c }

// ValidateShared checks the shared settings, each part by itself; prefix is the service's
// (COMPOSER) for the messages.
func (c *Common) ValidateShared(prefix string) error {
	errs := []error{c.NATS.Validate(prefix), c.Streams.Validate(prefix), c.HTTP.Validate(prefix)}
	if c.MaxEventBytes < 1 {
		errs = append(errs, fmt.Errorf("MAX_EVENT_BYTES (or %s_MAX_EVENT_BYTES) must be positive, got %d", prefix, c.MaxEventBytes))
	}
	return errors.Join(errs...)
}

// variable names a setting in an error: its shared name, and the service's override.
func variable(name, prefix string) string { return fmt.Sprintf("%s (or %s_%s)", name, prefix, name) }

// LogLevel is a slog level read from the environment by name.
type LogLevel slog.Level

// Decode implements envconfig.Decoder.
func (l *LogLevel) Decode(v string) error {
	switch strings.ToLower(v) {
	case "debug":
		*l = LogLevel(slog.LevelDebug)
	case "info":
		*l = LogLevel(slog.LevelInfo)
	case "warn", "warning":
		*l = LogLevel(slog.LevelWarn)
	case "error":
		*l = LogLevel(slog.LevelError)
	default:
		return fmt.Errorf("%q is not one of debug, info, warn, error", v)
	}
	return nil
}

// Load reads cfg from the environment with envconfig under prefix ("ranker", "composer").
func Load(prefix string, cfg any) error {
	if err := envconfig.Process(prefix, cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	return nil
}

// Usage writes the --help text: what the command does and the variable table. Shared settings
// are listed by their shared name (NATS_URL), a service's own by its prefixed one
// (RANKER_BATCH_SIZE), as the README names them.
func Usage(w io.Writer, prefix, summary string, cfg any) error {
	fmt.Fprintf(w, "%s\n\nConfiguration is read from the environment. Every variable may also be given with the\nprefix %s_ (for example %s_NATS_URL), which overrides the shared name.\n\n",
		summary, strings.ToUpper(prefix), strings.ToUpper(prefix))
	shared := map[string]bool{}
	sharedNames(reflect.TypeFor[Common](), shared)
	sharedNames(reflect.TypeFor[ClickHouseWriter](), shared)
	tmpl := template.Must(template.New("usage").Funcs(template.FuncMap{
		"name": func(key, alt string) string {
			if shared[alt] {
				return alt
			}
			return key
		},
	}).Parse(usageFormat))
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	if err := envconfig.Usaget(prefix, cfg, tw, tmpl); err != nil {
		return err
	}
	return tw.Flush()
}

// sharedNames adds the variables of t's fields, those of embedded parts included, to names.
func sharedNames(t reflect.Type, names map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			sharedNames(f.Type, names)
			continue
		}
		names[f.Tag.Get("envconfig")] = true
	}
}

const usageFormat = `VARIABLE	DEFAULT	MEANING
{{range .}}{{name .Key .Alt}}	{{.Tags.Get "default"}}	{{.Tags.Get "desc"}}
{{end}}`

// NewLogger returns the JSON logger every line of a service goes through.
// Lines logged with a context inside a span carry its trace_id and span_id.
func NewLogger(w io.Writer, level LogLevel, serviceName string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.Level(level)})
	return slog.New(tracing.LogHandler(h)).With("service", serviceName)
}
