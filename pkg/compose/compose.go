// Package compose turns one round request plus the stored history and leaderboard into one prompt.
// It is pure: no NATS, no ClickHouse, no clock. The same Inputs always give the same bytes.
//
// Templates are Mustache, parsed raw (no HTML escaping) and checked at load against the variables
// of docs/prompts.md, so a template that names something the composer does not provide never starts.
package compose

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/panics"
	"github.com/podium-llm/podium/pkg/events"
)

//go:embed templates
var builtin embed.FS

// Inputs is everything a prompt is made of.
type Inputs struct {
	RequestID string
	Request   events.RoundRequested
	Time      time.Time // the request's envelope time: the round's clock

	// History is the requesting team's latest evaluation of each earlier round, ascending.
	History []events.TeamRound
	// Leaderboard ranks the execution's evaluations of earlier rounds in the request's order.
	Leaderboard []events.LeaderboardRow
	// PreviousRanks are the teams' ranks on the previous board (rank.PromptInputs): movement is
	// measured from them; a team without one is new.
	PreviousRanks map[string]int
	// EvaluationsSeq and EvaluationsEra are the position the inputs were read as of (rank.Pos).
	EvaluationsSeq uint64
	EvaluationsEra uint32
	// Template is the template the request resolved to (Library.Resolve, once per request); nil:
	// Compose looks up the request's.
	Template *Template
	// Builder is the prompt builder that serves the request's model, if any: it builds the prompt,
	// and the template renders it only when the builder fails (build.go).
	Builder Builder
}

// Compose renders the prompt for in: the template the request names, in the model's variant when
// one matches (falling back to the base template if the variant fails), within the token budget.
//
// Rendering stops when ctx ends (the counting of a hostile text may take long): the error is
// then ctx's, not a Failure, and the caller decides what the time limit means.
func (l *Library) Compose(ctx context.Context, in Inputs) (events.PromptComposed, error) {
	t := in.Template
	if t == nil {
		var err error
		if t, err = l.Lookup(in.Request.Template); err != nil {
			return events.PromptComposed{}, err
		}
	}
	loc, err := l.location(in.Request.Timezone)
	if err != nil {
		return events.PromptComposed{}, err
	}
	if max := in.Request.MaxRounds; max > 0 && in.Request.RoundNumber > max {
		return events.PromptComposed{}, events.Failf(events.CodeInvalidRequest, "round_number %d is past max_rounds %d", in.Request.RoundNumber, max)
	}
	if err := checkRelativePaths(in.Request.Vars, t.relativePaths); err != nil {
		return events.PromptComposed{}, err
	}
	lim := t.limits(in.Request.Limits)
	from := t.contentFrom(in.History, lim)

	ref := events.TemplateRef{Name: t.Name, Version: t.Version, SHA256: t.SHA256}
	var r rendered
	var builtBy *events.BuilderRef
	var params map[string]any
	if in.Builder != nil {
		b := in.Builder.Ref()
		builtBy = &b
		r, params, err = l.build(ctx, in, lim, loc, from)
		if ctx.Err() != nil {
			return events.PromptComposed{}, ctx.Err()
		}
		if err != nil {
			// The template is the tested path: a builder that fails costs its format, not the
			// prompt, and the record says why.
			b.Fallback, b.Reason = true, err.Error()
		}
	}
	switch v := t.variantFor(in.Request.Model); {
	case builtBy != nil && !builtBy.Fallback:
	case v != nil:
		parts := v.parts
		if parts == nil {
			parts = t.parts
		}
		ref.Variant = v.Name
		r, err = l.renderBudgeted(ctx, t.Name+"/"+v.Name, parts, v.Format, in, lim, loc, from)
		if err != nil && ctx.Err() == nil {
			// The base template is the tested path: a broken variant costs its format, not the prompt.
			ref.Fallback = true
			r, err = l.renderBudgeted(ctx, t.Name, t.parts, "", in, lim, loc, from)
		}
	default:
		r, err = l.renderBudgeted(ctx, t.Name, t.parts, "", in, lim, loc, from)
	}
	if err != nil {
		return events.PromptComposed{}, err
	}
	sum := sha256.Sum256([]byte(r.prompt))
	out := events.PromptComposed{
		RequestID:     in.RequestID,
		ExecutionID:   in.Request.ExecutionID,
		TeamID:        in.Request.TeamID,
		TeamName:      in.Request.TeamName,
		RoundNumber:   in.Request.RoundNumber,
		Prompt:        r.prompt,
		PromptSHA256:  hex.EncodeToString(sum[:]),
		Template:      ref,
		Model:         in.Request.Model,
		TokenEstimate: r.tokens,
		TokenEncoding: l.tokens.Name(),
		Truncated:     r.cuts.truncations(in, lim),
		Inputs:        recordInputs(in),
		Request:       &events.RequestRecord{Time: in.Time.UTC().Format(time.RFC3339Nano), Data: in.Request},
		Builder:       builtBy,
		Params:        params,
	}
	if t.Roles() || ref.Variant != "" && !ref.Fallback || builtBy != nil && !builtBy.Fallback {
		out.Messages = r.messages
	}
	return out, nil
}

// rendered is one render of a template's parts with some cuts applied.
type rendered struct {
	messages []events.Message
	prompt   string
	tokens   int
	cuts     cuts
}

