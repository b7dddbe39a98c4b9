package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestTemplatesCompareAcrossAWeightChange plays a split whose weights change while an execution
// runs, through the pipeline: 12 teams start at round 1 under 50/50, the operator moves the label
// to 20/80 after round 2, and 12 more teams, 6 points weaker, join at round 3 under the new weights
// (version 2 scores 8 more). Every record keeps the weights that assigned its team
// (template.split), and compare blocks by them: version 2 is better over the teams of both
// blocks. Without the split in the block, the late starters' weakness, mostly on version 2,
// would be counted against it.
func TestTemplatesCompareAcrossAWeightChange(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	e.start("archiver")
	const early, late, rounds = 12, 12, 4
	pushVersions(t, e, "st", 2)
	relabel(t, e, composer, "st", "1=50", "2=50")
	rng := rand.New(rand.NewPCG(21, 5))
	level := map[string]float64{}
	asked := map[string]int{} // answers so far, by execution
	execs := []string{"st-1", "st-2"}
	splitOf := map[string]string{} // each team's first record's split, by execution/team
	for r := 1; r <= rounds; r++ {
		if r == 3 {
			relabel(t, e, composer, "st", "1=20", "2=80") // the weights change; the teams that start now are assigned under them
		}
		teams := early
		if r >= 3 {
			teams = early + late
		}
		for _, exec := range execs {
			for k := range teams {
				team := fmt.Sprintf("team-%d", k)
				e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, r), events.RoundRequested{ExecutionID: exec, TeamID: team,
					TeamName: "Team " + team, RoundNumber: r, UserPrompt: "Go.", MaxRounds: rounds, Template: "st"}, t0.Add(time.Duration(r)*time.Hour))
			}
		}
		for _, exec := range execs {
			asked[exec] += teams
			got := e.answers("prompt.*."+exec+".*", asked[exec], 30*time.Second)
			for k := range teams {
				team, id := fmt.Sprintf("team-%d", k), exec+"/"+fmt.Sprint(k)
				a := got[fmt.Sprintf("req-%s-%s-%d", exec, team, r)]
				if !a.ok() {
					t.Fatalf("%s round %d: %s %+v", id, r, a.subject, a.failed)
				}
				if _, ok := splitOf[id]; !ok {
					splitOf[id] = a.composed.Template.Split
				}
				if _, ok := level[id]; !ok {
					level[id] = 50 + 10*rng.Float64()
					if k >= early {
						level[id] -= 6
					}
				}
				score := level[id] + float64(r) + 2*rng.NormFloat64()
				if a.composed.Template.Version == 2 {
					score += 8
				}
				e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r),
					evaluation(exec, team, "Team "+team, r, score, fmt.Sprintf("answer %d", r), t0.Add(time.Duration(r)*time.Hour+time.Minute)))
			}
		}
	}
	for id, s := range splitOf {
		k := 0
		fmt.Sscanf(id[strings.Index(id, "/")+1:], "%d", &k)
		if want := map[bool]string{true: "1=50,2=50", false: "1=20,2=80"}[k < early]; s != want {
			t.Errorf("%s's first record says split %q, want %q", id, s, want)
		}
	}
	for _, exec := range execs {
		waitRanked(t, ranker, exec, early*rounds+late*(rounds-2))
	}
	out, code := e.podium(t, nil, "templates", "compare", "st", "--json")
	t.Logf("$ podium templates compare st --json\n%s", out)
	var rep struct {
		Comparisons []struct {
			Verdict, Reason string
			Teams           int
		} `json:"comparisons"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Comparisons) != 1 {
		t.Fatalf("compare st: exit %d\n%s", code, out)
	}
	if c := rep.Comparisons[0]; c.Verdict != "better" || c.Teams < early {
		t.Errorf("st: version 2, 8 better, across a weight change: %+v", c)
	}
}

// TestTemplatesCompareAVersionThatFailsMore plays, through the pipeline, a split whose version 2
// cannot fit a long task in its budget (max_prompt_tokens 40): its requests with a long user prompt
// fail with budget_exceeded, version 1's never. Four teams of each execution always send a long
// one, so those assigned version 2 only ever fail. Every prompt.failed names the version the
// request was assigned, and compare counts from it: version 2 `fails more`, its failed requests
// and its teams that only failed counted as the test itself counts them from the answers it got.
func TestTemplatesCompareAVersionThatFailsMore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	composer := e.start("composer")
	e.start("archiver")
	const teams, rounds, alwaysLong = 16, 3, 4
	pushFailingVersion(t, e, composer, "fm", "1=50", "2=50")
	rng := rand.New(rand.NewPCG(35, 7))
	long := func(r int) string { return longTask(rng, r) }
	// The oracle: what the test saw answered, by version.
	type teamKey struct{ exec, team string }
	failed, composed := map[int]int{}, map[int]int{}
	served := map[teamKey]int{}       // the version each team's answers named
	everyFailed := map[teamKey]bool{} // no answer of the team composed
	evaluated := map[string]int{}     // by execution
	execs := []string{"fm-1", "fm-2"}
	for r := 1; r <= rounds; r++ {
		for _, exec := range execs {
			for k := range teams {
				prompt := "Go."
				if k < alwaysLong || rng.Float64() < 0.4 {
					prompt = long(r)
				}
				team := fmt.Sprintf("team-%d", k)
				e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, r), events.RoundRequested{ExecutionID: exec, TeamID: team,
					TeamName: "Team " + team, RoundNumber: r, UserPrompt: prompt, MaxRounds: rounds, Template: "fm"}, t0.Add(time.Duration(r)*time.Hour))
			}
		}
		for _, exec := range execs {
			got := e.answers("prompt.*."+exec+".*", teams*r, 30*time.Second)
			for k := range teams {
				team := fmt.Sprintf("team-%d", k)
				id := teamKey{exec, team}
				a := got[fmt.Sprintf("req-%s-%s-%d", exec, team, r)]
				version := a.composed.Template.Version
				if !a.ok() {
					if a.failed.Code != events.CodeBudgetExceeded || a.failed.Template == nil || a.failed.Template.Name != "fm" || a.failed.Template.Split != "1=50,2=50" {
						t.Fatalf("%s round %d: %s %+v", id, r, a.subject, a.failed)
					}
					version = a.failed.Template.Version
					failed[version]++
				} else {
					composed[version]++
				}
				if v, ok := served[id]; ok && v != version {
					t.Fatalf("%v was served version %d, then %d", id, v, version)
				}
				served[id] = version
				if r == 1 {
					everyFailed[id] = true
				}
				if !a.ok() {
					continue
				}
				everyFailed[id] = false
				e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r),
					evaluation(exec, team, "Team "+team, r, 50+10*rng.Float64(), fmt.Sprintf("answer %d", r), t0.Add(time.Duration(r)*time.Hour+time.Minute)))
				evaluated[exec]++
			}
		}
	}
	teamsOf, onlyFailed := map[int]int{}, map[int]int{}
	for id, v := range served {
		teamsOf[v]++
		if everyFailed[id] {
			onlyFailed[v]++
		}
	}
	if failed[1] != 0 || failed[2] == 0 || onlyFailed[2] == 0 {
		t.Fatalf("the play did not make version 2 fail more: failed %v, teams that only failed %v", failed, onlyFailed)
	}
	for _, exec := range execs {
		waitRanked(t, ranker, exec, evaluated[exec])
	}
	out, code := e.podium(t, nil, "templates", "compare", "fm", "--json")
	t.Logf("$ podium templates compare fm --json\n%s", out)
	var rep struct {
		Versions []struct {
			Version, Teams, Prompts, Failed int
			OnlyFailed                      int `json:"teams_only_failed"`
		} `json:"versions"`
		Comparisons []struct {
			Verdict, Reason string
			ScoresVerdict   string `json:"scores_verdict"`
			Failures        *struct {
				Rate         float64 `json:"rate"`
				BaselineRate float64 `json:"baseline_rate"`
			} `json:"failures"`
		} `json:"comparisons"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Versions) != 2 || len(rep.Comparisons) != 1 {
		t.Fatalf("compare fm: exit %d\n%s", code, out)
	}
	for _, v := range rep.Versions {
		if v.Teams != teamsOf[v.Version] || v.Prompts != composed[v.Version] || v.Failed != failed[v.Version] || v.OnlyFailed != onlyFailed[v.Version] {
			t.Errorf("version %d: %+v, want %d teams, %d prompts, %d failed, %d teams that only failed", v.Version, v, teamsOf[v.Version], composed[v.Version], failed[v.Version], onlyFailed[v.Version])
		}
	}
	c := rep.Comparisons[0]
	if c.Verdict != "fails more" || c.ScoresVerdict == "" || c.Failures == nil || c.Failures.BaselineRate != 0 ||
		c.Failures.Rate != float64(failed[2])/float64(failed[2]+composed[2]) || !strings.Contains(c.Reason, "failed more often") {
		t.Errorf("fm: version 2 fails %d of %d requests, version 1 none: %+v", failed[2], failed[2]+composed[2], c)
	}
	out, code = e.podium(t, nil, "templates", "compare", "fm")
	t.Logf("$ podium templates compare fm\n%s", out)
	if code != 0 || !strings.Contains(out, "ONLY FAILED") || !strings.Contains(out, "version 2 against 1: fails more") {
		t.Errorf("compare fm: exit %d\n%s", code, out)
	}
	// The console's page of the template says the same.
	console := e.start("console")
	page, err := httpGet("http://" + console.addr + "/templates/fm")
	for _, want := range []string{`data-verdict="fails more"`, fmt.Sprintf(`data-teams-only-failed="%d"`, onlyFailed[2]), "version 2 against 1: fails more"} {
		if err != nil || !strings.Contains(page, want) {
			t.Errorf("the template page lacks %s (%v)\n%s", want, err, page)
		}
	}
}

