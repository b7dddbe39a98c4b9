package chstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ExecutionSummary is what the store says of one execution at a glance: how many teams, the
// highest round evaluated, the latest evaluation time and the highest EVALUATIONS sequence (its
// last activity, in the order the ranker committed it).
type ExecutionSummary struct {
	ExecutionID string
	Teams       int
	MaxRound    int
	LastAtUs    int64  // latest evaluated_at, microseconds since the epoch
	LastSeq     uint64 // highest stream sequence stored
}

// executionsQuery is one row per execution (see Executions).
const executionsQuery = `SELECT execution_id, uniqExact(team_id), max(round_number), max(evaluated_at_us), max(stream_seq)
FROM evaluations GROUP BY execution_id`

// anchoredExecutionsQuery is executionsQuery with a sixth column: how many of the execution's
// rows are the anchor row (cond).
func anchoredExecutionsQuery(cond string) string {
	return `SELECT execution_id, uniqExact(team_id), max(round_number), max(evaluated_at_us), max(stream_seq), countIf(` + cond + `)
FROM evaluations GROUP BY execution_id`
}

// Executions summarizes every execution in the store, newest activity (highest sequence) first,
// then by id. Counts are of stored rows, copies included: a replay of an event id travels on its
// subject (the same team), but one whose body names another round raises MaxRound until
// ClickHouse merges the copies. One row per execution is read; on a
// cluster the rows of several replicas are merged here (a replica may lag, so the largest wins).
func (s *Store) Executions(ctx context.Context) ([]ExecutionSummary, error) {
	return s.executions(ctx, executionsQuery, nil, nil)
}

// executions is Executions with q; with anchor set (q counts the anchor rows in a sixth column),
// it fails with ErrAnchorLost unless one execution holds the anchor row.
func (s *Store) executions(ctx context.Context, q string, args []any, anchor *RowKey) ([]ExecutionSummary, error) {
	byID := map[string]ExecutionSummary{}
	held := false
	err := s.query(ctx, q, args, func(rows driver.Rows) error {
		var e ExecutionSummary
		var teams, anchors uint64
		var round uint32
		dst := []any{&e.ExecutionID, &teams, &round, &e.LastAtUs, &e.LastSeq}
		if anchor != nil {
			dst = append(dst, &anchors)
		}
		if err := rows.Scan(dst...); err != nil {
			return err
		}
		held = held || anchors > 0
		e.Teams, e.MaxRound = int(teams), int(round)
		have := byID[e.ExecutionID]
		byID[e.ExecutionID] = ExecutionSummary{ExecutionID: e.ExecutionID, Teams: max(have.Teams, e.Teams),
			MaxRound: max(have.MaxRound, e.MaxRound), LastAtUs: max(have.LastAtUs, e.LastAtUs), LastSeq: max(have.LastSeq, e.LastSeq)}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rank: executions: %w", err)
	}
	if anchor != nil && !held {
		return nil, anchorLost(*anchor)
	}
	out := make([]ExecutionSummary, 0, len(byID))
	for _, e := range byID {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b ExecutionSummary) int {
		return cmp.Or(cmp.Compare(b.LastSeq, a.LastSeq), cmp.Compare(a.ExecutionID, b.ExecutionID))
	})
	return out, nil
}
