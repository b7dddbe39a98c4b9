package chstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"golang.org/x/sync/errgroup"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Shape of the generated table: executions of 10 teams x 10 rounds, 100 evaluations each.
const (
	benchTeams  = 10
	benchRounds = 10
	perExec     = benchTeams * benchRounds
)

// BenchmarkLeaderboardRead measures the latency of one execution's leaderboard read with
// 1,000,000 evaluations in the table and again with 10,000,000, to show the read costs what one
// execution holds, not what the table holds. b.N is the number of reads at each size; the rows
// are generated inside ClickHouse (INSERT ... SELECT FROM numbers), so filling 10M takes seconds,
// not minutes. Run it with -benchtime=2000x.
func BenchmarkLeaderboardRead(b *testing.B) {
	if testing.Short() {
		b.Skip("fills a table with 10M rows")
	}
	s, raw := openStoreAt(b)
	ctx := context.Background()

	// Baseline: the round trip of the cheapest query, through the same client.
	base := percentiles(b, func() error {
		var one uint8
		return raw.QueryRow(ctx, "SELECT 1").Scan(&one)
	})

	var p50, p99 [2]time.Duration
	filled := 0
	for i, total := range []int{1_000_000, 10_000_000} {
		b.StopTimer()
		fill(b, raw, filled, total)
		filled = total
		// The execution read is in the middle of the key range, not at an end.
		exec := fmt.Sprintf("exec-%07d", total/perExec/2)
		board, err := s.Leaderboard(ctx, exec, events.Desc, rank.Everything())
		if err != nil {
			b.Fatal(err)
		}
		if len(board.Rows) != benchTeams || board.Rows[0].Rounds != benchRounds {
			b.Fatalf("%s: %d rows, first %+v; want %d teams of %d rounds", exec, len(board.Rows), board.Rows[0], benchTeams, benchRounds)
		}
		b.StartTimer()
		lat := percentiles(b, func() error {
			_, err := s.Leaderboard(ctx, exec, events.Desc, rank.Everything())
			return err
		})
		b.StopTimer()
		p50[i], p99[i] = lat[0], lat[1]
	}
	b.ReportMetric(float64(base[0].Microseconds())/1000, "select1-p50-ms")
	b.ReportMetric(float64(base[1].Microseconds())/1000, "select1-p99-ms")
	b.ReportMetric(float64(p50[0].Microseconds())/1000, "p50-ms-1M")
	b.ReportMetric(float64(p99[0].Microseconds())/1000, "p99-ms-1M")
	b.ReportMetric(float64(p50[1].Microseconds())/1000, "p50-ms-10M")
	b.ReportMetric(float64(p99[1].Microseconds())/1000, "p99-ms-10M")
	b.ReportMetric(float64(p99[1])/float64(p99[0]), "p99-growth-10x")
}

