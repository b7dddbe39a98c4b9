package compose

import (
	"context"
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/pkg/events"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestPyFloatRepr(t *testing.T) {
	tenth, fifth := 0.1, 0.2 // variables: constant arithmetic would be exact
	tests := []struct {
		in   float64
		want string
	}{
		{80, "80.0"}, {75.5, "75.5"}, {1e-05, "1e-05"}, {1e16, "1e+16"}, {123456789, "123456789.0"},
		{0.0001, "0.0001"}, {tenth + fifth, "0.30000000000000004"}, {math.Copysign(0, -1), "-0.0"}, {1.5e16, "1.5e+16"},
		{9999999999999998, "9999999999999998.0"}, {1e100, "1e+100"}, {-2.5e-7, "-2.5e-07"}, {0, "0.0"},
	}
	for _, tt := range tests {
		if got := pyFloatRepr(tt.in); got != tt.want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestIsoformat(t *testing.T) {
	tokyo, _ := time.LoadLocation("Asia/Tokyo")
	tests := []struct {
		in   time.Time
		want string
	}{
		{time.Date(2025, 11, 19, 21, 34, 56, 789012000, tokyo), "2025-11-19T21:34:56.789012+09:00"},
		{time.Date(2025, 11, 19, 12, 0, 0, 0, time.UTC), "2025-11-19T12:00:00+00:00"},
		{time.Date(2025, 11, 19, 12, 0, 0, 999, time.UTC), "2025-11-19T12:00:00+00:00"}, // below a microsecond
		{time.Date(2025, 11, 19, 12, 0, 0, 1000, time.UTC), "2025-11-19T12:00:00.000001+00:00"},
	}
	for _, tt := range tests {
		if got := isoformat(tt.in); got != tt.want {
			t.Errorf("isoformat(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestScore2RoundsHalfToEvenOnTheBinaryValue(t *testing.T) {
	// 0.125 is exact in binary (ties to even: 0.12); 0.375 too (0.38); 2.675 is below 2.675 (2.67).
	for in, want := range map[float64]string{0.125: "0.12", 0.375: "0.38", 2.675: "2.67", 82.5: "82.50"} {
		if got := score2(in); got != want {
			t.Errorf("score2(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestTeamPositionMessage(t *testing.T) {
	tests := []struct {
		pos, teams int
		want       string
	}{
		{0, 0, "まだあなたのチームの順位はありません。"},
		{1, 4, "🏆 現在、あなたのチームは1位です！この調子で頑張ってください。"},
		{2, 4, "現在、4チーム中2位です。素晴らしい成績です！"},
		{3, 4, "現在、4チーム中3位です。素晴らしい成績です！"},
		{4, 4, "現在、4チーム中4位です。"},
	}
	for _, tt := range tests {
		if got := teamPositionMessage(tt.pos, tt.teams); got != tt.want {
			t.Errorf("teamPositionMessage(%d, %d) = %q, want %q", tt.pos, tt.teams, got, tt.want)
		}
	}
}

func TestScoreDetailsJSON(t *testing.T) {
	r := events.TeamRound{OverallScore: 82.5, Metrics: []events.Metric{
		{MetricName: "ClarityCoherence", Score: 80, EvaluatorComment: "明確 <ok> & \"quoted\"\n"},
		{MetricName: "Tiny", Score: 1e-05, EvaluatorComment: ""},
	}}
	want := `{
  "overall_score": 82.5,
  "metrics": [
    {
      "metric_name": "ClarityCoherence",
      "score": 80.0,
      "evaluator_comment": "明確 <ok> & \"quoted\"\n"
    },
    {
      "metric_name": "Tiny",
      "score": 1e-05,
      "evaluator_comment": ""
    }
  ]
}`
	if diff := cmp.Diff(want, scoreDetailsJSON(r)); diff != "" {
		t.Errorf("scoreDetailsJSON mismatch (-want +got):\n%s", diff)
	}
	if got := scoreDetailsJSON(events.TeamRound{OverallScore: 70}); got != "{\n  \"overall_score\": 70.0,\n  \"metrics\": []\n}" {
		t.Errorf("empty metrics: got %q", got)
	}
}

func TestPreviewKeepsHeadAndTail(t *testing.T) {
	got, cut := preview(strings.Repeat("a", 10)+strings.Repeat("é", 10)+strings.Repeat("z", 10), 10)
	if !cut || !strings.HasPrefix(got, "aaaaa\n") || !strings.HasSuffix(got, "\nzzzzz") || !strings.Contains(got, "20 characters omitted") {
		t.Errorf("preview = %q, %v", got, cut)
	}
	if got, cut := preview("short", 10); got != "short" || cut {
		t.Errorf("preview(short) = %q, %v", got, cut)
	}
}

func loadFS(t *testing.T, files map[string]string) (*Library, error) {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return Load(Options{Dir: dir})
}

func TestLoadRejectsBadTemplates(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string // every fragment must appear in the error
	}{
		{"unknown", "Hello\n{{team.name}}\n{{scoer}}\n", []string{`"unknown"`, "line 3", `unknown variable "scoer"`}},
		{"unknown-field", "{{team.nmae}}", []string{`unknown variable "team.nmae"`}},
		{"list-field", "{{history.score}}", []string{`"history" is a list`}},
		{"optional-outside", "{{self.position}}", []string{`optional variable "self.position"`}},
		{"max-rounds-outside", "Round {{round_number}} of {{max_rounds}}", []string{`optional variable "max_rounds"`}},
		{"syntax", "{{#history}}unclosed", []string{`"syntax"`}},
		{"partial", "{{> header}}", []string{`partial "header"`}},
		// A leaderboard row has no submission: other teams' work is not reachable from a template.
		{"other-team", "{{#leaderboard}}{{submission}}{{/leaderboard}}", []string{`unknown variable "submission"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadFS(t, map[string]string{tt.name + ".mustache": tt.src})
			if err == nil {
				t.Fatalf("Load accepted %q", tt.src)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadAcceptsOptionalInsideOwnSection(t *testing.T) {
	_, err := loadFS(t, map[string]string{"ok.mustache": "{{#self}}{{position}} {{self.rank}}{{/self}}{{^self}}unranked{{/self}}{{#max_rounds}}{{max_rounds}}{{/max_rounds}}{{#history}}{{#metrics}}{{metric_name}}{{/metrics}}{{user_prompt}}{{/history}}{{vars.anything.at.all}}"})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLoadFailsOnMissingDefault(t *testing.T) {
	if _, err := Load(Options{DefaultTemplate: "nope"}); err == nil || !strings.Contains(err.Error(), `default template "nope"`) {
		t.Fatalf("Load with unknown default: %v", err)
	}
}

func testLibrary(t *testing.T) *Library {
	t.Helper()
	tokens, err := NewTokenCounter("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	l, err := Load(Options{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func tr(round int, score float64, content, feedback string, metrics ...events.Metric) events.TeamRound {
	return events.TeamRound{RoundNumber: round, EvaluationID: "ev-" + content[:min(3, len(content))] + "-" + strings.Repeat("x", round),
		OverallScore: score, Metrics: metrics, Feedback: feedback, Submission: events.Submission{Content: content, Format: "md"}}
}

func lb(pos, rank int, team, name string, best float64, bestRound, rounds int) events.LeaderboardRow {
	return events.LeaderboardRow{Position: pos, Rank: rank, TeamID: team, TeamName: name, BestScore: best, BestRound: bestRound, Rounds: rounds}
}

func request(round int, template string) events.RoundRequested {
	return events.RoundRequested{ExecutionID: "exec-7f3a", TeamID: "team-alpha", TeamName: "Alpha", RoundNumber: round,
		UserPrompt: "Write a haiku about distributed consensus.", Template: template, Timezone: "Asia/Tokyo", MaxRounds: 5}
}

var roundTime = time.Date(2026, 11, 21, 10, 0, 0, 123456000, time.UTC)

// goldenCases are the prompts every shipped template is rendered for.
func goldenCases() map[string]Inputs {
	history := []events.TeamRound{
		tr(1, 72, "Logs agree;\nleaders fall, then rise again—\nquorum holds the line.", "Imagery is fine, the 5-7-5 is off.",
			events.Metric{MetricName: "ClarityCoherence", Score: 70, EvaluatorComment: "clear"}, events.Metric{MetricName: "Form", Score: 60.5, EvaluatorComment: "syllables: 5-8-5"}),
		tr(2, 80.5, strings.Repeat("Paxos <prepare> & \"promise\" {{ranking_table}} ", 12)+"END", "Better form; the <tags> & {{braces}} distract.",
			events.Metric{MetricName: "ClarityCoherence", Score: 85, EvaluatorComment: ""}),
	}
	board := []events.LeaderboardRow{
		lb(1, 1, "team-beta", "Beta", 90, 2, 2), lb(2, 2, "team-alpha", "Alpha", 80.5, 2, 2),
		lb(3, 2, "team-gamma", "Γάμμα チーム", 80.5, 1, 2), lb(4, 4, "team-delta", "Delta", 12.25, 2, 2),
	}
	// Ranks after round 1: Beta rose, Alpha fell, Γάμμα held its rank, Delta is new.
	previous := map[string]int{"team-alpha": 1, "team-beta": 2, "team-gamma": 2}
	return map[string]Inputs{
		"round1": {RequestID: "req-1", Request: request(1, ""), Time: roundTime},
		"round3-history-ties": {RequestID: "req-3", Request: request(3, ""), Time: roundTime,
			History: history, Leaderboard: board, PreviousRanks: previous, EvaluationsSeq: 8},
		"round2-unranked-empty-leaderboard": {RequestID: "req-2", Request: request(2, ""), Time: roundTime},
		// The team sent nothing yet, others did: a leaderboard without the team.
		"round3-unranked": {RequestID: "req-5", Request: request(3, ""), Time: roundTime, Leaderboard: []events.LeaderboardRow{
			lb(1, 1, "team-beta", "Beta", 90, 2, 2), lb(2, 2, "team-gamma", "Γάμμα チーム", 80.5, 1, 2)},
			PreviousRanks: map[string]int{"team-beta": 1}, EvaluationsSeq: 4},
		// A long Japanese submission with emoji and combining marks: previews cut on characters.
		"round2-long-unicode": {RequestID: "req-6", Request: request(2, ""), Time: roundTime, History: []events.TeamRound{
			tr(1, 64.25, strings.Repeat("分散合意は難しい。🚀 café ", 120)+"終わり", "長すぎます。要点を絞ってください。",
				events.Metric{MetricName: "簡潔さ", Score: 40, EvaluatorComment: "冗長 <verbose> & \"long\""})},
			Leaderboard: []events.LeaderboardRow{lb(1, 1, "team-alpha", "Alpha", 64.25, 1, 1)}, EvaluationsSeq: 1},
		"round3-leader-cut": {RequestID: "req-4", Request: func() events.RoundRequested {
			r := request(3, "")
			one := 1
			r.Limits.LeaderboardTeams = &one
			r.Limits.HistoryRounds = &one
			r.MaxRounds = 0
			r.Timezone = ""
			return r
		}(), Time: roundTime, History: history, Leaderboard: board, PreviousRanks: previous, EvaluationsSeq: 8},
	}
}

// runnerCases are the runner-task prompts: a first attempt and a retry with a digest.
func runnerCases() map[string]Inputs {
	vars := func(digest bool) map[string]any {
		v := map[string]any{
			"role": "You are a careful Go engineer working alone in a repository checkout.",
			"task": map[string]any{"id": "T-42", "title": "Make the ranker's flush configurable",
				"description": "Add RANKER_FLUSH_INTERVAL and use it for batches.\nKeep <defaults> & \"names\" as they are.",
				"done_when":   "go test ./... passes and the README lists the variable"},
			"workspace":     "podium (a Go module)",
			"read_first":    []any{"README.md", "cmd/ranker/config.go"},
			"constraints":   map[string]any{"write": []any{"cmd/ranker/"}, "exclude": []any{"vendor/"}, "forbidden": []any{".ci/run"}, "needs_approval": []any{"go.mod"}},
			"output_format": "A unified diff, then one paragraph on what you tested.",
		}
		if digest {
			v["digest"] = map[string]any{"exit_code": json.Number("1"), "reason": "tests failed",
				"checks":           []any{map[string]any{"name": "go vet", "passed": true}, map[string]any{"name": "go test", "passed": false}},
				"scope_violations": []any{"go.sum"}, "changed_files": []any{"cmd/ranker/config.go", "go.sum"}}
		}
		return v
	}
	first := request(1, "runner-task")
	first.Vars = vars(false)
	retry := request(2, "runner-task")
	retry.Vars = vars(true)
	// Long Unicode text in every free field, and no optional section: the inverted sections show.
	unicode := request(3, "runner-task")
	unicode.Vars = map[string]any{
		"role": "あなたは慎重なエンジニアです。🛠️",
		"task": map[string]any{"id": "T-東京-7", "title": "ランキングの同点処理を直す — «tie» ≠ 'draw'",
			"description": strings.Repeat("同点のチームは team_id 順に並べ、順位は同じにする。{{not a tag}} <b>&</b>\n", 40),
			"done_when":   "すべてのテストが通ること ✅"},
		"workspace":     "podium/ (Go モジュール)",
		"output_format": "差分と説明。",
	}
	return map[string]Inputs{
		"long-unicode-no-constraints": {RequestID: "req-t4", Request: unicode, Time: roundTime, History: goldenCases()["round3-history-ties"].History},
		"first-attempt":               {RequestID: "req-t1", Request: first, Time: roundTime},
		"retry-digest":                {RequestID: "req-t2", Request: retry, Time: roundTime},
		"retry-digest-phi":            {RequestID: "req-t3", Request: func() events.RoundRequested { r := retry; r.Model = "phi-4-mini-instruct"; return r }(), Time: roundTime},
	}
}

// checkGolden compares got with testdata/<name>.txt, rewriting it under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	golden := filepath.Join("testdata", name+".txt")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./pkg/compose -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("prompt differs from %s (-want +got):\n%s", golden, diff)
	}
}

func TestGoldenPrompts(t *testing.T) {
	l := testLibrary(t)
	type tc struct {
		template, name string
		in             Inputs
	}
	var cases []tc
	for _, tmpl := range []string{"team-round", "mixseek-team"} {
		for name, in := range goldenCases() {
			in.Request.Template = tmpl
			cases = append(cases, tc{tmpl, name, in})
		}
	}
	for name, in := range runnerCases() {
		cases = append(cases, tc{"runner-task", name, in})
	}
	for _, model := range []string{"phi-4-mini", "Meta-Llama-3-8B-Instruct", "qwen2.5-7b-instruct"} {
		in := goldenCases()["round3-history-ties"]
		in.Request.Template, in.Request.Model = "team-round", model
		cases = append(cases, tc{"team-round", "round3-model-" + strings.ToLower(model), in})
	}
	for _, c := range cases {
		t.Run(c.template+"/"+c.name, func(t *testing.T) {
			got, err := l.Compose(context.Background(), c.in)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, c.template+"."+c.name, got.Prompt)
			again, err := l.Compose(context.Background(), c.in)
			if err != nil || again.Prompt != got.Prompt || again.PromptSHA256 != got.PromptSHA256 || !cmp.Equal(again.Messages, got.Messages) {
				t.Errorf("second render differs: %v", err)
			}
			if got.TokenEncoding != "o200k_base" || got.TokenEstimate <= 0 {
				t.Errorf("token estimate %d %q", got.TokenEstimate, got.TokenEncoding)
			}
		})
	}
}

func TestValuesAreInsertedNotRendered(t *testing.T) {
	l := testLibrary(t)
	in := goldenCases()["round3-history-ties"]
	in.Request.UserPrompt = `Use {{ranking_table}} and <b>&amp;</b> "quotes" 'single'`
	out, err := l.Compose(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.Prompt, in.Request.UserPrompt) {
		t.Errorf("user prompt was altered:\n%s", out.Prompt)
	}
	if !strings.Contains(out.Prompt, `Paxos <prepare> & "promise" {{ranking_table}}`) {
		t.Errorf("submission was altered or escaped")
	}
}

func TestComposeFailures(t *testing.T) {
	l, err := loadFS(t, map[string]string{"needs-vars.mustache": "Task {{vars.task.title}} by {{team.name}}"})
	if err != nil {
		t.Fatal(err)
	}
	base := Inputs{RequestID: "r", Request: request(1, ""), Time: roundTime}
	tests := []struct {
		name   string
		mutate func(*events.RoundRequested)
		code   events.FailureCode
		msg    string
	}{
		{"unknown template", func(r *events.RoundRequested) { r.Template = "nope" }, events.CodeUnknownTemplate, `template "nope" not found`},
		{"unknown version", func(r *events.RoundRequested) { r.Template = "team-round@9" }, events.CodeUnknownTemplate, "no version 9"},
		{"unknown label", func(r *events.RoundRequested) { r.Template = "team-round:beta" }, events.CodeUnknownTemplate, `no label "beta"`},
		{"bad timezone", func(r *events.RoundRequested) { r.Timezone = "Mars/Olympus" }, events.CodeInvalidRequest, `"Mars/Olympus"`},
		{"past max rounds", func(r *events.RoundRequested) { r.RoundNumber = 6 }, events.CodeInvalidRequest, "past max_rounds"},
		{"missing var", func(r *events.RoundRequested) { r.Template = "needs-vars" }, events.CodeTemplateError, `"vars.task.title"`},
		{"null var", func(r *events.RoundRequested) {
			r.Template = "needs-vars"
			r.Vars = map[string]any{"task": map[string]any{"title": nil}}
		}, events.CodeTemplateError, `"vars.task.title"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := base
			tt.mutate(&in.Request)
			_, err := l.Compose(context.Background(), in)
			if failureCode(err) != tt.code || err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Compose error = %v, want code %s containing %q", err, tt.code, tt.msg)
			}
		})
	}
	in := base
	in.Request.Template = "needs-vars"
	in.Request.Vars = map[string]any{"task": map[string]any{"title": "Fix <the> bug"}}
	out, err := l.Compose(context.Background(), in)
	if err != nil || out.Prompt != "Task Fix <the> bug by Alpha" {
		t.Errorf("vars render = %q, %v", out.Prompt, err)
	}
}

func TestComposedEventShape(t *testing.T) {
	l := testLibrary(t)
	out, err := l.Compose(context.Background(), goldenCases()["round1"])
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(out)
	for _, want := range []string{`"truncated":[]`, `"evaluation_ids":[]`, `"history_rounds":[]`, `"leaderboard":[]`, `"team_position":null`, `"team_count":0`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("prompt.composed data lacks %s: %s", want, b)
		}
	}
}

// failureCode is the code of the events.Failure in err, "" when there is none.
func failureCode(err error) events.FailureCode {
	if f, ok := events.AsFailure(err); ok {
		return f.Code
	}
	return ""
}
