package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/internal/storeview"
	"github.com/podium-llm/podium/internal/textdiff"
	"github.com/podium-llm/podium/pkg/events"
)

type roundPage struct {
	Exec, Team string
	Round      int
	Next       int // the next round, when anything is recorded of it
	Record     *recordView
	Failure    string // the code of a prompt.failed, when the round has no prompt
	Requested  bool
	Diff       *diffView
	Eval       *evalView
	Verdict    *verdict
}

type recordView struct {
	Seq             uint64
	Stored          string
	RequestID       string
	Template        string // name@version
	TemplateSHA     string
	Variant         string
	Builder         *events.BuilderRef // the prompt builder that built it, or fell back
	Params          string             // the builder's hints, as JSON
	Model           string
	PromptSHA       string
	Tokens          int
	Encoding        string
	Cuts            []events.Truncation
	EvaluationsSeq  uint64
	TraceID, SpanID string
	Prompt          clipped
	Messages        []messageView
	TeamName        string
	TeamPosition    string
	TeamCount       int
	HistoryRounds   []int
}

type messageView struct {
	Role    string
	Content clipped
}

type diffView struct {
	From  int
	Lines []diffLine
	Cut   bool
	Same  bool
}

type diffLine struct {
	Class, Text string
}

type evalView struct {
	Score       float64
	EvaluatedAt string
	EventID     string
	Format      string
	Submission  clipped
	Feedback    clipped
	Metrics     []events.Metric
}

type verdict struct {
	OK      bool
	Message string
}

// teamRound is GET /executions/{exec}/teams/{team}/rounds/{round}[?verify=1].
func (c *Console) teamRound(r *http.Request, ev evaluations) (any, error) {
	exec, team, round, err := roundAddress(r)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	p := roundPage{Exec: exec, Team: team, Round: round}
	// The answers of the rounds around this one: from the archive once archived (no stream scan),
	// the tail from PROMPTS.
	recs, err := c.audit().Records(ctx, audit.Query{ExecutionID: exec, TeamID: team, Rounds: []int{round - 1, round, round + 1}, Failed: true})
	if err != nil && !isNotFound(err) {
		return nil, err
	}
	composed, answered := map[int]audit.Record{}, map[int]audit.Record{}
	for _, rec := range recs { // oldest first: the last of a round is its latest
		answered[rec.Data.RoundNumber] = rec
		if rec.Failed == nil {
			composed[rec.Data.RoundNumber] = rec
		}
	}
	if rec, ok := composed[round]; ok {
		p.Record = viewRecord(rec)
		if prev, ok := composed[round-1]; ok {
			p.Diff = diffOf(prev, rec)
		}
		if r.URL.Query().Get("verify") != "" {
			p.Verdict = c.verify(ctx, rec)
		}
	}
	if _, ok := answered[round+1]; ok {
		p.Next = round + 1
	}
	if last, ok := answered[round]; ok {
		p.Requested = true // an answer is to a request
		if last.Failed != nil {
			p.Failure = string(last.Failed.Code)
		}
	} else {
		// Not answered (yet): whether it was requested, only ROUNDS says.
		g, err := c.grid.get(ctx, exec)
		if err != nil {
			return nil, err
		}
		cl := g.cells[cellKey{team, round}]
		p.Requested = cl.Requested
		if _, ok := g.cells[cellKey{team, round + 1}]; ok {
			p.Next = round + 1
		}
	}
	tr, err := c.round(ctx, ev, exec, team, round)
	if err != nil {
		return nil, err
	}
	if tr != nil {
		p.Eval = &evalView{Score: tr.OverallScore, EvaluatedAt: tr.EvaluatedAt, EventID: tr.EvaluationID, Format: tr.Submission.Format,
			Submission: clip(tr.Submission.Content, shownBytes), Feedback: clip(tr.Feedback, shownBytes), Metrics: tr.Metrics}
	}
	if p.Record == nil && p.Eval == nil && !p.Requested {
		return nil, notFound("nothing is recorded for %s %s round %d", exec, team, round)
	}
	return p, nil
}

func roundAddress(r *http.Request) (exec, team string, round int, err error) {
	exec, team = r.PathValue("exec"), r.PathValue("team")
	if !events.ValidIdentifier(exec) || !events.ValidIdentifier(team) {
		return "", "", 0, badRequest("execution and team must be identifiers")
	}
	round, err = strconv.Atoi(r.PathValue("round"))
	if err != nil || round < 1 {
		return "", "", 0, badRequest("round must be a positive number")
	}
	return exec, team, round, nil
}

