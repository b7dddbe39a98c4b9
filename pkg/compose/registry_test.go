package compose

import (
	"context"
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
