package builders

import (
	"errors"
	"fmt"

	"github.com/podium-llm/podium/internal/wasm"
)

// Limits bound one run of a builder: the composer's settings (COMPOSER_BUILDER_*). Its time is half
// of what is left of the render's deadline (Runner).
type Limits struct {
	BuilderMemoryPages uint32 `envconfig:"BUILDER_MEMORY_PAGES" default:"1024" desc:"memory of one run of a prompt builder, in pages of 64 KiB (1024: 64 MiB); past it the builder falls back"`
	BuilderOutputBytes int    `envconfig:"BUILDER_OUTPUT_BYTES" default:"1048576" desc:"bytes a prompt builder may write as its answer; past them it falls back"`
}

// ComposersLimits are the composers' Limits as another program reads them (the console, the CLI),
// under the composers' names, so that its verify runs a builder as they do.
type ComposersLimits struct {
	ComposersMemoryPages uint32 `envconfig:"COMPOSER_BUILDER_MEMORY_PAGES" default:"1024" desc:"the composers' memory of a prompt builder's run, in pages of 64 KiB, for verify"`
	ComposersOutputBytes int    `envconfig:"COMPOSER_BUILDER_OUTPUT_BYTES" default:"1048576" desc:"the composers' limit of a prompt builder's answer, for verify"`
}

// Limits are the composers' limits.
func (c ComposersLimits) Limits() Limits {
	return Limits{BuilderMemoryPages: c.ComposersMemoryPages, BuilderOutputBytes: c.ComposersOutputBytes}
}

// Wasm is the engine's limits.
func (l Limits) Wasm() wasm.Limits {
	return wasm.Limits{MemoryPages: l.BuilderMemoryPages, OutputBytes: l.BuilderOutputBytes, StderrBytes: 4096}
}

// Validate checks the limits; prefix (COMPOSER) names the variables.
func (l Limits) Validate(prefix string) error {
	var errs []error
	if l.BuilderMemoryPages < 16 || l.BuilderMemoryPages > 65536 {
		errs = append(errs, fmt.Errorf("%s_BUILDER_MEMORY_PAGES must be 16 to 65536 (1 MiB to 4 GiB), got %d", prefix, l.BuilderMemoryPages))
	}
	if l.BuilderOutputBytes < 1024 {
		errs = append(errs, fmt.Errorf("%s_BUILDER_OUTPUT_BYTES must be at least 1024, got %d", prefix, l.BuilderOutputBytes))
	}
	return errors.Join(errs...)
}
