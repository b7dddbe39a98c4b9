package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	gocmp "github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestClickHouseCluster runs the pipeline on three real ClickHouse replicas coordinated by a real
// ZooKeeper: migrations, a replica killed under load, a lagging replica serving reads, and the
// quorum lost. The subtests share the cluster (starting one costs seconds of both cores) and run
// one after another, each in a database of its own and with every replica up at its start.
func TestClickHouseCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts ZooKeeper and three ClickHouse servers")
	}
	cl := testenv.Cluster(t, 3)
	t.Run("migrations on every replica, twice", func(t *testing.T) { testClusterMigrations(t, cl) })
	t.Run("a lagging replica never serves a stale prompt", func(t *testing.T) { testLaggingReplica(t, cl) })
	t.Run("a replica killed under load", func(t *testing.T) { testReplicaKilledUnderLoad(t, cl) })
	t.Run("quorum lost, then back", func(t *testing.T) { testQuorumLost(t, cl) })
	t.Run("the prompts archive on every replica", func(t *testing.T) { testClusterArchive(t, cl) })
}

// testClusterArchive: on a cluster the archive is a replicated table written with the quorum,
// every replica holds the same records, and the audit reads them there.
func testClusterArchive(t *testing.T, cl *servers.Cluster) {
	const db = "archive"
	e := newClusterEnv(t, cl, db)
	e.start("ranker")
	e.start("composer")
	e.start("archiver")
	e.start("archiver")
	n := e.play("clustered", 3, 3)
	e.checkArchive("clustered", n)
	want := ""
	for i, addr := range cl.Addrs() {
		onReplica(t, addr, "SYSTEM SYNC REPLICA "+db+".prompts")
		engine := onReplica(t, addr, "SELECT engine FROM system.tables WHERE database = '"+db+"' AND name = 'prompts'")
		if len(engine) != 1 || engine[0] != "ReplicatedReplacingMergeTree" {
			t.Errorf("replica %s: prompts is %v", addr, engine)
		}
		got := onReplica(t, addr, fmt.Sprintf("SELECT concat(toString(uniqExact(event_id)), ' records, checksum ', toString(sum(cityHash64(event_id, stream_seq, body)))) FROM %s.prompts WHERE execution_id != ''", db))[0]
		if i == 0 {
			want = got
		} else if got != want {
			t.Errorf("replica %s holds %s, replica %s holds %s", addr, got, cl.Addrs()[0], want)
		}
	}
	if out, code := e.podium(t, nil, "prompts", "verify", "--all", "--execution", "clustered"); code != 0 || !strings.Contains(out, fmt.Sprintf("%d record(s) verified", n)) {
		t.Errorf("verify on the cluster: exit %d\n%s", code, out)
	}
	t.Logf("every replica holds %s", want)
}

// newClusterEnv is a pipeline whose store is every replica of cl, in a fresh database.
func newClusterEnv(t *testing.T, cl *servers.Cluster, database string, extra ...string) *env {
	t.Helper()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	ns := testenv.NATS(t)
	nc, js := testenv.JetStream(t, ns)
	return &env{t: t, ns: ns, nc: nc, js: js, chAddr: strings.Join(cl.Addrs(), ","), database: database,
		extra: append([]string{"CLICKHOUSE_REPLICATED=true"}, extra...)}
}

// onReplica runs a query on one replica as it is (no sequential consistency: a lagging replica
// answers with what it has) and returns the first column of each row as text.
func onReplica(t testing.TB, addr, query string) []string {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, DialTimeout: 5 * time.Second, ReadTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if strings.HasPrefix(query, "SYSTEM ") {
		if err := conn.Exec(context.Background(), query); err != nil {
			t.Fatalf("%s on %s: %v", query, addr, err)
		}
		return nil
	}
	rows, err := conn.Query(context.Background(), query)
	if err != nil {
		t.Fatalf("%s on %s: %v", query, addr, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			t.Fatalf("%s on %s: %v", query, addr, err)
		}
		out = append(out, v)
	}
	return out
}

