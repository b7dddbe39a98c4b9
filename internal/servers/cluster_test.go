package servers_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/servers"
)

type row struct {
	ID   uint64
	Name string
	V    uint64
}

// TestClusterSurvivesReplicaLoss runs a three-replica cluster through a crash: quorum inserts go
// on while one replica is killed, and the replica catches up on its own data after it starts again.
func TestClusterSurvivesReplicaLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts ZooKeeper and three clickhouse-servers")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	start := time.Now()
	cl, err := servers.StartClickHouseCluster(ctx, t.TempDir(), 3)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Stop() })
	t.Logf("cluster of ZooKeeper and 3 replicas started in %s", time.Since(start).Round(time.Millisecond))
	if got, want := len(cl.Addrs()), 3; got != want {
		t.Fatalf("Addrs() has %d addresses, want %d", got, want)
	}
	if mode, err := cl.ZooKeeper.Mode(ctx); err != nil || mode != "standalone" {
		t.Fatalf("ZooKeeper mode = %q, %v; want standalone", mode, err)
	}

	conns := make([]driver.Conn, len(cl.Replicas))
	for i := range cl.Replicas {
		conns[i] = connect(t, cl.Replicas[i])
	}
	table := func(db string) string {
		return fmt.Sprintf(`(id UInt64, name String, v UInt64)
			ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/%s/t', '{replica}', v)
			ORDER BY id`, db)
	}

	// "local": created on each replica by hand, as a migration run against every server would.
	for i, conn := range conns {
		for _, q := range []string{"CREATE DATABASE local", "CREATE TABLE local.t " + table("local")} {
			if err := conn.Exec(ctx, q); err != nil {
				t.Fatalf("replica %d: %s: %v", i+1, q, err)
			}
		}
	}
	// "ddl": created once with ON CLUSTER; every replica must then have it.
	for _, q := range []string{
		"CREATE DATABASE ddl ON CLUSTER " + cl.Name,
		"CREATE TABLE ddl.t ON CLUSTER " + cl.Name + " " + table("ddl"),
	} {
		if err := conns[0].Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for i, conn := range conns {
		var n uint64
		if err := conn.QueryRow(ctx, "SELECT count() FROM system.tables WHERE database = 'ddl' AND name = 't'").Scan(&n); err != nil {
			t.Fatalf("replica %d: %v", i+1, err)
		}
		if n != 1 {
			t.Fatalf("replica %d has no ddl.t after CREATE TABLE ON CLUSTER", i+1)
		}
	}

	dbs := []string{"local", "ddl"}
	want := []row{{1, "before", 1}, {2, "during", 1}}
	for _, db := range dbs {
		insertQuorum(ctx, t, conns[0], db, want[0])
	}

	// Replica 3 holds "before" before it is killed. Killed around that fetch, it came back without
	// "before" for over 30 s after its sync in full runs on a loaded machine (three times; never
	// alone), most likely a part found broken at restart and fetched again only when its part
	// check came round: a fault of the kill's timing, not the catching up this test is about.
	for _, db := range dbs {
		if err := conns[2].Exec(ctx, "SYSTEM SYNC REPLICA "+db+".t"); err != nil {
			t.Fatalf("sync replica 3 %s.t before the kill: %v", db, err)
		}
	}
	r3 := cl.Replicas[2]
	if err := r3.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, db := range dbs {
		insertQuorum(ctx, t, conns[0], db, want[1])
	}

	start = time.Now()
	if err := r3.Start(ctx); err != nil {
		t.Fatalf("%v\n%s", err, r3.Logs())
	}
	t.Logf("killed replica started again in %s", time.Since(start).Round(time.Millisecond))
	conns[2] = connect(t, r3) // the old connection died with the server

	start = time.Now()
	for _, db := range dbs {
		if err := conns[2].Exec(ctx, "SYSTEM SYNC REPLICA "+db+".t"); err != nil {
			t.Fatalf("sync replica 3 %s.t: %v\n%s", db, err, r3.Logs())
		}
	}
	t.Logf("SYSTEM SYNC REPLICA on the restarted replica took %s", time.Since(start).Round(time.Millisecond))

	// SYNC REPLICA returns once the queue is empty; a part whose fetch the kill cut off is fetched
	// again after the queue's postponement (seen under a loaded machine: "before" came seconds
	// later), so every replica must converge to both rows, within a bound.
	for _, db := range dbs {
		for i, conn := range conns {
			var diff string
			deadline := time.Now().Add(30 * time.Second)
			for {
				if diff = cmp.Diff(want, selectRows(ctx, t, conn, db)); diff == "" || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if diff != "" {
				t.Errorf("replica %d %s.t rows 30s after the sync (-want +got):\n%s", i+1, db, diff)
			}
		}
	}
}

func TestStartZooKeeperWithoutJava(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := servers.StartZooKeeper(t.Context(), t.TempDir())
	if !errors.Is(err, servers.ErrNoZooKeeper) {
		t.Fatalf("StartZooKeeper without java: %v, want ErrNoZooKeeper", err)
	}
	if !strings.Contains(err.Error(), "apt-get install -y zookeeper") {
		t.Errorf("error %q does not say how to install ZooKeeper", err)
	}
}

func connect(t *testing.T, ch *servers.ClickHouse) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// insertQuorum inserts r into db.t and returns once two replicas hold it. 18.16 needs the column
// list for a batch. The table's quorum/last_part in ZooKeeper changes only when a quorum insert
// completes, so it shows the setting reached the server.
func insertQuorum(ctx context.Context, t *testing.T, conn driver.Conn, db string, r row) {
	t.Helper()
	before := lastQuorumPart(ctx, t, conn, db)
	qctx := clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"insert_quorum": 2}))
	b, err := conn.PrepareBatch(qctx, "INSERT INTO "+db+".t (id, name, v)")
	if err != nil {
		t.Fatalf("insert into %s.t: %v", db, err)
	}
	if err := b.Append(r.ID, r.Name, r.V); err != nil {
		t.Fatalf("insert into %s.t: %v", db, err)
	}
	if err := b.Send(); err != nil {
		t.Fatalf("insert into %s.t with insert_quorum=2: %v", db, err)
	}
	if after := lastQuorumPart(ctx, t, conn, db); after == before {
		t.Fatalf("insert into %s.t: quorum/last_part still %q: the insert was not a quorum insert", db, after)
	}
}

func lastQuorumPart(ctx context.Context, t *testing.T, conn driver.Conn, db string) string {
	t.Helper()
	var v string
	q := "SELECT value FROM system.zookeeper WHERE path = '/clickhouse/tables/01/" + db + "/t/quorum' AND name = 'last_part'"
	if err := conn.QueryRow(ctx, q).Scan(&v); err != nil {
		t.Fatalf("read quorum/last_part of %s.t: %v", db, err)
	}
	return v
}

func selectRows(ctx context.Context, t *testing.T, conn driver.Conn, db string) []row {
	t.Helper()
	rows, err := conn.Query(ctx, "SELECT id, name, v FROM "+db+".t FINAL ORDER BY id")
	if err != nil {
		t.Fatalf("select %s.t: %v", db, err)
	}
	defer rows.Close()
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.ID, &r.Name, &r.V); err != nil {
			t.Fatalf("select %s.t: %v", db, err)
		}
		got = append(got, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("select %s.t: %v", db, err)
	}
	return got
}
