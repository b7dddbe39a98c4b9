package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/pkg/events"
)

// asyncTournament publishes an execution whose teams run at different speeds: Alpha is two rounds
// ahead of Beta and Gamma. It returns the sequence of the last evaluation.
func asyncTournament(e *env, exec string) uint64 {
	var last uint64
	for _, ev := range []struct {
		team, name string
		round      int
		score      float64
	}{
		{"team-alpha", "Alpha", 1, 70}, {"team-beta", "Beta", 1, 80}, {"team-gamma", "Gamma", 1, 60},
		{"team-alpha", "Alpha", 2, 85}, {"team-alpha", "Alpha", 3, 95},
	} {
		last = e.publishEvaluation(fmt.Sprintf("%s-%s-%d", exec, ev.team, ev.round),
			evaluation(exec, ev.team, ev.name, ev.round, ev.score, "answer of "+ev.name+" in round "+fmt.Sprint(ev.round), t0.Add(time.Duration(ev.round)*time.Minute)))
	}
	return last
}

// TestStandingsOfAsynchronousTeams: Beta asks for round 2 while Alpha has finished round 3. With
// live standings (the default) the board counts every evaluation committed before the request,
// as mixseek-core ranks them; with before_round only round 1, the same board for every team of
// round 2. The mixseek-team prompt is compared whole, with its text worked out by hand from
// docs/prompts.md. The team's own history is its rounds below 2 in both modes.
func TestStandingsOfAsynchronousTeams(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	const exec = "async"
	asyncTournament(e, exec)

	history := strings.Join([]string{
		"## ラウンド 1",
		"### スコア: 80.00/100",
		"### スコア詳細:",
		"{",
		`  "overall_score": 80.0,`,
		`  "metrics": [`,
		"    {",
		`      "metric_name": "ClarityCoherence",`,
		`      "score": 80.0,`,
		`      "evaluator_comment": "comment team-beta"`,
		"    }",
		"  ]",
		"}",
		"### あなたの提出内容:",
		"answer of Beta in round 1",
	}, "\n")
	prompt := func(table, position string) string {
		return "現在日時: 2026-11-21T20:00:00+09:00\n\n# タスク\nWrite it.\n\n# 現在のラウンド\nラウンド 2 / 5\n\n# リーダーボード\n" +
			table + "\n\n" + position + "\n\n# 過去のSubmission履歴\n" + history + "\n"
	}
	row := func(pos, rank int, team, name string, best float64, bestRound, rounds int) events.LeaderboardRow {
		return events.LeaderboardRow{Position: pos, Rank: rank, TeamID: team, TeamName: name, BestScore: best, BestRound: bestRound, Rounds: rounds}
	}
	asked := 0
	for _, tt := range []struct {
		standings  events.Standings
		wantPrompt string
		wantBoard  []events.LeaderboardRow
		position   int
	}{{
		standings: "", // live by default
		wantPrompt: prompt("#1 Alpha - スコア: 95.00/100 (ラウンド数: 3)\n**#2 Beta (あなたのチーム) - スコア: 80.00/100 (ラウンド数: 1)**\n#3 Gamma - スコア: 60.00/100 (ラウンド数: 1)",
			"現在、3チーム中2位です。素晴らしい成績です！"),
		wantBoard: []events.LeaderboardRow{row(1, 1, "team-alpha", "Alpha", 95, 3, 3), row(2, 2, "team-beta", "Beta", 80, 1, 1), row(3, 3, "team-gamma", "Gamma", 60, 1, 1)},
		position:  2,
	}, {
		standings: events.BeforeRound,
		wantPrompt: prompt("**#1 Beta (あなたのチーム) - スコア: 80.00/100 (ラウンド数: 1)**\n#2 Alpha - スコア: 70.00/100 (ラウンド数: 1)\n#3 Gamma - スコア: 60.00/100 (ラウンド数: 1)",
			"🏆 現在、あなたのチームは1位です！この調子で頑張ってください。"),
		wantBoard: []events.LeaderboardRow{row(1, 1, "team-beta", "Beta", 80, 1, 1), row(2, 2, "team-alpha", "Alpha", 70, 1, 1), row(3, 3, "team-gamma", "Gamma", 60, 1, 1)},
		position:  1,
	}} {
		for _, template := range []string{"mixseek-team", "team-round"} {
			asked++
			name := fmt.Sprintf("%s-%s", template, tt.standings)
			e.requestRound(name, events.RoundRequested{ExecutionID: exec, TeamID: "team-beta", TeamName: "Beta", RoundNumber: 2,
				UserPrompt: "Write it.", Template: template, Timezone: "Asia/Tokyo", MaxRounds: 5, Standings: tt.standings}, t0.Add(time.Hour))
			a := e.answers("prompt.*."+exec+".team-beta", asked, 30*time.Second)[name]
			if !a.ok() {
				t.Fatalf("%s: %s %+v", name, a.subject, a.failed)
			}
			in := a.composed.Inputs
			if diff := cmp.Diff(tt.wantBoard, in.Leaderboard); diff != "" {
				t.Errorf("%s: leaderboard (-want +got):\n%s", name, diff)
			}
			if in.TeamPosition == nil || *in.TeamPosition != tt.position || in.TeamCount != 3 || !cmp.Equal(in.HistoryRounds, []int{1}) {
				t.Errorf("%s: position %v of %d, history %v; want %d of 3, history [1]", name, in.TeamPosition, in.TeamCount, in.HistoryRounds, tt.position)
			}
			if template == "mixseek-team" {
				if diff := cmp.Diff(tt.wantPrompt, a.composed.Prompt); diff != "" {
					t.Errorf("%s: prompt (-want +got):\n%s", name, diff)
				}
			} else if !strings.Contains(a.composed.Prompt, "answer of Beta in round 1") || strings.Contains(a.composed.Prompt, "answer of Alpha") {
				t.Errorf("%s: prompt lacks the team's own round 1 or shows another team's submission:\n%s", name, a.composed.Prompt)
			}
		}
	}

	// Round 1 has no standings in either mode, even with Alpha evaluated three times.
	for _, st := range []events.Standings{events.Live, events.BeforeRound} {
		status, body := composer.render(t, map[string]any{"execution_id": exec, "team_id": "team-gamma", "team_name": "Gamma",
			"round_number": 1, "user_prompt": "Go.", "standings": st, "time": t0.Format(time.RFC3339)})
		var out events.PromptComposed
		if err := json.Unmarshal(body, &out); status != http.StatusOK || err != nil || len(out.Inputs.Leaderboard) != 0 || out.Inputs.TeamPosition != nil {
			t.Errorf("round 1, %s: %d %s", st, status, body)
		}
	}
}