// pushFailingVersion pushes two versions of name, the second unable to fit a long task in its
// budget (max_prompt_tokens 40: such a request fails with budget_exceeded), and splits the
// production label between them with weights, waiting until the composer serves the split.
func pushFailingVersion(t *testing.T, e *env, composer *proc, name string, weights ...string) {
	t.Helper()
	for v, files := range []map[string]string{
		{"prompt.mustache": name + " version 1, round {{round_number}} for {{team.name}}.\n"},
		{"prompt.mustache": name + " version 2, round {{round_number}} for {{team.name}}: {{user_prompt}}\n", "manifest.json": `{"limits": {"max_prompt_tokens": 40}}`},
	} {
		dir := filepath.Join(t.TempDir(), name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for file, text := range files {
			if err := os.WriteFile(filepath.Join(dir, file), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if out, code := e.podium(t, nil, "templates", "push", dir); code != 0 {
			t.Fatalf("push %s v%d: exit %d\n%s", name, v+1, code, out)
		}
	}
	relabel(t, e, composer, name, weights...)
}

// relabel splits name's production label with weights, and waits until the composer serves it.
func relabel(t *testing.T, e *env, composer *proc, name string, weights ...string) {
	t.Helper()
	if out, code := e.podium(t, nil, append(append([]string{"templates", "label", name}, weights...), "production")...); code != 0 {
		t.Fatalf("label %s %v: exit %d\n%s", name, weights, code, out)
	}
	want := `"split":"` + strings.Join(weights, ",") + `"`
	testenv.WaitFor(t, 10*time.Second, "the composer serves the split "+want, func() (bool, string) {
		status, body := composer.render(t, map[string]any{"execution_id": "probe", "team_id": fmt.Sprint(time.Now().UnixNano()), "team_name": "P", "round_number": 1, "user_prompt": "Go.", "template": name})
		return status == http.StatusOK && strings.Contains(string(body), want), fmt.Sprintf("%d %.300s", status, body)
	})
}

// longTask is a user prompt of about 800 tokens, different every time.
func longTask(rng *rand.Rand, round int) string {
	var b strings.Builder
	for i := range 60 {
		fmt.Fprintf(&b, "step %d of round %d: %x. ", i, round, rng.Uint32())
	}
	return b.String()
}

// TestAFailedRequestKeepsItsTeamsVersion: a team whose first request failed after the split gave
// it a version (prompt.failed names it) keeps that version when the weights change after, as a
// team whose first request was composed does: its failures and its later prompts are one
// version's.
func TestAFailedRequestKeepsItsTeamsVersion(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	const teams = 24
	pushFailingVersion(t, e, composer, "fk", "1=50", "2=50")
	rng := rand.New(rand.NewPCG(8, 1))
	first := map[string]int{} // each team's version in round 1
	for r, prompt := range []func() string{func() string { return longTask(rng, 1) }, func() string { return "Go." }} {
		round := r + 1
		if round == 2 {
			relabel(t, e, composer, "fk", "1=90", "2=10") // a team assigned afresh would mostly get version 1
		}
		for k := range teams {
			team := fmt.Sprintf("team-%d", k)
			e.requestRound(fmt.Sprintf("req-%s-%d", team, round), events.RoundRequested{ExecutionID: "fk-1", TeamID: team,
				TeamName: "Team " + team, RoundNumber: round, UserPrompt: prompt(), MaxRounds: 2, Template: "fk"}, t0.Add(time.Duration(round)*time.Hour))
		}
		got := e.answers("prompt.*.fk-1.*", teams*round, 30*time.Second)
		for k := range teams {
			team := fmt.Sprintf("team-%d", k)
			a := got[fmt.Sprintf("req-%s-%d", team, round)]
			version := a.composed.Template.Version
			if !a.ok() {
				if a.failed.Template == nil {
					t.Fatalf("%s round %d failed naming no version: %+v", team, round, a.failed)
				}
				version = a.failed.Template.Version
			}
			if round == 1 {
				if a.ok() != (version == 1) {
					t.Fatalf("%s round 1 (a long task): version %d, composed %v", team, version, a.ok())
				}
				first[team] = version
			} else if !a.ok() || version != first[team] {
				t.Errorf("%s: version %d in round 1, %d in round 2 (%s)", team, first[team], version, a.subject)
			}
		}
	}
	twos := 0
	for _, v := range first {
		if v == 2 {
			twos++
		}
	}
	if twos == 0 {
		t.Fatal("no team was given version 2 in round 1: the test shows nothing")
	}
	t.Logf("%d of %d teams failed round 1 on version 2 and kept it", twos, teams)
}
