package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/bounded"
	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/internal/textdiff"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// registryKV opens the TEMPLATES bucket; create makes it when missing (a first push).
func (e *env) registryKV(ctx context.Context, create bool) (jetstream.KeyValue, error) {
	return e.keyValue(ctx, registry.Config(e.cfg.StreamReplicas), create, "the template registry")
}

// keyValue opens a registry's bucket; create makes it when missing (a first push), else a
// missing one is a failed check naming what (the template registry).
func (e *env) keyValue(ctx context.Context, cfg jetstream.KeyValueConfig, create bool, what string) (jetstream.KeyValue, error) {
	js, err := e.jetstream()
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, cfg.Bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) && create:
		// Made (sealed: no rollups, no purges), never updated: a bucket that exists keeps the
		// configuration its owner gave it, and an author needs no right to change it
		// (deploy/nats/nats.conf).
		kv, err = events.EnsureBucket(ctx, js, cfg, false)
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, &checkError{what + " is empty: nothing was pushed yet"}
	}
	return kv, err
}

// readTemplate reads a template an author edits: a folder (every file in it, by relative path)
// or a <name>.mustache file (with <name>.json beside it as its manifest), in the registry's
// folder form.
// A template is stored as one registry entry, so its files together are read with one budget (at
// most limit bytes, counted while reading).
func readTemplate(path string, limit bounded.Limit) (string, map[string][]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", nil, err
	}
	files := map[string][]byte{}
	read := func(fsys fs.FS, name, key string) error {
		left := limit
		left.Bytes -= filesBytes(files)
		b, err := left.ReadFS(fsys, name, "template "+path)
		if bounded.IsTooLarge(err) {
			return &bounded.TooLargeError{What: "template " + path, Limit: limit} // the folder's limit, not what was left of it
		}
		files[key] = b
		return err
	}
	if !st.IsDir() {
		name, ok := strings.CutSuffix(filepath.Base(path), ".mustache")
		if !ok {
			return "", nil, fmt.Errorf("%s is neither a template folder nor a .mustache file", path)
		}
		dir := os.DirFS(filepath.Dir(path))
		if err := read(dir, filepath.Base(path), "prompt.mustache"); err != nil {
			return "", nil, err
		}
		manifest := name + ".json"
		if _, err := fs.Stat(dir, manifest); err == nil {
			if err := read(dir, manifest, "manifest.json"); err != nil {
				return "", nil, err
			}
		}
		return name, files, nil
	}
	root := os.DirFS(path)
	err = fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") {
			return err
		}
		return read(root, p, p)
	})
	return filepath.Base(filepath.Clean(path)), files, err
}

// filesBytes is the size of a template's files read so far.
func filesBytes(files map[string][]byte) int64 {
	var n int64
	for _, b := range files {
		n += int64(len(b))
	}
	return n
}

func templatesPush(fs *flag.FlagSet) func(context.Context, *env) error {
	label := fs.String("label", "", "point this label at the new version (production makes it the default for the name)")
	return func(ctx context.Context, e *env) error {
		name, files, err := readTemplate(e.args[0], e.cfg.eventLimit())
		if err != nil {
			return &usageError{err.Error()}
		}
		if !events.ValidIdentifier(name) {
			return usagef("template name %s (from the path) must be an identifier", events.Quote(name))
		}
		kv, err := e.registryKV(ctx, true)
		if err != nil {
			return err
		}
		var v int
		err = e.permitted(ctx, func(ctx context.Context) (err error) { v, err = registry.Push(ctx, kv, name, files); return err })
		if err != nil {
			return &checkError{"refused: " + denial(err, "push versions of "+name).Error()}
		}
		fmt.Fprintf(e.out, "pushed %s@%d (%d files)\n", name, v, len(files))
		if *label != "" {
			return labelTemplate(ctx, e, kv, name, *label, registry.Target{{Version: v, Weight: 1}})
		}
		return nil
	}
}

// registry reads and parses the bucket's current content.
func (e *env) registry(ctx context.Context) (registry.State, error) {
	kv, err := e.registryKV(ctx, false)
	if err != nil {
		return registry.State{}, err
	}
	return registryState(ctx, kv)
}

// registryIfAny is the registry's state, or an empty one where there is no registry: the
// built-in and directory templates alone.
func (e *env) registryIfAny(ctx context.Context) (registry.State, error) {
	kv, err := e.registryKV(ctx, false)
	if err != nil {
		return registry.State{}, nil
	}
	return registryState(ctx, kv)
}

