package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/internal/streamscan"
	"github.com/podium-llm/podium/internal/textdiff"
	"github.com/podium-llm/podium/pkg/events"
)

// templatesTry is a dry run of a candidate template on recorded requests: each is rendered again
// with the candidate as of its own evaluations_seq, and nothing is published.
func templatesTry(fs *flag.FlagSet) func(context.Context, *env) error {
	execution := fs.String("execution", "", "the recorded requests of this execution")
	last := fs.Int("last", 0, "only the last N recorded requests (of --execution, or of every execution)")
	asJSON := fs.Bool("json", false, "print one object per request and a summary, as JSON")
	diff := fs.Bool("diff", false, "print a unified diff of each recorded prompt and the candidate's")
	return func(ctx context.Context, e *env) error {
		if _, err := events.ParseReference(e.args[0]); err != nil {
			return usagef("%v", err)
		}
		if *execution == "" && *last <= 0 {
			return usagef("try takes --execution EXEC, --last N, or both")
		}
		if *execution != "" && !events.ValidIdentifier(*execution) {
			return usagef("--execution %s is not an identifier", events.Quote(*execution))
		}
		recs, err := e.tryRecords(ctx, *execution, *last)
		if err != nil {
			return err
		}
		if len(recs) == 0 {
			return &checkError{"no recorded prompt.composed to try the candidate on"}
		}
		view, err := e.reads(ctx)
		if err != nil {
			return err
		}
		reg, err := e.registryIfAny(ctx) // the candidate may be one of its versions
		if err != nil {
			return err
		}
		v := audit.NewVerifier(e.templates, reg, render.Store{St: view})
		trials := make([]audit.Trial, 0, len(recs))
		for _, r := range recs {
			t, err := v.Try(ctx, r, e.args[0])
			if _, isFailure := events.AsFailure(err); isFailure {
				return &checkError{err.Error()} // the candidate itself is not there
			}
			var bad *audit.ConfigError
			if errors.As(err, &bad) {
				return usagef("%v", bad)
			}
			if err != nil {
				return err
			}
			trials = append(trials, t)
		}
		sum := summarize(trials)
		if *asJSON {
			return printJSON(e, struct {
				Requests []audit.Trial `json:"requests"`
				Summary  trySummary    `json:"summary"`
			}{trials, sum})
		}
		tw := tabwriter.NewWriter(e.out, 1, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EXECUTION\tTEAM\tROUND\tRECORDED\tTOKENS\tCUTS\tCANDIDATE\tTOKENS\tCUTS")
		for _, t := range trials {
			after, cuts := fmt.Sprint(t.TokensAfter), fmt.Sprint(len(t.CutsAfter))
			if t.Failure != "" {
				after, cuts = "fails: "+string(t.Failure), "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s@%d\t%d\t%d\t%s@%d\t%s\t%s\n", t.ExecutionID, t.TeamID, t.Round, t.Recorded.Name, t.Recorded.Version,
				t.TokensBefore, len(t.CutsBefore), t.Candidate.Name, t.Candidate.Version, after, cuts)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		failing := ""
		for _, code := range slices.Sorted(maps.Keys(sum.FailuresByCode)) {
			failing += fmt.Sprintf(" %s=%d", code, sum.FailuresByCode[code])
		}
		fmt.Fprintf(e.out, "%d requests: %d would fail%s; tokens of those composed %d -> %d (%+.1f%%); cuts %d -> %d; nothing was published\n",
			sum.Requests, sum.Failures, failing, sum.TokensBefore, sum.TokensAfter, sum.TokensChangePct, sum.CutsBefore, sum.CutsAfter)
		if *diff {
			for _, t := range trials {
				before, after := t.Prompts()
				if t.Failure == "" && before != after {
					textdiff.Unified(e.out, fmt.Sprintf("%s %s round %d %s@%d", t.ExecutionID, t.TeamID, t.Round, t.Recorded.Name, t.Recorded.Version),
						fmt.Sprintf("%s %s round %d %s@%d", t.ExecutionID, t.TeamID, t.Round, t.Candidate.Name, t.Candidate.Version), before, after, 3)
				}
			}
		}
		return nil
	}
}

// trySummary is what a dry run says of all its requests.
type trySummary struct {
	Requests        int                  `json:"requests"`
	Failures        int                  `json:"failures"`
	FailuresByCode  map[string]int       `json:"failures_by_code"`
	TokensBefore    int                  `json:"tokens_before"` // of the requests the candidate composes
	TokensAfter     int                  `json:"tokens_after"`
	TokensChangePct float64              `json:"tokens_change_pct"`
	CutsBefore      int                  `json:"cuts_before"`
	CutsAfter       int                  `json:"cuts_after"`
	Candidates      []events.TemplateRef `json:"candidates"`
}

func summarize(trials []audit.Trial) trySummary {
	s := trySummary{Requests: len(trials), FailuresByCode: map[string]int{}}
	for _, t := range trials {
		if !slices.Contains(s.Candidates, t.Candidate) {
			s.Candidates = append(s.Candidates, t.Candidate)
		}
		if t.Failure != "" {
			s.Failures++
			s.FailuresByCode[string(t.Failure)]++
			continue
		}
		s.TokensBefore += t.TokensBefore
		s.TokensAfter += t.TokensAfter
		s.CutsBefore += len(t.CutsBefore)
		s.CutsAfter += len(t.CutsAfter)
	}
	if s.TokensBefore > 0 {
		s.TokensChangePct = 100 * float64(s.TokensAfter-s.TokensBefore) / float64(s.TokensBefore)
	}
	return s
}

// tryRecords are the recorded requests a dry run takes: an execution's (the last n of them when n
// is positive), or the last n of every execution, read from PROMPTS' tail.
func (e *env) tryRecords(ctx context.Context, execution string, n int) ([]audit.Record, error) {
	if execution != "" {
		recs, err := e.records(ctx, audit.Query{ExecutionID: execution})
		if err != nil {
			return nil, err
		}
		if n > 0 && len(recs) > n {
			recs = recs[len(recs)-n:]
		}
		return recs, nil
	}
	js, err := e.jetstream()
	if err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	// The last n composed records lie within the last n answers' worth of messages and the
	// failures among them: read back until n are found or the stream's start is reached.
	last := st.CachedInfo().State.LastSeq
	var recs []audit.Record
	for span := uint64(n); ; span *= 2 {
		after := uint64(0)
		if last > span {
			after = last - span
		}
		recs = recs[:0]
		_, err := streamscan.Scan(ctx, js, events.StreamPrompts, events.TypePromptComposed+".>", after, func(msg jetstream.Msg) error {
			r, err := audit.Decode(msg.Subject(), msg.Data())
			if err != nil {
				return nil // not a record: verify names those
			}
			md, _ := msg.Metadata()
			if md != nil {
				r.Seq, r.Stored = md.Sequence.Stream, md.Timestamp
			}
			recs = append(recs, r)
			return nil
		})
		if err != nil {
			return nil, err
		}
		if len(recs) >= n || after == 0 {
			break
		}
	}
	if len(recs) > n {
		recs = recs[len(recs)-n:]
	}
	return recs, nil
}