func viewRecord(rec audit.Record) *recordView {
	d := rec.Data
	v := &recordView{Seq: rec.Seq, Stored: rec.Stored.UTC().Format("2006-01-02 15:04:05Z"), RequestID: d.RequestID,
		Template: fmt.Sprintf("%s@%d", d.Template.Name, d.Template.Version), TemplateSHA: d.Template.SHA256, Variant: d.Template.Variant,
		Model: d.Model, PromptSHA: d.PromptSHA256, Tokens: d.TokenEstimate, Encoding: d.TokenEncoding, Cuts: d.Truncated,
		EvaluationsSeq: d.Inputs.EvaluationsSeq, Prompt: clip(d.Prompt, promptBytes), TeamName: d.TeamName,
		TeamCount: d.Inputs.TeamCount, HistoryRounds: d.Inputs.HistoryRounds}
	v.Builder = d.Builder
	if len(d.Params) > 0 {
		p, _ := json.Marshal(d.Params)
		v.Params = string(p)
	}
	v.TeamPosition = "unranked"
	if d.Inputs.TeamPosition != nil {
		v.TeamPosition = strconv.Itoa(*d.Inputs.TeamPosition)
	}
	v.TraceID, v.SpanID, _ = audit.TraceIDs(rec.TraceParent)
	for _, m := range d.Messages {
		v.Messages = append(v.Messages, messageView{Role: m.Role, Content: clip(m.Content, promptBytes)})
	}
	return v
}

// diffOf is what `podium prompts diff` prints for the two rounds, line by line.
func diffOf(prev, cur audit.Record) *diffView {
	var b strings.Builder
	textdiff.Unified(&b, fmt.Sprintf("round %d", prev.Data.RoundNumber), fmt.Sprintf("round %d", cur.Data.RoundNumber), prev.Data.Prompt, cur.Data.Prompt, 3)
	d := linesOf(b.String())
	d.From = prev.Data.RoundNumber
	return d
}

// linesOf splits a unified diff into classed lines, bounded.
func linesOf(diff string) *diffView {
	out := clip(diff, diffBytes)
	d := &diffView{Cut: out.Cut, Same: out.Total == 0}
	for _, line := range strings.Split(strings.TrimSuffix(out.Text, "\n"), "\n") {
		class := "ctx"
		switch {
		case strings.HasPrefix(line, "+++"), strings.HasPrefix(line, "---"):
			class = "file"
		case strings.HasPrefix(line, "@@"):
			class = "hunk"
		case strings.HasPrefix(line, "+"):
			class = "add"
		case strings.HasPrefix(line, "-"):
			class = "del"
		}
		if line != "" || class != "ctx" {
			d.Lines = append(d.Lines, diffLine{Class: class, Text: line})
		}
	}
	return d
}

// verify runs the check of `podium prompts verify` on one record. It reads and renders only.
func (c *Console) verify(ctx context.Context, rec audit.Record) *verdict {
	err := c.d.Verify(ctx, rec)
	var m *audit.Mismatch
	switch {
	case err == nil:
		c.m.verifies.WithLabelValues("ok").Inc()
		return &verdict{OK: true, Message: fmt.Sprintf("verified: rendering the request again as of evaluations_seq %d gives sha256 %s, as recorded", rec.Data.Inputs.EvaluationsSeq, rec.Data.PromptSHA256)}
	case errors.As(err, &m):
		c.m.verifies.WithLabelValues("differs").Inc()
		return &verdict{Message: "differs: " + m.Error()}
	default:
		c.m.verifies.WithLabelValues("error").Inc()
		return &verdict{Message: "could not verify (no verdict): " + err.Error()}
	}
}

// text is GET /text/{kind}/{exec}/{team}/{round}: a whole text as text/plain, where a page
// showed part of it. kind is prompt, submission or feedback.
func (c *Console) text(w http.ResponseWriter, r *http.Request) {
	exec, team, round, err := roundAddress(r)
	if err == nil {
		var body string
		var view *storeview.Read
		if view, err = storeview.Begin(r.Context(), c.d.JS, c.d.Store); err == nil {
			body, err = c.wholeText(r.Context(), view, r.PathValue("kind"), exec, team, round)
		}
		if err == nil {
			err = view.End(r.Context())
		}
		if err == nil {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Content-Disposition", "inline")
			w.Header().Set("Cache-Control", "no-store")
			_, _ = w.Write([]byte(body))
			return
		}
	}
	c.fail(w, r, "text", err)
}

func (c *Console) wholeText(ctx context.Context, ev evaluations, kind, exec, team string, round int) (string, error) {
	switch kind {
	case "prompt":
		recs, err := c.audit().Rounds(ctx, exec, team, round)
		if err != nil && !isNotFound(err) {
			return "", err
		}
		if rec, ok := recs[round]; ok {
			return rec.Data.Prompt, nil
		}
	case "submission", "feedback":
		tr, err := c.round(ctx, ev, exec, team, round)
		if err != nil {
			return "", err
		}
		if tr != nil && kind == "submission" {
			return tr.Submission.Content, nil
		}
		if tr != nil {
			return tr.Feedback, nil
		}
	default:
		return "", notFound("no text of kind %s", events.Quote(kind))
	}
	return "", notFound("no %s for %s %s round %d", kind, exec, team, round)
}
