package rank

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/podium-llm/podium/pkg/events"
)

// Config says where the store lives.
type Config struct {
	Addrs       []string
	Database    string
	User        string
	Password    string
	DialTimeout time.Duration
	ReadTimeout time.Duration
}

// Store reads and writes evaluations in one ClickHouse database.
type Store struct {
	conn driver.Conn
	db   string
}

func (c Config) options(database string) *clickhouse.Options {
	dial := orDefault(c.DialTimeout, 5*time.Second)
	read := orDefault(c.ReadTimeout, 30*time.Second)
	return &clickhouse.Options{
		Addr:         c.Addrs,
		Auth:         clickhouse.Auth{Database: database, Username: c.User, Password: c.Password},
		DialTimeout:  dial,
		ReadTimeout:  read,
		MaxOpenConns: 16,
		MaxIdleConns: 8,
	}
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// CreateDatabase creates cfg.Database if it is missing.
func CreateDatabase(ctx context.Context, cfg Config) error {
	conn, err := clickhouse.Open(cfg.options("default"))
	if err != nil {
		return fmt.Errorf("rank: connect: %w", err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+quoteIdent(cfg.Database)); err != nil {
		return fmt.Errorf("rank: create database %s: %w", cfg.Database, err)
	}
	return nil
}

// Open connects to cfg.Database and checks the connection.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	conn, err := clickhouse.Open(cfg.options(cfg.Database))
	if err != nil {
		return nil, fmt.Errorf("rank: connect: %w", err)
	}
	if err := conn.Ping(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("rank: ping %v: %w", cfg.Addrs, err)
	}
	return &Store{conn: conn, db: cfg.Database}, nil
}

// Close releases the connections.
func (s *Store) Close() error { return s.conn.Close() }

// Ping checks that ClickHouse answers.
func (s *Store) Ping(ctx context.Context) error { return s.conn.Ping(ctx) }

// Record is one accepted evaluation with where it came from.
type Record struct {
	EventID string
	Source  string
	Seq     uint64 // EVALUATIONS stream sequence
	events.EvaluationCompleted
}

// Insert writes records in one batch. Writing a record again is harmless: reads collapse rows by
// event id, keeping the one with the lowest stream sequence.
func (s *Store) Insert(ctx context.Context, recs []Record) error {
	if len(recs) == 0 {
		return nil
	}
	// 18.16 needs the explicit column list for a native-protocol batch.
	batch, err := s.conn.PrepareBatch(ctx, `INSERT INTO evaluations (execution_id, team_id, round_number, event_id,
		team_name, overall_score, metrics, feedback, submission, submission_format, evaluated_at,
		evaluated_at_us, event_source, stream_seq)`)
	if err != nil {
		return fmt.Errorf("rank: prepare insert: %w", err)
	}
	defer batch.Abort()
	for _, r := range recs {
		metrics := r.Evaluation.Metrics
		if metrics == nil {
			metrics = []events.Metric{}
		}
		mj, err := json.Marshal(metrics)
		if err != nil {
			return fmt.Errorf("rank: encode metrics of %s: %w", r.EventID, err)
		}
		if err := batch.Append(r.ExecutionID, r.TeamID, uint32(r.RoundNumber), r.EventID,
			r.TeamName, r.Evaluation.OverallScore, string(mj), r.Evaluation.Feedback,
			r.Submission.Content, r.Submission.Format, r.EvaluatedAt.Format(time.RFC3339Nano),
			r.EvaluatedAt.UnixMicro(), r.Source, r.Seq); err != nil {
			return fmt.Errorf("rank: append %s: %w", r.EventID, err)
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("rank: insert %d evaluations: %w", len(recs), err)
	}
	return nil
}

// Board is a leaderboard with the highest EVALUATIONS sequence among the evaluations it reflects.
type Board struct {
	Rows []events.LeaderboardRow
	Seq  uint64
}

// roundLimit turns "before round N" (0 = no limit) into an exclusive bound.
func roundLimit(beforeRound int) uint32 {
	if beforeRound <= 0 || beforeRound > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(beforeRound)
}

// Leaderboard ranks an execution from the latest evaluation of each (team, round) with
// round_number < beforeRound (0 = all rounds). An unknown execution has no rows.
func (s *Store) Leaderboard(ctx context.Context, executionID string, order events.ScoreOrder, beforeRound int) (Board, error) {
	boards, err := s.Leaderboards(ctx, []string{executionID}, order, beforeRound)
	if err != nil {
		return Board{}, err
	}
	return boards[executionID], nil
}

// Leaderboards ranks several executions with one query, as the ranker does for every execution
// a batch touched. Every requested execution has an entry, empty when it has no evaluations.
func (s *Store) Leaderboards(ctx context.Context, executionIDs []string, order events.ScoreOrder, beforeRound int) (map[string]Board, error) {
	// The rows of the executions are few (one per evaluation and copy) and the key starts with
	// execution_id, so they are fetched as stored and reduced in Go by Latest: one plain range
	// read costs ClickHouse 18.16 far less than a two-level GROUP BY, and the reduction is exact
	// whatever the merge state.
	const q = `
SELECT execution_id, team_id, event_id, round_number, team_name, overall_score, evaluated_at_us, stream_seq
FROM evaluations
WHERE execution_id IN ?`
	rows, err := s.conn.Query(ctx, q, inSet(executionIDs))
	if err != nil {
		return nil, fmt.Errorf("rank: leaderboards: %w", err)
	}
	defer rows.Close()
	stored := make(map[string][]Stored, len(executionIDs))
	for rows.Next() {
		var exec string
		var r Stored
		var round uint32
		if err := rows.Scan(&exec, &r.TeamID, &r.EventID, &round, &r.TeamName, &r.Score, &r.AtMicros, &r.Seq); err != nil {
			return nil, fmt.Errorf("rank: leaderboards: %w", err)
		}
		r.Round = int(round)
		stored[exec] = append(stored[exec], r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rank: leaderboards: %w", err)
	}
	boards := make(map[string]Board, len(executionIDs))
	for _, id := range executionIDs {
		rounds, seq := Latest(stored[id], beforeRound)
		boards[id] = Board{Rows: Rank(rounds, order), Seq: seq}
	}
	return boards, nil
}

// History returns a team's latest evaluation of each round below beforeRound (0 = all), ascending.
func (s *Store) History(ctx context.Context, executionID, teamID string, beforeRound int) ([]events.TeamRound, error) {
	const q = `
SELECT r,
       argMax(event_id, tuple(t, event_id)), argMax(s, tuple(t, event_id)),
       argMax(m, tuple(t, event_id)), argMax(f, tuple(t, event_id)),
       argMax(c, tuple(t, event_id)), argMax(cf, tuple(t, event_id)), argMax(ea, tuple(t, event_id))
FROM (
    SELECT event_id, argMin(round_number, stream_seq) AS r,
           argMin(overall_score, stream_seq) AS s, argMin(metrics, stream_seq) AS m,
           argMin(feedback, stream_seq) AS f, argMin(submission, stream_seq) AS c,
           argMin(submission_format, stream_seq) AS cf, argMin(evaluated_at, stream_seq) AS ea,
           argMin(evaluated_at_us, stream_seq) AS t
    FROM evaluations
    WHERE execution_id = ? AND team_id = ?
    GROUP BY event_id
)
WHERE r < ?
GROUP BY r
ORDER BY r`
	rows, err := s.conn.Query(ctx, q, executionID, teamID, roundLimit(beforeRound))
	if err != nil {
		return nil, fmt.Errorf("rank: history of %s/%s: %w", executionID, teamID, err)
	}
	defer rows.Close()
	out := []events.TeamRound{}
	for rows.Next() {
		var r events.TeamRound
		var round uint32
		var metrics string
		if err := rows.Scan(&round, &r.EvaluationID, &r.OverallScore, &metrics, &r.Feedback,
			&r.Submission.Content, &r.Submission.Format, &r.EvaluatedAt); err != nil {
			return nil, fmt.Errorf("rank: history of %s/%s: %w", executionID, teamID, err)
		}
		r.RoundNumber = int(round)
		if err := json.Unmarshal([]byte(metrics), &r.Metrics); err != nil {
			return nil, fmt.Errorf("rank: history of %s/%s round %d: metrics: %w", executionID, teamID, round, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("rank: history of %s/%s: %w", executionID, teamID, err)
	}
	return out, nil
}

// inSet binds ids as the right-hand side of IN.
func inSet(ids []string) clickhouse.GroupSet {
	set := clickhouse.GroupSet{Value: make([]any, len(ids))}
	for i, id := range ids {
		set.Value[i] = id
	}
	return set
}

func quoteIdent(s string) string {
	out := make([]byte, 0, len(s)+2)
	out = append(out, '`')
	for i := 0; i < len(s); i++ {
		if s[i] == '`' || s[i] == '\\' {
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(append(out, '`'))
}

// IsUnavailable reports whether err is a failure to reach ClickHouse rather than a bad query.
func IsUnavailable(err error) bool {
	var ex *clickhouse.Exception
	return err != nil && !errors.As(err, &ex)
}
