package builders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/builder"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Runner runs one version's module for one request (a compose.Builder): with the request's time
// as its clock, and half the time left to the caller's deadline, so that the template renders
// within the other half when the module fails. Err is why the module could not load: every run
// then fails with it.
type Runner struct {
	V      Version
	Module *wasm.Module
	Err    error
	At     time.Time
	// Timeout stands for the render's deadline where the caller's ctx has none (verify): the
	// composers' COMPOSER_RENDER_TIMEOUT, of which a run takes half, as theirs do.
	Timeout time.Duration
}

// Ref names the version as a record does.
func (r *Runner) Ref() events.BuilderRef {
	return events.BuilderRef{Name: r.V.Name, Version: r.V.Version, SHA256: r.V.SHA256}
}

// Build runs the module's build and checks its answer.
func (r *Runner) Build(ctx context.Context, req builder.BuildRequest) (builder.Built, error) {
	out, err := r.run(ctx, req)
	return decodeAnswer(out, err, builder.DecodeBuilt)
}

// Parse runs the module's parse of a model's output and checks its answer.
func (r *Runner) Parse(ctx context.Context, model, output string) (builder.Parsed, error) {
	out, err := r.run(ctx, builder.ParseRequest{Op: builder.OpParse, Model: model, Output: output})
	return decodeAnswer(out, err, builder.DecodeParsed)
}

// decodeAnswer decodes a run's output: a run that failed is its failure, an answer decode
// refuses is invalid_output.
func decodeAnswer[T any](out []byte, err error, decode func([]byte) (T, error)) (T, error) {
	var zero T
	if err != nil {
		return zero, err
	}
	v, err := decode(out)
	if err != nil {
		return zero, &wasm.Failure{Reason: wasm.ReasonInvalid, Detail: err.Error()}
	}
	return v, nil
}

func (r *Runner) run(ctx context.Context, req any) ([]byte, error) {
	if r.Err != nil {
		return nil, &wasm.Failure{Reason: wasm.ReasonLoad, Detail: r.Err.Error()}
	}
	if _, ok := ctx.Deadline(); !ok && r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		defer cancel()
	}
	in, err := json.Marshal(req)
	if err != nil {
		return nil, &wasm.Failure{Reason: wasm.ReasonInvalid, Detail: "the input does not encode: " + err.Error()}
	}
	return r.Module.Run(ctx, in, r.At)
}

// Loader reads versions' modules from their store and compiles them: a module the engine
// has compiled now (those served, and its bounded cache) is not read again.
type Loader struct {
	Engine  *wasm.Engine
	Modules *Store
}

// Load is the compiled module of v; its bytes are checked against v's sha256.
func (l *Loader) Load(ctx context.Context, v Version) (*wasm.Module, error) {
	if m, ok := l.Engine.Cached(v.SHA256); ok {
		return m, nil
	}
	module, err := l.Modules.Module(ctx, v)
	if err != nil {
		return nil, err
	}
	return l.Engine.Load(ctx, module)
}

// Recorded is the runner of the version a record names, for verifying it: the registry's
// version of that name and number, whose sha256 must be the record's.
func Recorded(ctx context.Context, kv jetstream.KeyValue, l *Loader, ref events.BuilderRef, at time.Time, timeout time.Duration) (*Runner, error) {
	s, _, err := Load(ctx, kv)
	if err != nil {
		return nil, err
	}
	v, ok := s.Version(ref.Name, ref.Version)
	if !ok {
		return nil, fmt.Errorf("the registry has no builder %s@%d", ref.Name, ref.Version)
	}
	if v.SHA256 != ref.SHA256 {
		return nil, fmt.Errorf("builder %s@%d is sha256 %.12s… in the registry, %.12s… in the record", ref.Name, ref.Version, v.SHA256, ref.SHA256)
	}
	m, err := l.Load(ctx, v)
	if err != nil {
		return nil, err
	}
	return &Runner{V: v, Module: m, At: at, Timeout: timeout}, nil
}

// FromBytes is the runner of a version known by its bytes alone (a bundle's), which must be its
// sha256.
func FromBytes(ctx context.Context, engine *wasm.Engine, ref events.BuilderRef, module []byte, at time.Time, timeout time.Duration) (*Runner, error) {
	if got := wasm.SHA256(module); got != ref.SHA256 {
		return nil, fmt.Errorf("its module is sha256 %.12s…, the record says %.12s…", got, ref.SHA256)
	}
	m, err := engine.Load(ctx, module)
	if err != nil {
		return nil, err
	}
	return &Runner{V: Version{Name: ref.Name, Version: ref.Version, SHA256: ref.SHA256}, Module: m, At: at, Timeout: timeout}, nil
}

