package chstore

import (
	"context"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// ReplicaStatus is what one ClickHouse node says of itself and of the evaluations it holds, for
// operators (`podium store status`) and tests.
type ReplicaStatus struct {
	Addr string
	Err  error // set when the node did not answer; nothing else is then known

	Rows   uint64 // rows of evaluations stored here (every copy, before merges)
	MaxSeq uint64 // the highest EVALUATIONS sequence stored here

	// Replicated tables only (system.replicas); Replicated is false on one node.
	Replicated     bool
	ReadOnly       bool   // lost ZooKeeper: serves old reads, takes no writes
	QueueSize      uint64 // replication tasks waiting here (fetches, merges)
	InsertsInQueue uint64 // parts written elsewhere not fetched yet
	LogLag         uint64 // replication log entries not yet read
	AbsoluteDelay  uint64 // seconds this replica is behind the newest part it knows of
	ActiveReplicas uint8
	TotalReplicas  uint8
}

// statusQuery is how much a replica holds.
const statusQuery = "SELECT count(), max(stream_seq) FROM evaluations"

// Status asks every replica (or the one node) about itself, each on its own: a lagging replica
// says how far behind it is.
func (s *Store) Status(ctx context.Context) []ReplicaStatus {
	out := make([]ReplicaStatus, len(s.rs.replicas))
	s.rs.each(func(i int, r *replica) error {
		st := &out[i]
		st.Addr = r.addr
		st.Err = r.do(func(conn driver.Conn) error { return s.status(ctx, conn, st) })
		return nil
	})
	return out
}

func (s *Store) status(ctx context.Context, conn driver.Conn, st *ReplicaStatus) error {
	if err := conn.QueryRow(ctx, statusQuery).Scan(&st.Rows, &st.MaxSeq); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `SELECT is_readonly, queue_size, inserts_in_queue, log_max_index - log_pointer,
	absolute_delay, active_replicas, total_replicas FROM system.replicas WHERE database = ? AND table = 'evaluations'`, s.db)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var readOnly uint8
		var queue, inserts uint32
		var logLag int64 // a difference of two UInt64: Int64
		if err := rows.Scan(&readOnly, &queue, &inserts, &logLag, &st.AbsoluteDelay, &st.ActiveReplicas, &st.TotalReplicas); err != nil {
			return err
		}
		st.LogLag = uint64(max(logLag, 0))
		st.Replicated, st.ReadOnly = true, readOnly != 0
		st.QueueSize, st.InsertsInQueue = uint64(queue), uint64(inserts)
	}
	return rows.Err()
}
