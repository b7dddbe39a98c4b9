package chstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// A rebuild (podium store rebuild) writes the EVALUATIONS stream into the store again and notes
// how far it got in rebuild_progress, a table of its own beside evaluations: an interrupted
// rebuild resumes there. The note lives in the database it describes, so a database dropped
// again takes its note with it; and a note is trusted only while evaluations still holds the row
// it points at (a table dropped alone leaves a note that would skip rows). The table is
// migration 0002's, so a rebuild from the start notes its progress on any database.

// RebuildFrom is the EVALUATIONS sequence a rebuild resumes after: the last one it noted, when
// the evaluations table still holds that row; else 0 (from the start).
func (s *Store) RebuildFrom(ctx context.Context) (uint64, error) {
	var noted uint64
	if err := s.query(ctx, "SELECT max(stream_seq) FROM rebuild_progress", nil, func(rows driver.Rows) error {
		var seq uint64
		if err := rows.Scan(&seq); err != nil {
			return err
		}
		noted = max(noted, seq)
		return nil
	}); err != nil || noted == 0 {
		return 0, err
	}
	var held uint64
	if err := s.query(ctx, "SELECT count() FROM evaluations WHERE stream_seq = ?", []any{noted}, func(rows driver.Rows) error {
		var n uint64
		if err := rows.Scan(&n); err != nil {
			return err
		}
		held += n
		return nil
	}); err != nil {
		return 0, fmt.Errorf("rank: rebuild progress: %w", err)
	}
	if held == 0 {
		return 0, nil
	}
	return noted, nil
}

// NoteRebuilt records that every evaluation up to seq is written.
func (s *Store) NoteRebuilt(ctx context.Context, seq uint64) error {
	return s.rs.write(ctx, func(conn driver.Conn) error {
		batch, err := conn.PrepareBatch(ctx, "INSERT INTO rebuild_progress (stream_seq, noted_at)")
		if err != nil {
			return err
		}
		defer batch.Abort()
		if err := batch.Append(seq, time.Now()); err != nil {
			return err
		}
		return batch.Send()
	})
}