// Source runs the versions records name from the registry (Recorded), for a verifier, each run
// bounded by half of timeout.
func Source(kv jetstream.KeyValue, l *Loader, timeout time.Duration) func(ctx context.Context, ref events.BuilderRef, at time.Time) (compose.Builder, error) {
	return func(ctx context.Context, ref events.BuilderRef, at time.Time) (compose.Builder, error) {
		return Recorded(ctx, kv, l, ref, at, timeout)
	}
}

// Limits bound one run of a builder: the composer's settings (COMPOSER_BUILDER_*). Its time is half
// of what is left of the render's deadline (Runner).
type Limits struct {
	BuilderMemoryPages uint32 `envconfig:"BUILDER_MEMORY_PAGES" default:"1024" desc:"memory of one run of a prompt builder, in pages of 64 KiB (1024: 64 MiB); past it the builder falls back"`
	BuilderOutputBytes int    `envconfig:"BUILDER_OUTPUT_BYTES" default:"1048576" desc:"bytes a prompt builder may write as its answer; past them it falls back"`
	BuilderConcurrency int    `envconfig:"BUILDER_CONCURRENCY" default:"0" desc:"prompt builder runs at once (0: one per CPU); the others wait within their deadline (each run may hold its memory pages plus up to 400 MB of call stack)"`
}

// ComposersLimits are the composers' Limits as another program reads them (the console, the CLI),
// under the composers' names, so that its verify runs a builder as they do.
type ComposersLimits struct {
	ComposersMemoryPages uint32 `envconfig:"COMPOSER_BUILDER_MEMORY_PAGES" default:"1024" desc:"the composers' memory of a prompt builder's run, in pages of 64 KiB, for verify"`
	ComposersOutputBytes int    `envconfig:"COMPOSER_BUILDER_OUTPUT_BYTES" default:"1048576" desc:"the composers' limit of a prompt builder's answer, for verify"`
	// ComposersRenderTimeout bounds a builder's run in verify as the render's deadline does.
	ComposersRenderTimeout time.Duration `envconfig:"COMPOSER_RENDER_TIMEOUT" default:"10s" desc:"the composers' COMPOSER_RENDER_TIMEOUT: a prompt builder run again by verify has half of it"`
}

// Limits are the composers' limits.
func (c ComposersLimits) Limits() Limits {
	return Limits{BuilderMemoryPages: c.ComposersMemoryPages, BuilderOutputBytes: c.ComposersOutputBytes}
}

// Validate checks the composers' settings as read here.
func (c ComposersLimits) Validate() error {
	errs := []error{c.Limits().Validate("COMPOSER")}
	if c.ComposersRenderTimeout <= 0 {
		errs = append(errs, fmt.Errorf("COMPOSER_RENDER_TIMEOUT must be positive, got %s", c.ComposersRenderTimeout))
	}
	return errors.Join(errs...)
}

// Wasm is the engine's limits.
func (l Limits) Wasm() wasm.Limits {
	return wasm.Limits{MemoryPages: l.BuilderMemoryPages, OutputBytes: l.BuilderOutputBytes, StderrBytes: 4096, Concurrent: l.BuilderConcurrency}
}

// Validate checks the limits; prefix (COMPOSER) names the variables.
func (l Limits) Validate(prefix string) error {
	var errs []error
	if l.BuilderMemoryPages < 16 || l.BuilderMemoryPages > 65536 {
		errs = append(errs, fmt.Errorf("%s_BUILDER_MEMORY_PAGES must be 16 to 65536 (1 MiB to 4 GiB), got %d", prefix, l.BuilderMemoryPages))
	}
	if l.BuilderConcurrency < 0 {
		errs = append(errs, fmt.Errorf("%s_BUILDER_CONCURRENCY must be 0 (one per CPU) or more, got %d", prefix, l.BuilderConcurrency))
	}
	if l.BuilderOutputBytes < 1024 {
		errs = append(errs, fmt.Errorf("%s_BUILDER_OUTPUT_BYTES must be at least 1024, got %d", prefix, l.BuilderOutputBytes))
	}
	return errors.Join(errs...)
}
