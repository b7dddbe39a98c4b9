package chstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// A table emptied under its readers (TRUNCATE, or dropped and made again by hand) takes new rows at
// once, and nothing about it changes what the ranker published: until the ranker's check finds its
// lineage's anchor row gone (every few seconds) and refills the table, a read would return part of
// the rows as if whole. An anchored read reads the anchor row in the same query as the rows it was
// asked for: one query reads one set of the table's parts, so when the anchor is among its rows,
// the rows read are of the table the lineage filled, and when it is not, the read fails with
// ErrAnchorLost (retryable: the ranker refills the table) instead of answering short.

// anchorCondition is the WHERE of the anchor row (RowKey), ORed to a read's own: the primary
// index serves both (ClickHouse 18.16 included).
const anchorCondition = `(execution_id = ? AND team_id = ? AND event_id = ?)`

// anchorAtCondition is anchorCondition with a copy at the anchor's position or before it: an
// earlier era, or the same era up to its sequence (RowKey).
const anchorAtCondition = `(execution_id = ? AND team_id = ? AND event_id = ? AND (stream_era < ? OR stream_era = ? AND stream_seq <= ?))`

// ErrAnchorLost is an anchored read that did not find the anchor row.
var ErrAnchorLost = errors.New("the evaluations table no longer holds the row its lineage is anchored on (emptied, or dropped and made again): the ranker refills it from EVALUATIONS")

// String is the anchor as the ranker publishes it (events.MetaStoreAnchor): a JSON array,
// [execution_id, team_id, event_id, era, seq].
func (k RowKey) String() string {
	b, _ := json.Marshal([]any{k.ExecutionID, k.TeamID, k.EventID, k.Pos.Era, k.Pos.Seq})
	return string(b)
}

// ParseRowKey reads a RowKey's String (or the three strings a ranker before positions published).
func ParseRowKey(s string) (RowKey, error) {
	var a []json.RawMessage
	var k RowKey
	err := json.Unmarshal([]byte(s), &a)
	if err == nil && len(a) != 3 && len(a) != 5 {
		err = fmt.Errorf("%d elements", len(a))
	}
	for i, dst := range []any{&k.ExecutionID, &k.TeamID, &k.EventID, &k.Pos.Era, &k.Pos.Seq} {
		if err != nil || i >= len(a) {
			break
		}
		err = json.Unmarshal(a[i], dst)
	}
	if err != nil {
		return RowKey{}, fmt.Errorf("an anchor is [execution_id, team_id, event_id, era, seq]: %w", err)
	}
	return k, nil
}

func anchorLost(k RowKey) error {
	return fmt.Errorf("%w (anchor %s/%s/%s at %d:%d)", ErrAnchorLost, k.ExecutionID, k.TeamID, k.EventID, k.Pos.Era, k.Pos.Seq)
}

// Anchored are the store's reads of executions' rows, each checked against the anchor row; with
// no anchor (a lineage noted while the table was empty), the plain reads.
type Anchored struct {
	s      *Store
	anchor RowKey
}

// Anchored returns the reads anchored on k, the anchor of the lineage the reader serves.
func (s *Store) Anchored(k RowKey) Anchored { return Anchored{s: s, anchor: k} }

// at is the anchor to check, nil when there is none.
func (a Anchored) at() *RowKey {
	if a.anchor == (RowKey{}) {
		return nil
	}
	return &a.anchor
}

// Scores is Store.Scores, anchored.
func (a Anchored) Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error) {
	if a.at() == nil {
		return a.s.Scores(ctx, executionIDs)
	}
	return a.s.scanScores(ctx, executionIDs, a.at(), anchoredScoresQuery, inSet(executionIDs), a.anchor.ExecutionID, a.anchor.TeamID, a.anchor.EventID)
}

// Contents is Store.Contents, anchored.
func (a Anchored) Contents(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error) {
	return a.s.contents(ctx, keys, fromRound, beforeRound, a.at())
}

// Content is Store.Content, anchored.
func (a Anchored) Content(ctx context.Context, executionID, teamID string, fromRound, beforeRound int) (*rank.Content, error) {
	key := rank.TeamKey{ExecutionID: executionID, TeamID: teamID}
	cs, err := a.Contents(ctx, []rank.TeamKey{key}, fromRound, beforeRound)
	if err != nil {
		return nil, err
	}
	return cs[key], nil
}

// Leaderboard is Store.Leaderboard, anchored.
func (a Anchored) Leaderboard(ctx context.Context, executionID string, order events.ScoreOrder, b rank.Bound) (rank.Board, error) {
	evs, err := a.Scores(ctx, []string{executionID})
	if err != nil {
		return rank.Board{}, fmt.Errorf("rank: leaderboard: %w", err)
	}
	return evs[executionID].Reduce(b).Leaderboard(order), nil
}

// History is Store.History, anchored (both of its reads).
func (a Anchored) History(ctx context.Context, executionID, teamID string, b rank.Bound) ([]events.TeamRound, error) {
	if a.at() == nil {
		return a.s.History(ctx, executionID, teamID, b)
	}
	evs, err := a.s.scanScores(ctx, []string{executionID}, a.at(), anchoredTeamScoresQuery, executionID, teamID,
		a.anchor.ExecutionID, a.anchor.TeamID, a.anchor.EventID)
	if err != nil {
		return nil, fmt.Errorf("rank: history of %s/%s: %w", executionID, teamID, err)
	}
	content, err := a.Content(ctx, executionID, teamID, 0, b.BeforeRound)
	if err != nil {
		return nil, err
	}
	return evs[executionID].Reduce(b).History(teamID, content), nil
}

// Executions is Store.Executions, anchored: each execution's row counts the anchor among its
// rows, so the one query that summarizes the table also says whether it holds the anchor.
func (a Anchored) Executions(ctx context.Context) ([]ExecutionSummary, error) {
	if a.at() == nil {
		return a.s.Executions(ctx)
	}
	cond, args := a.anchor.condition()
	return a.s.executions(ctx, anchoredExecutionsQuery(cond), args, a.at())
}

// condition is the WHERE that selects the anchor row at its position (by its key alone when it
// has none), with its arguments.
func (k RowKey) condition() (string, []any) {
	if k.Pos == (rank.Pos{}) {
		return anchorCondition, []any{k.ExecutionID, k.TeamID, k.EventID}
	}
	return anchorAtCondition,
		[]any{k.ExecutionID, k.TeamID, k.EventID, k.Pos.Era, k.Pos.Era, k.Pos.Seq}
}