// rowsOn is a replica's evaluations as stored: the count and a checksum of every row.
func rowsOn(t testing.TB, addr, db string) string {
	t.Helper()
	return onReplica(t, addr, fmt.Sprintf(
		"SELECT concat(toString(count()), ' rows, checksum ', toString(sum(cityHash64(event_id, stream_seq, overall_score, submission)))) FROM %s.evaluations", db))[0]
}

// sameRowsEverywhere waits until every replica has fetched everything and compares their rows.
func sameRowsEverywhere(t *testing.T, cl *servers.Cluster, db string) string {
	t.Helper()
	start := time.Now()
	for _, addr := range cl.Addrs() {
		onReplica(t, addr, "SYSTEM SYNC REPLICA "+db+".evaluations")
	}
	want := rowsOn(t, cl.Addrs()[0], db)
	for _, addr := range cl.Addrs()[1:] {
		if got := rowsOn(t, addr, db); got != want {
			t.Errorf("replica %s holds %s, replica %s holds %s", addr, got, cl.Addrs()[0], want)
		}
	}
	t.Logf("every replica holds %s (synced in %s)", want, time.Since(start).Round(time.Millisecond))
	return want
}

func testClusterMigrations(t *testing.T, cl *servers.Cluster) {
	for _, mode := range []struct{ db, cluster string }{{"mig_each", ""}, {"mig_on_cluster", "CLICKHOUSE_CLUSTER=" + cl.Name}} {
		e := newClusterEnv(t, cl, mode.db, mode.cluster)
		reordered := "CLICKHOUSE_ADDR=" + strings.Join([]string{cl.Addrs()[1], cl.Addrs()[2], cl.Addrs()[0]}, ",")
		// Every migration on each of the 3 replicas, or once ON CLUSTER; nothing the second time.
		migs, err := chstore.Migrations()
		if err != nil {
			t.Fatal(err)
		}
		each := 3 * len(migs)
		if mode.cluster != "" {
			each = len(migs)
		}
		for run, want := range []string{fmt.Sprintf("migrations applied: %d\n", each), "migrations applied: 0\n"} {
			cmd := exec.Command(filepath.Join(bins.dir, "ranker"), "migrate")
			cmd.Env = e.baseEnv()
			if run == 1 {
				cmd.Env = e.baseEnv(reordered) // through another replica: it knows what was applied
			}
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: ranker migrate (run %d): %v\n%s", mode.db, run+1, err, stderr.String())
			}
			if out := string(out); !strings.HasSuffix(out, want) {
				t.Errorf("%s: ranker migrate (run %d) said %q, want it to end with %q", mode.db, run+1, out, want)
			}
		}
		var schemas []string
		for _, addr := range cl.Addrs() {
			engine := onReplica(t, addr, fmt.Sprintf("SELECT engine FROM system.tables WHERE database = '%s' AND name = 'evaluations'", mode.db))
			if !slices.Equal(engine, []string{"ReplicatedReplacingMergeTree"}) {
				t.Errorf("%s on %s: evaluations has engine %v, want one ReplicatedReplacingMergeTree", mode.db, addr, engine)
			}
			replicas := onReplica(t, addr, fmt.Sprintf("SELECT toString(total_replicas) FROM system.replicas WHERE database = '%s' AND table = 'evaluations'", mode.db))
			if !slices.Equal(replicas, []string{"3"}) {
				t.Errorf("%s on %s: the table knows %v replicas, want 3", mode.db, addr, replicas)
			}
			schemas = append(schemas, onReplica(t, addr, "SHOW CREATE TABLE "+mode.db+".evaluations")[0])
		}
		for i, s := range schemas[1:] {
			if s != schemas[0] {
				t.Errorf("%s: replica %d's schema differs from replica 1's:\n%s", mode.db, i+2, gocmp.Diff(schemas[0], s))
			}
		}
		// A ranker starts with a replica down: nothing is left to apply, so nothing waits for it.
		if err := cl.Replicas[2].Kill(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		cmd := exec.Command(filepath.Join(bins.dir, "ranker"), "migrate")
		cmd.Env = e.baseEnv()
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.HasSuffix(string(out), "migrations applied: 0\n") {
			t.Errorf("%s: ranker migrate with replica 3 down: %v\n%s", mode.db, err, out)
		}
		t.Logf("%s: ranker migrate with replica 3 down took %s", mode.db, time.Since(start).Round(time.Millisecond))
		if err := cl.Replicas[2].Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", mode.db, schemas[0])
	}
}

