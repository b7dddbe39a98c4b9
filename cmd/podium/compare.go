package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/experiment"
	"github.com/podium-llm/podium/pkg/events"
)

// templatesCompare tells which version of a template helps teams, where the data can say so: the
// prompts each version served (the archive, and the stream's tail), the evaluations that answered
// them (the store, reduced by rank.Latest), per version its figures, and each version against the
// baseline by experiment.Analyze (docs/templates.md, "Experiments: which version helps teams").
func templatesCompare(fs *flag.FlagSet) func(context.Context, *env) error {
	var executions executionList
	fs.Var(&executions, "execution", "only this execution (repeat for several; default: every execution the archive holds prompts of the template in)")
	baseline := fs.Int("baseline", 0, "the version every other is compared with (default: the production label's, or its split's first version; else the lowest served)")
	since := fs.String("since", "", "only prompts recorded at or after this time (RFC 3339)")
	until := fs.String("until", "", "only prompts recorded before this time (RFC 3339)")
	margin := fs.Float64("margin", 0, "the largest difference in score units you would call none: \"no difference\" is said only of an interval within ±margin (default: none, and an interval that holds 0 is \"inconclusive\")")
	asJSON := fs.Bool("json", false, "print one object: versions and comparisons, as JSON")
	return func(ctx context.Context, e *env) error {
		if !events.ValidIdentifier(e.args[0]) {
			return usagef("want one template name")
		}
		if *baseline < 0 {
			return usagef("--baseline must be a version")
		}
		if *margin < 0 || math.IsNaN(*margin) || math.IsInf(*margin, 0) {
			return usagef("--margin must be a difference of at least 0")
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
		view, err := e.reads(ctx)
		if err != nil {
			return err
		}
		st, err := e.rank(ctx) // the prompts archive
		if err != nil {
			return err
		}
		execs := []string(executions)
		if len(execs) == 0 {
			if execs, err = st.TemplateExecutions(ctx, name); err != nil {
				return err
			}
		}
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		prompts, rounds, err := experiment.Gather(ctx, audit.Source{JS: js, Archive: st}, view, name, execs, window.holds)
		if err != nil {
			return err
		}
		if len(prompts) == 0 {
			return &checkError{fmt.Sprintf("no prompt of template %s is recorded", name)}
		}
		base := *baseline
		if base == 0 {
			if reg, err := e.registry(ctx); err == nil {
				base = reg.ProductionOf(name)
			}
		}
		rep := experiment.Analyze(prompts, rounds, experiment.Options{Baseline: base, Margin: *margin})
		if *asJSON {
			return printJSON(e, rep)
		}
		fmt.Fprintf(e.out, "template %s over %d execution(s), score_order %s; each version against version %d\n", name, len(execs), rep.Order, rep.Baseline)
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tTEAMS\tNEVER EVALUATED\tONLY FAILED\tEXECUTIONS\tPROMPTS\tFAILED\tUNEVALUATED\tMEAN SCORE (95%)")
		for _, v := range rep.Versions {
			fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", v.Version, v.Teams, v.TeamsUnevaluated, v.TeamsOnlyFailed, v.Executions, v.Prompts, v.Failed, v.Unevaluated, v.Mean())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, c := range rep.Comparisons {
			fmt.Fprintf(e.out, "version %d against %d: %s: %s\n", c.Version, c.Baseline, c.Verdict, c.Reason)
		}
		return nil
	}
}

// executionList is a repeatable --execution.
type executionList []string

func (l *executionList) String() string { return strings.Join(*l, ",") }

func (l *executionList) Set(v string) error {
	if !events.ValidIdentifier(v) {
		return fmt.Errorf("%s is not an identifier", events.Quote(v))
	}
	*l = append(*l, v)
	return nil
}

// timeWindow bounds when a prompt was recorded: [from, to), a zero end unbounded.
type timeWindow struct{ from, to time.Time }

func (w timeWindow) holds(t time.Time) bool {
	return (w.from.IsZero() || !t.Before(w.from)) && (w.to.IsZero() || t.Before(w.to))
}
