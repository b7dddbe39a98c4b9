package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// executionsPerPage is the length of a page of the executions list.
const executionsPerPage = 50

type executionsPage struct {
	Rows             []executionRow
	Total            int
	Page, Pages      int
	PrevPage, NextPg int
}

type executionRow struct {
	chstore.ExecutionSummary
	Order events.ScoreOrder
}

// executions is GET /: every execution in the store, newest activity first.
func (c *Console) executions(r *http.Request, ev evaluations) (any, error) {
	page := 1
	if p := r.URL.Query().Get("page"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 {
			return nil, badRequest("page must be a positive number, got %s", events.Quote(p))
		}
		page = n
	}
	all, err := ev.Executions(r.Context())
	if chstore.FaultOf(err) == chstore.Missing {
		// The view's lineage is whole, its table gone: not an empty store, one to refill.
		return nil, &chstore.NotWholeError{Why: "its evaluations table is missing; the ranker makes it again and refills it"}
	}
	if err != nil {
		return nil, err
	}
	out := executionsPage{Total: len(all), Page: page, Pages: max(1, (len(all)+executionsPerPage-1)/executionsPerPage)}
	from := min((page-1)*executionsPerPage, len(all))
	for _, e := range all[from:min(from+executionsPerPage, len(all))] {
		out.Rows = append(out.Rows, executionRow{ExecutionSummary: e, Order: c.scoreOrder(r.Context(), e.ExecutionID)})
	}
	if page > 1 {
		out.PrevPage = page - 1
	}
	if page < out.Pages {
		out.NextPg = page + 1
	}
	return out, nil
}

// scoreOrder is the score order of an execution's latest request (ROUNDS keeps every request;
// requests are small, so this is one direct read). Without one it is the default, desc.
func (c *Console) scoreOrder(ctx context.Context, executionID string) events.ScoreOrder {
	s, err := c.d.JS.Stream(ctx, events.StreamRounds)
	if err != nil {
		return events.Desc
	}
	msg, err := s.GetLastMsgForSubject(ctx, events.TypeRoundRequested+"."+executionID+".*")
	if err != nil {
		return events.Desc
	}
	var f requestFields
	if json.Unmarshal(msg.Data, &f) == nil {
		if o, ok := f.order(); ok {
			return o
		}
	}
	return events.Desc
}

type executionPage struct {
	ID      string
	Order   events.ScoreOrder
	Seq     uint64
	Board   []boardRow
	Top     *topSubmission
	Chart   chart
	Grid    grid
	Rounds  int
	Partial bool // the grid reached its bound
}

type boardRow struct {
	events.LeaderboardRow
	Movement, MovementClass string
}

type topSubmission struct {
	TeamID, TeamName string
	Round            int
	Score            float64
	Preview          clipped // a few lines
	Shown            clipped // what expanding shows
	Format           string
}

type grid struct {
	Rounds []int
	Teams  []gridTeam
	// HiddenRounds and HiddenTeams count what the bounds left out (the earliest rounds, the
	// last teams).
	HiddenRounds, HiddenTeams int
}

type gridTeam struct {
	ID, Name string
	Cells    []gridCell
}

type gridCell struct {
	State string // none, requested, composed, failed, evaluated: the cell's class
	Label string
	Sub   string // a second line: what the prompt was, under an evaluated score
	Title string
	Href  string
}

// execution is GET /executions/{exec}: the board as the ranker computes it, the top submission,
// the chart and the grid.
func (c *Console) execution(r *http.Request, store evaluations) (any, error) {
	exec := r.PathValue("exec")
	if !events.ValidIdentifier(exec) {
		return nil, badRequest("execution %s is not an identifier", events.Quote(exec))
	}
	ctx := r.Context()
	g, err := c.grid.get(ctx, exec)
	if err != nil {
		return nil, err
	}
	order := g.order
	if q := r.URL.Query().Get("score_order"); q != "" {
		o, ok := events.ParseScoreOrder(q)
		if !ok {
			return nil, badRequest(`score_order must be "asc" or "desc"`)
		}
		order = o
	}
	evs, err := store.Scores(ctx, []string{exec})
	if chstore.FaultOf(err) == chstore.Missing {
		err = &chstore.NotWholeError{Why: "its evaluations table is missing; the ranker makes it again and refills it"}
	}
	if err != nil {
		return nil, err
	}
	ev := evs[exec]
	if ev == nil {
		ev, _ = rank.FromRecords(nil)
	}
	now := ev.Reduce(rank.Everything())
	board := now.Leaderboard(order)
	scores := now.Rounds()
	maxRound := 0
	for _, s := range scores {
		maxRound = max(maxRound, s.Round)
	}
	p := executionPage{ID: exec, Order: order, Seq: board.Seq, Chart: scoreChart(scores, board.Rows, order), Partial: g.full}
	p.Board = movement(board.Rows, ev.Reduce(rank.Bound{BeforeRound: maxRound, UpTo: rank.End}).Leaderboard(order).Rows)
	if len(board.Rows) > 0 {
		top, err := c.top(ctx, store, exec, board.Rows[0])
		if err != nil {
			return nil, err
		}
		p.Top = top
	}
	p.Grid, p.Rounds = buildGrid(exec, g, board.Rows, scores)
	return p, nil
}

// movement says how each team moved since the previous board: the board of the rounds before
// the latest one, as a prompt's movement does.
func movement(rows, previous []events.LeaderboardRow) []boardRow {
	before := map[string]int{}
	for _, r := range previous {
		before[r.TeamID] = r.Rank
	}
	out := make([]boardRow, len(rows))
	for i, r := range rows {
		b := boardRow{LeaderboardRow: r}
		was, ok := before[r.TeamID]
		switch {
		case !ok:
			b.Movement, b.MovementClass = "new", "new"
		case was > r.Rank:
			b.Movement, b.MovementClass = fmt.Sprintf("▲%d", was-r.Rank), "up"
		case was < r.Rank:
			b.Movement, b.MovementClass = fmt.Sprintf("▼%d", r.Rank-was), "down"
		default:
			b.Movement, b.MovementClass = "=", "same"
		}
		out[i] = b
	}
	return out
}

