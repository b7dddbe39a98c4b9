package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode/utf8"

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
		if len(e.args) != 1 {
			return usagef("want the path of a prompt_builder.toml")
		}
		raw, err := os.ReadFile(e.args[0])
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
				if err := registry.Label(ctx, kv, *name, *label, v); err != nil {
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

// tomlString reads one string value of a TOML document, key in [table]: the forms a
// prompt_builder.toml uses (basic and literal strings, single- or multi-line). It is not a TOML
// parser: it finds the key's line and decodes the string that starts there.
func tomlString(doc, table, key string) (string, error) {
	inTable := false
	for i := 0; i < len(doc); {
		end := strings.IndexByte(doc[i:], '\n')
		if end < 0 {
			end = len(doc) - i
		}
		line := strings.TrimSpace(doc[i : i+end])
		next := i + end + 1
		switch {
		case strings.HasPrefix(line, "["):
			inTable = line == "["+table+"]"
		case inTable:
			if k, _, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == key {
				start := i + strings.Index(doc[i:], "=") + 1
				rest := strings.TrimLeft(doc[start:], " \t")
				return tomlValue(rest)
			}
		}
		i = next
	}
	return "", fmt.Errorf("no %s in [%s]", key, table)
}

// tomlValue decodes the string value at the start of s.
func tomlValue(s string) (string, error) {
	switch {
	case strings.HasPrefix(s, `"""`):
		body, ok := strings.CutPrefix(s[3:], "\n")
		if !ok {
			body = s[3:]
		}
		end := -1
		for j := 0; j+3 <= len(body); j++ {
			if body[j] == '\\' {
				j++ // an escaped character never closes the string
				continue
			}
			if body[j:j+3] == `"""` {
				end = j
				break
			}
		}
		if end < 0 {
			return "", fmt.Errorf(`unterminated """ string`)
		}
		return tomlUnescape(body[:end], true)
	case strings.HasPrefix(s, `'''`):
		body, ok := strings.CutPrefix(s[3:], "\n")
		if !ok {
			body = s[3:]
		}
		end := strings.Index(body, `'''`)
		if end < 0 {
			return "", fmt.Errorf(`unterminated ''' string`)
		}
		return body[:end], nil
	case strings.HasPrefix(s, `"`):
		line, _, _ := strings.Cut(s[1:], "\n")
		v, err := strconv.Unquote(`"` + line[:strings.LastIndex(line, `"`)] + `"`)
		if err != nil {
			return "", fmt.Errorf("string: %w", err)
		}
		return v, nil
	case strings.HasPrefix(s, `'`):
		line, _, _ := strings.Cut(s[1:], "\n")
		end := strings.IndexByte(line, '\'')
		if end < 0 {
			return "", fmt.Errorf("unterminated ' string")
		}
		return line[:end], nil
	}
	return "", fmt.Errorf("the value is not a string")
}

// tomlUnescape decodes a basic string's escapes; in a multi-line one, a backslash at the end of
// a line removes the newline and the whitespace after it.
func tomlUnescape(s string, multiline bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		i++
		if i >= len(s) {
			return "", fmt.Errorf("a string ends with a backslash")
		}
		switch c := s[i]; c {
		case 'b':
			b.WriteByte('\b')
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'f':
			b.WriteByte('\f')
		case 'r':
			b.WriteByte('\r')
		case '"', '\\':
			b.WriteByte(c)
		case 'u', 'U':
			n := 4
			if c == 'U' {
				n = 8
			}
			if i+n >= len(s) {
				return "", fmt.Errorf(`a \%c escape is cut short`, c)
			}
			r, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil || !utf8.ValidRune(rune(r)) {
				return "", fmt.Errorf(`bad \%c escape %q`, c, s[i+1:i+1+n])
			}
			b.WriteRune(rune(r))
			i += n
		default:
			if multiline && (c == '\n' || c == ' ' || c == '\t' || c == '\r') {
				// A line-ending backslash: skip the newline and the whitespace after it.
				for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
					i++
				}
				i--
				continue
			}
			return "", fmt.Errorf(`unknown escape \%c`, c)
		}
	}
	return b.String(), nil
}
