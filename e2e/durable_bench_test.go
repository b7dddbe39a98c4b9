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

// BenchmarkAcknowledged measures what "acknowledged means durable" costs, over real nats-server
// processes storing on this machine's disk: one server syncing every 2 minutes (NATS's default),
// one syncing every write (deploy/nats/nats.conf: `sync_interval: always`), and a 3-node cluster
// with R3 streams. For each, b.N evaluations are published one after another, each waiting for
// its acknowledgement (an orchestrator's rate, in evaluations/s), then 40 rounds of the next
// prompt (an evaluation, then at once its team's request, to prompt.composed; p50 and p99).
//
// go test -run '^$' -bench Acknowledged -benchtime 300x ./e2e
func BenchmarkAcknowledged(b *testing.B) {
	for _, mode := range []struct {
		name   string
		nodes  int
		always bool
	}{{"R1-default", 1, false}, {"R1-always", 1, true}, {"R3", 3, false}} {
		b.Run(mode.name, func(b *testing.B) {
			cluster, err := servers.StartNATSProcesses(b.Context(), b.TempDir(), filepath.Join(bins.dir, "nats-server"), mode.nodes, mode.always)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(cluster.Stop)
			nc, err := nats.Connect(cluster.URLs())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(nc.Close)
			js, err := jetstream.New(nc)
			if err != nil {
				b.Fatal(err)
			}
			addr, db := testenv.Database(b)
			e := &env{t: b, natsURL: cluster.URLs(), nc: nc, js: js, chAddr: addr, database: db, extra: []string{fmt.Sprintf("STREAM_REPLICAS=%d", mode.nodes)}}
			e.start("ranker")
			e.start("composer")

			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				ev := evaluation("burst", fmt.Sprintf("t%03d", i%100), "Team", 1+i/100, float64(i%97)+0.5, coldText(uint64(i), 1500), t0)
				e.publishEvaluation(fmt.Sprintf("burst-%d", i), ev)
			}
			took := time.Since(start)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/took.Seconds(), "evaluations/s")

			lat := nextPrompts(b, e, 40)
			b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "next-prompt-p50-ms")
			b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "next-prompt-p99-ms")
			b.Logf("%s: %d acknowledged evaluations in %s (%.0f/s); next prompt p50 %s, p99 %s over %d rounds",
				mode.name, b.N, took.Round(time.Millisecond), float64(b.N)/took.Seconds(),
				percentile(lat, 0.5).Round(time.Microsecond), percentile(lat, 0.99).Round(time.Microsecond), len(lat))
		})
	}
}

// nextPrompts plays rounds rounds of one team on an idle pipeline: its evaluation, then at once
// its request for the next round; each latency is from the request to its prompt.composed, which
// must count the evaluation.
func nextPrompts(b *testing.B, e *env, rounds int) []time.Duration {
	b.Helper()
	const exec = "next"
	answers := make(chan *nats.Msg, 16)
	sub, err := e.nc.ChanSubscribe("prompt.*."+exec+".*", answers)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	var lat []time.Duration
	for r := 1; r <= rounds; r++ {
		seq := e.publishEvaluation(fmt.Sprintf("next-%d", r), evaluation(exec, "t1", "One", r, float64(r%89)+0.5, coldText(uint64(1000+r), 1500), t0))
		start := time.Now()
		e.requestRound(fmt.Sprintf("next-req-%d", r), events.RoundRequested{ExecutionID: exec, TeamID: "t1", TeamName: "One", RoundNumber: r + 1, UserPrompt: "go"}, t0.Add(time.Duration(r)*time.Hour))
		for done := false; !done; {
			select {
			case m := <-answers:
				var pc events.PromptComposed
				if env := dataOf(b, m.Data, &pc); env.Type != events.TypePromptComposed {
					b.Fatalf("round %d: %s", r+1, m.Data)
				}
				if pc.RoundNumber != r+1 {
					continue
				}
				if pc.Inputs.EvaluationsSeq < seq {
					b.Fatalf("round %d composed as of %d, before its evaluation at %d", r+1, pc.Inputs.EvaluationsSeq, seq)
				}
				lat, done = append(lat, time.Since(start)), true
			case <-time.After(30 * time.Second):
				b.Fatalf("no prompt for round %d", r+1)
			}
		}
		time.Sleep(20 * time.Millisecond) // idle between rounds
	}
	return lat
}