// percentiles runs f b.N times and returns the p50 and p99 of its latency.
func percentiles(b *testing.B, f func() error) [2]time.Duration {
	n := b.N
	lat := make([]time.Duration, n)
	for i := range n {
		start := time.Now()
		if err := f(); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	slices.Sort(lat)
	return [2]time.Duration{lat[n/2], lat[n*99/100]}
}

// fill adds evaluations from row number from up to to: execution i/100, team (i/10)%10, round
// i%10+1, a deterministic score, and a short submission. Merges are let finish before returning so
// a background merge does not land in the measurement.
func fill(b *testing.B, raw driver.Conn, from, to int) {
	ctx := context.Background()
	start := time.Now()
	q := fmt.Sprintf(`INSERT INTO evaluations (execution_id, team_id, round_number, event_id, team_name,
		overall_score, metrics, feedback, submission, submission_format, evaluated_at, evaluated_at_us,
		event_source, stream_seq)
	SELECT concat('exec-', substring(toString(10000000 + intDiv(n, %[1]d)), 2)) AS execution_id,
	       concat('team-', toString(intDiv(n, %[2]d) %% %[3]d)) AS team_id,
	       toUInt32(n %% %[2]d + 1), concat('ev-', toString(n)), concat('Team ', toString(intDiv(n, %[2]d) %% %[3]d)),
	       toFloat64((n * 7919) %% 1000) / 10, '[]', 'feedback', concat('submission ', toString(n)), 'text',
	       '2026-11-21T10:00:00Z', toInt64(1795773600000000 + n), 'bench', toUInt64(n + 1)
	FROM (SELECT number + %[4]d AS n FROM system.numbers LIMIT %[5]d)`, perExec, benchRounds, benchTeams, from, to-from)
	if err := raw.Exec(ctx, q); err != nil {
		b.Fatalf("fill %d..%d: %v", from, to, err)
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		var merging uint64
		if err := raw.QueryRow(ctx, "SELECT count() FROM system.merges WHERE table = 'evaluations'").Scan(&merging); err != nil {
			b.Fatal(err)
		}
		if merging == 0 {
			break
		}
	}
	b.Logf("filled %d..%d in %s", from, to, time.Since(start).Round(time.Millisecond))
}

// BenchmarkScoresReadThreads sets Config.ReadThreads (ClickHouse's max_threads for the reads of
// one execution) from measurement. 2,000 executions of 10 teams x 10 rounds, one part per round,
// are read by 16 goroutines at once, as composer replicas and the ranker's announcer read, with
// the server's default (0: a thread per core) and with 1, 2 and 16 threads (16: the default on
// a 16-core server). b.N reads at each setting; it reports reads/s, ClickHouse CPU per read
// (from /proc/<pid>/stat) and the p50 of a read alone.
//
// go test -run '^$' -bench ScoresReadThreads -benchtime 4000x ./internal/chstore
func BenchmarkScoresReadThreads(b *testing.B) {
	const executions, readers = 2000, 16
	_, cfg := testenv.Store(b, true)
	raw, err := clickhouse.Open(&clickhouse.Options{Addr: cfg.Addrs, Auth: clickhouse.Auth{Database: cfg.Database}})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	// Rounds arrive apart in a tournament, so an execution's rows lie in several parts until
	// merges catch up: one part per round here (merges stopped), each holding every execution.
	if err := raw.Exec(context.Background(), "SYSTEM STOP MERGES evaluations"); err != nil {
		b.Fatal(err)
	}
	fillRounds(b, raw, executions)
	pid := testenv.ClickHouse(b).Pid()
	ctx := context.Background()
	b.ResetTimer()
	for _, threads := range []int{0, 1, 2, 16} {
		c := cfg
		c.ReadThreads = threads
		s, err := chstore.Open(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		read := func(i int) error {
			exec := fmt.Sprintf("exec-%07d", (i*7919)%executions)
			evs, err := s.Scores(ctx, []string{exec})
			if err == nil && len(evs[exec].Reduce(rank.Everything()).Leaderboard(events.Desc).Rows) != benchTeams {
				err = fmt.Errorf("%s: not %d teams", exec, benchTeams)
			}
			return err
		}
		alone := percentiles(b, func() error { return read(0) })
		var next atomic.Int64
		cpu0, start := testenv.CPUSeconds(pid), time.Now()
		var g errgroup.Group
		for range readers {
			g.Go(func() error {
				for i := int(next.Add(1)); i <= b.N; i = int(next.Add(1)) {
					if err := read(i); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			b.Fatal(err)
		}
		wall, cpu := time.Since(start), testenv.CPUSeconds(pid)-cpu0
		s.Close()
		name := fmt.Sprintf("threads=%d", threads)
		if threads == 0 {
			name = "threads=default"
		}
		b.ReportMetric(float64(b.N)/wall.Seconds(), name+"-reads/s")
		b.ReportMetric(cpu/float64(b.N)*1e6, name+"-ch-µs/read")
		b.ReportMetric(float64(alone[0].Microseconds())/1000, name+"-alone-p50-ms")
	}
}

// fillRounds adds executions of benchTeams x benchRounds evaluations as fill does, one INSERT
// (one part) per round.
func fillRounds(b *testing.B, raw driver.Conn, executions int) {
	for r := range benchRounds {
		q := fmt.Sprintf(`INSERT INTO evaluations (execution_id, team_id, round_number, event_id, team_name,
		overall_score, metrics, feedback, submission, submission_format, evaluated_at, evaluated_at_us,
		event_source, stream_seq)
	SELECT concat('exec-', substring(toString(10000000 + intDiv(n, %[1]d)), 2)) AS execution_id,
	       concat('team-', toString(n %% %[1]d)) AS team_id, toUInt32(%[2]d), concat('ev-', toString(n), '-', toString(%[2]d)),
	       concat('Team ', toString(n %% %[1]d)), toFloat64((n * 7919 + %[2]d) %% 1000) / 10, '[]', 'feedback',
	       concat('submission ', toString(n)), 'text', '2026-11-21T10:00:00Z', toInt64(1795773600000000 + n),
	       'bench', toUInt64(%[2]d * 1000000 + n + 1)
	FROM (SELECT number AS n FROM system.numbers LIMIT %[3]d)`, benchTeams, r+1, executions*benchTeams)
		if err := raw.Exec(context.Background(), q); err != nil {
			b.Fatalf("fill round %d: %v", r+1, err)
		}
	}
}
