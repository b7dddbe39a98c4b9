package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/podium-llm/podium/pkg/events"
)

// BenchmarkNextPrompt measures what an orchestrator waits between rounds on an idle pipeline: a
// team's evaluation is published, then at once its request for the next round, and the time is
// taken from publishing the request to receiving its prompt.composed (which must count the
// evaluation). b.N rounds, one at a time, over a few teams with distinct texts; it reports p50
// and p99.
//
// go test -run '^$' -bench NextPrompt -benchtime 60x ./e2e
func BenchmarkNextPrompt(b *testing.B) {
	e := newEnv(b)
	ranker := e.start("ranker")
	composer := e.start("composer")
	const exec = "latency"
	answers := make(chan *nats.Msg, 16)
	sub, err := e.nc.ChanSubscribe("prompt.*."+exec+".*", answers)
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	teams := []string{"team-a", "team-b", "team-c", "team-d"}
	// Round 1 of every team first: its prompt has nothing to wait for.
	round := func(team string, r int) {
		e.requestRound(fmt.Sprintf("req-%s-%d", team, r), events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: team, RoundNumber: r, UserPrompt: "go"}, t0.Add(time.Duration(r)*time.Hour))
	}
	wait := func(team string, r int, seq uint64) {
		b.Helper()
		for {
			select {
			case m := <-answers:
				var pc events.PromptComposed
				env := dataOf(b, m.Data, &pc)
				if env.Type != events.TypePromptComposed {
					b.Fatalf("%s round %d: %s", team, r, m.Data)
				}
				if pc.TeamID != team || pc.RoundNumber != r {
					continue
				}
				if pc.Inputs.EvaluationsSeq < seq {
					b.Fatalf("%s round %d composed as of %d, before its evaluation at %d", team, r, pc.Inputs.EvaluationsSeq, seq)
				}
				return
			case <-time.After(30 * time.Second):
				b.Fatalf("no prompt for %s round %d", team, r)
			}
		}
	}
	for _, team := range teams {
		round(team, 1)
		wait(team, 1, 0)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		team, r := teams[i%len(teams)], 1+i/len(teams)
		ev := evaluation(exec, team, team, r, float64(i%89)+0.5, coldText(uint64(i), 1500), t0.Add(time.Duration(i)*time.Second))
		seq := e.publishEvaluation(fmt.Sprintf("ev-%d", i), ev)
		start := time.Now()
		round(team, r+1)
		wait(team, r+1, seq)
		lat = append(lat, time.Since(start))
		// Idle between rounds: the next evaluation arrives on a quiet pipeline.
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(percentile(lat, 0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(percentile(lat, 0.99).Microseconds())/1000, "p99-ms")
	b.Logf("evaluation then request, to prompt.composed: p50 %s, p90 %s, p99 %s over %d rounds",
		percentile(lat, 0.5).Round(time.Microsecond), percentile(lat, 0.9).Round(time.Microsecond), percentile(lat, 0.99).Round(time.Microsecond), len(lat))
	// Where the time goes, as the services measure it (means over the run).
	mean := func(p *proc, h string) string {
		n := p.metric(b, h+"_count")
		if n == 0 {
			return "-"
		}
		return (time.Duration(p.metric(b, h+"_sum") / n * float64(time.Second))).Round(10 * time.Microsecond).String()
	}
	b.Logf("means: ranker insert %s; composer inputs wait %s, scores read %s, render %s",
		mean(ranker, "ranker_insert_duration_seconds"), mean(composer, "composer_inputs_wait_seconds"),
		mean(composer, "composer_store_read_duration_seconds"), mean(composer, "composer_render_duration_seconds"))
}
