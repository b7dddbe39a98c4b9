package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// BenchmarkArchiverRecord is what copying one PROMPTS record into the archive costs: the
// archiver's CPU and ClickHouse's, per record, from /proc/<pid>/stat, over records like a
// tournament's (distinct prompts of 4.5-7 KiB, in the prompt and again in two messages (11-14 KiB a record), as the team-round template makes
// them, with their request), published while the archiver runs and timed until it has them all.
// The archiver's own idle CPU over as long a time, measured first, is reported beside it.
//
// `go test -run '^$' -bench ArchiverRecord -benchtime 4000x ./e2e`; BENCH_ARCHIVER_PROFILE=FILE saves a
// CPU profile of two seconds of it.
func BenchmarkArchiverRecord(b *testing.B) {
	e := newEnv(b)
	arch := e.start("archiver", "PPROF=true")
	chPid := testenv.ClickHouse(b).Pid()
	records := make([][]byte, b.N)
	subjects := make([]string, b.N)
	for i := range records {
		exec, team, round := fmt.Sprintf("arc-%03d", i/200), fmt.Sprintf("team-%02d", i%20), 1+(i/20)%10
		system := coldText(uint64(i)*3+1, 800+i%400)
		user := coldText(uint64(i)*3+2, 3800+(i*37)%2000)
		req := events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round,
			UserPrompt: "Write the best possible design document for a rate limiter.", MaxRounds: 10}
		pc := events.PromptComposed{RequestID: fmt.Sprintf("req-%d", i), ExecutionID: exec, TeamID: team, TeamName: "Team " + team,
			RoundNumber: round, Prompt: system + "\n\n" + user, Messages: []events.Message{{Role: "system", Content: system}, {Role: "user", Content: user}},
			PromptSHA256: fmt.Sprintf("%064x", i), Template: events.TemplateRef{Name: "team-round", Version: 2}, TokenEstimate: 2400,
			TokenEncoding: "o200k_base", Truncated: []events.Truncation{}, Inputs: events.ComposeInputs{EvaluationsSeq: uint64(i)},
			Request: &events.RequestRecord{Time: t0.Format(time.RFC3339Nano), Data: req}}
		body, err := events.Marshal(events.PromptEventID(pc.RequestID), "composer/bench", events.TypePromptComposed, t0, pc)
		if err != nil {
			b.Fatal(err)
		}
		records[i], subjects[i] = body, events.PromptComposedSubject(exec, team)
	}
	pid := arch.cmd.Process.Pid
	idle := cpuSince(pid)
	time.Sleep(3 * time.Second)
	idlePerSecond := idle()[0] / 3

	b.ResetTimer()
	start := time.Now()
	cpu := cpuSince(pid, chPid)
	if out := os.Getenv("BENCH_ARCHIVER_PROFILE"); out != "" {
		go saveProfile(b, arch, out) // two seconds of the archiver at work
	}
	ctx := context.Background()
	for i, body := range records {
		if _, err := e.js.PublishAsync(subjects[i], body, jetstream.WithMsgID(fmt.Sprintf("bench-%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case <-e.js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("publishes not acknowledged within a minute")
	}
	testenv.WaitFor(b, 5*time.Minute, "the archive has every record", func() (bool, string) {
		info, err := consumerInfo(ctx, e.js, events.StreamPrompts, events.ConsumerArchiver)
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream >= uint64(b.N) && info.NumAckPending == 0, fmt.Sprintf("ack floor %d of %d", info.AckFloor.Stream, b.N)
	})
	took := time.Since(start)
	used := cpu()
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(used[0]/n*1e6, "archiver-cpu-µs/record")
	b.ReportMetric(used[1]/n*1e6, "clickhouse-cpu-µs/record")
	b.ReportMetric(idlePerSecond*took.Seconds()/n*1e6, "archiver-idle-cpu-µs/record")
	batches := arch.metric(b, "archiver_batch_size_count")
	b.ReportMetric(n/max(batches, 1), "records/batch")
	b.Logf("%d records (%d B each on average) archived in %s, %.0f batches: archiver %.0f µs CPU per record (of it idle ticks at most %.1f µs), ClickHouse %.0f µs",
		b.N, avgLen(records), took.Round(time.Millisecond), batches, used[0]/n*1e6, idlePerSecond*took.Seconds()/n*1e6, used[1]/n*1e6)
}

func avgLen(bs [][]byte) int {
	t := 0
	for _, b := range bs {
		t += len(b)
	}
	return t / max(1, len(bs))
}
