package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

var capacityExecutions = flag.Int("capacity.executions", 6, "BenchmarkArchiveCapacity: executions of 20 teams x 10 rounds")

// BenchmarkArchiveCapacity plays a realistic tournament (executions of 20 teams and 10 rounds,
// submissions of distinct LLM-like text of 2-4 KiB each, feedback of a few hundred bytes, played
// round by round as an orchestrator does, all executions at once) through the ranker, the composer
// and the archiver, and reports what one prompt costs to keep:
//
//   - raw_B/prompt: the prompt.composed event as published;
//   - js_s2_B/prompt and js_plain_B/prompt: PROMPTS' block files on disk, S2-compressed as the
//     services make it, and the same records in a stream without compression; js_s2_closed_x:
//     the closed blocks' S2 size over their plain size (the server compresses a block once full);
//   - ch_lz4_B/prompt and ch_zstd_B/prompt: the prompts archive's compressed columns in ClickHouse
//     (merged), under the server's default lz4 and under zstd (config.xml <compression>), and
//     ch_*_x: that over raw;
//   - lag_p99_s: archiver_lag_seconds' 99th percentile while the tournament played;
//   - verify_first_s and verify_last_s: `podium prompts verify` of one archived record after the
//     first execution was archived and after all of them: the audit's cost does not grow with the
//     archive.
//
// `go test -run '^$' -bench ArchiveCapacity -benchtime 1x ./e2e [-capacity.executions N]`.
func BenchmarkArchiveCapacity(b *testing.B) {
	for range b.N {
		archiveCapacity(b)
	}
}

func archiveCapacity(b *testing.B) {
	e := newEnv(b)
	e.start("ranker")
	e.start("composer")
	arch := e.start("archiver")
	const teams, rounds = 20, 10
	var answered atomic.Int64
	sub, err := e.nc.Subscribe("prompt.>", func(*nats.Msg) { answered.Add(1) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()

	execs := make([]string, *capacityExecutions)
	for i := range execs {
		execs[i] = fmt.Sprintf("cap-%03d", i)
	}
	want := int64(0)
	// play plays every round of execs, all at once, round by round.
	play := func(execs []string, offset int) {
		for r := 1; r <= rounds; r++ {
			for x, exec := range execs {
				for k := range teams {
					team := fmt.Sprintf("team-%02d", k)
					if r > 1 {
						seed := uint64((offset+x)*10_000 + k*100 + r)
						sub := coldText(seed, 2048+int(seed%2048))
						ev := evaluation(exec, team, "Team "+team, r-1, float64(seed%1000)/10, sub, t0.Add(time.Duration(r)*time.Minute))
						ev.Evaluation.Feedback = coldText(seed+7, 300+int(seed%300))
						e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r-1), ev)
					}
					e.requestRound(fmt.Sprintf("req-%s-%s-%d", exec, team, r), events.RoundRequested{ExecutionID: exec, TeamID: team,
						TeamName: "Team " + team, RoundNumber: r, UserPrompt: "Write the best possible design document for a rate limiter.",
						MaxRounds: rounds}, t0.Add(time.Duration(r)*time.Minute+time.Second))
					want++
				}
			}
			testenv.WaitFor(b, 5*time.Minute, fmt.Sprintf("round %d answered", r), func() (bool, string) {
				return answered.Load() >= want, fmt.Sprintf("%d of %d", answered.Load(), want)
			})
		}
	}
	// The first execution alone, its last prompt verified once archived; then every other, and
	// the same record verified again.
	play(execs[:1], 0)
	waitArchiverIdle(b, e)
	verifyFirst := timedVerify(b, e, execs[0])
	play(execs[1:], 1)
	waitArchiverIdle(b, e)
	verifyLast := timedVerify(b, e, execs[0])

	// Raw events, and PROMPTS on disk.
	ctx := context.Background()
	prompts, err := e.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		b.Fatal(err)
	}
	info, err := prompts.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	n := float64(info.State.Msgs)
	if int64(n) != want {
		b.Fatalf("PROMPTS holds %v records, want %d", n, want)
	}
	raw := 0
	copied := copyStream(b, e, events.StreamPrompts, "PLAIN", jetstream.NoCompression, func(m jetstream.Msg) { raw += len(m.Data()) })
	if copied != int(want) {
		b.Fatalf("copied %d records, want %d", copied, want)
	}
	s2Blocks, plainBlocks := blockBytes(b, e.ns.StoreDir(), events.StreamPrompts), blockBytes(b, e.ns.StoreDir(), "PLAIN")
	s2, plain := blockTotal(s2Blocks), blockTotal(plainBlocks)
	s2x := compressionOfClosedBlocks(s2Blocks, plainBlocks)
	// EVALUATIONS, which the services leave uncompressed: what S2 would make of it.
	evalBytes := 0
	copyStream(b, e, events.StreamEvaluations, "EVPLAIN", jetstream.NoCompression, func(m jetstream.Msg) { evalBytes += len(m.Data()) })
	copyStream(b, e, events.StreamEvaluations, "EVS2", jetstream.S2Compression, func(jetstream.Msg) {})
	evS2x := compressionOfClosedBlocks(blockBytes(b, e.ns.StoreDir(), "EVS2"), blockBytes(b, e.ns.StoreDir(), "EVPLAIN"))

	// The archive under lz4 (this server's default), then the same rows under zstd.
	lz4, rows := archiveBytes(b, e.chAddr, e.database)
	if rows != uint64(want) {
		b.Fatalf("the archive holds %d records, want %d", rows, want)
	}
	zstd := zstdArchiveBytes(b, e)

	p99 := histogramQuantile(b, arch, "archiver_lag_seconds", 0.99)
	b.ReportMetric(float64(raw)/n, "raw_B/prompt")
	b.ReportMetric(float64(s2)/n, "js_s2_B/prompt")
	b.ReportMetric(float64(plain)/n, "js_plain_B/prompt")
	b.ReportMetric(s2x, "js_s2_closed_x")
	b.ReportMetric(evS2x, "evaluations_s2_closed_x")
	b.ReportMetric(float64(lz4)/n, "ch_lz4_B/prompt")
	b.ReportMetric(float64(zstd)/n, "ch_zstd_B/prompt")
	b.ReportMetric(float64(lz4)/float64(raw), "ch_lz4_x")
	b.ReportMetric(float64(zstd)/float64(raw), "ch_zstd_x")
	b.ReportMetric(p99, "lag_p99_s")
	b.ReportMetric(verifyFirst.Seconds(), "verify_first_s")
	b.ReportMetric(verifyLast.Seconds(), "verify_last_s")
	b.Logf("%d prompts of %d executions (20 teams x 10 rounds): raw %.0f B/prompt; PROMPTS on disk %.0f B/prompt S2 (%d blocks; the closed ones %.3fx their plain size), %.0f plain; archive %.0f B/prompt lz4 (%.3fx raw), %.0f zstd (%.3fx); archive lag p99 <= %.3f s; verify of one record %s after one execution, %s after %d; EVALUATIONS (%d B an evaluation) with S2: %.3fx",
		int(n), len(execs), float64(raw)/n, float64(s2)/n, len(s2Blocks), s2x, float64(plain)/n, float64(lz4)/n, float64(lz4)/float64(raw), float64(zstd)/n,
		float64(zstd)/float64(raw), p99, verifyFirst.Round(time.Millisecond), verifyLast.Round(time.Millisecond), len(execs), evalBytes/max(1, int(n)-len(execs)*teams), evS2x)
}

