package e2e

import (
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// publishAll sends sends[from:to]. The Nats-Msg-Id includes the position, so a replay of an id
// is stored again, as it would be after the broker's duplicate window.
func publishAll(t testing.TB, e *env, sends []published, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		s := sends[i]
		e.publishRaw(events.EvaluationSubject(s.ev.ExecutionID, s.ev.TeamID), fmt.Sprintf("%s/%d", s.id, i), mustMarshal(t, s))
	}
}

// checkAgainstTruth compares every leaderboard the ranker serves with the ground truth.
func checkAgainstTruth(t *testing.T, ranker *proc, first map[string]published) {
	t.Helper()
	boards, _ := truth(first, false)
	for exec, want := range boards {
		var got leaderboard
		ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &got)
		if diff := gocmp.Diff(want, got.Teams); diff != "" {
			t.Errorf("%s leaderboard (-truth +api):\n%s", exec, diff)
		}
	}
}

func ackFloor(t testing.TB, e *env) uint64 {
	t.Helper()
	cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		return 0
	}
	info, err := cons.Info(t.Context())
	if err != nil {
		return 0
	}
	return info.AckFloor.Stream
}

// TestRankerKilledMidStreamLosesNothing kills a ranker with SIGKILL while it ingests and starts a
// new one: every evaluation ends up committed once and the leaderboards are exact.
func TestRankerKilledMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	opts := []string{"RANKER_BATCH_SIZE=100", "RANKER_FLUSH_INTERVAL=30ms", "RANKER_ACK_WAIT=2s"}
	first := e.start("ranker", opts...)
	sends, firstByID := tournament(7, 30, 8, 6)
	half := len(sends) / 2
	publishAll(t, e, sends, 0, half)
	// Polled every millisecond, not with testenv.WaitFor's backoff: the kill must land as soon as
	// the first batch is committed, while the rest of the half is still in flight.
	for ackFloor(t, e) == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	first.done <- nil
	killedAt := ackFloor(t, e)
	publishAll(t, e, sends, half, len(sends))
	second := e.start("ranker", opts...)
	waitCommitted(t, e, len(sends))
	t.Logf("killed after %d of %d events were committed; the second ranker committed the rest", killedAt, len(sends))
	if killedAt >= uint64(half) {
		t.Logf("the first ranker had committed everything published before the kill")
	}
	checkAgainstTruth(t, second, firstByID)
}

// TestRankerRidesOutClickHousePauseAndRestart freezes ClickHouse (SIGSTOP) during ingestion, then
// restarts it: readiness turns 503 and back, nothing is lost, ingestion resumes by itself.
func TestRankerRidesOutClickHousePauseAndRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A server of its own: freezing and restarting the shared one would fail the tests beside it.
	ch := testenv.PrivateClickHouse(t)
	e.chAddr, e.database = ch.Addr, "faults"
	ranker := e.start("ranker", "RANKER_BATCH_SIZE=50", "RANKER_FLUSH_INTERVAL=20ms")
	sends, firstByID := tournament(11, 12, 6, 5)
	third := len(sends) / 3
	publishAll(t, e, sends, 0, third)
	waitCommitted(t, e, third)

	if err := ch.Pause(); err != nil {
		t.Fatal(err)
	}
	publishAll(t, e, sends, third, 2*third)
	waitStatus(t, ranker, http.StatusServiceUnavailable, 15*time.Second)
	if got := ackFloor(t, e); got != uint64(third) {
		t.Errorf("ack floor moved to %d while ClickHouse was frozen, want %d", got, third)
	}
	if err := ch.Resume(); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, e, 2*third)
	waitStatus(t, ranker, http.StatusOK, 30*time.Second)

	if err := ch.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	publishAll(t, e, sends, 2*third, len(sends))
	waitCommitted(t, e, len(sends))
	waitStatus(t, ranker, http.StatusOK, 30*time.Second)
	checkAgainstTruth(t, ranker, firstByID)
	if errs := ranker.metric(t, `ranker_clickhouse_errors_total{kind="unavailable"}`); errs == 0 {
		t.Errorf("no ClickHouse unavailability was counted")
	}
}

func waitStatus(t *testing.T, p *proc, want int, limit time.Duration) {
	t.Helper()
	testenv.WaitFor(t, limit, fmt.Sprintf("/readyz to answer %d", want), func() (bool, string) {
		code := p.getJSON(t, "/readyz", nil)
		return code == want, fmt.Sprint(code)
	})
}

// TestRankerSIGTERMDuringFlushLosesNothing stops a ranker while it holds a batch that is still
// filling: it writes and acks the batch, and exits 0 within the shutdown timeout.
func TestRankerSIGTERMDuringFlushLosesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker", "RANKER_BATCH_SIZE=100000", "RANKER_FLUSH_INTERVAL=30s", "RANKER_LINGER=30s", "RANKER_SHUTDOWN_TIMEOUT=5s") // one batch held for 30 s
	sends, firstByID := tournament(3, 5, 5, 3)
	publishAll(t, e, sends, 0, len(sends))
	// Wait until the ranker holds every message unacked in its batch.
	testenv.WaitFor(t, 10*time.Second, "the ranker to hold the whole batch", func() (bool, string) {
		cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
		if err != nil {
			return false, err.Error()
		}
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending == len(sends), fmt.Sprintf("%d of %d ack pending", info.NumAckPending, len(sends))
	})
	took, err := ranker.stop(t, 10*time.Second)
	if err != nil {
		t.Fatalf("ranker exited with %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("ranker took %s to stop, over its 5s shutdown timeout", took)
	}
	if got := ackFloor(t, e); got != uint64(len(sends)) {
		t.Fatalf("after SIGTERM the ack floor is %d, want %d: the batch in hand was not committed", got, len(sends))
	}
	t.Logf("stopped in %s with %d evaluations flushed", took, len(sends))
	checkAgainstTruth(t, e.start("ranker"), firstByID)
}

// TestRankerKilledRecoveryTime measures how long evaluations held by a SIGKILLed ranker wait:
// with the default RANKER_ACK_WAIT (10s) a new ranker commits them at most that long after they
// were delivered. Meanwhile prompts of their execution answer inputs_not_ready.
func TestRankerKilledRecoveryTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	victim := e.start("ranker")
	// Frozen before the evaluations arrive: it is handed them (they are pending an ack on it)
	// but never commits them.
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 50 {
		last = e.publishEvaluation(fmt.Sprintf("held-%d", i), evaluation("held", "t1", "One", i+1, 50, "x", t0))
	}
	cons, err := e.js.Consumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the frozen ranker to be handed the evaluations", func() (bool, string) {
		info, err := cons.Info(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending > 0, fmt.Sprintf("%+v", info)
	})
	killed := time.Now()
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	e.start("ranker")
	waitCommitted(t, e, int(last))
	recovery := time.Since(killed)
	t.Logf("evaluations held by the killed ranker committed %s after the kill (RANKER_ACK_WAIT 10s)", recovery.Round(100*time.Millisecond))
	// The redelivery delay is the consumer's AckWait, read exactly; the time is bounded with a
	// margin a loaded machine meets (the new ranker's insert and ack take about 0.1s idle), still
	// short of JetStream's default AckWait of 30s.
	info, err := cons.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.AckWait != 10*time.Second {
		t.Errorf("ranker consumer AckWait = %s, want the default RANKER_ACK_WAIT 10s", info.Config.AckWait)
	}
	if recovery > 20*time.Second {
		t.Errorf("recovery took %s, want the 10s AckWait and at most 10s more", recovery)
	}
}
