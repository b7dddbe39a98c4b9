package chstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// BenchmarkInsertQuorum measures what a write costs on three replicas: the latency of one batch
// insert of 10 evaluations with insert_quorum 2 (the ranker's write) against the same insert on
// one replica without a quorum, and a quorum read (2 of 3 replicas, rows merged) against a read of one node. b.N is
// the number of inserts of each kind.
func BenchmarkInsertQuorum(b *testing.B) {
	if testing.Short() {
		b.Skip("starts ZooKeeper and three ClickHouse servers")
	}
	cl := testenv.Cluster(b, 3)
	ctx := context.Background()
	open := func(db string, repl chstore.Replication, addrs []string) *chstore.Store {
		cfg := chstore.Config{Addrs: addrs, Database: db, Replication: repl}
		if err := chstore.CreateDatabase(ctx, cfg); err != nil {
			b.Fatal(err)
		}
		st, err := chstore.Open(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		if _, err := st.Migrate(ctx); err != nil {
			b.Fatal(err)
		}
		return st
	}
	replicated := open("bench_quorum", chstore.Replication{Enabled: true}, cl.Addrs())
	single := open("bench_single", chstore.Replication{}, cl.Addrs()[:1])
	seq := uint64(0)
	batch := func() []rank.Record {
		recs := make([]rank.Record, 10)
		for i := range recs {
			seq++
			recs[i] = rank.Record{EventID: fmt.Sprintf("ev-%d", seq), Source: "bench", Seq: seq, EvaluationCompleted: events.EvaluationCompleted{
				ExecutionID: fmt.Sprintf("exec-%d", seq%7), TeamID: fmt.Sprintf("team-%d", seq%10), TeamName: "T", RoundNumber: 1 + int(seq%5),
				Submission: events.Submission{Content: fmt.Sprintf("submission %d", seq)}, Evaluation: events.Scores{OverallScore: float64(seq % 100)},
				EvaluatedAt: time.Unix(int64(seq), 0)}}
		}
		return recs
	}
	measure := func(name string, f func() error) {
		d := make([]time.Duration, 0, b.N)
		for range b.N {
			start := time.Now()
			if err := f(); err != nil {
				b.Fatalf("%s: %v", name, err)
			}
			d = append(d, time.Since(start))
		}
		slices.Sort(d)
		b.Logf("%-40s p50 %7.2f ms  p99 %7.2f ms", name, ms(d[len(d)/2]), ms(d[len(d)*99/100]))
	}
	b.ResetTimer()
	measure("insert, one node", func() error { return single.Insert(ctx, batch()) })
	measure("insert, quorum 2 of 3", func() error { return replicated.Insert(ctx, batch()) })
	measure("scores read, one node", func() error { _, err := single.Scores(ctx, []string{"exec-1"}); return err })
	measure("scores read, quorum of 2 replicas", func() error { _, err := replicated.Scores(ctx, []string{"exec-1"}); return err })
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
