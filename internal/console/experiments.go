package console

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/experiment"
	"github.com/podium-llm/podium/pkg/events"
)

// experimentView is a template's versions and how each compares with the baseline
// (internal/experiment, as `podium templates compare` prints them).
type experimentView struct {
	Executions int
	Report     experiment.Report
}

// experimentOf compares the versions of a template over the executions the archive holds prompts
// of it in (at most maxCompared, the newest by name order last): their prompts and the
// evaluations that answered them, against the production label's version. Nil when no prompt of it
// is recorded.
func (c *Console) experimentOf(ctx context.Context, ev evaluations, name string, production int) (*experimentView, error) {
	execs, err := c.d.Store.TemplateExecutions(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(execs) > maxCompared {
		execs = execs[len(execs)-maxCompared:]
	}
	prompts, rounds, err := experiment.Gather(ctx, c.audit(), ev, name, execs, nil)
	if err != nil || len(prompts) == 0 {
		return nil, err
	}
	// No margin: an interval that holds 0 is "inconclusive" here; `podium templates compare
	// --margin` says "no difference" of one within the author's margin.
	return &experimentView{Executions: len(execs), Report: experiment.Analyze(prompts, rounds, experiment.Options{Baseline: production})}, nil
}

// maxCompared bounds the executions a template page reads (each one's records and scores): the
// CLI compares any number.
const maxCompared = 50

// tryView is a dry run of a version on an execution's recorded requests.
type tryView struct {
	Version   int
	Execution string
	Trials    []audit.Trial
	Failures  int
	Before    int
	After     int
}

// tryOf runs the dry run the page's form asks for (?try=V&execution=E), nil when it asks none.
func (c *Console) tryOf(r *http.Request, name string) (*tryView, error) {
	q := r.URL.Query()
	if q.Get("try") == "" {
		return nil, nil
	}
	v, err := strconv.Atoi(q.Get("try"))
	if err != nil || v < 1 {
		return nil, badRequest("try: %s is not a version", events.Quote(q.Get("try")))
	}
	exec := q.Get("execution")
	if !events.ValidIdentifier(exec) {
		return nil, badRequest("execution %s is not an identifier", events.Quote(exec))
	}
	recs, err := c.audit().Records(r.Context(), audit.Query{ExecutionID: exec})
	if err != nil && !isNotFound(err) {
		return nil, err
	}
	if len(recs) > maxTried {
		recs = recs[len(recs)-maxTried:]
	}
	trials, err := c.d.Try(r.Context(), fmt.Sprintf("%s@%d", name, v), recs)
	if err != nil {
		return nil, err
	}
	t := &tryView{Version: v, Execution: exec, Trials: trials}
	for _, tr := range trials {
		if tr.Failure != "" {
			t.Failures++
			continue
		}
		t.Before += tr.TokensBefore
		t.After += tr.TokensAfter
	}
	return t, nil
}

// maxTried bounds the requests one page renders again: the newest of the execution.
const maxTried = 200
