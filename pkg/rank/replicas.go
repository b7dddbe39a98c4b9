package rank

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// or lagging one costs one failed attempt per interval, not one per read.
	downUntil atomic.Int64
	failovers atomic.Uint64 // reads that failed here and moved on
}

// replicaSet spreads reads over the replicas and sends writes to one at a time, moving on when
// a replica fails.
type replicaSet struct {
	replicas []*replica
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
	if cfg.Replication.Enabled {
		groups = groups[:0]
		for _, a := range cfg.Addrs {
			groups = append(groups, []string{a})
		}
	}
	rs := &replicaSet{log: cfg.Log, now: time.Now}
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

// read runs q on one replica, the next in turn, and on the next ones while it fails: a replica
// that is down, lost ZooKeeper or lags behind the quorum (code 289) gives the read to another.
// q must start from scratch on each call. The error of the last replica is returned when none
// answered, naming it.
func (rs *replicaSet) read(ctx context.Context, q func(driver.Conn) error) error {
	if len(rs.replicas) == 1 {
		return rs.replicas[0].do(q)
	}
	var err error
	for _, r := range rs.order(rs.next.Add(1)) {
		if err = r.do(q); err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		r.failovers.Add(1)
		r.downUntil.Store(rs.now().Add(downFor).UnixNano())
		rs.log.Warn("clickhouse read failed on a replica, trying another", "replica", r.addr, "lagging", IsLagging(err), "error", err)
	}
	return err
}

// write runs w on the replica writes go to, moving to the next one when it cannot be reached
// or refuses. Quorum errors are returned at once: every replica shares the quorum's state, so
// another one would answer the same, and the caller retries later.
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
		if ctx.Err() != nil || IsQuorumError(err) {
			return err
		}
		if n > 1 {
			rs.log.Warn("clickhouse write failed on a replica, trying another", "replica", r.addr, "error", err)
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
