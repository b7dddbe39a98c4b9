package compose

import (
	"context"
	"os"
	"strings"
	"testing"
)

// mixseekDefault is mixseek-core's default team prompt as docs/prompts.md describes it (date header,
// task, round, leaderboard, position message, history), in the Jinja2 its prompt_builder.toml
// holds, with the round-1 branch its default has. The e2e test of a mixseek user reads the same file.
var mixseekDefault = func() string {
	b, err := os.ReadFile("testdata/mixseek-default.jinja")
	if err != nil {
		panic(err) // a test file of this package: missing means a broken checkout
	}
	return string(b)
}()

func TestFromJinja(t *testing.T) {
	got, err := FromJinja(mixseekDefault)
	if err != nil {
		t.Fatal(err)
	}
	want := `現在日時: {{current_datetime}}

# タスク
{{user_prompt}}

# 現在のラウンド
ラウンド {{round_number}}
{{!}}{{^is_first_round}}

# リーダーボード
{{!}}{{#ranking_table}}
{{ranking_table}}
{{!}}{{/ranking_table}}

{{team_position_message}}

# 過去のSubmission履歴
{{submission_history}}
{{/is_first_round}}{{#is_first_round}}

初回のラウンドです。
{{!}}{{/is_first_round}}`
	if got != want {
		t.Fatalf("converted:\n%s\nwant:\n%s", got, want)
	}
	// It loads as a template and renders both branches.
	base := testLibrary(t)
	lib, errs := base.WithRegistry([]Version{{Name: "imported", Version: 1, Files: map[string][]byte{"prompt.mustache": []byte(got)}}}, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	later := longTournament("imported", 0)
	later.Request.Template = "imported@1"
	out, err := lib.Compose(context.Background(), later)
	if err != nil || !strings.Contains(out.Prompt, "# 過去のSubmission履歴\n## ラウンド 1") || !strings.Contains(out.Prompt, "(あなたのチーム)") || strings.Contains(out.Prompt, "初回") {
		t.Errorf("round 8: %v\n%s", err, out.Prompt)
	}
	first := later
	first.Request.RoundNumber, first.History, first.Leaderboard = 1, nil, nil
	out, err = lib.Compose(context.Background(), first)
	if err != nil || !strings.Contains(out.Prompt, "初回のラウンドです。") || strings.Contains(out.Prompt, "リーダーボード") {
		t.Errorf("round 1: %v\n%s", err, out.Prompt)
	}

	for _, bad := range []struct{ src, want string }{
		{"a\n{% for r in rounds %}x{% endfor %}", `line 2: {% for r in rounds %} is not converted`},
		{"{{ user_prompt | upper }}", `line 1: {{ user_prompt | upper }} is not a plain variable`},
		{"x\ny\n{% if round_number > 2 %}", `line 3: {% if round_number > 2 %} is not converted`},
		{"{% if round_number > 1 %}open", `not closed`},
		{"{%- if ranking_table %}", `whitespace control`},
	} {
		if _, err := FromJinja(bad.src); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want %q", bad.src, err, bad.want)
		}
	}
}
