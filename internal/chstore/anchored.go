package chstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// ErrAnchorLost is an anchored read that did not find the anchor row.
var ErrAnchorLost = errors.New("the evaluations table no longer holds the row its lineage is anchored on (emptied, or dropped and made again): the ranker refills it from EVALUATIONS")

// String is the anchor as the ranker publishes it (events.MetaStoreAnchor): a JSON array.
func (k RowKey) String() string {
	b, _ := json.Marshal([3]string{k.ExecutionID, k.TeamID, k.EventID})
	return string(b)
}

// ParseRowKey reads a RowKey's String.
func ParseRowKey(s string) (RowKey, error) {
	var a [3]string
	if err := json.Unmarshal([]byte(s), &a); err != nil {
		return RowKey{}, fmt.Errorf("an anchor is [execution_id, team_id, event_id]: %w", err)
	}
	return RowKey{a[0], a[1], a[2]}, nil
}

func anchorLost(k RowKey) error {
	return fmt.Errorf("%w (anchor %s/%s/%s)", ErrAnchorLost, k.ExecutionID, k.TeamID, k.EventID)
}

// Anchored are the store's reads of executions' rows, each checked against the anchor row.
type Anchored struct {
	s      *Store
	anchor RowKey
}

// Anchored returns the reads anchored on k, the anchor of the lineage the reader serves.
func (s *Store) Anchored(k RowKey) Anchored { return Anchored{s: s, anchor: k} }

// Scores is Store.Scores, anchored.
func (a Anchored) Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error) {
	return a.s.scanScores(ctx, executionIDs, &a.anchor, anchoredScoresQuery, inSet(executionIDs), a.anchor.ExecutionID, a.anchor.TeamID, a.anchor.EventID)
}

// Contents is Store.Contents, anchored.
func (a Anchored) Contents(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error) {
	return a.s.contents(ctx, keys, fromRound, beforeRound, &a.anchor)
}
