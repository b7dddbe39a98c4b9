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
		st, err := e.reads(ctx)
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
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		served, rounds, err := experiment.Gather(ctx, audit.Source{JS: js, Archive: st}, st, name, execs, window.holds)
		if err != nil {
			return err
		}
		if len(served) == 0 {
			return &checkError{fmt.Sprintf("no prompt of template %s is recorded", name)}
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
				v.MeanScore, v.MeanScoreCI, v.MeanGain, v.MeanGainCI, v.MeanBestScore, v.MeanBestCI)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, line := range experiment.Verdicts(versions) {
			fmt.Fprintln(e.out, line)
		}
		return nil
	}
}

// timeWindow bounds when a prompt was recorded: [from, to), a zero end unbounded.
type timeWindow struct{ from, to time.Time }

func (w timeWindow) holds(t time.Time) bool {
	return (w.from.IsZero() || !t.Before(w.from)) && (w.to.IsZero() || t.Before(w.to))
}
