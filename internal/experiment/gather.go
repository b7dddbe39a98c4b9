package experiment

import (
	"context"
	"time"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/pkg/rank"
)

// Scores are the evaluations of executions (chstore.Store.Scores).
type Scores interface {
	Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
}

// Gather reads what Analyze needs of a template over executions: the prompts of name recorded at a
// time keep accepts (nil: any), each team's round once with its latest record (a request answered
// again keeps the record its submission answered last), the failed requests assigned a version of
// name and those of teams it served, and each execution's counted evaluations. The CLI and the console compare through it.
func Gather(ctx context.Context, src audit.Source, scores Scores, name string, execs []string, keep func(time.Time) bool) ([]Prompt, map[string][]rank.RoundScore, error) {
	var prompts []Prompt
	for _, exec := range execs {
		recs, err := src.Records(ctx, audit.Query{ExecutionID: exec, Failed: true})
		if err != nil {
			return nil, nil, err
		}
		type key struct {
			team  string
			round int
		}
		latest := map[key]Prompt{}
		var order []key
		teams := map[string]bool{}
		var failed []Prompt
		for _, r := range recs {
			if keep != nil && !keep(r.Stored) {
				continue
			}
			if f := r.Failed; f != nil {
				p := Prompt{ExecutionID: exec, TeamID: f.TeamID, Round: f.RoundNumber, Failed: true}
				if a := f.Template; a != nil { // the version it was assigned: this template's, or another's
					if a.Name != name {
						continue
					}
					p.Version, p.Label, p.Split = a.Version, a.Label, a.Split
				}
				failed = append(failed, p)
				continue
			}
			if r.Data.Template.Name != name {
				continue
			}
			k := key{r.Data.TeamID, r.Data.RoundNumber}
			if _, ok := latest[k]; !ok {
				order = append(order, k)
			}
			p := Prompt{ExecutionID: exec, TeamID: k.team, Round: k.round, Version: r.Data.Template.Version, Label: r.Data.Template.Label, Split: r.Data.Template.Split}
			if r.Data.Request != nil {
				p.Order, p.MaxRounds = r.Data.Request.Data.ScoreOrder, r.Data.Request.Data.MaxRounds
			}
			latest[k] = p
			teams[k.team] = true
		}
		for _, k := range order {
			prompts = append(prompts, latest[k])
		}
		for _, f := range failed {
			// A failure that names its version is that version's, whether the team was ever
			// served or not; one that does not (it failed before a template was resolved, or
			// was recorded before prompt.failed named it) is counted only for a team the
			// template served, against the version it was served.
			if f.Version != 0 || teams[f.TeamID] {
				prompts = append(prompts, f)
			}
		}
	}
	if len(prompts) == 0 {
		return nil, nil, nil
	}
	evs, err := scores.Scores(ctx, execs)
	if err != nil {
		return nil, nil, err
	}
	rounds := make(map[string][]rank.RoundScore, len(evs))
	for id, ev := range evs {
		rounds[id] = ev.Reduce(rank.Everything()).Rounds()
	}
	return prompts, rounds, nil
}
