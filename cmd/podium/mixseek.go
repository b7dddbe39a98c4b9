package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/BurntSushi/toml"

	"github.com/podium-llm/podium/internal/registry"
	"github.com/podium-llm/podium/pkg/compose"
)

// templatesImportMixseek converts the team template of a mixseek-core prompt_builder.toml into a
// Mustache template: printed, written as <name>.mustache into --out, or pushed to the registry.
func templatesImportMixseek(fs *flag.FlagSet) func(context.Context, *env) error {
	name := fs.String("name", "mixseek-import", "the template's name")
	out := fs.String("out", "", "write <name>.mustache into this folder instead of printing it")
	push := fs.Bool("push", false, "push it to the template registry as the next version of --name")
	label := fs.String("label", "", "with --push: point this label at the new version")
	return func(ctx context.Context, e *env) error {
		raw, err := e.cfg.eventLimit().ReadFile(e.args[0])
		if err != nil {
			return &usageError{err.Error()}
		}
		src, err := tomlString(string(raw), "prompt_builder", "team_user_prompt")
		if err != nil {
			return &checkError{fmt.Sprintf("%s: %v", e.args[0], err)}
		}
		text, err := compose.FromJinja(src)
		if err != nil {
			return &checkError{fmt.Sprintf("%s: team_user_prompt %v", e.args[0], err)}
		}
		files := map[string][]byte{"prompt.mustache": []byte(text)}
		if _, err := compose.LoadVersion(compose.Version{Name: *name, Version: 1, Files: files}); err != nil {
			return &checkError{err.Error()}
		}
		switch {
		case *push:
			kv, err := e.registryKV(ctx, true)
			if err != nil {
				return err
			}
			v, err := registry.Push(ctx, kv, *name, files)
			if err != nil {
				return &checkError{"refused: " + err.Error()}
			}
			fmt.Fprintf(e.out, "pushed %s@%d\n", *name, v)
			if *label != "" {
				if _, err := registry.Label(ctx, kv, *name, *label, registry.Target{{Version: v, Weight: 1}}); err != nil {
					return err
				}
				fmt.Fprintf(e.out, "label %s of %s -> %d\n", *label, *name, v)
			}
		case *out != "":
			path := filepath.Join(*out, *name+".mustache")
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(e.out, "wrote %s\n", path)
		default:
			fmt.Fprint(e.out, text)
		}
		return nil
	}
}

// tomlString reads one string value of a TOML document, key in [table]. The document is parsed
// whole by a TOML library (BurntSushi/toml: the TOML 1.0 reference implementation in Go, kept
// since 2013): every string form, comments after headers, a multi-line string holding "[Task]",
// and a document that is not TOML refused with its line and column.
func tomlString(doc, table, key string) (string, error) {
	var m map[string]any
	if _, err := toml.Decode(doc, &m); err != nil {
		var perr toml.ParseError
		if errors.As(err, &perr) {
			return "", fmt.Errorf("not TOML: line %d, column %d: %s", perr.Position.Line, perr.Position.Col, perr.Message)
		}
		return "", fmt.Errorf("not TOML: %w", err)
	}
	t, ok := m[table].(map[string]any)
	if !ok {
		return "", fmt.Errorf("no [%s] table", table)
	}
	v, ok := t[key]
	if !ok {
		return "", fmt.Errorf("no %s in [%s]", key, table)
	}
	text, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s in [%s] is a %T, not a string", key, table, v)
	}
	return text, nil
}
