package e2e

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestFullJetStreamLosesNothing: a NATS server whose JetStream storage is nearly full (a filler
// stream holds most of it) fills up under a tournament: the composer turns unready naming the
// storage its answers cannot get, orchestrators' publishes are refused (so not acknowledged), and
// nothing acknowledged is lost. Once the filler is deleted, without a restart, every request is
// answered once, every evaluation ranked, every record archived.
func TestFullJetStreamLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	const maxStore = 64 << 20
	ns, err := servers.StartNATS(t.TempDir(), func(o *server.Options) { o.JetStreamMaxStore = maxStore })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, js := testenv.JetStream(t, ns)
	addr, db := testenv.Database(t)
	e := &env{t: t, ns: ns, nc: nc, js: js, chAddr: addr, database: db}
	ranker := e.start("ranker")
	composer := e.start("composer", "COMPOSER_ACK_WAIT=2s")
	e.start("archiver")

	// The filler takes all but about 512 KiB.
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "FILLER", Subjects: []string{"filler.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 256<<10)
	for i := 0; ; i++ {
		info, err := js.AccountInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Store > maxStore-(512<<10) {
			break
		}
		if _, err := js.Publish(ctx, fmt.Sprintf("filler.%d", i), chunk); err != nil {
			t.Fatalf("filling: %v (store %d of %d)", err, info.Store, maxStore)
		}
	}

	// An orchestrator publishes every pair until JetStream takes it, as the contract says: the
	// same id again, so nothing is stored twice.
	const execs, teams, rounds = 6, 4, 5
	type pair struct{ exec, team string }
	var mu sync.Mutex
	refused := 0
	var lastRefusal string
	publish := func(subject, id, eventType string, at time.Time, data any) {
		body, err := events.Marshal(id, "orchestrator/test", eventType, at, data)
		if err != nil {
			t.Error(err)
			return
		}
		for ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := events.Publish(pctx, js, subject, id, body)
			cancel()
			if err == nil {
				return
			}
			mu.Lock()
			refused++
			lastRefusal = err.Error()
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := 1; r <= rounds; r++ {
			for x := range execs {
				for k := range teams {
					p := pair{fmt.Sprintf("full-%d", x), fmt.Sprintf("team-%d", k)}
					ev := evaluation(p.exec, p.team, "Team "+p.team, r, float64(10*r+k), coldText(uint64(x*100+k*10+r), 4096), t0.Add(time.Duration(r)*time.Minute))
					publish(events.EvaluationSubject(p.exec, p.team), fmt.Sprintf("ev-%s-%s-%d", p.exec, p.team, r), events.TypeEvaluationCompleted, ev.EvaluatedAt, ev)
					rr := events.RoundRequested{ExecutionID: p.exec, TeamID: p.team, TeamName: "Team " + p.team, RoundNumber: r + 1, UserPrompt: "Improve.", MaxRounds: rounds + 1}
					publish(events.RoundSubject(p.exec, p.team), fmt.Sprintf("req-%s-%s-%d", p.exec, p.team, r+1), events.TypeRoundRequested, t0.Add(time.Duration(r)*time.Minute+time.Second), rr)
				}
			}
		}
	}()

	// The storage fills: the composer says so.
	var unready string
	testenv.WaitFor(t, 60*time.Second, "the composer unready for PROMPTS' storage", func() (bool, string) {
		code, body := readiness(composer)
		if code == http.StatusServiceUnavailable && strings.Contains(body, "answers cannot be stored") {
			unready = body
			return true, ""
		}
		mu.Lock()
		defer mu.Unlock()
		return false, fmt.Sprintf("composer %d %s; %d publishes refused", code, body, refused)
	})
	t.Logf("full: composer /readyz: %s; orchestrator refused %d times (last: %s)", unready, refused, lastRefusal)
	if !strings.Contains(unready, "JetStream storage is full") {
		t.Errorf("the composer's readiness does not name the storage: %s", unready)
	}

	// Space freed, no restart.
	freed := time.Now()
	if err := js.DeleteStream(ctx, "FILLER"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the orchestrator's publishes were still refused 2 minutes after the space was freed")
	}
	n := execs * teams * rounds
	got := 0
	for x := range execs {
		exec := fmt.Sprintf("full-%d", x)
		answers := e.answers("prompt.*."+exec+".*", teams*rounds, 60*time.Second) // fails on a request answered twice
		for id, a := range answers {
			if !a.ok() {
				t.Errorf("%s: %s %+v", id, a.subject, a.failed)
			}
		}
		got += len(answers)
		board := waitRanked(t, ranker, exec, teams*rounds)
		if len(board.Teams) != teams {
			t.Errorf("%s ranks %d teams, want %d", exec, len(board.Teams), teams)
		}
		e.checkArchive(exec, teams*rounds)
	}
	waitReadiness(t, composer, http.StatusOK, 30*time.Second)
	t.Logf("after the space was freed: %d requests answered once, every evaluation ranked and archived in %s", got, time.Since(freed).Round(time.Millisecond))
	if got != n {
		t.Errorf("%d answers, want %d", got, n)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("the test ended early")
	}
}

// TestFullClickHouseLosesNothing: ClickHouse's disk (a small filesystem of its own) fills up
// under a tournament: the ranker and the archiver turn unready naming the disk, hold what they
// have unacknowledged, and requests waiting for the held evaluations answer inputs_not_ready
// (retryable). Once space is freed, without a restart, every evaluation is ranked, every record
// archived, every acknowledged request answered exactly once.
func TestFullClickHouseLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the services")
	}
	// The data disk alone is small (its logs and temporary files are elsewhere, as on a server
	// whose data volume fills): a server with no byte left for its own logs drops connections
	// instead of refusing inserts.
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", data).CombinedOutput(); err != nil {
		t.Skipf("a small filesystem for ClickHouse needs mount (root): %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", data).Run() })
	ctx := t.Context()
	startCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	ch, err := servers.StartClickHouse(startCtx, dir)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.Stop() })
	ns := testenv.NATS(t)
	nc, js := testenv.JetStream(t, ns)
	e := &env{t: t, ns: ns, nc: nc, js: js, chAddr: ch.Addr, database: "full"}
	ranker := e.start("ranker", "RANKER_ACK_WAIT=3s")
	e.start("composer", "COMPOSER_INPUTS_TIMEOUT=2s")
	archiver := e.start("archiver", "ARCHIVER_ACK_WAIT=3s")

	// The filler takes all but a few MiB of the disk, in data that does not compress.
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr}, Auth: clickhouse.Auth{Database: "full"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Exec(ctx, "CREATE TABLE filler (s String) ENGINE = MergeTree ORDER BY tuple()"); err != nil {
		t.Fatal(err)
	}
	free := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(data, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	junk := make([]byte, 64<<10)
	for free() > 6<<20 {
		batch, err := conn.PrepareBatch(ctx, "INSERT INTO filler (s)")
		if err != nil {
			t.Fatal(err)
		}
		for range 16 {
			_, _ = cryptorand.Read(junk)
			if err := batch.Append(string(junk)); err != nil {
				t.Fatal(err)
			}
		}
		if err := batch.Send(); err != nil {
			break // full already
		}
	}
	t.Logf("ClickHouse's disk: %d KiB free", free()>>10)

	// An orchestrator plays rounds: each team's evaluation, then its next request; publishes are
	// acknowledged by JetStream, which has room.
	const execs, teams, rounds = 3, 4, 8
	requests := map[string]bool{}
	for r := 1; r <= rounds; r++ {
		for x := range execs {
			for k := range teams {
				exec, team := fmt.Sprintf("chfull-%d", x), fmt.Sprintf("team-%d", k)
				ev := evaluation(exec, team, "Team "+team, r, float64(10*r+k), coldText(uint64(x*100+k*10+r), 128<<10), t0.Add(time.Duration(r)*time.Minute))
				e.publishEvaluation(fmt.Sprintf("ev-%s-%s-%d", exec, team, r), ev)
				id := fmt.Sprintf("req-%s-%s-%d", exec, team, r+1)
				e.requestRound(id, events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: r + 1,
					UserPrompt: "Improve.", MaxRounds: rounds + 1}, t0.Add(time.Duration(r)*time.Minute+time.Second))
				requests[id] = true
			}
		}
	}
	// Whichever writes first finds the disk full: the ranker (evaluations) or the archiver
	// (prompts); each holds what it has.
	var why string
	testenv.WaitFor(t, 60*time.Second, "the ranker or the archiver unready for want of disk", func() (bool, string) {
		for _, p := range []*proc{ranker, archiver} {
			code, body := readiness(p)
			if code == http.StatusServiceUnavailable && strings.Contains(body, "no disk space left") {
				why = p.name + ": " + body
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d KiB free", free()>>10)
	})
	t.Logf("full: %s", why)
	for line := range strings.Lines(ranker.logs.String()) {
		if strings.Contains(line, "clickhouse insert failed") {
			t.Logf("full: the ranker's log: %s", strings.TrimSpace(line))
			break
		}
	}
	if code, body := readiness(archiver); code == http.StatusServiceUnavailable {
		t.Logf("full: archiver /readyz: %s", body)
	}

	// Space freed, no restart.
	freed := time.Now()
	if err := conn.Exec(ctx, "DROP TABLE filler"); err != nil {
		t.Fatal(err)
	}
	answered := 0
	for x := range execs {
		exec := fmt.Sprintf("chfull-%d", x)
		board := waitRanked(t, ranker, exec, teams*rounds)
		if len(board.Teams) != teams {
			t.Errorf("%s ranks %d teams, want %d", exec, len(board.Teams), teams)
		}
		got := e.answers("prompt.*."+exec+".*", teams*rounds, 60*time.Second) // fails on a request answered twice
		for id, a := range got {
			if !requests[id] {
				t.Errorf("an answer to %s, which was never requested", id)
			}
			if !a.ok() && a.failed.Code != events.CodeInputsNotReady {
				t.Errorf("%s: %s %+v", id, a.subject, a.failed)
			}
		}
		answered += len(got)
		e.checkArchive(exec, teams*rounds)
	}
	waitReadiness(t, ranker, http.StatusOK, 30*time.Second)
	waitReadiness(t, archiver, http.StatusOK, 30*time.Second)
	t.Logf("after the space was freed: %d evaluations ranked, %d requests answered once and archived, in %s", execs*teams*rounds, answered, time.Since(freed).Round(time.Millisecond))
}
