package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/podium-llm/podium/internal/library"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// Mismatch is a record that does not render again as recorded: the verdict of a verification.
// Any other error of Verify is not a verdict (the store, the templates or the settings failed).
type Mismatch struct{ msg string }

func (m *Mismatch) Error() string { return m.msg }

func differs(format string, args ...any) error { return &Mismatch{fmt.Sprintf(format, args...)} }

// ConfigError is a verifier setting that cannot be used (an unknown timezone, a template
// directory that does not load).
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// Verifier renders records again with the composer's templates and the same reads. It is safe
// for concurrent use.
type Verifier struct {
	settings library.Settings
	registry registry.State
	reader   render.Reader
	extra    []*compose.Template // served by name@version before anything else (a bundle's)
	// builders runs the builder version a record names at the record's time (WithBuilders); nil:
	// a record built by a builder cannot be verified here.
	builders func(ctx context.Context, ref events.BuilderRef, at time.Time) (compose.Builder, error)

	mu   sync.Mutex
	libs map[string]*compose.Library // by token encoding
}

// NewVerifier loads templates as a composer with these settings does, plus the registry's
// versions, and reads the store through reader.
func NewVerifier(settings library.Settings, reg registry.State, reader render.Reader) *Verifier {
	return &Verifier{settings: settings, registry: reg, reader: reader, libs: map[string]*compose.Library{}}
}

// WithBuilders has records built by a prompt builder verified by running the version they name
// again (internal/builders.Recorded).
func (v *Verifier) WithBuilders(src func(ctx context.Context, ref events.BuilderRef, at time.Time) (compose.Builder, error)) *Verifier {
	v.builders = src
	return v
}

func (v *Verifier) library(encoding string) (*compose.Library, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if lib, ok := v.libs[encoding]; ok {
		return lib, nil
	}
	// The record's own encoding: a record counted with another than the settings' is verified
	// as it was counted.
	lib, err := v.settings.Load(encoding, v.registry)
	if err != nil {
		return nil, &ConfigError{err}
	}
	if len(v.extra) > 0 {
		lib = lib.WithTemplates(v.extra)
	}
	v.libs[encoding] = lib
	return lib, nil
}

// Verify renders one record again from its request, template version and evaluations_seq and
// compares everything it says about the prompt: nil when it is exactly what the record holds, a
// *Mismatch saying where it parts otherwise.
func (v *Verifier) Verify(ctx context.Context, r Record) error {
	d := r.Data
	if d.Request == nil {
		return differs("the record does not hold the request it was made from (a composer older than prompt.composed.request)")
	}
	lib, err := v.library(d.TokenEncoding)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("%s@%d", d.Template.Name, d.Template.Version) // exactly the version that rendered
	t, err := lib.Lookup(ref)
	if err != nil {
		return differs("%v", err)
	}
	if t.Version != d.Template.Version || t.SHA256 != d.Template.SHA256 {
		return differs("template %s@%d (sha256 %.12s…) is not loaded here: %s@%d (sha256 %.12s…)", d.Template.Name, d.Template.Version, d.Template.SHA256, t.Name, t.Version, t.SHA256)
	}
	at, err := time.Parse(time.RFC3339Nano, d.Request.Time)
	if err != nil {
		return differs("request time: %v", err)
	}
	req := d.Request.Data
	req.Template = ref // the version the composer resolved, whatever the request named
	in, err := render.Inputs(ctx, t, v.reader, d.RequestID, req, at, render.AsOf(d.Inputs))
	if err != nil {
		return err
	}
	if b := d.Builder; b != nil && !b.Fallback {
		// Built by a builder: the same module bytes, the same input, the same answer.
		if v.builders == nil {
			return differs("it was built by builder %s@%d, and no builder registry is at hand to run it again", b.Name, b.Version)
		}
		if in.Builder, err = v.builders(ctx, *b, at); err != nil {
			return differs("builder %s@%d: %v", b.Name, b.Version, err)
		}
	}
	out, err := lib.Compose(ctx, in)
	if err != nil {
		if _, isFailure := events.AsFailure(err); !isFailure {
			return err
		}
		return differs("renders no prompt now: %v", err)
	}
	if sum := sha256.Sum256([]byte(d.Prompt)); hex.EncodeToString(sum[:]) != d.PromptSHA256 {
		return differs("its prompt does not match its own prompt_sha256 (%.16s…): %s", d.PromptSHA256, firstDifference(out.Prompt, d.Prompt))
	}
	if b := out.Builder; b != nil && b.Fallback && d.Builder != nil && !d.Builder.Fallback {
		return differs("builder %s@%d built it, and fails now (%s): the template rendered instead", b.Name, b.Version, b.Reason)
	}
	if out.PromptSHA256 != d.PromptSHA256 {
		return differs("prompt sha256 %.16s…, rendered again %.16s…: %s", d.PromptSHA256, out.PromptSHA256, firstDifference(out.Prompt, d.Prompt))
	}
	// Everything else the record says about the prompt, but the request, which the record names
	// by what it asked for, and the label its template resolved through and that label's split
	// (the version, which the label chose, is what renders again).
	out.Request, d.Request = nil, nil
	out.Template.Label, out.Template.Split = d.Template.Label, d.Template.Split
	if d.Builder != nil && d.Builder.Fallback {
		// A fallback is verified on its template: the builder's failure (a timeout) need not
		// happen again, and the prompt is the template's.
		out.Builder = d.Builder
	}
	var got, want map[string]json.RawMessage
	g, _ := json.Marshal(out)
	w, _ := json.Marshal(d)
	_ = json.Unmarshal(g, &got)
	_ = json.Unmarshal(w, &want)
	for _, field := range slices.Sorted(maps.Keys(want)) {
		if !bytes.Equal(got[field], want[field]) {
			return differs("same prompt, but %s: the record says %.200s, rendering again says %.200s", field, want[field], got[field])
		}
	}
	return nil
}

// firstDifference says where two texts part, with a little of each.
func firstDifference(rendered, recorded string) string {
	i := 0
	for i < len(rendered) && i < len(recorded) && rendered[i] == recorded[i] {
		i++
	}
	cut := func(s string) string { return strconv.Quote(strings.ToValidUTF8(s[i:min(len(s), i+40)], "")) }
	return fmt.Sprintf("the texts part at byte %d: recorded %s, rendered %s", i, cut(recorded), cut(rendered))
}