// waitArchiverIdle waits until the archiver has every record of PROMPTS.
func waitArchiverIdle(b *testing.B, e *env) {
	b.Helper()
	testenv.WaitFor(b, 2*time.Minute, "the archive caught up", func() (bool, string) {
		info, err := consumerInfo(context.Background(), e.js, events.StreamPrompts, events.ConsumerArchiver)
		if err != nil {
			return false, err.Error()
		}
		return info.NumPending == 0 && info.NumAckPending == 0, fmt.Sprintf("%d pending", info.NumPending+uint64(info.NumAckPending))
	})
}

// timedVerify times `podium prompts verify` of the last round of team-00 of exec.
func timedVerify(b *testing.B, e *env, exec string) time.Duration {
	b.Helper()
	start := time.Now()
	out, code := e.podium(b, nil, "prompts", "verify", exec, "team-00", "10")
	took := time.Since(start)
	if code != 0 || !strings.Contains(out, "read from the ClickHouse archive") && !strings.Contains(out, "1 record(s) verified") {
		b.Fatalf("verify: exit %d\n%s", code, out)
	}
	return took
}

// copyStream copies every message of stream into a new stream name with compression (subjects
// name.>), calling each on every message, and returns how many it copied.
func copyStream(b *testing.B, e *env, stream, name string, compression jetstream.StoreCompression, each func(jetstream.Msg)) int {
	b.Helper()
	ctx := context.Background()
	if _, err := e.js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"},
		Storage: jetstream.FileStorage, Compression: compression}); err != nil {
		b.Fatal(err)
	}
	cons, err := e.js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		b.Fatal(err)
	}
	copied := 0
	for pending := int(info.NumPending); copied < pending; {
		batch, err := cons.Fetch(min(pending-copied, 256), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		for m := range batch.Messages() {
			each(m)
			if _, err := e.js.Publish(ctx, strings.ToLower(name)+"."+m.Subject(), m.Data()); err != nil {
				b.Fatal(err)
			}
			copied++
		}
	}
	return copied
}

