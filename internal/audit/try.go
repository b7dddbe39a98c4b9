package audit

import (
	"context"
	"fmt"
	"time"

	"github.com/podium-llm/podium/internal/render"
	"github.com/podium-llm/podium/pkg/events"
)

// Trial is one recorded request rendered again with a candidate template, as of the request's own
// evaluations_seq (a dry run: nothing is published): what the record had, and what the candidate
// makes of the same request and inputs.
type Trial struct {
	RequestID   string `json:"request_id"`
	ExecutionID string `json:"execution_id"`
	TeamID      string `json:"team_id"`
	Round       int    `json:"round_number"`
	// Recorded is what the record says: its template and tokens, and its cuts.
	Recorded     events.TemplateRef  `json:"recorded_template"`
	TokensBefore int                 `json:"tokens_before"`
	CutsBefore   []events.Truncation `json:"cuts_before"`
	// Candidate is the template the candidate reference resolved to; TokensAfter and CutsAfter
	// what it made, or Failure (the prompt.failed code) and its message when it makes no prompt of
	// this request.
	Candidate      events.TemplateRef  `json:"candidate_template"`
	TokensAfter    int                 `json:"tokens_after,omitempty"`
	CutsAfter      []events.Truncation `json:"cuts_after,omitempty"`
	Failure        events.FailureCode  `json:"failure,omitempty"`
	FailureMessage string              `json:"failure_message,omitempty"`

	before, after string // the prompts, for a diff
}

// Prompts are the recorded prompt and the candidate's (empty when it failed).
func (t Trial) Prompts() (before, after string) { return t.before, t.after }

// Try renders the request of a record with the template ref names (name@V, name:L, or a name),
// with the verifier's templates and through its reads as of the record's evaluations_seq: what
// Verify does with the record's own version, with a candidate's. A request the candidate cannot
// compose is a Trial with its Failure; an error is a read, a candidate that is not there, or a
// record that holds no request.
func (v *Verifier) Try(ctx context.Context, r Record, ref string) (Trial, error) {
	d := r.Data
	t := Trial{RequestID: d.RequestID, ExecutionID: d.ExecutionID, TeamID: d.TeamID, Round: d.RoundNumber,
		Recorded: d.Template, TokensBefore: d.TokenEstimate, CutsBefore: d.Truncated, before: d.Prompt}
	if d.Request == nil {
		return t, fmt.Errorf("record %s holds no request (a composer older than prompt.composed.request)", r.EventID)
	}
	at, err := time.Parse(time.RFC3339Nano, d.Request.Time)
	if err != nil {
		return t, fmt.Errorf("record %s: request time: %w", r.EventID, err)
	}
	lib, err := v.library(d.TokenEncoding)
	if err != nil {
		return t, err
	}
	cand, err := lib.Lookup(ref)
	if err != nil {
		return t, err
	}
	t.Candidate = events.TemplateRef{Name: cand.Name, Version: cand.Version, SHA256: cand.SHA256}
	req := d.Request.Data
	req.Template = fmt.Sprintf("%s@%d", cand.Name, cand.Version)
	in, err := render.Inputs(ctx, cand, v.reader, d.RequestID, req, at, render.AsOf(d.Inputs))
	if err != nil {
		if f, ok := events.AsFailure(err); ok {
			t.Failure, t.FailureMessage = f.Code, f.Message
			return t, nil
		}
		return t, err
	}
	out, err := lib.Compose(ctx, in)
	if err != nil {
		if f, ok := events.AsFailure(err); ok {
			t.Failure, t.FailureMessage = f.Code, f.Message
			return t, nil
		}
		return t, err
	}
	t.Candidate = out.Template
	t.TokensAfter, t.CutsAfter, t.after = out.TokenEstimate, out.Truncated, out.Prompt
	return t, nil
}
