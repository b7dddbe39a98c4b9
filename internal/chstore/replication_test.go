package chstore

import (
	"strings"
	"testing"
)

func TestReplicatedStatements(t *testing.T) {
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	evaluations := migs[0].Statements[0]
	tests := []struct {
		name string
		r    Replication
		st   string
		want []string // substrings of the result, in order
		not  []string
	}{
		{"one node changes nothing", Replication{}, evaluations, []string{"ENGINE = ReplacingMergeTree(keep_version)"}, []string{"Replicated", "ON CLUSTER"}},
		{"replicated on each address", Replication{Enabled: true}, evaluations,
			[]string{"CREATE TABLE IF NOT EXISTS evaluations (", "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/rounds/evaluations', '{replica}', keep_version)", "ORDER BY (execution_id, team_id, event_id)", "index_granularity = 256"},
			[]string{"ON CLUSTER"}},
		{"on a cluster, own path and replica name", Replication{Enabled: true, Cluster: "podium", ZooKeeperPath: "/ch/{shard}/", ReplicaName: "{host}"}, evaluations,
			[]string{"CREATE TABLE IF NOT EXISTS evaluations ON CLUSTER `podium` (", "ReplicatedReplacingMergeTree('/ch/{shard}/rounds/evaluations', '{host}', keep_version)"}, nil},
		{"an engine without arguments", Replication{Enabled: true}, "CREATE TABLE IF NOT EXISTS t (a UInt8) ENGINE = MergeTree() ORDER BY a",
			[]string{"ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/rounds/t', '{replica}') ORDER BY a"}, nil},
		{"already replicated stays", Replication{Enabled: true}, "CREATE TABLE IF NOT EXISTS t (a UInt8) ENGINE = ReplicatedMergeTree('/x', 'y') ORDER BY a",
			[]string{"ENGINE = ReplicatedMergeTree('/x', 'y')"}, []string{"ReplicatedReplicated"}},
		{"not a table", Replication{Enabled: true, Cluster: "c"}, "ALTER TABLE t ADD COLUMN b UInt8", []string{"ALTER TABLE t ADD COLUMN b UInt8"}, []string{"ON CLUSTER"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.r.statement(tt.st, "rounds")
			if err != nil {
				t.Fatal(err)
			}
			rest := got
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("missing %q (in order) in:\n%s", w, got)
				}
				rest = rest[i+len(w):]
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Errorf("has %q:\n%s", n, got)
				}
			}
		})
	}
	if _, err := (Replication{Enabled: true}).statement("CREATE TABLE IF NOT EXISTS t (a UInt8) ENGINE = Log", "db"); err == nil {
		t.Error("a table without a MergeTree engine was accepted for replication")
	}
}

func TestQuorumIsAMajorityByDefault(t *testing.T) {
	for _, tt := range []struct{ set, addrs, want int }{{0, 1, 1}, {0, 2, 2}, {0, 3, 2}, {0, 5, 3}, {3, 3, 3}, {1, 3, 1}} {
		if got := (Replication{Enabled: true, InsertQuorum: tt.set}).quorum(tt.addrs); got != tt.want {
			t.Errorf("quorum(InsertQuorum %d, %d addresses) = %d, want %d", tt.set, tt.addrs, got, tt.want)
		}
	}
}