// top reads the leader's best submission: one team's one round of content.
func (c *Console) top(ctx context.Context, ev evaluations, exec string, leader events.LeaderboardRow) (*topSubmission, error) {
	tr, err := c.round(ctx, ev, exec, leader.TeamID, leader.BestRound)
	if err != nil || tr == nil {
		return nil, err
	}
	return &topSubmission{TeamID: leader.TeamID, TeamName: leader.TeamName, Round: leader.BestRound, Score: leader.BestScore,
		Preview: clip(tr.Submission.Content, previewBytes), Shown: clip(tr.Submission.Content, shownBytes), Format: tr.Submission.Format}, nil
}

// round is the counted evaluation of one team's round with its content, nil when there is none.
func (c *Console) round(ctx context.Context, ev evaluations, exec, team string, round int) (*events.TeamRound, error) {
	evs, err := ev.Scores(ctx, []string{exec})
	if err != nil {
		return nil, err
	}
	content, err := ev.Content(ctx, exec, team, round, round+1)
	if err != nil {
		return nil, err
	}
	for _, tr := range evs[exec].Reduce(rank.Everything()).History(team, content) {
		if tr.RoundNumber == round && tr.Metrics != nil {
			return &tr, nil
		}
	}
	return nil, nil
}

// The grid is teams x rounds: quadratic in what one execution's events say, so both are bounded.
// One valid round.requested of round 2147483647 must cost one column, not two billion.
const (
	// maxGridRounds is how many rounds the grid shows: the latest ones anything happened in.
	maxGridRounds = 100
	// maxGridTeams is how many teams it shows: board order, then teams not ranked yet.
	maxGridTeams = 500
)

// buildGrid lays out the teams (board order, then teams not ranked yet) against the rounds
// anything happened in, at most maxGridTeams by maxGridRounds (the latest rounds). It returns the
// grid and the latest round.
func buildGrid(exec string, g gridState, board []events.LeaderboardRow, scores []rank.RoundScore) (grid, int) {
	type key = cellKey
	scored := map[key]float64{}
	rounds := map[int]bool{}
	for _, s := range scores {
		scored[key{s.TeamID, s.Round}] = s.Score
		rounds[s.Round] = true
	}
	var teams []gridTeam
	seen := map[string]bool{}
	for _, r := range board {
		teams = append(teams, gridTeam{ID: r.TeamID, Name: r.TeamName})
		seen[r.TeamID] = true
	}
	var others []string
	for k := range g.cells {
		rounds[k.Round] = true
		if !seen[k.Team] {
			seen[k.Team] = true
			others = append(others, k.Team)
		}
	}
	slices.Sort(others)
	for _, t := range others {
		teams = append(teams, gridTeam{ID: t, Name: t})
	}
	out := grid{Rounds: slices.Sorted(maps.Keys(rounds))}
	maxRound := 0
	if n := len(out.Rounds); n > 0 {
		maxRound = out.Rounds[n-1]
	}
	if n := len(out.Rounds); n > maxGridRounds {
		out.HiddenRounds, out.Rounds = n-maxGridRounds, out.Rounds[n-maxGridRounds:]
	}
	if len(teams) > maxGridTeams {
		out.HiddenTeams, teams = len(teams)-maxGridTeams, teams[:maxGridTeams]
	}
	for i := range teams {
		t := &teams[i]
		t.Cells = make([]gridCell, 0, len(out.Rounds))
		for _, r := range out.Rounds {
			t.Cells = append(t.Cells, describeCell(exec, t.ID, r, g.cells[key{t.ID, r}], scored))
		}
	}
	out.Teams = teams
	return out, maxRound
}

// describeCell says the state of one team's round: evaluated (its score) over failed over
// composed over requested. The title says all of it.
func describeCell(exec, team string, round int, c cell, scored map[cellKey]float64) gridCell {
	gc := gridCell{State: "none", Href: fmt.Sprintf("/executions/%s/teams/%s/rounds/%d", exec, team, round)}
	var title []string
	switch {
	case c.Failed:
		gc.State, gc.Label = "failed", c.Code
		title = append(title, "prompt failed: "+c.Code)
	case c.Composed:
		gc.State, gc.Label = "composed", strconv.Itoa(c.Tokens)+" tok"
		if c.Cuts > 0 {
			gc.Label += " ✂" + strconv.Itoa(c.Cuts)
		}
		title = append(title, fmt.Sprintf("prompt composed: %d tokens, %d cut(s)", c.Tokens, c.Cuts))
	case c.Requested:
		gc.State, gc.Label = "requested", "requested"
		title = append(title, "requested, not answered yet")
	}
	if s, ok := scored[cellKey{team, round}]; ok {
		gc.State, gc.Sub = "evaluated", gc.Label // what was composed stays visible under the score
		gc.Label = strconv.FormatFloat(s, 'f', -1, 64)
		title = append(title, "evaluated: "+gc.Label)
	}
	if gc.State == "none" {
		gc.Label, gc.Href = "", ""
		return gc
	}
	gc.Title = fmt.Sprintf("%s round %d: %s", team, round, strings.Join(title, "; "))
	return gc
}

// isNotFound reports a stream or message that does not exist.
func isNotFound(err error) bool {
	return errors.Is(err, jetstream.ErrMsgNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrKeyNotFound) ||
		errors.Is(err, jetstream.ErrBucketNotFound)
}
