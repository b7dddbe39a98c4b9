// Package render is the one way the inputs of a prompt are read from the store: the composer
// uses it for every request, and the podium CLI to render an audit record again, so both see
// exactly the same evaluations, as of the same sequence.
package render

import (
	"context"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Reader is what reading the inputs needs of ClickHouse. The composer shares and batches these
// reads between requests; the CLI reads the store directly.
type Reader interface {
	// Scores are an execution's score rows, read after the ranker committed up to pos.
	Scores(ctx context.Context, executionID string, pos rank.Pos) (*rank.Evaluations, error)
	// Content is a team's content in rounds from to before-1: at least the evaluations refs
	// names, the ones the prompt counts, each the first stored copy at its sequence.
	Content(ctx context.Context, key rank.TeamKey, from, before int, refs []rank.ContentRef) (*rank.Content, error)
}

// Inputs reads what the prompt of req, rendered with t (the template req resolved to), shows as
// of the position pos in the EVALUATIONS history (rank.Pos): every team's scores, then the requesting team's own content of
// the rounds t prints (compose.Template.ContentFrom), reduced by the standings rule
// (rank.Evaluations.ForPrompt).
func Inputs(ctx context.Context, t *compose.Template, r Reader, requestID string, req events.RoundRequested, at time.Time, pos rank.Pos) (compose.Inputs, error) {
	evs, err := r.Scores(ctx, req.ExecutionID, pos)
	if err != nil {
		return compose.Inputs{}, err
	}
	before := evs.Reduce(rank.Bound{BeforeRound: req.RoundNumber, UpTo: pos})
	rounds := before.History(req.TeamID, nil)
	var content *rank.Content
	if from := t.ContentFrom(req, rounds); from < req.RoundNumber {
		refs := before.ContentRefs(req.TeamID, from, req.RoundNumber)
		content, err = r.Content(ctx, rank.TeamKey{ExecutionID: req.ExecutionID, TeamID: req.TeamID}, from, req.RoundNumber, refs)
		if err != nil {
			return compose.Inputs{}, err
		}
	}
	order := req.ScoreOrder
	if order == "" {
		order = events.Desc
	}
	in := evs.ForPrompt(req.TeamID, req.RoundNumber, pos, req.Standings, order, content)
	return compose.Inputs{
		RequestID:      requestID,
		Request:        req,
		Time:           at,
		History:        in.History,
		Leaderboard:    in.Board.Rows,
		PreviousRanks:  in.PreviousRanks,
		EvaluationsSeq: pos.Seq,
		EvaluationsEra: pos.Era,
		Template:       t,
	}, nil
}

// AsOf is the position a recorded prompt was composed as of.
func AsOf(in events.ComposeInputs) rank.Pos {
	return rank.Pos{Era: in.EvaluationsEra, Seq: in.EvaluationsSeq}
}

// Store reads the store directly, for callers that render one prompt at a time: a *chstore.Store,
// or a reader's anchored view of it (chstore.View).
type Store struct{ St Evaluations }

// Evaluations are the store's reads a rendering needs.
type Evaluations interface {
	Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error)
	Content(ctx context.Context, executionID, teamID string, fromRound, beforeRound int) (*rank.Content, error)
}

var (
	_ Evaluations = (*chstore.Store)(nil)
	_ Evaluations = (*chstore.View)(nil)
)

// Scores reads one execution's scores.
func (s Store) Scores(ctx context.Context, executionID string, _ rank.Pos) (*rank.Evaluations, error) {
	evs, err := s.St.Scores(ctx, []string{executionID})
	if err != nil {
		return nil, err
	}
	return evs[executionID], nil
}

// Content reads one team's content from ClickHouse.
func (s Store) Content(ctx context.Context, key rank.TeamKey, from, before int, _ []rank.ContentRef) (*rank.Content, error) {
	return s.St.Content(ctx, key.ExecutionID, key.TeamID, from, before)
}

// Memory reads inputs from records held in memory (rank.FromRecords): offline rendering, and the
// proof of an export bundle, which reads exactly what the store's reads would.
type Memory struct {
	Evs      *rank.Evaluations
	Contents map[rank.TeamKey]*rank.Content
}

// Scores are the records' score rows.
func (m Memory) Scores(context.Context, string, rank.Pos) (*rank.Evaluations, error) {
	return m.Evs, nil
}

// Content is one team's content of the records.
func (m Memory) Content(_ context.Context, key rank.TeamKey, _, _ int, _ []rank.ContentRef) (*rank.Content, error) {
	return m.Contents[key], nil
}