// TestRenderPinnedToASequence: a render as of evaluations_seq S gives the same bytes however much
// is stored afterwards (a new round, a re-evaluation, a replay past the duplicate window, a new
// team), while an unpinned render shows the new evaluations. A sequence past the stream's last
// one is invalid.
func TestRenderPinnedToASequence(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	const exec = "pinned"
	last := asyncTournament(e, exec)
	req := map[string]any{"execution_id": exec, "team_id": "team-beta", "team_name": "Beta", "round_number": 3,
		"user_prompt": "Write it.", "template": "mixseek-team", "request_id": "audit", "time": t0.Add(time.Hour).Format(time.RFC3339)}
	render := func(seq *uint64) (events.PromptComposed, []byte) {
		t.Helper()
		body := map[string]any{}
		for k, v := range req {
			body[k] = v
		}
		if seq != nil {
			body["evaluations_seq"] = *seq
		}
		status, out := composer.render(t, body)
		if status != http.StatusOK {
			t.Fatalf("render: %d %s", status, out)
		}
		var pc events.PromptComposed
		if err := json.Unmarshal(out, &pc); err != nil {
			t.Fatal(err)
		}
		return pc, out
	}
	first, firstBytes := render(nil)
	s := first.Inputs.EvaluationsSeq
	if s != last {
		t.Fatalf("evaluations_seq %d, want the last evaluation's sequence %d", s, last)
	}

	// A new round of Beta, a re-evaluation of Gamma's round 1, a replay of Alpha's round 3 with
	// other content under a new message id (as after the duplicate window), a new team.
	e.publishEvaluation(exec+"-team-beta-2", evaluation(exec, "team-beta", "Beta", 2, 99, "answer of Beta in round 2", t0.Add(2*time.Minute)))
	e.publishEvaluation(exec+"-team-gamma-1b", evaluation(exec, "team-gamma", "Gamma", 1, 98, "re-evaluated", t0.Add(time.Hour)))
	replay, err := events.Marshal(exec+"-team-alpha-3", "orchestrator/test", events.TypeEvaluationCompleted, t0,
		evaluation(exec, "team-alpha", "Alpha", 3, 1, "replayed", t0.Add(2*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	e.publishRaw(events.EvaluationSubject(exec, "team-alpha"), "another-message-id", replay)
	newest := e.publishEvaluation(exec+"-team-delta-1", evaluation(exec, "team-delta", "Delta", 1, 97, "answer of Delta", t0.Add(time.Minute)))
	waitCommitted(t, e, int(newest))

	pinned, pinnedBytes := render(&s)
	if diff := cmp.Diff(string(firstBytes), string(pinnedBytes)); diff != "" {
		t.Errorf("render pinned to %d changed after later evaluations (-first +pinned):\n%s", s, diff)
	}
	later, _ := render(nil)
	if later.Inputs.EvaluationsSeq != newest || len(later.Inputs.Leaderboard) != 4 || !cmp.Equal(later.Inputs.HistoryRounds, []int{1, 2}) ||
		!strings.Contains(later.Prompt, "answer of Beta in round 2") || later.Prompt == pinned.Prompt {
		t.Errorf("unpinned render does not show the new evaluations: seq %d, board %+v, history %v", later.Inputs.EvaluationsSeq, later.Inputs.Leaderboard, later.Inputs.HistoryRounds)
	}
	for _, r := range later.Inputs.Leaderboard {
		if r.TeamID == "team-alpha" && (r.BestScore != 95 || r.Rounds != 3) {
			t.Errorf("the replay of Alpha's round 3 changed its row: %+v", r)
		}
	}

	past := newest + 1
	body := map[string]any{}
	for k, v := range req {
		body[k] = v
	}
	body["evaluations_seq"] = past
	status, out := composer.render(t, body)
	want := fmt.Sprintf(`{"code":"invalid_request","message":"evaluations_seq %d is past the last sequence of the EVALUATIONS stream (%d)"}`, past, newest)
	if status != http.StatusBadRequest || strings.TrimSpace(string(out)) != want {
		t.Errorf("render past the last sequence: %d %s, want 400 %s", status, out, want)
	}
}
