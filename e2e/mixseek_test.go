package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/pkg/events"
)

// TestMixseekUserSession plays what a mixseek user does: import the team template of their
// prompt_builder.toml, push it, label it production, and have round 2 composed by the pipeline.
// The prompt must be byte for byte what mixseek-core renders: its Jinja2 Environment
// (autoescape=False, undefined=StrictUndefined) over the values its UserPromptBuilder computes,
// written out here by hand from docs/prompts.md for this small tournament.
func TestMixseekUserSession(t *testing.T) {
	t.Parallel()
	python := ""
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(p, "-c", "import jinja2").Run() == nil {
			python = p
			break
		}
	}
	if python == "" {
		t.Skip("no python3 with jinja2: apt-get install python3-jinja2")
	}
	// mixseek-core's default team_user_prompt, in the prompt_builder.toml a mixseek user has.
	src, err := os.ReadFile("../pkg/compose/testdata/mixseek-default.jinja")
	if err != nil {
		t.Fatal(err)
	}
	mixseekTeamPrompt := string(src)
	e := newEnv(t)
	e.start("ranker")
	e.start("composer")
	dir := t.TempDir()
	toml := filepath.Join(dir, "prompt_builder.toml")
	if err := os.WriteFile(toml, []byte("[prompt_builder]\nteam_user_prompt = \"\"\"\n"+mixseekTeamPrompt+"\"\"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var session strings.Builder
	run := func(args ...string) string {
		t.Helper()
		out, code := e.podium(t, nil, args...)
		if code != 0 {
			t.Fatalf("podium %s: exit %d\n%s", strings.Join(args, " "), code, out)
		}
		session.WriteString("$ podium " + strings.Join(args, " ") + "\n" + out)
		return out
	}
	run("templates", "import-mixseek", toml, "--name", "mixseek-team-v1", "--out", dir)
	run("templates", "push", filepath.Join(dir, "mixseek-team-v1.mustache"))
	run("templates", "label", "mixseek-team-v1", "1", "production")

	for _, ev := range []events.EvaluationCompleted{
		evaluation("mx", "team-alpha", "Alpha", 1, 72.25, "第一案: 合意は <quorum> & \"過半数\" で決まる。", t0),
		evaluation("mx", "team-beta", "Beta", 1, 90, "beta's answer", t0),
		evaluation("mx", "team-gamma", "Gamma", 1, 60, "gamma's answer", t0),
	} {
		e.publishEvaluation("ev-"+ev.TeamID, ev)
	}
	at := time.Date(2026, 11, 24, 9, 30, 0, 0, time.UTC)
	e.requestRound("req-mx-2", events.RoundRequested{ExecutionID: "mx", TeamID: "team-alpha", TeamName: "Alpha", RoundNumber: 2,
		UserPrompt: "合意アルゴリズムを説明せよ。", Template: "mixseek-team-v1", Timezone: "Asia/Tokyo"}, at)
	a := e.answers("prompt.*.mx.team-alpha", 1, 30*time.Second)["req-mx-2"]
	if !a.ok() {
		t.Fatalf("round 2: %s %+v", a.subject, a.failed)
	}
	run("prompts", "show", "mx", "team-alpha", "2")

	// What mixseek-core renders for the same round.
	values := map[string]any{
		"current_datetime": "2026-11-24T18:30:00+09:00",
		"user_prompt":      "合意アルゴリズムを説明せよ。",
		"round_number":     2,
		"ranking_table": "#1 Beta - スコア: 90.00/100 (ラウンド数: 1)\n" +
			"**#2 Alpha (あなたのチーム) - スコア: 72.25/100 (ラウンド数: 1)**\n" +
			"#3 Gamma - スコア: 60.00/100 (ラウンド数: 1)",
		"team_position_message": "現在、3チーム中2位です。素晴らしい成績です！",
		"submission_history": "## ラウンド 1\n### スコア: 72.25/100\n### スコア詳細:\n" +
			"{\n  \"overall_score\": 72.25,\n  \"metrics\": [\n    {\n      \"metric_name\": \"ClarityCoherence\",\n" +
			"      \"score\": 72.25,\n      \"evaluator_comment\": \"comment team-alpha\"\n    }\n  ]\n}\n" +
			"### あなたの提出内容:\n第一案: 合意は <quorum> & \"過半数\" で決まる。",
	}
	in, err := json.Marshal(map[string]any{"template": mixseekTeamPrompt, "values": values})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, "-c", `import json, sys, jinja2
job = json.load(sys.stdin)
env = jinja2.Environment(autoescape=False, undefined=jinja2.StrictUndefined)  # mixseek-core's
sys.stdout.write(env.from_string(job["template"]).render(**job["values"]))`)
	cmd.Stdin = bytes.NewReader(in)
	want, err := cmd.Output()
	if err != nil {
		t.Fatalf("jinja2: %v", err)
	}
	if got := a.composed.Prompt; got != string(want) {
		t.Errorf("the prompt differs from what mixseek-core renders:\npodium: %q\nmixseek: %q", got, want)
	}
	run("prompts", "verify", "mx", "team-alpha", "2")
	t.Logf("a mixseek user's session:\n%s", session.String())
}
