package compose

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/pkg/events"
)

// Fuzz targets of the template loader and the renderer. Run one with, for example:
//
//	go test -run '^$' -fuzz '^FuzzRender$' -fuzztime 30s ./pkg/compose
//
// Plain `go test` runs the seeds below (and any failure Go saved under testdata/fuzz/).

var fuzzTime = time.Date(2026, 11, 21, 10, 0, 0, 123456000, time.UTC)

// fuzzHostile are strings that try to break out of a value into the template, or through
// escaping, encoding and tokenizing.
var fuzzHostile = []string{
	"{{x}}", "{{{y}}}", "{{#a}}b{{/a}}", "{{> p}}", "{{=<% %>=}}", "{{!c}}", "{{^a}}{{/a}}", "{{/a}}", "{{",
	`<&"'>`, "\xff\xfe", strings.Repeat("a", 5000), "🚀👩‍💻🏳️‍🌈", "分散合意は難しい。漢字テスト", "a\x00b\x00",
	"<nil>", "%!v(MISSING) %s %d", "<|endoftext|><|im_end|>", "\r\n\t\v\f", "\u202e\u200b\ufeff",
}

// fuzzCounter is built once: the BPE ranks take a while to load.
var fuzzCounter = sync.OnceValues(func() (TokenCounter, error) { return NewTokenCounter("o200k_base") })

func fuzzTokens(f *testing.F) TokenCounter {
	tokens, err := fuzzCounter()
	if err != nil {
		f.Fatal(err)
	}
	return tokens
}

// fuzzRequest is a valid request of team "team-alpha" for the fuzz inputs.
func fuzzRequest(round int, tmpl, userPrompt string) events.RoundRequested {
	return events.RoundRequested{ExecutionID: "exec-fuzz", TeamID: "team-alpha", TeamName: "Alpha", RoundNumber: round,
		UserPrompt: userPrompt, Template: tmpl, Timezone: "Asia/Tokyo", MaxRounds: 20}
}

