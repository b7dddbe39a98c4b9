package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
)

var update = flag.Bool("update", false, "TestCLIReference: rewrite docs/cli-reference.md from the command table")

// TestCLIReference: docs/cli-reference.md is what `podium help` and every command's --help print,
// both made from the one command table (commands.go); it fails when the page differs.
// `go test ./cmd/podium -run TestCLIReference -update` writes it again.
func TestCLIReference(t *testing.T) {
	var help bytes.Buffer
	if err := run(t.Context(), []string{"podium", "help"}, &help, io.Discard); err != nil {
		t.Fatal(err)
	}
	var page strings.Builder
	page.WriteString("# podium command reference\n\nGenerated from the code: what `podium help` and each command's `--help` print, both made\n" +
		"from the command table of `cmd/podium/commands.go` (`go test ./cmd/podium -run TestCLIReference -update`\n" +
		"writes this page again; the test fails when it differs). How the commands are used: [cli.md](cli.md).\n\n```\n" +
		strings.TrimRight(help.String(), "\n") + "\n```\n")
	cmds := commands()
	slices.SortFunc(cmds, func(a, b command) int { return strings.Compare(a.name, b.name) })
	for _, c := range cmds {
		var out bytes.Buffer
		if err := run(t.Context(), append(append([]string{"podium"}, strings.Fields(c.name)...), "--help"), &out, io.Discard); err != nil {
			t.Fatalf("podium %s --help: %v", c.name, err)
		}
		if !strings.Contains(help.String(), c.name) {
			t.Errorf("podium help does not list %s", c.name)
		}
		fmt.Fprintf(&page, "\n## podium %s\n\n```\n%s\n```\n", c.name, strings.TrimRight(out.String(), "\n"))
	}
	testenv.Golden(t, filepath.Join("..", "..", "docs", "cli-reference.md"), []byte(page.String()), *update,
		"go test ./cmd/podium -run TestCLIReference -update")
}

// TestCommandTable: every name is unique, every group word starts only two-word commands, and a
// command of a group is reached through it.
func TestCommandTable(t *testing.T) {
	cmds := commands()
	seen := map[string]bool{}
	for _, c := range cmds {
		if seen[c.name] {
			t.Errorf("%s twice", c.name)
		}
		seen[c.name] = true
		if c.audience != authors && c.audience != auditors && c.audience != operators || c.short == "" || c.what == "" || c.flags == nil {
			t.Errorf("%s is incomplete: %+v", c.name, c)
		}
		if first, _, two := strings.Cut(c.name, " "); !two && isGroup(cmds, first) {
			t.Errorf("%s is both a command and a group", first)
		}
	}
	var out bytes.Buffer
	err := run(t.Context(), []string{"podium", "prompts", "nope"}, &out, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `unknown command "prompts nope"`) {
		t.Errorf("an unknown subcommand: %v", err)
	}
}
