package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
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
	split := func(weights ...string) {
		t.Helper()
		if out, code := e.podium(t, nil, append(append([]string{"templates", "label", "st"}, weights...), "production")...); code != 0 {
			t.Fatalf("label st %v: exit %d\n%s", weights, code, out)
		}
		want := `"split":"` + strings.Join(weights, ",") + `"`
		testenv.WaitFor(t, 10*time.Second, "the composer serves the split "+want, func() (bool, string) {
			status, body := composer.render(t, map[string]any{"execution_id": "probe", "team_id": fmt.Sprint(time.Now().UnixNano()), "team_name": "P", "round_number": 1, "user_prompt": "Go.", "template": "st"})
			return status == http.StatusOK && strings.Contains(string(body), want), fmt.Sprintf("%d %.300s", status, body)
		})
	}
	split("1=50", "2=50")
	rng := rand.New(rand.NewPCG(21, 5))
	level := map[string]float64{}
	asked := map[string]int{} // answers so far, by execution
	execs := []string{"st-1", "st-2"}
	splitOf := map[string]string{} // each team's first record's split, by execution/team
	for r := 1; r <= rounds; r++ {
		if r == 3 {
			split("1=20", "2=80") // the weights change; the teams that start now are assigned under them
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