// testLaggingReplica stops fetches on one replica while evaluations arrive, written through it
// as well as through the others (a second ranker lists it first), so it holds some new parts
// but not the ones before them: the case ClickHouse's select_sequential_consistency misses.
// Reads include it (they are spread), and every prompt still counts every evaluation committed
// before its request, because a read takes the union of a quorum of replicas.
func testLaggingReplica(t *testing.T, cl *servers.Cluster) {
	const db = "lagging"
	e := newClusterEnv(t, cl, db)
	ranker := e.start("ranker")
	lagging := cl.Addrs()[2]
	e.start("ranker", "CLICKHOUSE_ADDR="+strings.Join([]string{lagging, cl.Addrs()[0], cl.Addrs()[1]}, ","))
	composer := e.start("composer", "COMPOSER_READ_CACHE_TTL=0")
	load := newRYWLoad("lag", 4, 10)
	for i := range load.teams {
		load.publish(e, i)
	}
	waitCommitted(t, e, load.teams)
	onReplica(t, lagging, "SYSTEM STOP FETCHES "+db+".evaluations")
	for i := load.teams; i < load.pairs(); i++ {
		load.publish(e, i)
	}
	load.check(t, e, load.pairs(), 60*time.Second)
	behind, full := rowsOn(t, lagging, db), rowsOn(t, cl.Addrs()[0], db)
	if behind == full {
		t.Fatalf("replica %s did not lag (it holds %s like the others): the test proves nothing", lagging, behind)
	}
	reads := composer.metric(t, fmt.Sprintf(`composer_store_replica_reads_total{replica=%q}`, lagging))
	if reads == 0 {
		t.Errorf("no read went to the lagging replica %s: the test proves nothing", lagging)
	}
	// The operator's view: every replica answers, the lagging one with fetches waiting.
	out, code := e.podium(t, nil, "store", "status", "--json")
	var status []struct {
		Replica        string `json:"replica"`
		Answers        bool   `json:"answers"`
		Rows           uint64 `json:"rows"`
		InsertsInQueue uint64 `json:"inserts_in_queue"`
	}
	if err := json.Unmarshal([]byte(out), &status); err != nil || code != 0 || len(status) != 3 {
		t.Fatalf("podium store status --json: exit %d, %v:\n%s", code, err, out)
	}
	for _, st := range status {
		if !st.Answers || st.Replica == lagging && st.InsertsInQueue == 0 {
			t.Errorf("podium store status: %+v (lagging replica: %s)", st, lagging)
		}
	}
	table, _ := e.podium(t, nil, "store", "status")
	t.Logf("podium store status while %s lags:\n%s", lagging, table)
	t.Logf("the lagging replica held %s (the others %s) and answered %v reads while %d prompts were composed, all exact", behind, full, reads, load.pairs())
	checkAgainstTruth(t, ranker, firstOf(load.sent))
	onReplica(t, lagging, "SYSTEM START FETCHES "+db+".evaluations")
	sameRowsEverywhere(t, cl, db)
}

// firstOf indexes sent evaluations by id, the first copy of each.
func firstOf(sent []published) map[string]published {
	out := map[string]published{}
	for _, p := range sent {
		if _, ok := out[p.id]; !ok {
			out[p.id] = p
		}
	}
	return out
}

