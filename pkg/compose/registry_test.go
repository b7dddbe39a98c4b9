package compose

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/events"
)

func TestRegistryResolution(t *testing.T) {
	base := testLibrary(t)
	v := func(name string, n int, text string) Version {
		return Version{Name: name, Version: n, Files: map[string][]byte{"prompt.mustache": []byte(text)}}
	}
	lib, errs := base.WithRegistry([]Version{
		v("greet", 1, "v1 {{team.name}}"),
		v("greet", 2, "v2 {{team.name}}"),
		v("greet", 3, "v3 {{team.nmae}}"), // bad: never served
		v("team-round", 7, "registry round {{round_number}}"),
	}, map[string]map[string]int{
		"greet":      {"production": 1, "staging": 3},
		"team-round": {"canary": 7},
	})
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `greet@3`) || !strings.Contains(errs[0].Error(), `unknown variable "team.nmae"`) {
		t.Fatalf("errors %v, want the bad version 3 named with its variable", errs)
	}
	for _, tt := range []struct {
		ref, want, wantErr string
	}{
		{"greet", "v1 Alpha", ""},
		{"greet:production", "v1 Alpha", ""},
		{"greet@2", "v2 Alpha", ""},
		{"greet:latest", "v2 Alpha", ""},
		{"greet@3", "", `template "greet" has no version 3`},
		{"greet:staging", "", `template "greet" is labelled staging at version 3, which is not loaded`},
		{"greet:nope", "", `template "greet" has no label "nope"`},
		{"team-round:canary", "registry round 2", ""},
		{"team-round", "# Round\nRound 2 of 10", ""}, // no production label: the built-in one
	} {
		in := longTournament(tt.ref, 0)
		in.Request.Template, in.Request.TeamName, in.Request.RoundNumber, in.History = tt.ref, "Alpha", 2, nil
		out, err := lib.Compose(context.Background(), in)
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%s: error %v, want %q", tt.ref, err, tt.wantErr)
		case tt.wantErr == "" && (err != nil || !strings.Contains(out.Prompt, tt.want)):
			t.Errorf("%s: %v %q, want it to contain %q", tt.ref, err, out.Prompt, tt.want)
		}
		if err != nil && failureCode(err) != events.CodeUnknownTemplate {
			t.Errorf("%s: code %s, want unknown_template", tt.ref, failureCode(err))
		}
	}
	if _, err := base.Lookup("greet"); err == nil {
		t.Errorf("the base library changed: it resolves greet")
	}
}

// TestLoadFilesMakesTheSameTemplate: every built-in template, folder or single file, made again
// from its Files is the same template (the same SHA256), and a library WithTemplates serves it
// by name@version; a file changed is another template.
func TestLoadFilesMakesTheSameTemplate(t *testing.T) {
	base := testLibrary(t)
	var again []*Template
	for _, tmpl := range base.Templates() {
		got, err := LoadFiles(tmpl.Name, 40+tmpl.Version, tmpl.Files())
		if err != nil {
			t.Fatalf("%s: %v", tmpl.Name, err)
		}
		if got.SHA256 != tmpl.SHA256 || len(tmpl.Files()) == 0 {
			t.Errorf("%s made again from %d files: sha256 %s, was %s", tmpl.Name, len(tmpl.Files()), got.SHA256, tmpl.SHA256)
		}
		again = append(again, got)
	}
	if len(again) < 2 {
		t.Fatalf("only %d built-in templates", len(again))
	}
	lib := base.WithTemplates(again)
	for _, want := range again {
		got, err := lib.Lookup(fmt.Sprintf("%s@%d", want.Name, want.Version))
		if err != nil || got != want {
			t.Errorf("Lookup(%s@%d) = %v, %v", want.Name, want.Version, got, err)
		}
	}
	files := again[0].Files()
	for p, b := range files {
		files[p] = append(b, ' ')
		break
	}
	if changed, err := LoadFiles(again[0].Name, 1, files); err == nil && changed.SHA256 == again[0].SHA256 {
		t.Error("a changed file made the same template")
	}
}
