package chstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Reads fetch an execution's rows as stored, every copy of every event, and leave the choice of
// which evaluation counts to Latest: a plain range read on the sort key costs ClickHouse 18.16
// far less than a two-level GROUP BY, and the reduction is exact whatever the merge state (but
// for an id sent again to a stream made again, pkg/rank/latest.go).
// Rows of every round are read: a replayed event id keeps the round of its first copy, which a
// WHERE on round_number could not see.

// Leaderboard ranks an execution within b. An unknown execution has no rows.
func (s *Store) Leaderboard(ctx context.Context, executionID string, order events.ScoreOrder, b rank.Bound) (rank.Board, error) {
	boards, err := s.Leaderboards(ctx, []string{executionID}, order, b)
	if err != nil {
		return rank.Board{}, err
	}
	return boards[executionID], nil
}

// Leaderboards ranks several executions with one query, as the ranker does for every execution
// a batch touched. Every requested execution has an entry, empty when it has no evaluations.
func (s *Store) Leaderboards(ctx context.Context, executionIDs []string, order events.ScoreOrder, b rank.Bound) (map[string]rank.Board, error) {
	evs, err := s.Scores(ctx, executionIDs)
	if err != nil {
		return nil, fmt.Errorf("rank: leaderboards: %w", err)
	}
	boards := make(map[string]rank.Board, len(executionIDs))
	for _, id := range executionIDs {
		boards[id] = evs[id].Reduce(b).Leaderboard(order)
	}
	return boards, nil
}

// scoreColumns are what ranking needs of a row: no content, so reads of every team stay small.
const scoreColumns = `execution_id, team_id, event_id, round_number, team_name, overall_score, evaluated_at_us, stream_seq, stream_era`

// The store's read queries, named so that the test comparing ClickHouse 18.16 with a current
// engine (chdb_test.go) runs exactly them.
const (
	scoresQuery = `SELECT ` + scoreColumns + ` FROM evaluations WHERE execution_id IN ?`
	// anchoredScoresQuery is scoresQuery that also reads the anchor row (anchorCondition): one
	// query reads one set of the table's parts, so the anchor in its result says the rows read
	// are of the table the lineage filled (anchored.go).
	anchoredScoresQuery = scoresQuery + ` OR ` + anchorCondition
	teamScoresQuery     = `SELECT ` + scoreColumns + ` FROM evaluations WHERE execution_id = ? AND team_id = ?`
	// anchoredTeamScoresQuery is teamScoresQuery that also reads the anchor row.
	anchoredTeamScoresQuery = `SELECT ` + scoreColumns + ` FROM evaluations WHERE (execution_id = ? AND team_id = ?) OR ` + anchorCondition
	contentColumns          = `execution_id, team_id, event_id, round_number, overall_score, stream_seq, stream_era, metrics, feedback, submission, submission_format, evaluated_at`
)

