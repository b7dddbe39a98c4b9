package main

import (
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/compose"
)

func TestTomlString(t *testing.T) {
	doc := `# mixseek workspace
[orchestrator]
team_user_prompt = "not this one"

[prompt_builder]
evaluator_user_prompt = """
Evaluate: {{ submission }}"""
team_user_prompt = """
現在日時: {{ current_datetime }}

# タスク
{{ user_prompt }}
{% if round_number > 1 %}
{{ ranking_table }}
{% endif %}
tab\there \"quoted\" \u00e9 end \
    joined
"""
judgment_user_prompt = 'literal {{ x }}'
`
	got, err := tomlString(doc, "prompt_builder", "team_user_prompt")
	want := "現在日時: {{ current_datetime }}\n\n# タスク\n{{ user_prompt }}\n{% if round_number > 1 %}\n{{ ranking_table }}\n{% endif %}\ntab\there \"quoted\" é end joined\n"
	if err != nil || got != want {
		t.Fatalf("team_user_prompt = %q, %v\nwant %q", got, err, want)
	}
	if got, err := tomlString(doc, "prompt_builder", "judgment_user_prompt"); err != nil || got != "literal {{ x }}" {
		t.Errorf("literal string = %q, %v", got, err)
	}
	if _, err := tomlString(doc, "prompt_builder", "missing"); err == nil || !strings.Contains(err.Error(), "no missing in [prompt_builder]") {
		t.Errorf("missing key: %v", err)
	}
	// The whole path: the converted team template loads as a checked template.
	text, err := compose.FromJinja(got)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compose.LoadVersion(compose.Version{Name: "mixseek-import", Version: 1, Files: map[string][]byte{"prompt.mustache": []byte(text)}}); err != nil {
		t.Errorf("converted template does not load: %v\n%s", err, text)
	}
}

// TestTomlStringWhatTheHandReaderGotWrong: the cases the hand-written reader failed on, read by
// the TOML library: an unterminated string is an error with its line (the reader panicked), a
// header with a comment is the table, and a multi-line string holding "[Task]" is not a header.
func TestTomlStringWhatTheHandReaderGotWrong(t *testing.T) {
	tests := []struct {
		name, doc, want, err string
	}{
		{name: "unterminated string", doc: "[prompt_builder]\nteam_user_prompt = \"never closed\n", err: "not TOML: line 2"},
		{name: "unterminated multi-line string", doc: "[prompt_builder]\nteam_user_prompt = \"\"\"\nstill open\n", err: "not TOML: line"},
		{name: "a header with a comment", doc: "[prompt_builder]   # the team's prompt\nteam_user_prompt = \"hello {{ user_prompt }}\"\n", want: "hello {{ user_prompt }}"},
		{name: "a multi-line string holding a header", doc: "[other]\nx = \"\"\"\n[prompt_builder]\nteam_user_prompt = \"the wrong one\"\n\"\"\"\n\n[prompt_builder]\nteam_user_prompt = '''\n[Task]\n{{ user_prompt }}'''\n",
			want: "[Task]\n{{ user_prompt }}"},
		{name: "not a string", doc: "[prompt_builder]\nteam_user_prompt = 3\n", err: "team_user_prompt in [prompt_builder] is a int64, not a string"},
		{name: "no table", doc: "title = 'x'\n", err: "no [prompt_builder] table"},
		{name: "a key twice", doc: "[prompt_builder]\nteam_user_prompt = 'a'\nteam_user_prompt = 'b'\n", err: "not TOML: line 3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tomlString(tt.doc, "prompt_builder", "team_user_prompt")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("err = %v, want it to contain %q (got %q)", err, tt.err, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}
