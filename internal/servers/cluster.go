package servers

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
)

// clusterName is the remote_servers cluster every replica knows, for ON CLUSTER DDL.
const clusterName = "podium"

// Cluster is one shard of replicated ClickHouse: N clickhouse-server replicas sharing one
// ZooKeeper. Each replica has its own directory and ports, so a test can kill one and start it
// again on the same data.
type Cluster struct {
	ZooKeeper *ZooKeeper
	Replicas  []*ClickHouse // replica i+1 has the macro replica "r<i+1>"
	Name      string        // the remote_servers cluster name, "podium", for ON CLUSTER
}

// StartClickHouseCluster starts a ZooKeeper and n ClickHouse replicas of shard "01" under dir
// (dir/zookeeper, dir/r1 ... dir/rN), and waits until every replica answers queries and reaches
// ZooKeeper. Each replica's config carries the {shard} and {replica} macros for
// Replicated*MergeTree paths, the cluster "podium" of all replicas for ON CLUSTER DDL, and its
// interserver port, on which the others fetch its parts.
func StartClickHouseCluster(ctx context.Context, dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("servers: cluster: want at least 1 replica, got %d", n)
	}
	// Every config names every replica's port, so all ports are chosen before any server starts.
	ports, err := freePorts(1 + 3*n)
	if err != nil {
		return nil, err
	}
	zkPort, ports := ports[0], ports[1:]
	tcp, httpp, inter := ports[:n], ports[n:2*n], ports[2*n:]
	c := &Cluster{Name: clusterName}
	for i := range n {
		extra := replicaConfig(zkPort, fmt.Sprintf("r%d", i+1), inter[i], tcp)
		ch, err := newClickHouse(filepath.Join(dir, fmt.Sprintf("r%d", i+1)), tcp[i], httpp[i], extra)
		if err != nil {
			return nil, err
		}
		ch.zookeeper = true
		c.Replicas = append(c.Replicas, ch)
	}
	// ZooKeeper first: a replica that starts without it comes up without a session.
	c.ZooKeeper, err = startZooKeeper(ctx, filepath.Join(dir, "zookeeper"), zkPort)
	if err != nil {
		return nil, err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, ch := range c.Replicas {
		wg.Go(func() { errs[i] = ch.Start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Stop()
		return nil, err // each names its replica's address and log
	}
	return c, nil
}

// replicaConfig is the cluster part of a replica's config. A 2 s ZooKeeper session lets a killed
// replica's session, and with it its claim to be active, expire soon.
func replicaConfig(zkPort int, replica string, interserverPort int, tcpPorts []int) string {
	var replicas strings.Builder
	for _, p := range tcpPorts {
		fmt.Fprintf(&replicas, "        <replica><host>127.0.0.1</host><port>%d</port></replica>\n", p)
	}
	return fmt.Sprintf(`  <interserver_http_host>127.0.0.1</interserver_http_host>
  <interserver_http_port>%d</interserver_http_port>
  <zookeeper>
    <node index="1"><host>127.0.0.1</host><port>%d</port></node>
    <session_timeout_ms>2000</session_timeout_ms>
  </zookeeper>
  <macros><shard>01</shard><replica>%s</replica></macros>
  <remote_servers>
    <%s>
      <shard>
        <internal_replication>true</internal_replication>
%s      </shard>
    </%[4]s>
  </remote_servers>
  <distributed_ddl><path>/clickhouse/task_queue/ddl</path></distributed_ddl>
`, interserverPort, zkPort, replica, clusterName, replicas.String())
}

// Addrs returns the replicas' native protocol addresses, replica 1 first.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Replicas))
	for i, ch := range c.Replicas {
		addrs[i] = ch.Addr
	}
	return addrs
}

// Stop stops the replicas (together, each may take seconds), then ZooKeeper, which they need
// to shut down cleanly.
func (c *Cluster) Stop() error {
	var wg sync.WaitGroup
	for _, ch := range c.Replicas {
		wg.Go(func() { ch.Stop() })
	}
	wg.Wait()
	if c.ZooKeeper != nil {
		return c.ZooKeeper.Stop()
	}
	return nil
}
