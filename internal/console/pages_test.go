package console

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestPagesOnRealServers renders each page from a tournament stored in a real ClickHouse and
// JetStream: what the grid says of each state, the board as the store ranks it, the bounds of
// long texts, the errors of bad addresses.
func TestPagesOnRealServers(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse")
	}
	tr := seed(t, 4, 3, 500)
	ctx := context.Background()
	at := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
	// Round 4: team-000 requested and not answered, team-001 failed, team-002 composed but not
	// evaluated; team-003's round-3 submission is 300 KB of hostile text.
	publish(t, tr.js, events.RoundSubject(tr.exec, "team-000"), "r4-0", events.TypeRoundRequested, at,
		events.RoundRequested{ExecutionID: tr.exec, TeamID: "team-000", TeamName: "x", RoundNumber: 4, UserPrompt: "t", ScoreOrder: events.Desc})
	publish(t, tr.js, events.PromptFailedSubject(tr.exec, "team-001"), "r4-1", events.TypePromptFailed, at,
		events.PromptFailed{RequestID: "r4-1", ExecutionID: tr.exec, TeamID: "team-001", RoundNumber: 4, Code: "unknown_template", Message: "no"})
	publish(t, tr.js, events.PromptComposedSubject(tr.exec, "team-002"), "r4-2", events.TypePromptComposed, at,
		events.PromptComposed{RequestID: "r4-2", ExecutionID: tr.exec, TeamID: "team-002", RoundNumber: 4, Prompt: "p", TokenEstimate: 321,
			Truncated: []events.Truncation{{Section: "history", Detail: "cut"}}})
	hostile := `<script>alert(1)</script>"><img src=x onerror=alert(2)>` + strings.Repeat("javascript:alert(3) ", 15000)
	if err := tr.st.Insert(ctx, []rank.Record{{EventID: "eval-hostile", Seq: 1000, EvaluationCompleted: events.EvaluationCompleted{
		ExecutionID: tr.exec, TeamID: "team-003", TeamName: `<b>Bold</b>`, RoundNumber: 3, Submission: events.Submission{Content: hostile},
		Evaluation: events.Scores{OverallScore: 99, Feedback: `<img src=x onerror=alert(4)>`}, EvaluatedAt: at.Add(time.Hour)}}}); err != nil {
		t.Fatal(err)
	}
	// The console reads as a user who may only read, as an operator would give it (readonly=1,
	// which refuses the max_threads of the reads too: the store reads without it).
	reader, err := chstore.Open(ctx, chstore.Config{Addrs: tr.cfg.Addrs, Database: tr.cfg.Database, User: "reader", ReadThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	if err := reader.Insert(ctx, []rank.Record{{EventID: "x", EvaluationCompleted: events.EvaluationCompleted{ExecutionID: "x", TeamID: "x", RoundNumber: 1}}}); err == nil {
		t.Fatal("the reader could write: the test's user is not read-only")
	}
	tr.st = reader
	h := tr.console(t).Handler()

	code, body := get(t, h, "/executions/"+tr.exec)
	if code != http.StatusOK {
		t.Fatalf("execution page: %d\n%s", code, body)
	}
	for _, want := range []string{
		`<td class="cell requested" data-round="4" title="team-000 round 4: requested, not answered yet">`,
		`<td class="cell failed" data-round="4" title="team-001 round 4: prompt failed: unknown_template">`,
		`<td class="cell composed" data-round="4" title="team-002 round 4: prompt composed: 321 tokens, 1 cut(s)">`,
		`>321 tok ✂1<`,
		`&lt;b&gt;Bold&lt;/b&gt;`, // the team name of its latest evaluation, as text
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the execution page lacks %s", want)
		}
	}
	board, err := tr.st.Leaderboard(ctx, tr.exec, events.Desc, rank.Everything())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range board.Rows {
		if !strings.Contains(body, fmt.Sprintf(`<tr data-team="%s">
<td class="num">%d</td><td class="num rank">%d</td>`, r.TeamID, r.Position, r.Rank)) {
			t.Errorf("the board lacks %s at position %d rank %d", r.TeamID, r.Position, r.Rank)
		}
	}
	for _, page := range []string{body, mustGet(t, h, "/executions/"+tr.exec+"/teams/team-003/rounds/3")} {
		if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img src=x") {
			t.Error("untrusted text was written as markup")
		}
	}
	round := mustGet(t, h, "/executions/"+tr.exec+"/teams/team-003/rounds/3")
	if !strings.Contains(round, `shown 64.0 KiB of 293.0 KiB: <a href="/text/submission/`+tr.exec+`/team-003/3">`) {
		t.Error("the 300 KB submission is not cut with a link to the whole text")
	}
	if len(round) > 200<<10 {
		t.Errorf("the round page is %d bytes: the submission is not bounded", len(round))
	}
	if code, text := get(t, h, "/text/submission/"+tr.exec+"/team-003/3"); code != http.StatusOK || text != hostile {
		t.Errorf("the whole text: %d, %d bytes, want %d", code, len(text), len(hostile))
	}

	for _, tt := range []struct {
		path string
		want int
	}{
		{"/", http.StatusOK},
		{"/?page=0", http.StatusBadRequest},
		{"/executions/bad%20id", http.StatusBadRequest},
		{"/executions/unknown", http.StatusOK}, // an execution nothing is known of yet is empty, as the ranker's API says
		{"/executions/" + tr.exec + "/teams/team-000/rounds/0", http.StatusBadRequest},
		{"/executions/" + tr.exec + "/teams/nobody/rounds/1", http.StatusNotFound},
		{"/executions/" + tr.exec + "/teams/team-000/rounds/1", http.StatusOK},
		{"/text/other/" + tr.exec + "/team-000/1", http.StatusNotFound},
		{"/templates", http.StatusOK},
		{"/templates/none", http.StatusNotFound},
		{"/deadletters", http.StatusOK},
		{"/static/console.js", http.StatusOK},
	} {
		if code, body := get(t, h, tt.path); code != tt.want {
			t.Errorf("GET %s: %d, want %d\n%.400s", tt.path, code, tt.want, body)
		}
	}
}

