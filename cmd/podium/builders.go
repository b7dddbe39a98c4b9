package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/builders"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// builderBuckets opens the BUILDERS bucket and the store of the modules authors push; create
// makes the bucket when missing (a first push). The store is never made here: a composer or the
// operator makes it sealed.
func (e *env) builderBuckets(ctx context.Context, create bool) (jetstream.KeyValue, *builders.Store, error) {
	kv, err := e.keyValue(ctx, builders.BucketConfig(e.cfg.StreamReplicas), create, "the builder registry")
	if err != nil {
		return nil, nil, err
	}
	obj, err := e.moduleStore(ctx, builders.ModulesConfig(e.cfg.StreamReplicas), false)
	if errors.Is(err, builders.ErrNoStore) {
		return nil, nil, &checkError{"the store of pushed modules (" + builders.Modules + ") does not exist: a composer makes it at start (MANAGE_STREAMS), or the operator (`podium streams apply`)"}
	}
	return kv, obj, err
}

// moduleStore opens a store of modules; create makes it when missing.
func (e *env) moduleStore(ctx context.Context, cfg jetstream.StreamConfig, create bool) (*builders.Store, error) {
	js, err := e.jetstream()
	if err != nil {
		return nil, err
	}
	return builders.OpenStore(ctx, js, cfg, create)
}

// releasedBuilders are the builder registry's bucket and the store of the modules production
// served, nils when either is missing (nothing was ever labelled production).
func (e *env) releasedBuilders(ctx context.Context) (jetstream.KeyValue, *builders.Store, error) {
	kv, err := e.keyValue(ctx, builders.BucketConfig(e.cfg.StreamReplicas), false, "the builder registry")
	var empty *checkError
	if errors.As(err, &empty) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	obj, err := e.moduleStore(ctx, builders.ReleasesConfig(e.cfg.StreamReplicas), false)
	if errors.Is(err, builders.ErrNoStore) {
		return nil, nil, nil
	}
	return kv, obj, err
}

// builderSource runs the builder versions records name, from the registry and the modules
// production served (nil when there are none): what `prompts verify` needs for records a builder
// built.
func (e *env) builderSource(ctx context.Context) (func(context.Context, events.BuilderRef, time.Time) (compose.Builder, error), error) {
	kv, obj, err := e.releasedBuilders(ctx)
	if kv == nil || err != nil {
		return nil, err
	}
	engine, err := e.builderEngine(ctx)
	if err != nil {
		return nil, err
	}
	return builders.Source(kv, &builders.Loader{Engine: engine, Modules: obj}, e.cfg.ComposersRenderTimeout), nil
}

// builderEngine runs builders as the composers do (their limits), closed when the command ends.
func (e *env) builderEngine(ctx context.Context) (*wasm.Engine, error) {
	engine, err := wasm.NewEngine(ctx, e.cfg.ComposersLimits.Limits().Wasm())
	if err != nil {
		return nil, err
	}
	e.close = append(e.close, func() { engine.Close(context.Background()) })
	return engine, nil
}

// builderModules reads the module of a builder version production served, for a bundle (nil
// when there is no registry).
func (e *env) builderModules(ctx context.Context) (func(events.BuilderRef) ([]byte, error), error) {
	kv, obj, err := e.releasedBuilders(ctx)
	if kv == nil || err != nil {
		return nil, err
	}
	s, _, err := builders.Load(ctx, kv)
	if err != nil {
		return nil, err
	}
	return func(ref events.BuilderRef) ([]byte, error) {
		v, ok := s.Version(ref.Name, ref.Version)
		if !ok || v.SHA256 != ref.SHA256 {
			return nil, fmt.Errorf("the registry does not hold it with sha256 %.12s…", ref.SHA256)
		}
		return obj.Module(ctx, v)
	}, nil
}

// loadable checks a module the way composers load it: it compiles within their memory limit, and
// it is a WASI command.
func loadable(ctx context.Context, memoryPages uint32) func([]byte) error {
	return func(module []byte) error {
		engine, err := wasm.NewEngine(ctx, wasm.Limits{MemoryPages: memoryPages, OutputBytes: 1, StderrBytes: 0})
		if err != nil {
			return err
		}
		defer engine.Close(ctx)
		_, err = engine.Load(ctx, module)
		return err
	}
}

// globList is a repeatable --models.
type globList []string

func (l *globList) String() string { return strings.Join(*l, ",") }

