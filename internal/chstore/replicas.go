package chstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// replica is one connection pool. A replicated store has one per address; a single-node store
// has one over all addresses (the driver then fails over when it dials, as it always did).
type replica struct {
	addr string // what logs, metrics and errors call it
	conn driver.Conn

	// downUntil (unix nanoseconds) keeps reads away from a replica that just failed, so a dead
	// one costs one failed attempt per interval, not one per read.
	downUntil atomic.Int64
	reads     atomic.Uint64 // reads this replica answered
	failovers atomic.Uint64 // reads that failed here and went to another replica
}

// replicaSet says which replicas a query goes to.
//
// Reads are quorum reads. Every write the ranker acknowledged is on at least Q of the N
// replicas (its insert quorum), so any N-Q+1 replicas hold it between them: a read asks that
// many and takes the union of their rows, which the reductions collapse by event id (copies of
// an id are harmless). No replica has to be caught up, and none is trusted to be: a lagging
// one, or one that fetched parts out of order, only adds fewer rows to the union. (ClickHouse's
// select_sequential_consistency is not enough: it checks that a replica has the newest quorum
// part, not the ones before it.) Reads start at a different replica each time, spreading them.
//
// Writes go to one replica at a time and move to the next when it fails.
type replicaSet struct {
	replicas []*replica
	need     int           // replicas a read must hear from: N-Q+1, 1 on one node
	next     atomic.Uint64 // round-robin start of the next read
	writer   atomic.Uint64 // index of the replica writes go to
	log      *slog.Logger
	now      func() time.Time
}

// downFor is how long a replica that failed a query is passed over while others answer.
const downFor = 2 * time.Second

// openReplicas connects one pool per address (replicated) or one over all of them.
func openReplicas(cfg Config, database string) (*replicaSet, error) {
	groups := [][]string{cfg.Addrs}
	need := 1
	if cfg.Replication.Enabled {
		groups = groups[:0]
		for _, a := range cfg.Addrs {
			groups = append(groups, []string{a})
		}
		need = len(cfg.Addrs) - cfg.Replication.quorum(len(cfg.Addrs)) + 1
	}
	rs := &replicaSet{need: need, log: cfg.Log, now: time.Now}
	if rs.log == nil {
		rs.log = slog.New(slog.DiscardHandler)
	}
	for _, addrs := range groups {
		opts := cfg.options(database)
		opts.Addr = addrs
		opts.Settings = cfg.Replication.settings(len(cfg.Addrs))
		conn, err := clickhouse.Open(opts)
		if err != nil {
			rs.close()
			return nil, fmt.Errorf("rank: clickhouse at %v: %w", addrs, err)
		}
		rs.replicas = append(rs.replicas, &replica{addr: joinAddrs(addrs), conn: conn})
	}
	return rs, nil
}

func joinAddrs(addrs []string) string {
	if len(addrs) == 1 {
		return addrs[0]
	}
	return fmt.Sprint(addrs)
}

func (rs *replicaSet) close() error {
	var errs []error
	for _, r := range rs.replicas {
		errs = append(errs, r.conn.Close())
	}
	return errors.Join(errs...)
}

// order is the replicas to try for one query, starting at start: those not marked down first,
// then the ones marked down (when every replica failed lately, trying them is all there is).
func (rs *replicaSet) order(start uint64) []*replica {
	n := uint64(len(rs.replicas))
	now := rs.now().UnixNano()
	out := make([]*replica, 0, n)
	var down []*replica
	for i := range n {
		r := rs.replicas[(start+i)%n]
		if r.downUntil.Load() > now {
			down = append(down, r)
			continue
		}
		out = append(out, r)
	}
	return append(out, down...)
}