// registryState reads and parses the bucket.
func registryState(ctx context.Context, kv jetstream.KeyValue) (registry.State, error) {
	s, _, err := registry.Load(ctx, kv)
	return s, err
}

func templatesList(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		s, err := e.registry(ctx)
		if err != nil {
			return err
		}
		versions := map[string][]int{}
		for _, v := range s.Versions {
			versions[v.Name] = append(versions[v.Name], v.Version)
		}
		for name := range s.Rewritten {
			if versions[name] == nil {
				versions[name] = []int{}
			}
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "TEMPLATE\tVERSIONS\tLABELS\tWRITTEN AGAIN (never served from their key)")
		for _, name := range slices.Sorted(maps.Keys(versions)) {
			vs := versions[name]
			slices.Sort(vs)
			var labels []string
			if len(vs) > 0 {
				labels = append(labels, "latest="+strconv.Itoa(vs[len(vs)-1]))
			}
			for _, l := range slices.Sorted(maps.Keys(s.Labels[name])) {
				labels = append(labels, fmt.Sprintf("%s=%d", l, s.Labels[name][l]))
			}
			for _, l := range slices.Sorted(maps.Keys(s.Splits[name])) {
				labels = append(labels, fmt.Sprintf("%s=[%s]", l, s.Splits[name][l]))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, strings.Trim(fmt.Sprint(vs), "[]"), strings.Join(labels, " "), strings.Trim(fmt.Sprint(s.Rewritten[name]), "[]"))
		}
		return tw.Flush()
	}
}

// resolve finds the templates references name exactly as a composer with the same template
// settings resolves them (internal/library): the registry's version or label, else the built-in
// or directory template of that name. One it does not find is a failed check.
func (e *env) resolve(ctx context.Context, refs ...string) ([]compose.Version, error) {
	s, err := e.registry(ctx)
	if err != nil {
		return nil, err
	}
	lib, err := e.templates.Load("", s)
	if err != nil {
		return nil, &usageError{err.Error()}
	}
	out := make([]compose.Version, len(refs))
	for i, ref := range refs {
		t, err := lib.Lookup(ref)
		if err != nil {
			return nil, &checkError{err.Error()}
		}
		out[i] = compose.Version{Name: t.Name, Version: t.Version, Files: t.Files()}
	}
	return out, nil
}

func templatesShow(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		vs, err := e.resolve(ctx, e.args[0])
		if err != nil {
			return err
		}
		v := vs[0]
		fmt.Fprintf(e.out, "%s@%d\n%s", v.Name, v.Version, registry.Source(v))
		return nil
	}
}

func templatesLabel(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		name, label, specs := e.args[0], e.args[len(e.args)-1], e.args[1:len(e.args)-1]
		target, err := registry.ParseTarget(strings.Join(specs, ","))
		if err != nil {
			return usagef("%v", err)
		}
		kv, err := e.registryKV(ctx, false)
		if err != nil {
			return err
		}
		return labelTemplate(ctx, e, kv, name, label, target)
	}
}

// labelTemplate moves a label of a template and prints what it names now, each version with the
// digest it pins (what a reviewer passes as VERSION@DIGEST to refuse a version changed since).
func labelTemplate(ctx context.Context, e *env, kv jetstream.KeyValue, name, label string, target registry.Target) error {
	err := e.permitted(ctx, func(ctx context.Context) (err error) {
		target, err = registry.Label(ctx, kv, name, label, target)
		return err
	})
	if err != nil {
		return &checkError{denial(err, fmt.Sprintf("move the %s label of %s", label, name)).Error()}
	}
	if len(target) == 1 {
		fmt.Fprintf(e.out, "label %s of %s -> %s\n", label, name, target)
		return nil
	}
	fmt.Fprintf(e.out, "label %s of %s -> %s (each team keeps the version it was first served for its whole execution)\n", label, name, target)
	return nil
}

// denial says what a user was not permitted to do, where the server refused its publish; any
// other error is returned as it is.
func denial(err error, what string) error {
	var denied *permissionError
	if !errors.As(err, &denied) {
		return err
	}
	return fmt.Errorf("not permitted to %s: NATS refuses this user's publish (protected labels and the release role: docs/templates.md, \"Protected labels\"): %v", what, denied)
}

