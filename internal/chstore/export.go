package chstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/podium-llm/podium/pkg/rank"
)

// exportQuery reads every stored copy of an execution's evaluations, every column Insert writes.
const exportQuery = `SELECT execution_id, team_id, event_id, round_number, team_name, overall_score, metrics, feedback,
submission, submission_format, evaluated_at, event_source, stream_seq, stream_era FROM evaluations WHERE execution_id = ?`

// ExecutionRecords reads every stored copy of an execution's evaluations as the records they were
// written from, by EVALUATIONS sequence: what FromRecords turns back into exactly the reads of the
// store (an export bundle proves its prompts with them, offline).
func (s *Store) ExecutionRecords(ctx context.Context, executionID string) ([]rank.Record, error) {
	return s.executionRecords(ctx, executionID, nil)
}

// ExecutionRecords is Store.ExecutionRecords, anchored.
func (a Anchored) ExecutionRecords(ctx context.Context, executionID string) ([]rank.Record, error) {
	return a.s.executionRecords(ctx, executionID, a.at())
}

// executionRecords is ExecutionRecords; with anchor set, the same query reads the anchor row, and
// fails with ErrAnchorLost without it.
func (s *Store) executionRecords(ctx context.Context, executionID string, anchor *RowKey) ([]rank.Record, error) {
	var out []rank.Record
	q, args := exportQuery, []any{executionID}
	if anchor != nil {
		q += ` OR ` + anchorCondition
		args = append(args, anchor.ExecutionID, anchor.TeamID, anchor.EventID)
	}
	held := false
	err := s.query(ctx, q, args, func(rows driver.Rows) error {
		var r rank.Record
		var round uint32
		var metrics, at string
		if err := rows.Scan(&r.ExecutionID, &r.TeamID, &r.EventID, &round, &r.TeamName, &r.Evaluation.OverallScore, &metrics,
			&r.Evaluation.Feedback, &r.Submission.Content, &r.Submission.Format, &at, &r.Source, &r.Seq, &r.Era); err != nil {
			return err
		}
		r.RoundNumber = int(round)
		if anchor != nil && anchor.is(r.ExecutionID, r.TeamID, r.EventID, r.Pos()) {
			held = true
		}
		if r.ExecutionID != executionID {
			return nil // the anchor row, of another execution
		}
		if err := json.Unmarshal([]byte(metrics), &r.Evaluation.Metrics); err != nil {
			return fmt.Errorf("metrics of %s: %w", r.EventID, err)
		}
		var err error
		if r.EvaluatedAt, err = time.Parse(time.RFC3339Nano, at); err != nil {
			return fmt.Errorf("evaluated_at of %s: %w", r.EventID, err)
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rank: evaluations of %s: %w", executionID, err)
	}
	if anchor != nil && !held {
		return nil, anchorLost(*anchor)
	}
	// On a cluster, or before a merge, a copy may be read twice: keep one of each (event, sequence).
	slices.SortFunc(out, func(a, b rank.Record) int {
		return cmp.Or(a.Pos().Compare(b.Pos()), cmp.Compare(a.EventID, b.EventID))
	})
	out = slices.CompactFunc(out, func(a, b rank.Record) bool { return a.Pos() == b.Pos() && a.EventID == b.EventID })
	return out, nil
}
