package e2e

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestAcknowledgedEvaluationsSurviveANodeKilled: on a 3-node NATS cluster of real nats-server
// processes with STREAM_REPLICAS=3 (deploy/README.md), a burst of evaluations is published, each
// acknowledged by JetStream; right after the last acknowledgement the leader of EVALUATIONS is
// killed with SIGKILL. Every acknowledged evaluation is ranked: the board, recounted from what the
// test published, has every team with its every round and its best score.
func TestAcknowledgedEvaluationsSurviveANodeKilled(t *testing.T) {
	t.Parallel()
	cluster, err := servers.StartNATSProcesses(t.Context(), t.TempDir(), filepath.Join(bins.dir, "nats-server"), 3, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Stop)
	nc, err := nats.Connect(cluster.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	addr, db := testenv.Database(t)
	e := &env{t: t, natsURL: cluster.URLs(), nc: nc, js: js, chAddr: addr, database: db, extra: []string{"STREAM_REPLICAS=3"}}
	ranker := e.start("ranker")

	const teams, rounds = 20, 5
	best := map[string]float64{}
	for round := 1; round <= rounds; round++ {
		for i := range teams {
			team := fmt.Sprintf("t%02d", i)
			score := float64((i*7+round*13)%100) + 0.5
			best[team] = max(best[team], score)
			e.publishEvaluation(fmt.Sprintf("durable-%s-%d", team, round), evaluation("durable", team, "Team "+team, round, score, "work", t0))
		}
	}
	st, err := js.Stream(t.Context(), events.StreamEvaluations)
	if err != nil {
		t.Fatal(err)
	}
	info := st.CachedInfo()
	if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("EVALUATIONS: %d replicas, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	leader := cluster.Node(info.Cluster.Leader)
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d evaluations acknowledged; the leader of EVALUATIONS (%s) killed with SIGKILL right after", teams*rounds, leader.Name)

	waitBoardRounds(t, ranker, "durable", teams*rounds, 2*time.Minute)
	_, lb := boardRounds(t, ranker, "durable")
	if len(lb.Teams) != teams {
		t.Fatalf("the board has %d teams, want %d", len(lb.Teams), teams)
	}
	for _, row := range lb.Teams {
		if row.Rounds != rounds || row.BestScore != best[row.TeamID] {
			t.Errorf("%s: %d rounds, best %v; published %d rounds, best %v", row.TeamID, row.Rounds, row.BestScore, rounds, best[row.TeamID])
		}
	}
	// The killed node comes back with its store and catches up with the others.
	if err := leader.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
}
