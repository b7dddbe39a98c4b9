package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// ClickHouse is where a service reads ClickHouse: the composer and the console read only.
type ClickHouse struct {
	ClickHouseAddr     []string `envconfig:"CLICKHOUSE_ADDR" default:"127.0.0.1:9000" desc:"ClickHouse native-protocol host:port list, comma-separated"`
	ClickHouseDatabase string   `envconfig:"CLICKHOUSE_DATABASE" default:"rounds" desc:"ClickHouse database (created by the ranker if missing)"`
	ClickHouseUser     string   `envconfig:"CLICKHOUSE_USER" default:"default" desc:"ClickHouse user"`
	ClickHousePassword string   `envconfig:"CLICKHOUSE_PASSWORD" desc:"ClickHouse password"`
	// 1 from BenchmarkScoresReadThreads: 16 readers at once did 1.4x the reads/s of the server's
	// default (2 on 2 cores) at 0.67x its CPU per read, and 2x those of 16 threads.
	ClickHouseReadThreads int `envconfig:"CLICKHOUSE_READ_THREADS" default:"1" desc:"ClickHouse max_threads of the reads of one execution's rows (scores, content, history); 0 = the server's default, one per core"`

	ClickHouseReplicated    bool   `envconfig:"CLICKHOUSE_REPLICATED" default:"false" desc:"CLICKHOUSE_ADDR lists every replica of one shard: replicated tables, quorum writes, quorum reads"`
	ClickHouseCluster       string `envconfig:"CLICKHOUSE_CLUSTER" desc:"with CLICKHOUSE_REPLICATED: run the migrations ON CLUSTER of this remote_servers name instead of on each address"`
	ClickHouseZooKeeperPath string `envconfig:"CLICKHOUSE_ZOOKEEPER_PATH" default:"/clickhouse/tables/{shard}" desc:"ZooKeeper path prefix of replicated tables (database and table names are appended; macros are the servers')"`
	ClickHouseReplicaName   string `envconfig:"CLICKHOUSE_REPLICA_NAME" default:"{replica}" desc:"replica name of replicated tables, normally the servers' {replica} macro"`
}

// Validate checks where ClickHouse is; prefix is the service's, for the messages.
func (c *ClickHouse) Validate(prefix string) error {
	var errs []error
	if len(c.ClickHouseAddr) == 0 {
		errs = append(errs, fmt.Errorf("%s must name at least one host:port", variable("CLICKHOUSE_ADDR", prefix)))
	}
	for _, a := range c.ClickHouseAddr {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not host:port", variable("CLICKHOUSE_ADDR", prefix), a))
		}
	}
	if c.ClickHouseReadThreads < 0 {
		errs = append(errs, fmt.Errorf("%s must be 0 (the server's default) or more, got %d", variable("CLICKHOUSE_READ_THREADS", prefix), c.ClickHouseReadThreads))
	}
	if !c.ClickHouseReplicated {
		if c.ClickHouseCluster != "" {
			errs = append(errs, fmt.Errorf("%s needs CLICKHOUSE_REPLICATED=true", variable("CLICKHOUSE_CLUSTER", prefix)))
		}
		return errors.Join(errs...)
	}
	if !strings.HasPrefix(c.ClickHouseZooKeeperPath, "/") {
		errs = append(errs, fmt.Errorf("%s must be an absolute ZooKeeper path, got %q", variable("CLICKHOUSE_ZOOKEEPER_PATH", prefix), c.ClickHouseZooKeeperPath))
	}
	if c.ClickHouseReplicaName == "" {
		errs = append(errs, fmt.Errorf("%s must not be empty", variable("CLICKHOUSE_REPLICA_NAME", prefix)))
	}
	return errors.Join(errs...)
}

// Store returns where ClickHouse is and how it replicates; log hears of replicas failing over.
func (c *ClickHouse) Store(log *slog.Logger) chstore.Config {
	return chstore.Config{
		Addrs: c.ClickHouseAddr, Database: c.ClickHouseDatabase, User: c.ClickHouseUser, Password: c.ClickHousePassword,
		ReadThreads: c.ClickHouseReadThreads,
		Replication: chstore.Replication{
			Enabled:       c.ClickHouseReplicated,
			Cluster:       c.ClickHouseCluster,
			ZooKeeperPath: c.ClickHouseZooKeeperPath,
			ReplicaName:   c.ClickHouseReplicaName,
		},
		Log: log,
	}
}

