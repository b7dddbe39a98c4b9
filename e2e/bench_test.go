package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
// number of events: run it with -benchtime=50000x.
func BenchmarkRankerIngest(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	if err := events.EnsureStreams(ctx, e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		b.Fatal(err)
	}
	n := b.N
	sends := make([]published, n)
	bodies := make([][]byte, n)
	for i := range n {
		sends[i] = twoKiB(i)
		bodies[i] = mustMarshal(b, sends[i])
	}
	// Publish asynchronously in windows: setup, not measured.
	for start := 0; start < n; start += 1000 {
		var futures []jetstream.PubAckFuture
		for i := start; i < min(start+1000, n); i++ {
			f, err := e.js.PublishAsync(events.EvaluationSubject(sends[i].ev.ExecutionID, sends[i].ev.TeamID), bodies[i], jetstream.WithMsgID(sends[i].id))
			if err != nil {
				b.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(bodies[0])), "bytes/event")

	// Baseline 1: the broker's consume-and-ack rate with the ranker's pull buffer.
	cons, err := e.js.CreateOrUpdateConsumer(ctx, events.StreamEvaluations, jetstream.ConsumerConfig{Durable: "baseline", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
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

	// Baseline 2: raw batch inserts of the same rows, 500 at a time, into a table of its own.
	rawCfg := rank.Config{Addrs: []string{e.chAddr}, Database: e.database + "_raw"}
	if err := rank.CreateDatabase(ctx, rawCfg); err != nil {
		b.Fatal(err)
	}
	raw, err := rank.Open(ctx, rawCfg)
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	recs := make([]rank.Record, n)
	for i, s := range sends {
		recs[i] = rank.Record{EventID: s.id, Source: "bench", Seq: uint64(i + 1), EvaluationCompleted: s.ev}
	}
	start = time.Now()
	for i := 0; i < n; i += 500 {
		if err := raw.Insert(ctx, recs[i:min(i+500, n)]); err != nil {
			b.Fatal(err)
		}
	}
	insertRate := float64(n) / time.Since(start).Seconds()

	// The ranker: from process start until its consumer's ack floor covers every event.
	start = time.Now()
	ranker := e.spawn("ranker", "RANKER_BATCH_SIZE=500", "RANKER_FLUSH_INTERVAL=50ms", "LOG_LEVEL=warn")
	peak := 0
	for ackFloor(b, e) < uint64(n) {
		peak = max(peak, rssHighWater(ranker.cmd.Process.Pid))
		time.Sleep(2 * time.Millisecond)
	}
	rankerRate := float64(n) / time.Since(start).Seconds()
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
	if testing.Verbose() {
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ranker.cmd.Process.Pid)); err == nil {
			f := strings.Fields(string(st))
			ut, _ := strconv.Atoi(f[13])
			sy, _ := strconv.Atoi(f[14])
			b.Logf("ranker cpu: user %.2fs system %.2fs", float64(ut)/100, float64(sy)/100)
		}
		for _, m := range []string{"ranker_insert_duration_seconds_sum", "ranker_insert_duration_seconds_count", "ranker_leaderboard_query_duration_seconds_sum", "ranker_batch_size_sum"} {
			b.Logf("%s %v", m, ranker.metric(b, m))
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