func mustGet(t *testing.T, h http.Handler, path string) string {
	t.Helper()
	code, body := get(t, h, path)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d\n%.400s", path, code, body)
	}
	return body
}

// TestExecutionPageBoundedAtItsLimits: valid events that make an execution huge in both
// directions (a round_number of 2147483647, 102 distinct rounds, 503 teams) cost the grid at most
// maxGridTeams x maxGridRounds cells and the chart about ten ticks; the page says what it left out.
func TestExecutionPageBoundedAtItsLimits(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse")
	}
	tr := seed(t, 2, 2, 100)
	at := time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)
	request := func(team string, round int) {
		publish(t, tr.js, events.RoundSubject(tr.exec, team), fmt.Sprintf("big-%s-%d", team, round), events.TypeRoundRequested, at,
			events.RoundRequested{ExecutionID: tr.exec, TeamID: team, TeamName: "x", RoundNumber: round, UserPrompt: "t"})
	}
	for r := 3; r <= 101; r++ {
		request("team-000", r) // 101 distinct rounds so far: one past the bound
	}
	request("team-000", math.MaxInt32)
	if err := tr.st.Insert(t.Context(), []rank.Record{{EventID: "eval-last", Seq: 9999, EvaluationCompleted: events.EvaluationCompleted{
		ExecutionID: tr.exec, TeamID: "team-001", TeamName: "Team team-001", RoundNumber: math.MaxInt32,
		Evaluation: events.Scores{OverallScore: 1}, EvaluatedAt: at}}}); err != nil {
		t.Fatal(err)
	}
	for i := 100; i <= 600; i++ {
		request(fmt.Sprintf("team-%03d", i), 1) // 501 teams not ranked yet: 503 in all, one past the bound and two more
	}
	code, body := get(t, tr.console(t).Handler(), "/executions/"+tr.exec)
	if code != http.StatusOK {
		t.Fatalf("execution page: %d\n%.2000s", code, body)
	}
	for _, want := range []string{"2 earlier rounds are not shown: the grid shows the latest 100.", "3 more teams are not shown in the grid",
		`<th class="num">2147483647</th>`} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if cells := strings.Count(body, `<td class="cell `); cells != maxGridTeams*maxGridRounds {
		t.Errorf("%d grid cells, want %d x %d", cells, maxGridTeams, maxGridRounds)
	}
	if ticks := strings.Count(body, `text-anchor="middle" font-size="11"`); ticks > 12 {
		t.Errorf("%d ticks on the chart's round axis", ticks)
	}
}
