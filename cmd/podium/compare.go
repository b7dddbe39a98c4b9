package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/experiment"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// templatesCompare tells which version of a template helps teams: the prompts each version served
// (the archive, and the stream's tail), the evaluations that answered them (the store, reduced by
// rank.Latest), and per version the figures of internal/experiment with their intervals.
func templatesCompare(fs *flag.FlagSet) func(context.Context, *env) error {
	execution := fs.String("execution", "", "only this execution (default: every execution the archive holds prompts of the template in)")
	asc := fs.Bool("asc", false, "lower scores are better (the executions' score_order asc)")
	seed := fs.Uint64("seed", 1, "the bootstrap's seed: the same data and seed give the same intervals")
	since := fs.String("since", "", "only prompts recorded at or after this time (RFC 3339)")
	until := fs.String("until", "", "only prompts recorded before this time (RFC 3339)")
	asJSON := fs.Bool("json", false, "print one object per version, as JSON")
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 1 || !events.ValidIdentifier(e.args[0]) {
			return usagef("want one template name")
		}
		name := e.args[0]
		var window timeWindow
		for _, f := range []struct {
			flag, value string
			into        *time.Time
		}{{"--since", *since, &window.from}, {"--until", *until, &window.to}} {
			if f.value == "" {
				continue
			}
			t, err := time.Parse(time.RFC3339Nano, f.value)
			if err != nil {
				return usagef("%s: %v", f.flag, err)
			}
			*f.into = t
		}
		st, err := e.rank(ctx)
		if err != nil {
			return err
		}
		execs := []string{*execution}
		if *execution == "" {
			if execs, err = st.TemplateExecutions(ctx, name); err != nil {
				return err
			}
		} else if !events.ValidIdentifier(*execution) {
			return usagef("--execution %s is not an identifier", events.Quote(*execution))
		}
		served, err := e.served(ctx, name, execs, window)
		if err != nil {
			return err
		}
		if len(served) == 0 {
			return &checkError{fmt.Sprintf("no prompt of template %s is recorded", name)}
		}
		evs, err := st.Scores(ctx, execs)
		if err != nil {
			return err
		}
		rounds := map[string][]rank.RoundScore{}
		for id, ev := range evs {
			rounds[id] = ev.Reduce(rank.Bound{UpToSeq: rank.AllSeqs}).Rounds()
		}
		order := events.Desc
		if *asc {
			order = events.Asc
		}
		versions := experiment.Compare(experiment.Observe(served, rounds, order), *seed)
		if *asJSON {
			return printJSON(e, versions)
		}
		fmt.Fprintf(e.out, "template %s over %d execution(s); intervals are 95%%, bootstrapped over teams (seed %d)\n", name, len(execs), *seed)
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tPROMPTS\tTEAMS\tEXECUTIONS\tMEAN SCORE\tMEAN GAIN\tMEAN BEST")
		for _, v := range versions {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%.2f %s\t%+.2f %s\t%.2f %s\n", v.Version, v.Prompts, v.Teams, v.Executions,
				v.MeanScore, ci(v.MeanScoreCI), v.MeanGain, ci(v.MeanGainCI), v.MeanBestScore, ci(v.MeanBestCI))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, v := range versions {
			for _, d := range v.VersusPrevious {
				verdict := "no difference shown (the interval holds 0)"
				switch {
				case d.CI[0] > 0:
					verdict = fmt.Sprintf("version %d helps teams more", v.Version)
				case d.CI[1] < 0:
					verdict = fmt.Sprintf("version %d helps teams more", d.Version)
				}
				fmt.Fprintf(e.out, "gain of %d minus %d: %+.2f %s: %s\n", v.Version, d.Version, d.MeanGainDiff, ci(d.CI), verdict)
			}
		}
		return nil
	}
}

func ci(i experiment.Interval) string { return fmt.Sprintf("[%.2f, %.2f]", i[0], i[1]) }

// timeWindow bounds when a prompt was recorded: [from, to), a zero end unbounded.
type timeWindow struct{ from, to time.Time }

func (w timeWindow) holds(t time.Time) bool {
	return (w.from.IsZero() || !t.Before(w.from)) && (w.to.IsZero() || t.Before(w.to))
}

// served are the prompts of a template in the executions, recorded within the window: each team's
// round once, the version of its latest record (a request answered again keeps the record the
// submission answered last).
func (e *env) served(ctx context.Context, name string, execs []string, window timeWindow) ([]experiment.Served, error) {
	var out []experiment.Served
	for _, exec := range execs {
		recs, err := e.records(ctx, audit.Query{ExecutionID: exec})
		if err != nil {
			return nil, err
		}
		type key struct {
			team  string
			round int
		}
		latest := map[key]int{}
		var order []key
		for _, r := range recs {
			if r.Data.Template.Name != name || !window.holds(r.Stored) {
				continue
			}
			k := key{r.Data.TeamID, r.Data.RoundNumber}
			if _, ok := latest[k]; !ok {
				order = append(order, k)
			}
			latest[k] = r.Data.Template.Version
		}
		for _, k := range order {
			out = append(out, experiment.Served{ExecutionID: exec, TeamID: k.team, Round: k.round, Version: latest[k]})
		}
	}
	return out, nil
}