func templatesHistory(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		if !events.ValidIdentifier(e.args[0]) {
			return usagef("want one template name")
		}
		name := e.args[0]
		kv, err := e.registryKV(ctx, false)
		if err != nil {
			return err
		}
		changes, err := registry.History(ctx, kv, name)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "REVISION\tTIME\tCHANGE")
		for _, c := range changes {
			change := c.What()
			fmt.Fprintf(tw, "%d\t%s\t%s\n", c.Revision, c.Time.Format(time.RFC3339), change)
		}
		return tw.Flush()
	}
}

func templatesDiff(fs *flag.FlagSet) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		vs, err := e.resolve(ctx, e.args[0], e.args[1])
		if err != nil {
			return err
		}
		a, b := vs[0], vs[1]
		textdiff.Unified(e.out, fmt.Sprintf("%s@%d", a.Name, a.Version), fmt.Sprintf("%s@%d", b.Name, b.Version), registry.Source(a), registry.Source(b), 3)
		return nil
	}
}

// templatesRender renders offline: a template being written (a folder or .mustache file) or a
// built-in one, with a request and evaluations from files, through the composer's own reading
// and rendering code. No server is involved.
func templatesRender(fs *flag.FlagSet) func(context.Context, *env) error {
	requestFile := fs.String("request", "", "round.requested data (JSON), as POST /v1/render takes it")
	evalsFile := fs.String("evaluations", "", "a JSON array of evaluation.completed data, in stream order")
	at := fs.String("time", "", "the request's time (RFC 3339; default: the request's \"time\", else now)")
	encoding := fs.String("encoding", "", "token encoding (default: COMPOSER_TOKEN_ENCODING, else o200k_base)")
	asJSON := fs.Bool("json", false, "print the whole prompt.composed data")
	return func(ctx context.Context, e *env) error {
		if *requestFile == "" {
			return usagef("want NAME (a built-in template, or a template folder or file) and --request FILE")
		}
		// The composers' templates and settings (not the registry: nothing is read from a server).
		lib, err := e.templates.Load(*encoding, registry.State{})
		if err != nil {
			return &usageError{err.Error()}
		}
		name := e.args[0]
		if _, statErr := os.Stat(name); statErr == nil {
			n, files, err := readTemplate(name, e.cfg.eventLimit())
			if err != nil {
				return &usageError{err.Error()}
			}
			var bad []error
			lib, bad = lib.WithRegistry([]compose.Version{{Name: n, Version: 1, Files: files}}, map[string]map[string]int{n: {"production": 1}})
			if len(bad) > 0 {
				return &checkError{bad[0].Error()}
			}
			name = n
		}
		raw, err := e.cfg.eventLimit().ReadFile(*requestFile)
		if err != nil {
			return &usageError{err.Error()}
		}
		req, err := events.ParseRenderRequest(raw, events.DefaultMaxEventBytes)
		if err != nil {
			return &checkError{err.Error()}
		}
		req.Data.Template = name
		when := req.Time
		if *at != "" {
			if when, err = time.Parse(time.RFC3339Nano, *at); err != nil {
				return usagef("--time: %v", err)
			}
		}
		if when.IsZero() {
			when = time.Now()
		}
		var recs []rank.Record
		if *evalsFile != "" {
			raw, err := e.cfg.inputLimit().ReadFile(*evalsFile)
			if err != nil {
				return &usageError{err.Error()}
			}
			var datas []events.EvaluationCompleted
			if err := json.Unmarshal(raw, &datas); err != nil {
				return usagef("--evaluations: %v", err)
			}
			for i, d := range datas {
				d.ExecutionID = req.Data.ExecutionID
				recs = append(recs, rank.Record{EventID: fmt.Sprintf("file-%d", i+1), Seq: uint64(i + 1), EvaluationCompleted: d})
			}
		}
		evs, contents := rank.FromRecords(recs)
		t, err := lib.Lookup(req.Data.Template)
		if err != nil {
			return &checkError{err.Error()}
		}
		in, err := render.Inputs(ctx, t, render.Memory{Evs: evs, Contents: contents}, "render", req.Data, when.Truncate(time.Microsecond), rank.Pos{Seq: uint64(len(recs))})
		if err != nil {
			return err
		}
		out, err := lib.Compose(ctx, in)
		if err != nil {
			return &checkError{err.Error()}
		}
		if *asJSON {
			return printJSON(e, out)
		}
		fmt.Fprintf(e.out, "%s\n", out.Prompt)
		fmt.Fprintf(e.stderr, "(%s@%d, %d tokens %s, %d cut(s))\n", out.Template.Name, out.Template.Version, out.TokenEstimate, out.TokenEncoding, len(out.Truncated))
		return nil
	}
}
