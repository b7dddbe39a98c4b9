package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/auditlog"
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
func BenchmarkArchiverRecord(b *testing.B) { benchArchiver(b, nil) }

// BenchmarkArchiverAuditLog is BenchmarkArchiverRecord with the audit log off and on
// (docs/audit.md): on, the archiver also reads each record again, extends the tree and signs a
// checkpoint every 1000 records, and the clock stops once the last checkpoint signs every record.
//
// `go test -run '^$' -bench ArchiverAuditLog -benchtime 4000x -count 3 ./e2e`
func BenchmarkArchiverAuditLog(b *testing.B) {
	b.Run("off", func(b *testing.B) { benchArchiver(b, nil) })
	b.Run("on", func(b *testing.B) {
		private, public, err := auditlog.NewKey("bench")
		if err != nil {
			b.Fatal(err)
		}
		keyFile := filepath.Join(b.TempDir(), "audit.key")
		if err := os.WriteFile(keyFile, []byte(private), 0o600); err != nil {
			b.Fatal(err)
		}
		benchArchiver(b, &benchLog{keyFile: keyFile, public: public})
	})
}

// benchLog is the audit log a benchmark of the archiver keeps.
type benchLog struct{ keyFile, public string }

func benchArchiver(b *testing.B, log *benchLog) {
	e := newEnv(b)
	settings := []string{"PPROF=true"}
	if log != nil {
		settings = append(settings, "ARCHIVER_AUDIT_SIGNING_KEY_FILE="+log.keyFile)
	}
	arch := e.start("archiver", settings...)
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
		// At most 2,000 in flight: beyond the client's 4,000 a publish stalls and fails.
		if i > 0 && i%2000 == 0 {
			select {
			case <-e.js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("publishes not acknowledged within a minute")
			}
		}
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
	if log != nil {
		v, err := auditlog.Verifier(log.public)
		if err != nil {
			b.Fatal(err)
		}
		testenv.WaitFor(b, 5*time.Minute, "a checkpoint of every record", func() (bool, string) {
			st, err := e.js.Stream(ctx, events.StreamAudit)
			if err != nil {
				return false, err.Error()
			}
			last, err := st.GetLastMsgForSubject(ctx, auditlog.Subject)
			if err != nil {
				return false, err.Error()
			}
			c, err := auditlog.Open(last.Data, v)
			if err != nil {
				return false, err.Error()
			}
			return c.Size >= int64(b.N), fmt.Sprintf("signed %d of %d", c.Size, b.N)
		})
	}
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