func (l *globList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// buildersPush stores a module as the next version of a builder, after loading it as composers
// will; it serves nothing until labelled production.
func buildersPush(fs *flag.FlagSet) func(context.Context, *env) error {
	name := fs.String("name", "", "the builder's name (an identifier)")
	var models globList
	fs.Var(&models, "models", "a model glob the builder serves (path.Match, case-insensitive; repeat for several)")
	priority := fs.Int("priority", 0, "among the builders whose globs match a model, the highest priority builds it (then the name)")
	label := fs.String("label", "", "point this label at the new version (production serves it)")
	return func(ctx context.Context, e *env) error {
		if *name == "" || len(models) == 0 {
			return usagef("builders push takes --name NAME and at least one --models GLOB")
		}
		module, err := bounded.Limit{Bytes: builders.MaxModuleBytes}.ReadFile(e.args[0])
		if err != nil {
			return &usageError{err.Error()}
		}
		kv, obj, err := e.builderBuckets(ctx, true)
		if err != nil {
			return err
		}
		var v builders.Version
		err = e.permitted(ctx, func(ctx context.Context) (err error) {
			v, err = builders.Push(ctx, kv, obj, *name, module, models, *priority, loadable(ctx, e.cfg.ComposersMemoryPages))
			return err
		})
		if err != nil {
			return &checkError{"refused: " + denial(err, "push versions of builder "+*name).Error()}
		}
		fmt.Fprintf(e.out, "pushed builder %s@%d (sha256 %s, %d bytes, models %s, priority %d)\n", v.Name, v.Version, v.SHA256, v.Size, strings.Join(v.Models, " "), v.Priority)
		if *label == "" {
			fmt.Fprintf(e.out, "it serves nothing until labelled production; it will see %s\n", builders.Sees)
			return nil
		}
		return labelBuilder(ctx, e, kv, obj, v.Name, v.Version, "", *label)
	}
}

// labelBuilder moves a label of a builder, saying where the server refused it, and prints what it
// names now with its digest. Production's module is copied into the releases store, which only
// the release role may write.
func labelBuilder(ctx context.Context, e *env, kv jetstream.KeyValue, modules *builders.Store, name string, version int, digest, label string) error {
	var releases *builders.Store
	if label == builders.Production {
		var err error
		if releases, err = e.moduleStore(ctx, builders.ReleasesConfig(e.cfg.StreamReplicas), false); err != nil {
			return &checkError{denial(err, "open the store of released modules ("+builders.Releases+")").Error()}
		}
	}
	var target registry.Target
	err := e.permitted(ctx, func(ctx context.Context) (err error) {
		target, err = builders.Label(ctx, kv, modules, releases, name, label, version, digest)
		return err
	})
	if err != nil {
		return &checkError{denial(err, fmt.Sprintf("move the %s label of builder %s", label, name)).Error()}
	}
	fmt.Fprintf(e.out, "label %s of builder %s -> %s\n", label, name, target)
	return nil
}

func buildersLabel(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		name, label := e.args[0], e.args[2]
		target, err := registry.ParseTarget(e.args[1])
		if err != nil || len(target) != 1 || strings.Contains(e.args[1], "=") {
			return usagef("VERSION must be a version number, or VERSION@DIGEST, got %s", events.Quote(e.args[1]))
		}
		kv, modules, err := e.builderBuckets(ctx, false)
		if err != nil {
			return err
		}
		return labelBuilder(ctx, e, kv, modules, name, target[0].Version, target[0].Digest, label)
	}
}

// buildersList prints every version, its models, priority and labels, and what a builder sees.
func buildersList(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		kv, err := e.keyValue(ctx, builders.BucketConfig(e.cfg.StreamReplicas), false, "the builder registry")
		if err != nil {
			return err
		}
		s, bad, err := builders.Load(ctx, kv)
		if err != nil {
			return err
		}
		for _, err := range bad {
			fmt.Fprintln(e.stderr, "left out:", err)
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "BUILDER\tVERSION\tSHA256\tBYTES\tMODELS\tPRIORITY\tLABELS")
		for _, v := range s.Versions {
			fmt.Fprintf(tw, "%s\t%d\t%.12s\t%d\t%s\t%d\t%s\n", v.Name, v.Version, v.SHA256, v.Size, strings.Join(v.Models, " "), v.Priority, strings.Join(s.LabelsOf(v), " "))
		}
		for _, name := range slices.Sorted(maps.Keys(s.Rewritten)) {
			for _, n := range s.Rewritten[name] {
				what := "written again: never served"
				if _, served := s.Version(name, n); served {
					what = "written again: served from its label's copy only"
				}
				fmt.Fprintf(tw, "%s\t%d\t-\t-\t-\t-\t%s\n", name, n, what)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "\nEvery builder sees %s. A version serves requests only once labelled production.\n", builders.Sees)
		return nil
	}
}

// buildersParse splits a model's output (stdin) the way its production builder does, through
// the composers' podium.parse.
func buildersParse(fs *flag.FlagSet) func(context.Context, *env) error {
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for a composer's answer")
	return func(ctx context.Context, e *env) error {
		output, err := bounded.Limit{Bytes: 1 << 20}.ReadAll(os.Stdin, "standard input")
		if err != nil {
			return usagef("%v", err)
		}
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		body, err := json.Marshal(map[string]string{"model": e.args[0], "output": string(output)})
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		reply, err := js.Conn().RequestWithContext(rctx, "podium.parse", body)
		if err != nil {
			return fmt.Errorf("podium.parse: %w (is a composer running?)", err)
		}
		if code := reply.Header.Get("Nats-Service-Error-Code"); code != "" {
			return &checkError{"podium.parse: " + string(reply.Data)}
		}
		_, err = fmt.Fprintf(e.out, "%s\n", reply.Data)
		return err
	}
}