// read runs q on rs.need replicas, the next ones in turn, skipping those that fail as a replica
// fails (down, unreachable, without ZooKeeper, table missing). q adds the rows it scans to what
// earlier calls gathered: rows of a replica that failed midway are real rows too, so nothing is
// undone. An error that any replica would give (a bad query) is returned at once.
func (rs *replicaSet) read(ctx context.Context, q func(driver.Conn) error) error {
	return rs.readFrom(ctx, rs.need, q)
}

// readFrom is read from need replicas.
func (rs *replicaSet) readFrom(ctx context.Context, need int, q func(driver.Conn) error) error {
	got := 0
	var errs []error
	for _, r := range rs.order(rs.next.Add(1)) {
		err := r.do(q)
		if err == nil {
			r.reads.Add(1)
			if got++; got == need {
				return nil
			}
			continue
		}
		if ctx.Err() != nil || !replicaFault(err) {
			return err
		}
		errs = append(errs, err)
		if len(rs.replicas) > 1 {
			r.failovers.Add(1)
			r.downUntil.Store(rs.now().Add(downFor).UnixNano())
			rs.log.WarnContext(ctx, "clickhouse read failed on a replica, trying another", "replica", r.addr, "error", err)
		}
	}
	if len(rs.replicas) == 1 {
		return errs[0]
	}
	return fmt.Errorf("a quorum read needs %d of the %d replicas, %d answered: %w", need, len(rs.replicas), got, errors.Join(errs...))
}

// write runs w on the replica writes go to, moving to the next one when it fails as a replica
// fails. Other errors, quorum errors among them, are returned at once: every replica shares the
// quorum's state, so another one would answer the same, and the caller retries later.
func (rs *replicaSet) write(ctx context.Context, w func(driver.Conn) error) error {
	n := uint64(len(rs.replicas))
	start := rs.writer.Load()
	var err error
	for i := range n {
		idx := (start + i) % n
		r := rs.replicas[idx]
		if err = r.do(w); err == nil {
			rs.writer.Store(idx)
			return nil
		}
		if ctx.Err() != nil || !replicaFault(err) {
			return err
		}
		if n > 1 {
			rs.log.WarnContext(ctx, "clickhouse write failed on a replica, trying another", "replica", r.addr, "error", err)
		}
	}
	rs.writer.Store((start + 1) % n)
	return err
}

// each runs f on every replica, for what must happen on all of them (migrations, status).
func (rs *replicaSet) each(f func(i int, r *replica) error) []error {
	errs := make([]error, len(rs.replicas))
	for i, r := range rs.replicas {
		errs[i] = f(i, r)
	}
	return errs
}

// do runs f on the replica's pool and says which ClickHouse failed.
func (r *replica) do(f func(driver.Conn) error) error {
	if err := f(r.conn); err != nil {
		return &ReplicaError{Addr: r.addr, Err: err}
	}
	return nil
}

// ReplicaError is a failure of the ClickHouse at Addr.
type ReplicaError struct {
	Addr string
	Err  error
}

func (e *ReplicaError) Error() string { return fmt.Sprintf("clickhouse at %s: %v", e.Addr, e.Err) }
func (e *ReplicaError) Unwrap() error { return e.Err }

// replicaFaults are the ClickHouse errors of one replica rather than of the query: another
// replica may well answer.
var replicaFaults = []int32{
	60,  // UNKNOWN_TABLE: a replica not migrated yet
	81,  // UNKNOWN_DATABASE
	159, // TIMEOUT_EXCEEDED
	209, // SOCKET_TIMEOUT
	210, // NETWORK_ERROR
	225, // NO_ZOOKEEPER
	242, // TABLE_IS_READ_ONLY: the replica lost ZooKeeper
	999, // KEEPER_EXCEPTION
}

// replicaFault reports whether err is a failure of the replica (it is down, unreachable, cut
// off from ZooKeeper, or lacks the table) rather than one every replica would give.
func replicaFault(err error) bool {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return slices.Contains(replicaFaults, ex.Code)
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, clickhouse.ErrAcquireConnTimeout)
}