// contentsQuery reads the content of n (execution, team) pairs in a range of rounds; anchored,
// the anchor row too (anchorCondition).
func contentsQuery(n int, anchored bool) string {
	// A tuple IN on the sort key's prefix: ClickHouse reads the granules of these teams only.
	q := `SELECT ` + contentColumns + `
FROM evaluations WHERE ((execution_id, team_id) IN (` + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ") + `)
AND round_number >= ? AND round_number < ?)`
	if anchored {
		q += ` OR ` + anchorCondition
	}
	return q
}

// Scores reads the score rows of the executions, every team and copy, in one query. Every
// requested execution has an entry, empty when it has no evaluations.
func (s *Store) Scores(ctx context.Context, executionIDs []string) (map[string]*rank.Evaluations, error) {
	return s.scanScores(ctx, executionIDs, nil, scoresQuery, inSet(executionIDs))
}

// scanScores reads score rows with q; with anchor set (q reads the anchor row too), it fails with
// ErrAnchorLost unless the anchor row is among them.
func (s *Store) scanScores(ctx context.Context, executionIDs []string, anchor *RowKey, q string, args ...any) (map[string]*rank.Evaluations, error) {
	out := make(map[string]*rank.Evaluations, len(executionIDs))
	for _, id := range executionIDs {
		out[id] = rank.NewEvaluations()
	}
	held := false
	// On a cluster the rows of several replicas are gathered: Latest collapses copies of an id.
	err := s.executionQuery(ctx, q, args, func(rows driver.Rows) error {
		var exec string
		var r rank.Stored
		var round uint32
		if err := rows.Scan(&exec, &r.TeamID, &r.EventID, &round, &r.TeamName, &r.Score, &r.AtMicros, &r.Seq, &r.Era); err != nil {
			return err
		}
		r.Round = int(round)
		if anchor != nil && anchor.is(exec, r.TeamID, r.EventID, rank.Pos{Era: r.Era, Seq: r.Seq}) {
			held = true
		}
		if ev := out[exec]; ev != nil {
			ev.Append(r) // the anchor row too, when it is of an execution asked for: one of its rows
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rank: scores: %w", err)
	}
	if anchor != nil && !held {
		return nil, anchorLost(*anchor)
	}
	return out, nil
}

// Content reads what one team submitted and was told in rounds fromRound to beforeRound-1 (0:
// no upper bound). Only the rows of that team are decoded: other teams' submissions and
// feedback are never read, and a prompt reads no more rounds than its template prints.
func (s *Store) Content(ctx context.Context, executionID, teamID string, fromRound, beforeRound int) (*rank.Content, error) {
	key := rank.TeamKey{ExecutionID: executionID, TeamID: teamID}
	cs, err := s.Contents(ctx, []rank.TeamKey{key}, fromRound, beforeRound)
	if err != nil {
		return nil, err
	}
	return cs[key], nil
}

// Contents reads the content of several teams in one query, as Content does for one: the rows
// of those (execution, team) pairs only, in rounds fromRound to beforeRound-1. Every key has an
// entry.
func (s *Store) Contents(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int) (map[rank.TeamKey]*rank.Content, error) {
	return s.contents(ctx, keys, fromRound, beforeRound, nil)
}

// contents is Contents; with anchor set, it fails with ErrAnchorLost unless the same read found
// the anchor row.
func (s *Store) contents(ctx context.Context, keys []rank.TeamKey, fromRound, beforeRound int, anchor *RowKey) (map[rank.TeamKey]*rank.Content, error) {
	out := make(map[rank.TeamKey]*rank.Content, len(keys))
	args := make([]any, 0, 2*len(keys)+5)
	for _, k := range keys {
		out[k] = rank.NewContent()
		args = append(args, k.ExecutionID, k.TeamID)
	}
	from, before := uint32(max(fromRound, 0)), roundLimit(beforeRound)
	args = append(args, from, before)
	if anchor != nil {
		args = append(args, anchor.ExecutionID, anchor.TeamID, anchor.EventID)
	}
	held := false
	q := contentsQuery(len(keys), anchor != nil)
	// On a cluster the rows of several replicas are gathered: add keeps one copy of an id.
	err := s.executionQuery(ctx, q, args, func(rows driver.Rows) error {
		var k rank.TeamKey
		var d events.TeamRound
		var round uint32
		var pos rank.Pos
		var metrics string
		if err := rows.Scan(&k.ExecutionID, &k.TeamID, &d.EvaluationID, &round, &d.OverallScore, &pos.Seq, &pos.Era, &metrics, &d.Feedback,
			&d.Submission.Content, &d.Submission.Format, &d.EvaluatedAt); err != nil {
			return err
		}
		if anchor != nil && anchor.is(k.ExecutionID, k.TeamID, d.EvaluationID, pos) {
			held = true
			if round < from || round >= before {
				return nil // read for the anchor alone
			}
		}
		c := out[k]
		if c == nil {
			return nil // the anchor row, of another team
		}
		if c.Has(d.EvaluationID, pos) {
			return nil // a later copy of an event already read: not worth decoding its metrics
		}
		d.RoundNumber = int(round)
		if err := json.Unmarshal([]byte(metrics), &d.Metrics); err != nil {
			return fmt.Errorf("%s/%s: metrics of %s: %w", k.ExecutionID, k.TeamID, d.EvaluationID, err)
		}
		c.Keep(d.EvaluationID, pos, d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rank: content of %d teams: %w", len(keys), err)
	}
	if anchor != nil && !held {
		return nil, anchorLost(*anchor)
	}
	return out, nil
}

// codeReadonly is ClickHouse's refusal of a query's settings for a user with readonly=1.
const codeReadonly = 164

// executionQuery is query for the reads of one execution's rows (a few granules): they run with
// ReadThreads. A user with readonly=1 (a console given a read-only account) may not set it: the
// store then reads with the server's default from that refusal on, rather than not at all.
func (s *Store) executionQuery(ctx context.Context, q string, args []any, scan func(driver.Rows) error) error {
	if s.readThreads <= 0 || s.threadsRefused.Load() {
		return s.query(ctx, q, args, scan)
	}
	// A plain int: 18.16 takes settings as varints (see Replication.settings).
	err := s.query(clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"max_threads": s.readThreads})), q, args, scan)
	if exceptionCode(err) != codeReadonly {
		return err
	}
	s.threadsRefused.Store(true)
	return s.query(ctx, q, args, scan)
}

// query runs q on the replicas a read needs and hands every row to scan.
func (s *Store) query(ctx context.Context, q string, args []any, scan func(driver.Rows) error) error {
	return s.rs.read(ctx, func(conn driver.Conn) error {
		rows, err := conn.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// column is the one column of q's rows, from every replica the read asks (as query).
func column[T any](ctx context.Context, s *Store, q string, args ...any) ([]T, error) {
	var out []T
	err := s.query(ctx, q, args, func(rows driver.Rows) error {
		var v T
		if err := rows.Scan(&v); err != nil {
			return err
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// roundLimit turns "before round N" (0 = no limit) into an exclusive bound of the UInt32 column.
func roundLimit(beforeRound int) uint32 {
	if beforeRound <= 0 || beforeRound > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(beforeRound)
}

// History returns a team's latest evaluation of each round within b, ascending, with content.
func (s *Store) History(ctx context.Context, executionID, teamID string, b rank.Bound) ([]events.TeamRound, error) {
	evs, err := s.scanScores(ctx, []string{executionID},
		nil, teamScoresQuery, executionID, teamID)
	if err != nil {
		return nil, fmt.Errorf("rank: history of %s/%s: %w", executionID, teamID, err)
	}
	content, err := s.Content(ctx, executionID, teamID, 0, b.BeforeRound)
	if err != nil {
		return nil, err
	}
	return evs[executionID].Reduce(b).History(teamID, content), nil
}

// inSet binds ids as the right-hand side of IN.
func inSet(ids []string) clickhouse.GroupSet {
	set := clickhouse.GroupSet{Value: make([]any, len(ids))}
	for i, id := range ids {
		set.Value[i] = id
	}
	return set
}