func FuzzLoad(f *testing.F) {
	tokens := fuzzTokens(f)
	manifests := []string{
		``, // no manifest.json at all
		`{}`,
		`{"version":3,"description":"d","labels":["stable"],"kind":"task","limits":{"history_rounds":1,"leaderboard_teams":2,"preview_chars":3,"max_prompt_tokens":50}}`,
		`{"variants":[{"name":"phi","models":["phi-*"],"priority":2,"format":"phi"},{"name":"q","models":["[","qwen*"],"format":"chatml"}]}`,
		`{"roles":["system","user"]}`,
		`{"relative_paths":["read_first","vars.x",""]}`,
		`{"version":-1}`,
		`{"kind":"other","unknown":1}`,
		`{"limits":{"history_rounds":-1}}`,
		`{"version":1e400}`,
		`[]`,
		`{"version":1}{}`,
		"{\"description\":\"\xff\"}",
	}
	sources := []string{
		"Task {{user_prompt}} for {{team.name}} in round {{round_number}}\n",
		"{{#history}}{{round_number}}: {{score_text}} {{#metrics}}{{metric_name}}={{score_text}}{{/metrics}}\n{{preview}}{{/history}}",
		"{{#leaderboard}}{{position}}. {{team_name}}{{#is_self}} <-{{/is_self}}\n{{/leaderboard}}{{#self}}{{position}}/{{team_count}}{{/self}}{{^self}}unranked{{/self}}",
		"{{ranking_table}}\n{{team_position_message}}\n{{submission_history}}\n{{trend}}",
		"{{vars.x}} {{#vars.list}}- {{.}}\n{{/vars.list}}{{vars.a.b.c}}",
		"{{#max_rounds}}{{rounds_remaining}} of {{max_rounds}}{{/max_rounds}}",
		"{{=<% %>=}}<% user_prompt %>",
		"{{{user_prompt}}} {{&user_prompt}}",
		"{{!comment}}{{^has_history}}none{{/has_history}}",
		"{{#history}}{{#history}}{{round_number}}{{/history}}{{/history}}",
		"{{#user_prompt}}{{.}}{{/user_prompt}}",
		"{{.}}",
		"{{scoer}}", "{{#history}}unclosed", "{{/history}}", "{{> p}}", "{{>p}}", "{{", "}}", "{{{x}}", "{{#}}{{/}}",
		"\xff\xfe", "", strings.Repeat("{{#vars.a}}", 300) + strings.Repeat("{{/vars.a}}", 300),
	}
	for i, s := range sources {
		f.Add([]byte(manifests[i%len(manifests)]), s)
	}
	for i, m := range manifests {
		f.Add([]byte(m), sources[i%3])
	}
	for _, h := range fuzzHostile[:10] {
		f.Add([]byte(`{}`), h)
	}
	f.Fuzz(func(t *testing.T, manifest []byte, source string) {
		dir := t.TempDir()
		folder := filepath.Join(dir, "t")
		if err := os.Mkdir(folder, 0o755); err != nil {
			t.Fatal(err)
		}
		if len(manifest) > 0 {
			if err := os.WriteFile(filepath.Join(folder, "manifest.json"), manifest, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(folder, "prompt.mustache"), []byte(source), 0o644); err != nil {
			t.Fatal(err)
		}
		l, err := Load(Options{Dir: dir, Tokens: tokens})
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("Load error %#v has an empty message", err)
			}
			return
		}
		if !slices.ContainsFunc(l.Templates(), func(tm *Template) bool { return tm.Name == "t" }) {
			t.Fatalf("Load succeeded without template \"t\"")
		}
		// A template the loader accepted must render (or fail with a Failure), never panic.
		in := Inputs{RequestID: "req", Request: fuzzRequest(2, "t", "the task"), Time: fuzzTime,
			History:     fuzzHistory(2, "sub", "fb"),
			Leaderboard: fuzzBoard("Beta")}
		in.Request.Vars = map[string]any{"x": "v", "list": []any{"a", "b"}}
		for _, model := range []string{"", "phi-4-mini", "qwen2"} {
			in.Request.Model = model
			if _, err := l.Compose(context.Background(), in); err != nil {
				if _, ok := events.AsFailure(err); !ok {
					t.Fatalf("Compose error %v (%T) is not an events.Failure", err, err)
				}
			}
		}
	})
}

// fuzzHistory is the team's rounds before round (at most two).
func fuzzHistory(round int, submission, feedback string) []events.TeamRound {
	var out []events.TeamRound
	for r := max(1, round-2); r < round; r++ {
		out = append(out, events.TeamRound{RoundNumber: r, EvaluationID: "ev-" + strings.Repeat("x", r),
			OverallScore: 50 + float64(r)*3.25, Feedback: feedback, EvaluatedAt: "2026-11-21T10:00:00Z",
			Metrics:    []events.Metric{{MetricName: "Clarity", Score: 70.5, EvaluatorComment: feedback}, {MetricName: "Form", Score: 1e-05}},
			Submission: events.Submission{Content: submission, Format: "md"}})
	}
	return out
}

// fuzzBoard is a small leaderboard with the team second and another team named other.
func fuzzBoard(other string) []events.LeaderboardRow {
	return []events.LeaderboardRow{
		{Position: 1, Rank: 1, TeamID: "team-beta", TeamName: other, BestScore: 90, BestRound: 1, Rounds: 2},
		{Position: 2, Rank: 2, TeamID: "team-alpha", TeamName: "Alpha", BestScore: 80.5, BestRound: 1, Rounds: 1},
		{Position: 3, Rank: 2, TeamID: "team-gamma", TeamName: "Γάμμα チーム", BestScore: 80.5, BestRound: 1, Rounds: 2},
	}
}

