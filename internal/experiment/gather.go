package experiment

import (
	"context"
	"fmt"
	"time"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/pkg/rank"
)

// Scores are the evaluations of executions (chstore.Store.Scores).
type Scores interface {
	Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
}

// Gather reads what Compare needs of a template over executions: the prompts of name recorded at
// a time keep accepts (nil: any), each team's round once with its latest record's version (a
// request answered again keeps the record its submission answered last), and each execution's
// counted evaluations. The CLI and the console compare through it.
func Gather(ctx context.Context, src audit.Source, scores Scores, name string, execs []string, keep func(time.Time) bool) ([]Served, map[string][]rank.RoundScore, error) {
	var served []Served
	for _, exec := range execs {
		recs, err := src.Records(ctx, audit.Query{ExecutionID: exec})
		if err != nil {
			return nil, nil, err
		}
		type key struct {
			team  string
			round int
		}
		latest := map[key]int{}
		var order []key
		for _, r := range recs {
			if r.Data.Template.Name != name || keep != nil && !keep(r.Stored) {
				continue
			}
			k := key{r.Data.TeamID, r.Data.RoundNumber}
			if _, ok := latest[k]; !ok {
				order = append(order, k)
			}
			latest[k] = r.Data.Template.Version
		}
		for _, k := range order {
			served = append(served, Served{ExecutionID: exec, TeamID: k.team, Round: k.round, Version: latest[k]})
		}
	}
	if len(served) == 0 {
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
	return served, rounds, nil
}

// Verdicts say, for each version and each lower one, the difference of their mean gains, its
// interval, and which helps teams more when the interval excludes 0.
func Verdicts(versions []Version) []string {
	var out []string
	for _, v := range versions {
		for _, d := range v.VersusPrevious {
			verdict := "no difference shown (the interval holds 0)"
			switch {
			case d.CI[0] > 0:
				verdict = fmt.Sprintf("version %d helps teams more", v.Version)
			case d.CI[1] < 0:
				verdict = fmt.Sprintf("version %d helps teams more", d.Version)
			}
			out = append(out, fmt.Sprintf("gain of %d minus %d: %+.2f %s: %s", v.Version, d.Version, d.MeanGainDiff, d.CI, verdict))
		}
	}
	return out
}

// String writes an interval as [low, high].
func (i Interval) String() string { return fmt.Sprintf("[%.2f, %.2f]", i[0], i[1]) }