// renderPart renders one part, bounded (bound.go): past MaxRenderSteps or MaxRenderBytes it is a
// budget_exceeded Failure, and when ctx ends, ctx's error. With checkVars, a variable the render
// would print as nothing is a template_error. A panic of the mustache library on a
// template it mishandles is a template_error of this request, answered like any other, not a
// crash of every composer the request is redelivered to.
func renderPart(ctx context.Context, name string, p part, vals map[string]any, checkVars bool) (string, error) {
	if err := renderWork(ctx, name, p.tags, vals, checkVars); err != nil {
		return "", err
	}
	out := boundedWriter{ctx: ctx}
	var err error
	if pv := panics.Catch(func() { err = p.tmpl.FRender(&out, vals) }); pv != nil {
		return "", events.Failf(events.CodeTemplateError, "template %q: rendering panicked: %v", name, pv.Value)
	}
	switch {
	case errors.Is(out.err, errRenderTooLarge):
		return "", tooLarge(name)
	case out.err != nil:
		return "", out.err // ctx's
	case err != nil:
		return "", events.Failf(events.CodeTemplateError, "template %q: %v", name, err)
	}
	return out.buf.String(), nil
}

// render renders parts with the context of in under c. A part without a role is the user's.
func (l *Library) render(ctx context.Context, name string, parts []part, format string, in Inputs, lim Limits, loc *time.Location, c cuts) (rendered, error) {
	vals := buildContext(in, lim, loc, c, func(name string) bool { return anyUses(parts, name) })
	// checkTags let only names that always have a value through, and those under vars, which
	// the request supplies; so only a template naming vars can miss one.
	checkVars := anyUses(parts, "vars")
	msgs := make([]events.Message, 0, len(parts))
	for _, p := range parts {
		text, err := renderPart(ctx, name, p, vals, checkVars)
		if err != nil {
			return rendered{}, err
		}
		role := p.role
		if role == "" {
			role = "user"
		} else {
			// A message is the part's text; the newline that ends the template file is not content.
			text = strings.TrimSuffix(text, "\n")
		}
		msgs = append(msgs, events.Message{Role: role, Content: text})
	}
	r := rendered{messages: msgs, cuts: c}
	if format == "" && len(parts) == 1 && parts[0].role == "" {
		r.prompt = msgs[0].Content
	} else {
		r.prompt = flatten(format, msgs)
	}
	tokens, err := l.tokens.Count(ctx, r.prompt)
	if err != nil {
		return rendered{}, err
	}
	r.tokens = tokens
	return r, nil
}

// renderBudgeted renders the whole prompt and, when it is over max_prompt_tokens, the smallest
// prefix of the cut sequence (budgetSteps) that fits. Cuts only shrink the prompt, so the first
// fitting step is found by bisection: a handful of renders whatever the history's length.
func (l *Library) renderBudgeted(ctx context.Context, name string, parts []part, format string, in Inputs, lim Limits, loc *time.Location, contentFrom int) (rendered, error) {
	steps := budgetSteps(in, lim, contentFrom)
	full, err := l.render(ctx, name, parts, format, in, lim, loc, steps[0])
	if err != nil || lim.MaxPromptTokens == 0 || full.tokens <= lim.MaxPromptTokens {
		return full, err
	}
	last := len(steps) - 1
	smallest, err := l.render(ctx, name, parts, format, in, lim, loc, steps[last])
	if err != nil {
		return rendered{}, err
	}
	if smallest.tokens > lim.MaxPromptTokens {
		return rendered{}, events.Failf(events.CodeBudgetExceeded,
			"template %q needs %d tokens (%s) with only the task, the team's position and its latest score, over max_prompt_tokens %d",
			name, smallest.tokens, l.tokens.Name(), lim.MaxPromptTokens)
	}
	best := smallest
	lo, hi := 1, last-1 // steps[0] does not fit, steps[last] does
	for lo <= hi {
		mid := (lo + hi) / 2
		r, err := l.render(ctx, name, parts, format, in, lim, loc, steps[mid])
		if err != nil {
			return rendered{}, err
		}
		if r.tokens <= lim.MaxPromptTokens {
			best, hi = r, mid-1
		} else {
			lo = mid + 1
		}
	}
	return best, nil
}

// recordInputs lists what the prompt was built from, for audit and replay.
func recordInputs(in Inputs) events.ComposeInputs {
	rec := events.ComposeInputs{
		EvaluationIDs:  make([]string, 0, len(in.History)),
		HistoryRounds:  make([]int, 0, len(in.History)),
		Leaderboard:    in.Leaderboard,
		TeamCount:      len(in.Leaderboard),
		EvaluationsSeq: in.EvaluationsSeq,
		EvaluationsEra: in.EvaluationsEra,
	}
	if rec.Leaderboard == nil {
		rec.Leaderboard = []events.LeaderboardRow{}
	}
	for _, r := range in.History {
		rec.EvaluationIDs = append(rec.EvaluationIDs, r.EvaluationID)
		rec.HistoryRounds = append(rec.HistoryRounds, r.RoundNumber)
	}
	if row, ok := selfRow(in.Leaderboard, in.Request.TeamID); ok {
		pos := row.Position
		rec.TeamPosition = &pos
	}
	return rec
}

func selfRow(rows []events.LeaderboardRow, teamID string) (events.LeaderboardRow, bool) {
	for _, r := range rows {
		if r.TeamID == teamID {
			return r, true
		}
	}
	return events.LeaderboardRow{}, false
}

// location resolves the request's timezone, else the composer's default.
func (l *Library) location(name string) (*time.Location, error) {
	if name == "" {
		return l.defaultLocation, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "Local" {
		return nil, events.Failf(events.CodeInvalidRequest, "timezone %q is not an IANA time zone name (for example \"UTC\", \"Asia/Tokyo\", \"Europe/Berlin\", \"America/New_York\")", name)
	}
	return loc, nil
}