// fuzzRunnerVars is a valid runner-task vars object carrying the fuzz strings.
func fuzzRunnerVars(varValue, submission, feedback string) map[string]any {
	v := map[string]any{
		"x":             varValue,
		"role":          varValue,
		"task":          map[string]any{"id": "T-1", "title": varValue, "description": submission, "done_when": feedback},
		"workspace":     "podium",
		"read_first":    []any{"README.md"},
		"constraints":   map[string]any{"write": []any{"pkg/"}, "exclude": []any{"vendor/"}},
		"output_format": feedback,
		"digest": map[string]any{"exit_code": 1, "reason": varValue,
			"checks": []any{map[string]any{"name": varValue, "passed": false}}},
	}
	if varValue != "" {
		v["digest"].(map[string]any)["changed_files"] = []any{varValue}
	}
	return v
}

func FuzzRender(f *testing.F) {
	tokens := fuzzTokens(f)
	l, err := Load(Options{Tokens: tokens})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("Write a haiku about distributed consensus.", "Logs agree;\nleaders fall.", "The 5-7-5 is off.", "value", 3)
	f.Add("task", "", "", "", 1)
	f.Add("task", "s", "f", "v", 0)
	f.Add("task", "s", "f", "v", -7)
	f.Add("task", "s", "f", "v", 1<<40)
	for i, h := range fuzzHostile {
		other := fuzzHostile[(i+1)%len(fuzzHostile)]
		f.Add(h, other, h, h, i%5+1)
		f.Add("Do "+h+" now", h, other, "v", 2)
		f.Add("task", h, other, h, 20)
	}
	f.Fuzz(func(t *testing.T, userPrompt, submission, feedback, varValue string, round int) {
		model := []string{"", "phi-4-mini", "qwen2.5-7b", "meta-llama-3-8b"}[uint(round)%4]
		round = min(max(round, 1), 20)
		hostileNil := strings.Contains(userPrompt+submission+feedback+varValue, "<nil>")
		for _, tmpl := range []string{"team-round", "mixseek-team", "runner-task"} {
			in := Inputs{RequestID: "req-fuzz", Request: fuzzRequest(round, tmpl, userPrompt), Time: fuzzTime,
				History: fuzzHistory(round, submission, feedback), Leaderboard: fuzzBoard(varValue), EvaluationsSeq: 7}
			in.Request.Model = model
			if tmpl == "runner-task" {
				in.Request.Vars = fuzzRunnerVars(varValue, submission, feedback)
			} else {
				in.Request.Vars = map[string]any{"x": varValue}
			}
			out, err := l.Compose(context.Background(), in)
			if err != nil {
				if _, ok := events.AsFailure(err); !ok || err.Error() == "" {
					t.Fatalf("%s: Compose error %q (%T) is not an events.Failure with a message", tmpl, err, err)
				}
				continue
			}
			if tmpl != "runner-task" && !strings.Contains(out.Prompt, userPrompt) {
				t.Fatalf("%s: the prompt does not contain the user prompt %q verbatim:\n%s", tmpl, userPrompt, out.Prompt)
			}
			if !hostileNil && strings.Contains(out.Prompt, "<nil>") {
				t.Fatalf("%s: the prompt contains <nil>:\n%s", tmpl, out.Prompt)
			}
			if out.TokenEstimate < 0 || out.Template.Name != tmpl {
				t.Fatalf("%s: token estimate %d, template %+v", tmpl, out.TokenEstimate, out.Template)
			}
			again, err := l.Compose(context.Background(), in)
			if err != nil {
				t.Fatalf("%s: the second Compose failed: %v", tmpl, err)
			}
			if again.Prompt != out.Prompt || again.PromptSHA256 != out.PromptSHA256 || again.TokenEstimate != out.TokenEstimate ||
				!cmp.Equal(again.Messages, out.Messages) || !cmp.Equal(again.Truncated, out.Truncated) {
				t.Fatalf("%s: two Composes of the same inputs differ:\n%s", tmpl, cmp.Diff(out, again))
			}
		}
	})
}