// ClickHouseWriter is where a service that writes ClickHouse (the ranker, the archiver, `podium
// store rebuild`) writes it: ClickHouse, and how many replicas confirm each insert.
type ClickHouseWriter struct {
	ClickHouse
	ClickHouseInsertQuorum        int           `envconfig:"CLICKHOUSE_INSERT_QUORUM" default:"0" desc:"replicas that must have a row before it is acknowledged; 0 = a majority of CLICKHOUSE_ADDR"`
	ClickHouseInsertQuorumTimeout time.Duration `envconfig:"CLICKHOUSE_INSERT_QUORUM_TIMEOUT" default:"10s" desc:"longest wait for the quorum of one insert; it is then retried (writes are idempotent)"`
}

// Validate checks the reader's settings and the quorum's.
func (c *ClickHouseWriter) Validate(prefix string) error {
	errs := []error{c.ClickHouse.Validate(prefix)}
	if c.ClickHouseReplicated {
		if q := c.ClickHouseInsertQuorum; q < 0 || q > len(c.ClickHouseAddr) {
			errs = append(errs, fmt.Errorf("%s must be 0 (a majority) to the %d replicas of CLICKHOUSE_ADDR, got %d", variable("CLICKHOUSE_INSERT_QUORUM", prefix), len(c.ClickHouseAddr), q))
		}
		if c.ClickHouseInsertQuorumTimeout < time.Second {
			errs = append(errs, fmt.Errorf("%s must be at least 1s, got %s", variable("CLICKHOUSE_INSERT_QUORUM_TIMEOUT", prefix), c.ClickHouseInsertQuorumTimeout))
		}
	}
	return errors.Join(errs...)
}

// Store is the reader's, with the quorum of inserts.
func (c *ClickHouseWriter) Store(log *slog.Logger) chstore.Config {
	cfg := c.ClickHouse.Store(log)
	cfg.Replication.InsertQuorum, cfg.Replication.InsertQuorumTimeout = c.ClickHouseInsertQuorum, c.ClickHouseInsertQuorumTimeout
	return cfg
}

// StoreMetrics exports how the store's replicas serve reads (on a cluster; one node has none):
// <service>_store_replica_reads_total{replica}, reads each replica answered (a read asks a
// quorum of them), and <service>_store_read_failovers_total{replica}, reads that failed on a
// replica (down, cut off from ZooKeeper, table missing) and went to another.
func (b *Base) StoreMetrics(st *chstore.Store) {
	f := promauto.With(b.Reg)
	for _, r := range st.ReplicaCounters() {
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: b.Name, Name: "store_replica_reads_total",
			Help: "Reads this ClickHouse replica answered.", ConstLabels: prometheus.Labels{"replica": r.Addr}},
			func() float64 { return float64(r.Reads()) })
		f.NewCounterFunc(prometheus.CounterOpts{Namespace: b.Name, Name: "store_read_failovers_total",
			Help: "Reads that failed on this ClickHouse replica and were given to another.", ConstLabels: prometheus.Labels{"replica": r.Addr}},
			func() float64 { return float64(r.Failovers()) })
	}
}

// OpenStore creates the database if needed, connects to it and applies the migrations that are
// missing, logging each: what the services that write ClickHouse (the ranker, the archiver) do
// first. It returns the store and the names of the migrations applied.
func OpenStore(ctx context.Context, cfg chstore.Config, log *slog.Logger) (*chstore.Store, []string, error) {
	if err := chstore.CreateDatabase(ctx, cfg); err != nil {
		return nil, nil, err
	}
	st, err := chstore.Open(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	applied, err := st.Migrate(ctx)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	for _, name := range applied {
		log.Info("migration applied", "migration", name)
	}
	return st, applied, nil
}
