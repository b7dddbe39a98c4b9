package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// twoKiB builds an evaluation whose body is about 2 KiB, the size the ingest benchmark is about.
func twoKiB(i int) published {
	exec := fmt.Sprintf("exec-%d", i/500)
	team := fmt.Sprintf("team-%02d", i%10)
	ev := evaluation(exec, team, "Team "+team, 1+(i/10)%50, float64(i%97)+0.5, strings.Repeat("x", 1400), t0.Add(time.Duration(i)*time.Millisecond))
	return published{id: fmt.Sprintf("ev-%08d", i), ev: ev}
}

// BenchmarkRankerIngest measures evaluations per second through the real ranker binary (NATS
// consume, validate, ClickHouse insert, ack, leaderboard.updated) against two baselines measured
// in the same run on the same 2 KiB events: the broker's own consume-and-ack rate (a plain pull
// consumer acking every message) and a raw clickhouse-go batch insert of the same rows. b.N is the
// number of events: run it with -benchtime=50000x. The targets are in CPU: the ranker's and
// ClickHouse's CPU per event, as multiples of the broker loop's CPU per message (consume,
// republish 2 KiB and ack the same events, on the same server, in the same run).
func BenchmarkRankerIngest(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	if err := events.EnsureStreams(ctx, e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		b.Fatal(err)
	}
	n := b.N
	sends := make([]published, n)
	msgs := make([]outgoing, n)
	for i := range n {
		sends[i] = twoKiB(i)
		msgs[i] = evaluationMessage(b, sends[i])
	}
	publishAcked(b, e.js, msgs) // setup, not measured
	b.ReportMetric(float64(len(msgs[0].body)), "bytes/event")

	// Baseline 1: the broker's consume-and-ack rate with the ranker's pull buffer.
	cons, err := e.js.CreateOrUpdateConsumer(ctx, events.StreamEvaluations, jetstream.ConsumerConfig{Durable: "baseline", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	self := os.Getpid()
	selfBefore := testenv.CPUSeconds(self) // this process: the in-process server and the consuming client
	start := time.Now()
	it, err := cons.Messages(jetstream.PullMaxMessages(500))
	if err != nil {
		b.Fatal(err)
	}
	for range n {
		msg, err := it.Next()
		if err != nil {
			b.Fatal(err)
		}
		_ = msg.Ack()
	}
	it.Stop()
	for {
		info, err := cons.Info(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if info.AckFloor.Stream >= uint64(n) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	brokerRate := float64(n) / time.Since(start).Seconds()
	ackCPU := (testenv.CPUSeconds(self) - selfBefore) / float64(n)

	// The unit of the targets: a broker-only loop that consumes, republishes 2 KiB and acks (as
	// in the composer's benchmark), over the same events, in this process.
	stopLoop := republish(ctx, b, e.js, 32, 2048)
	loop := make([]outgoing, n)
	for i, m := range msgs {
		loop[i] = outgoing{id: m.id, subject: "baseline.in." + strings.TrimPrefix(m.subject, events.TypeEvaluationCompleted+"."), body: m.body}
	}
	selfBefore = testenv.CPUSeconds(self)
	burst(b, e, loop, "baseline.out.>")
	brokerCPU := (testenv.CPUSeconds(self) - selfBefore) / float64(n)
	stopLoop()

	// Baseline 2: raw batch inserts of the same rows, 500 at a time, into a table of its own.
	rawCfg := chstore.Config{Addrs: []string{e.chAddr}, Database: e.database + "_raw"}
	if err := chstore.CreateDatabase(ctx, rawCfg); err != nil {
		b.Fatal(err)
	}
	raw, err := chstore.Open(ctx, rawCfg)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := raw.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	recs := make([]rank.Record, n)
	for i, s := range sends {
		recs[i] = rank.Record{EventID: s.id, Source: "bench", Seq: uint64(i + 1), EvaluationCompleted: s.ev}
	}
	chPid := testenv.ClickHouse(b).Pid()
	chBefore := testenv.CPUSeconds(chPid)
	start = time.Now()
	for i := 0; i < n; i += 500 {
		if err := raw.Insert(ctx, recs[i:min(i+500, n)]); err != nil {
			b.Fatal(err)
		}
	}
	insertRate := float64(n) / time.Since(start).Seconds()
	chRaw := testenv.CPUSeconds(chPid) - chBefore
	// Drop the baseline's table so its background merges do not compete with the ranker's run.
	raw.Close()
	e.storeExec("DROP DATABASE IF EXISTS " + rawCfg.Database)

	// The ranker: from process start until its consumer's ack floor covers every event.
	chBefore = testenv.CPUSeconds(chPid)
	start = time.Now()
	ranker := e.spawn("ranker", "RANKER_BATCH_SIZE=500", "RANKER_FLUSH_INTERVAL=50ms", "LOG_LEVEL=warn", "PPROF=true", os.Getenv("BENCH_RANKER_ENV"))
	if out := os.Getenv("BENCH_RANKER_PROFILE"); out != "" {
		go saveProfile(b, ranker, out)
	}
	peak := 0
	for ackFloor(b, e) < uint64(n) {
		peak = max(peak, rssHighWater(ranker.cmd.Process.Pid))
		time.Sleep(10 * time.Millisecond)
	}
	rankerRate := float64(n) / time.Since(start).Seconds()
	chRanker := testenv.CPUSeconds(chPid) - chBefore
	peak = max(peak, rssHighWater(ranker.cmd.Process.Pid))
	b.StopTimer()

	lower := min(brokerRate, insertRate)
	b.ReportMetric(brokerRate, "broker-events/s")
	b.ReportMetric(insertRate, "clickhouse-rows/s")
	b.ReportMetric(rankerRate, "ranker-events/s")
	b.ReportMetric(rankerRate/brokerRate, "ratio-vs-broker")
	b.ReportMetric(rankerRate/insertRate, "ratio-vs-insert")
	b.ReportMetric(rankerRate/lower, "ratio-vs-lower")
	b.ReportMetric(float64(peak)/1024, "ranker-peak-rss-MiB")
	rankerCPU := testenv.CPUSeconds(ranker.cmd.Process.Pid) / float64(n)
	b.ReportMetric(brokerCPU*1e6, "broker-loop-cpu-µs/msg")
	b.ReportMetric(ackCPU*1e6, "broker-consume-ack-cpu-µs/msg")
	b.ReportMetric(rankerCPU*1e6, "ranker-cpu-µs/event")
	b.ReportMetric(chRanker/float64(n)*1e6, "clickhouse-cpu-µs/event")
	b.ReportMetric(rankerCPU/brokerCPU, "ranker-x-broker")
	b.ReportMetric(chRanker/float64(n)/brokerCPU, "clickhouse-x-broker")
	if testing.Verbose() {
		b.Logf("CPU per event: ranker %.1fµs, ClickHouse %.1fµs under the ranker, %.1fµs under the raw insert",
			testenv.CPUSeconds(ranker.cmd.Process.Pid)/float64(n)*1e6, chRanker/float64(n)*1e6, chRaw/float64(n)*1e6)
		for _, m := range []string{"ranker_insert_duration_seconds_sum", "ranker_insert_duration_seconds_count", "ranker_leaderboard_query_duration_seconds_sum", "ranker_batch_size_sum"} {
			b.Logf("%s %v", m, ranker.metric(b, m))
		}
	}
}

// evaluationMessage is an evaluation ready to publish.
func evaluationMessage(tb testing.TB, p published) outgoing {
	return outgoing{id: p.id, subject: events.EvaluationSubject(p.ev.ExecutionID, p.ev.TeamID), body: mustMarshal(tb, p)}
}

// publishAcked publishes msgs asynchronously, at most 1,000 awaiting their ack, and waits for
// every ack.
func publishAcked(tb testing.TB, js jetstream.JetStream, msgs []outgoing) {
	tb.Helper()
	publishStream(tb, js, func() (outgoing, bool) {
		if len(msgs) == 0 {
			return outgoing{}, false
		}
		m := msgs[0]
		msgs = msgs[1:]
		return m, true
	})
}

// publishStream publishes the messages next yields until it returns false, as publishAcked does:
// 1,000 at a time, waiting for their acks before taking more, so a setup too large for memory
// can be read as it goes.
func publishStream(tb testing.TB, js jetstream.JetStream, next func() (outgoing, bool)) {
	tb.Helper()
	for more := true; more; {
		futures := make([]jetstream.PubAckFuture, 0, 1000)
		for len(futures) < cap(futures) {
			m, ok := next()
			if !ok {
				more = false
				break
			}
			f, err := js.PublishAsync(m.subject, m.body, jetstream.WithMsgID(m.id))
			if err != nil {
				tb.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				tb.Fatal(err)
			}
		}
	}
}

// rssHighWater is the process's peak resident set in KiB (VmHWM), 0 if unreadable.
func rssHighWater(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return kb
		}
	}
	return 0
}

// saveProfile writes a two-second CPU profile of p, taken once it serves HTTP, to path: set
// BENCH_RANKER_PROFILE to see where the ranker spends its time during the benchmark.
func saveProfile(b *testing.B, p *proc, path string) {
	for range 500 {
		resp, err := http.Get("http://" + p.addr + "/debug/pprof/profile?seconds=2")
		if err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if err := os.WriteFile(path, body, 0o644); err != nil {
			b.Log(err)
		}
		return
	}
}