// testReplicaKilledUnderLoad kills one replica (SIGKILL) a third into a paced stream of
// evaluations and requests and starts it again at two thirds, longer than its ZooKeeper session
// later, with two composers and two rankers sharing the work. Meanwhile the other two commit and
// serve every read. Every request is answered once, every prompt holds what was committed before
// its request, every leaderboard is exact, and the replicas end with the same rows.
func testReplicaKilledUnderLoad(t *testing.T, cl *servers.Cluster) {
	const db = "killed"
	e := newClusterEnv(t, cl, db)
	ranker := e.start("ranker")
	e.start("ranker")
	composers := []*proc{e.start("composer"), e.start("composer")}
	load := newRYWLoad("ha", 6, 15)
	victim := cl.Replicas[1]
	third := load.pairs() / 3
	var killedAt, restartedAt time.Time
	var floorAtKill, floorAtRestart uint64
	for i := range load.pairs() {
		switch i {
		case third:
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
			killedAt, floorAtKill = time.Now(), ackFloor(t, e)
		case 2 * third:
			// The other two replicas commit while it is down: waited for (the suite's load may
			// hold the pipeline seconds behind the pacing), at most 30 s.
			testenv.WaitFor(t, 30*time.Second, "a commit while the replica is down", func() (bool, string) {
				f := ackFloor(t, e)
				return f > floorAtKill, fmt.Sprintf("ack floor %d, %d at the kill", f, floorAtKill)
			})
			restartedAt, floorAtRestart = time.Now(), ackFloor(t, e)
			if err := victim.Start(context.Background()); err != nil { // while the pipeline works
				t.Fatalf("restart the killed replica: %v", err)
			}
		}
		load.publish(e, i)
		time.Sleep(100 * time.Millisecond) // paced: down for 3 s, longer than its 2 s ZooKeeper session
	}
	got := load.check(t, e, load.pairs(), 90*time.Second)
	t.Logf("replica %s killed after pair %d, restarted after pair %d (%s later)", victim.Addr, third, 2*third, restartedAt.Sub(killedAt).Round(time.Millisecond))
	if floorAtRestart <= floorAtKill {
		t.Errorf("nothing was committed while the replica was down (ack floor %d at the kill, %d at the restart)", floorAtKill, floorAtRestart)
	}
	checkAgainstTruth(t, ranker, firstOf(load.sent))
	sameRowsEverywhere(t, cl, db)

	// What the kill cost the prompts: latency from request to its answer, by phase.
	phases := map[string][]time.Duration{}
	for id, a := range got {
		at := load.requested[id]
		phase := "before the kill"
		switch {
		case at.After(restartedAt):
			phase = "after the restart"
		case at.After(killedAt):
			phase = "replica down"
		}
		phases[phase] = append(phases[phase], a.at.Sub(at))
	}
	for _, phase := range []string{"before the kill", "replica down", "after the restart"} {
		d := phases[phase]
		slices.Sort(d)
		if len(d) > 0 {
			t.Logf("%s: %d prompts, latency p50 %s, max %s", phase, len(d), d[len(d)/2].Round(time.Millisecond), d[len(d)-1].Round(time.Millisecond))
		}
	}
	var failovers float64
	for _, c := range composers {
		failovers += c.metric(t, fmt.Sprintf(`composer_store_read_failovers_total{replica=%q}`, victim.Addr))
	}
	if failovers == 0 {
		t.Errorf("no composer read tried the killed replica: the test proves nothing")
	}
	t.Logf("composer reads that found the killed replica down and went to another: %v; commits while it was down: %d", failovers, floorAtRestart-floorAtKill)
}

