package chstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Config says where the store lives.
type Config struct {
	Addrs       []string
	Database    string
	User        string
	Password    string
	DialTimeout time.Duration
	ReadTimeout time.Duration
	// ReadThreads is ClickHouse's max_threads for the reads of one execution's rows (scores,
	// content, history); 0 leaves the server's default (one thread per core). Those reads touch
	// a few granules: threads beyond one only add scheduling, and many replicas reading at once
	// then contend for the server's cores (BenchmarkScoresReadThreads).
	ReadThreads int
	// Replication is the cluster mode; the zero value is one node.
	Replication Replication
	// Log hears of replicas failing over (optional).
	Log *slog.Logger
}

// Store reads and writes evaluations in one ClickHouse database, on one node or on the
// replicas of a cluster (replicas.go says which query goes where).
type Store struct {
	rs          *replicaSet
	db          string
	replication Replication
	readThreads int
	// threadsRefused is set once the server refused ReadThreads (a readonly=1 user).
	threadsRefused atomic.Bool
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

// CreateDatabase creates cfg.Database if it is missing: on every replica that answers (at least
// one must), or once ON CLUSTER. A database that exists is left alone, so a start with a replica
// down does not wait for it (ON CLUSTER DDL waits for every host).
func CreateDatabase(ctx context.Context, cfg Config) error {
	rs, err := openReplicas(cfg, "system") // every user reaches system; a user may be allowed its database only (deploy/clickhouse)
	if err != nil {
		return err
	}
	defer rs.close()
	ddl := "CREATE DATABASE IF NOT EXISTS " + quoteIdent(cfg.Database)
	create := func(conn driver.Conn) error {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name = ?", cfg.Database).Scan(&n); err != nil || n > 0 {
			return err
		}
		return conn.Exec(cfg.Replication.ddlContext(ctx), ddl)
	}
	if c := cfg.Replication.Cluster; cfg.Replication.Enabled && c != "" {
		ddl += " ON CLUSTER " + quoteIdent(c)
		err = rs.write(ctx, create)
	} else {
		err = reachable(rs.each(func(_ int, r *replica) error { return r.do(create) }))
	}
	if err != nil {
		return fmt.Errorf("rank: create database %s: %w", cfg.Database, err)
	}
	return nil
}

// reachable is nil when at least one replica succeeded, else every replica's error.
func reachable(errs []error) error {
	for _, err := range errs {
		if err == nil {
			return nil
		}
	}
	return errors.Join(errs...)
}

// Open connects to cfg.Database and checks that ClickHouse answers: the node, or at least one
// replica (the others may be down now and serve later; Ping says when reads can be served).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	rs, err := openReplicas(cfg, cfg.Database)
	if err != nil {
		return nil, err
	}
	s := &Store{rs: rs, db: cfg.Database, replication: cfg.Replication, readThreads: cfg.ReadThreads}
	if err := rs.readFrom(ctx, 1, func(conn driver.Conn) error { return conn.Ping(ctx) }); err != nil {
		rs.close()
		return nil, fmt.Errorf("rank: %w", err)
	}
	if err := s.checkReplication(ctx); err != nil {
		rs.close()
		return nil, err
	}
	return s, nil
}

// Close releases the connections.
func (s *Store) Close() error { return s.rs.close() }

// Ping checks that ClickHouse answers: the node, or as many replicas as a read needs.
func (s *Store) Ping(ctx context.Context) error {
	return s.rs.read(ctx, func(conn driver.Conn) error { return conn.Ping(ctx) })
}

// ReplicaCounter is how one replica served reads.
type ReplicaCounter struct {
	Addr      string
	Reads     func() uint64 // reads it answered
	Failovers func() uint64 // reads that failed on it and went to another replica
}

// ReplicaCounters are the read counters of every replica (none on one node).
func (s *Store) ReplicaCounters() []ReplicaCounter {
	if !s.replication.Enabled {
		return nil
	}
	out := make([]ReplicaCounter, 0, len(s.rs.replicas))
	for _, r := range s.rs.replicas {
		out = append(out, ReplicaCounter{Addr: r.addr, Reads: r.reads.Load, Failovers: r.failovers.Load})
	}
	return out
}

// Insert writes records in one batch. Writing a record again is harmless: reads collapse rows by
// event id, keeping the one with the lowest stream sequence.
func (s *Store) Insert(ctx context.Context, recs []rank.Record) error {
	if len(recs) == 0 {
		return nil
	}
	metrics := make([]string, len(recs))
	for i, r := range recs {
		ms := r.Evaluation.Metrics
		if ms == nil {
			ms = []events.Metric{}
		}
		mj, err := json.Marshal(ms)
		if err != nil {
			return fmt.Errorf("rank: encode metrics of %s: %w", r.EventID, err)
		}
		metrics[i] = string(mj)
	}
	err := s.rs.write(ctx, func(conn driver.Conn) error {
		// 18.16 needs the explicit column list for a native-protocol batch.
		batch, err := conn.PrepareBatch(ctx, `INSERT INTO evaluations (execution_id, team_id, round_number, event_id,
		team_name, overall_score, metrics, feedback, submission, submission_format, evaluated_at,
		evaluated_at_us, event_source, stream_seq, stream_era)`)
		if err != nil {
			return err
		}
		defer batch.Abort()
		for i, r := range recs {
			if err := batch.Append(r.ExecutionID, r.TeamID, uint32(r.RoundNumber), r.EventID,
				r.TeamName, r.Evaluation.OverallScore, metrics[i], r.Evaluation.Feedback,
				r.Submission.Content, r.Submission.Format, r.EvaluatedAt.Format(time.RFC3339Nano),
				r.EvaluatedAt.UnixMicro(), r.Source, r.Seq, r.Era); err != nil {
				return &clientConversion{fmt.Errorf("append %s: %w", r.EventID, err)}
			}
		}
		return batch.Send()
	})
	if err != nil {
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