// blockBytes is the size of each message block file of a stream under a JetStream store
// directory, by block index.
func blockBytes(b *testing.B, storeDir, stream string) map[int]int64 {
	b.Helper()
	out := map[int]int64{}
	dir := string(filepath.Separator) + stream + string(filepath.Separator) + "msgs" + string(filepath.Separator)
	err := filepath.WalkDir(storeDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".blk") || !strings.Contains(path, dir) {
			return err
		}
		index, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(path), ".blk"))
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		out[index] = fi.Size()
		return nil
	})
	if err != nil || len(out) == 0 {
		b.Fatalf("blocks of %s under %s: %v, %v", stream, storeDir, out, err)
	}
	return out
}

// compressionOfClosedBlocks is the on-disk size of a compressed stream's blocks over the same
// blocks of an uncompressed copy, the block being written left out: the server compresses a
// block once it is full, so that ratio is what a stream holding much more than a block costs.
// Both streams cut blocks at the same logical size, so block i holds the same records in both.
// It returns 0 when there is no closed block yet.
func compressionOfClosedBlocks(compressed, plain map[int]int64) float64 {
	last := 0
	for i := range compressed {
		last = max(last, i)
	}
	var c, p int64
	for i, size := range compressed {
		if i != last && plain[i] > 0 {
			c, p = c+size, p+plain[i]
		}
	}
	if p == 0 {
		return 0
	}
	return float64(c) / float64(p)
}

func blockTotal(blocks map[int]int64) (total int64) {
	for _, size := range blocks {
		total += size
	}
	return total
}

// archiveBytes merges the prompts table and returns its compressed bytes and its distinct records.
func archiveBytes(b *testing.B, addr, database string) (uint64, uint64) {
	b.Helper()
	ctx := context.Background()
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}, Auth: clickhouse.Auth{Database: database}})
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "OPTIMIZE TABLE prompts FINAL"); err != nil {
		b.Fatal(err)
	}
	var bytes, rows uint64
	if err := conn.QueryRow(ctx, "SELECT sum(data_compressed_bytes) FROM system.columns WHERE database = ? AND table = 'prompts'", database).Scan(&bytes); err != nil {
		b.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT uniqExact(event_id) FROM prompts WHERE execution_id != ''").Scan(&rows); err != nil {
		b.Fatal(err)
	}
	return bytes, rows
}

// zstdArchiveBytes copies the archive into a ClickHouse server configured for zstd and returns
// its compressed bytes there.
func zstdArchiveBytes(b *testing.B, e *env) uint64 {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch, err := servers.StartClickHouseWith(ctx, b.TempDir(), "<compression><case><method>zstd</method></case></compression>")
	if err != nil {
		b.Fatal(err)
	}
	defer ch.Stop()
	cfg := chstore.Config{Addrs: []string{ch.Addr}, Database: "zstd"}
	if err := chstore.CreateDatabase(ctx, cfg); err != nil {
		b.Fatal(err)
	}
	dst, err := chstore.Open(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer dst.Close()
	if _, err := dst.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	src, err := chstore.Open(ctx, chstore.Config{Addrs: []string{e.chAddr}, Database: e.database})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	for i := range *capacityExecutions {
		recs, err := src.ArchivedPrompts(ctx, chstore.PromptFilter{ExecutionID: fmt.Sprintf("cap-%03d", i)})
		if err != nil {
			b.Fatal(err)
		}
		if err := dst.ArchivePrompts(ctx, recs); err != nil {
			b.Fatal(err)
		}
	}
	bytes, _ := archiveBytes(b, ch.Addr, "zstd")
	return bytes
}

// histogramQuantile estimates a quantile of a histogram on p's /metrics as the upper bound of
// the bucket that holds it.
func histogramQuantile(b *testing.B, p *proc, name string, q float64) float64 {
	b.Helper()
	total := p.metric(b, name+"_count")
	if total == 0 {
		b.Fatalf("%s is empty", name)
	}
	resp, err := httpGet("http://" + p.addr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	best := math.Inf(1)
	for _, line := range strings.Split(resp, "\n") {
		rest, ok := strings.CutPrefix(line, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le, count, _ := strings.Cut(rest, `"} `)
		bound, err1 := strconv.ParseFloat(le, 64)
		c, err2 := strconv.ParseFloat(strings.TrimSpace(count), 64)
		if err1 == nil && err2 == nil && c >= q*total && bound < best {
			best = bound
		}
	}
	return best
}

// httpGet returns the body of a GET.
func httpGet(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}