// testQuorumLost kills two of three replicas, past their ZooKeeper sessions: no insert can reach
// its quorum, so the ranker holds its evaluations unacknowledged (readiness 503, quorum failures
// counted) and loses nothing; no read can reach its quorum either, so requests answer
// store_unavailable, or inputs_not_ready when they wait for the held evaluations, both
// retryable. When one replica returns, the ranker commits everything and the retried requests
// compose with it.
func testQuorumLost(t *testing.T, cl *servers.Cluster) {
	const db = "quorum"
	e := newClusterEnv(t, cl, db, "CLICKHOUSE_INSERT_QUORUM_TIMEOUT=2s")
	ranker := e.start("ranker", "RANKER_FLUSH_INTERVAL=20ms")
	e.start("composer", "COMPOSER_INPUTS_TIMEOUT=3s", "COMPOSER_MAX_DELIVER=2")
	load := newRYWLoad("quorum", 3, 4)
	for i := range load.teams {
		load.publish(e, i)
	}
	load.check(t, e, load.teams, 30*time.Second)
	committed := ackFloor(t, e)

	for _, r := range cl.Replicas[1:] {
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	killedAt := time.Now()
	if out, code := e.podium(t, nil, "store", "status"); code != 1 || !strings.Contains(out, "2 of 3 ClickHouse replicas do not answer") {
		t.Errorf("podium store status with two replicas down: exit %d, want 1 and the count:\n%s", code, out)
	}
	time.Sleep(3 * time.Second) // past their 2 s ZooKeeper sessions: the live replicas are one
	// Nothing pending, but a read needs two replicas: the last delivery answers store_unavailable
	// (once the ranker's score snapshot, which would serve it without ClickHouse, is gone).
	e.dropSnapshot("quorum")
	e.requestRound("req-alone", events.RoundRequested{ExecutionID: "quorum", TeamID: "team-0", TeamName: "Team team-0",
		RoundNumber: 2, UserPrompt: "Improve."}, t0.Add(time.Hour))
	if a := e.answers("prompt.*.quorum.team-0", 2, 30*time.Second)["req-alone"]; a.ok() || a.failed.Code != events.CodeStoreUnavailable || !a.failed.Retryable {
		t.Errorf("with one replica left, the request got %s %+v, want store_unavailable, retryable", a.subject, a.failed)
	}

	// Evaluations now cannot be committed.
	for i := load.teams; i < 2*load.teams; i++ {
		load.publish(e, i)
	}
	waitStatus(t, ranker, http.StatusServiceUnavailable, 30*time.Second)
	for deadline := time.Now().Add(30 * time.Second); ranker.metric(t, "ranker_insert_quorum_failures_total") == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	var ready struct {
		Failing map[string]string `json:"failing"`
	}
	ranker.getJSON(t, "/readyz", &ready)
	if !strings.Contains(ready.Failing["clickhouse"], "quorum") {
		t.Errorf("ranker /readyz with two replicas down says %v, want the quorum named", ready.Failing)
	}
	t.Logf("ranker /readyz with two replicas down: %v", ready.Failing)
	failed := e.answers("prompt.*.quorum.*", load.teams+1+load.teams, 30*time.Second)
	for i := load.teams; i < 2*load.teams; i++ {
		r, k := i/load.teams+1, i%load.teams
		a := failed[fmt.Sprintf("req-team-%d-%d", k, r+1)]
		if a.ok() || a.failed.Code != events.CodeInputsNotReady || !a.failed.Retryable {
			t.Errorf("team-%d round %d while the quorum is lost: got %s %+v, want inputs_not_ready, retryable", k, r+1, a.subject, a.failed)
		}
	}
	if got := ackFloor(t, e); got != committed {
		t.Errorf("the ack floor moved from %d to %d without a quorum", committed, got)
	}
	if n := ranker.metric(t, "ranker_insert_quorum_failures_total"); n == 0 {
		t.Errorf("no quorum failure counted")
	}

	back := time.Now()
	if err := cl.Replicas[1].Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, e, 2*load.teams)
	t.Logf("quorum lost for %s; after the restart began, the held evaluations were committed in %s",
		back.Sub(killedAt).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	waitStatus(t, ranker, http.StatusOK, 30*time.Second)
	// The orchestrator retries (a new request id): now the prompt counts what was held.
	for i := load.teams; i < 2*load.teams; i++ {
		r, k := i/load.teams+1, i%load.teams
		team := fmt.Sprintf("team-%d", k)
		e.requestRound(fmt.Sprintf("retry-%s-%d", team, r+1), events.RoundRequested{ExecutionID: "quorum", TeamID: team, TeamName: "Team " + team,
			RoundNumber: r + 1, UserPrompt: "Improve."}, t0.Add(2*time.Hour))
	}
	retried := e.answers("prompt.*.quorum.*", 2*load.teams+1+load.teams, 30*time.Second)
	for i := load.teams; i < 2*load.teams; i++ {
		r, k := i/load.teams+1, i%load.teams
		a := retried[fmt.Sprintf("retry-team-%d-%d", k, r+1)]
		if !a.ok() || !slices.Contains(a.composed.Inputs.EvaluationIDs, fmt.Sprintf("ev-team-%d-%d", k, r)) {
			t.Errorf("team-%d round %d retried: got %s %+v, ids %v: the held evaluation is missing", k, r+1, a.subject, a.failed, a.composed.Inputs.EvaluationIDs)
		}
	}
	checkAgainstTruth(t, ranker, firstOf(load.sent))
	if err := cl.Replicas[2].Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sameRowsEverywhere(t, cl, db)
}
