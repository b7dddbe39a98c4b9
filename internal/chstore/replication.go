package chstore

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Replication says how the store runs on a ClickHouse cluster. The zero value is one node, as
// before: plain MergeTree tables, no quorum, reads from whatever address answers.
//
// With Enabled, tables are Replicated*MergeTree, coordinated by ZooKeeper (or ClickHouse
// Keeper), and every address of Config.Addrs is a replica of the one shard (all of them must be
// listed: reads count on it). Writes are quorum inserts: ClickHouse answers only when
// InsertQuorum replicas have the rows, so the ranker acks an evaluation only when losing a
// replica cannot lose it. Reads are quorum reads (replicas.go): together with the quorum writes
// they keep read-your-writes (docs/contract.md#read-your-writes) on any replicas, lagging or not.
type Replication struct {
	Enabled bool
	// Cluster, when set, names the remote_servers cluster the DDL runs on (ON CLUSTER) instead of
	// every address of Config.Addrs.
	Cluster string
	// ZooKeeperPath is the prefix of each table's path in ZooKeeper; the database and table names
	// are appended. Macros such as {shard} are the servers' own.
	ZooKeeperPath string
	// ReplicaName names the replica in ZooKeeper, normally the {replica} macro.
	ReplicaName string
	// InsertQuorum is how many replicas must have a write before it succeeds; 0 means a
	// majority of Config.Addrs.
	InsertQuorum int
	// InsertQuorumTimeout bounds the wait for the quorum; past it ClickHouse answers "unknown
	// status" (the rows may still replicate), and the ranker retries the idempotent write.
	InsertQuorumTimeout time.Duration
}

// quorum is the insert quorum for n replica addresses.
func (r Replication) quorum(n int) int {
	if r.InsertQuorum > 0 {
		return r.InsertQuorum
	}
	return n/2 + 1
}

// settings are the query settings of every connection of a replicated store; they apply to
// inserts only, so one set serves all queries.
func (r Replication) settings(addrs int) clickhouse.Settings {
	if !r.Enabled {
		return nil
	}
	timeout := r.InsertQuorumTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	// Plain ints: servers before 19.x take settings as varints, and the driver encodes only int
	// and bool that way.
	return clickhouse.Settings{
		"insert_quorum":         r.quorum(addrs),
		"insert_quorum_timeout": int(timeout.Milliseconds()),
	}
}

var (
	createTable = regexp.MustCompile(`(?i)^(\s*CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+)([A-Za-z_][A-Za-z0-9_]*)(\s*)`)
	engine      = regexp.MustCompile(`(?i)\bENGINE\s*=\s*([A-Za-z]*MergeTree)\s*\(([^)]*)\)`)
)

// statement turns a migration statement written for one node (schemas/clickhouse holds those)
// into its replicated form: a *MergeTree engine becomes Replicated*MergeTree with this
// database's and table's ZooKeeper path, and with a cluster the DDL runs ON CLUSTER. The
// migration files stay readable as plain single-node DDL, and both forms come from one source.
func (r Replication) statement(st, database string) (string, error) {
	if !r.Enabled {
		return st, nil
	}
	m := createTable.FindStringSubmatch(st)
	if m == nil {
		return st, nil // not a table: the same on every node
	}
	table := m[2]
	st = r.onCluster(st)
	em := engine.FindStringSubmatch(st)
	if em == nil {
		return "", fmt.Errorf("rank: table %s has no MergeTree engine to replicate", table)
	}
	if strings.HasPrefix(strings.ToLower(em[1]), "replicated") {
		return st, nil
	}
	args := []string{quoteString(r.zooKeeperPath(database, table)), quoteString(r.replicaName())}
	if a := strings.TrimSpace(em[2]); a != "" {
		args = append(args, a)
	}
	repl := "ENGINE = Replicated" + em[1] + "(" + strings.Join(args, ", ") + ")"
	return engine.ReplaceAllLiteralString(st, repl), nil
}

// ddlContext bounds how long ON CLUSTER DDL waits for every host (180 s by default): a host that
// is down fails the migration in 30 s, saying which.
func (r Replication) ddlContext(ctx context.Context) context.Context {
	if !r.Enabled || r.Cluster == "" {
		return ctx
	}
	return clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"distributed_ddl_task_timeout": 30}))
}

// onCluster makes a CREATE TABLE run on every node of the cluster, when one is named.
func (r Replication) onCluster(st string) string {
	if !r.Enabled || r.Cluster == "" {
		return st
	}
	return createTable.ReplaceAllString(st, "${1}${2} ON CLUSTER "+quoteIdent(r.Cluster)+"${3}")
}

func (r Replication) zooKeeperPath(database, table string) string {
	prefix := strings.TrimSuffix(r.ZooKeeperPath, "/")
	if prefix == "" {
		prefix = "/clickhouse/tables/{shard}"
	}
	return prefix + "/" + database + "/" + table
}

func (r Replication) replicaName() string {
	if r.ReplicaName == "" {
		return "{replica}"
	}
	return r.ReplicaName
}

// ClickHouse error codes the store acts on.
const (
	codeTooFewLiveReplicas    = 285 // fewer live replicas than the quorum
	codeUnsatisfiedQuorum     = 286 // an earlier quorum insert is not satisfied yet
	codeUnknownStatusOfInsert = 319 // the quorum was not reached in time; the rows may land
)

// IsQuorumError reports whether err says the replicas could not confirm a write: too few are
// alive, an earlier write still waits for its quorum, or the wait timed out. Retrying the same
// rows later is right (writes are idempotent); another replica would say the same now.
func IsQuorumError(err error) bool {
	switch exceptionCode(err) {
	case codeTooFewLiveReplicas, codeUnsatisfiedQuorum, codeUnknownStatusOfInsert:
		return true
	}
	return false
}

// IsQuorumBusy reports whether a quorum insert was refused because an earlier one is still
// being confirmed: 18.16 confirms one at a time, so writers sharing the cluster take turns.
func IsQuorumBusy(err error) bool { return exceptionCode(err) == codeUnsatisfiedQuorum }

func exceptionCode(err error) int32 {
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return ex.Code
	}
	return 0
}

func quoteString(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
