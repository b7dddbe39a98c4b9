package rank

import (
	"context"
	"encoding/json"
	"fmt"
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
