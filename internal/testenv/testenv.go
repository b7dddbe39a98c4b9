// Package testenv gives tests real servers: one private clickhouse-server per package run (started
// on first use, stopped by Main), a fresh database per test, and an in-process JetStream server per
// test. Nothing here is a stand-in: every test talks to the same servers production uses.
package testenv

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/servers"
)

// shared is the package run's ClickHouse. It is the one piece of package state here: TestMain
// owns its lifetime, and a server per test would cost 3 s each.
var shared struct {
	once sync.Once
	ch   *servers.ClickHouse
	dir  string
	err  error
	dbs  atomic.Int64
}

// Main runs the tests of a package and stops the shared ClickHouse afterwards. Call it from
// TestMain: func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }.
func Main(m *testing.M) int {
	code := m.Run()
	if shared.ch != nil {
		shared.ch.Stop()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	return code
}

// ClickHouse returns the package's ClickHouse server, starting it on first use. A missing binary
// fails the test with the apt command that installs it.
func ClickHouse(t testing.TB) *servers.ClickHouse {
	t.Helper()
	shared.once.Do(func() {
		// PODIUM_CLICKHOUSE_DIR puts the server's data elsewhere than the temp dir: on tmpfs
		// (/dev/shm) a benchmark measures the server rather than the disk's file creation, which
		// one-row parts of about 33 files each make the cost of an insert on a slow disk.
		shared.dir, shared.err = os.MkdirTemp(os.Getenv("PODIUM_CLICKHOUSE_DIR"), "podium-clickhouse-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		shared.ch, shared.err = servers.StartClickHouse(ctx, shared.dir)
	})
	if shared.err != nil {
		t.Fatalf("testenv: %v", shared.err)
	}
	return shared.ch
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_]+`)

// Database creates a fresh, empty database for this test and drops it when the test ends. It
// returns the server address and the database name.
func Database(t testing.TB) (addr, database string) {
	t.Helper()
	ch := ClickHouse(t)
	name := strings.ToLower(unsafeChars.ReplaceAllString(t.Name(), "_"))
	if len(name) > 40 {
		name = name[:40]
	}
	database = fmt.Sprintf("t%d_%s", shared.dbs.Add(1), name)
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr}})
	if err != nil {
		t.Fatalf("testenv: connect clickhouse: %v", err)
	}
	ctx := context.Background()
	if err := conn.Exec(ctx, "CREATE DATABASE "+database); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		defer conn.Close()
		if os.Getenv("PODIUM_KEEP_DATABASES") != "" {
			t.Logf("testenv: kept database %s on %s", database, ch.Addr)
			return
		}
		if err := conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+database); err != nil {
			t.Logf("testenv: drop database %s: %v", database, err)
		}
	})
	return ch.Addr, database
}

// Store opens the rank store on a fresh database of this test, migrated unless migrate is false
// (a store whose reads fail: its table is missing), closed when the test ends. It returns the
// store's configuration too, for tests that also talk to ClickHouse directly.
func Store(t testing.TB, migrate bool) (*chstore.Store, chstore.Config) {
	t.Helper()
	addr, db := Database(t)
	ctx := context.Background()
	cfg := chstore.Config{Addrs: []string{addr}, Database: db}
	st, err := chstore.Open(ctx, cfg)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if migrate {
		if _, err := st.Migrate(ctx); err != nil {
			t.Fatalf("testenv: %v", err)
		}
	}
	return st, cfg
}

// PrivateClickHouse starts a ClickHouse server for this test alone, stopped when it ends: for
// tests that freeze or restart the server, which must not disturb tests running beside them.
func PrivateClickHouse(t testing.TB) *servers.ClickHouse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ch, err := servers.StartClickHouse(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = ch.Stop() })
	return ch
}

// Cluster starts ZooKeeper and n ClickHouse replicas of one shard for this test alone, stopped
// when it ends: replicas are killed, stopped and lagged on purpose in such tests.
func Cluster(t testing.TB, n int) *servers.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	start := time.Now()
	cl, err := servers.StartClickHouseCluster(ctx, t.TempDir(), n)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Logf("testenv: ZooKeeper and %d ClickHouse replicas started in %s", n, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { _ = cl.Stop() })
	return cl
}

// NATS starts an in-process JetStream server for this test, shut down when the test ends.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	s, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// JetStream connects a client to s, closed when the test ends.
func JetStream(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("testenv: connect nats: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("testenv: jetstream: %v", err)
	}
	return nc, js
}

// CPUSeconds is the user plus system CPU time process pid has used so far, 0 if unreadable:
// benchmarks compare CPU per unit of work, which two shared cores leave far steadier than rates.
func CPUSeconds(pid int) float64 {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.Atoi(f[11])
	sy, _ := strconv.Atoi(f[12])
	return float64(ut+sy) / 100 // USER_HZ
}
