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
