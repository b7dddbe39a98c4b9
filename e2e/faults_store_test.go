package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// TestAnswersHeldWhilePromptsCannotStoreThem: PROMPTS stops taking answers, first full (an
// operator's max_bytes with discard new), then deleted. The composer holds every request in
// hand, kept alive past its AckWait and never redelivered, so COMPOSER_MAX_DELIVER=2 drops
// nothing; it turns unready naming PROMPTS; once the limit is raised, and once it has made the
// deleted stream again, every request is answered exactly once and it is ready again, without a
// restart.
func TestAnswersHeldWhilePromptsCannotStoreThem(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer", "COMPOSER_ACK_WAIT=1s", "COMPOSER_MAX_DELIVER=2")
	const exec = "held"
	e.publishEvaluation("ev-held-1", evaluation(exec, "t1", "Team t1", 1, 50, "first", t0))
	request := func(i int) {
		e.requestRound(fmt.Sprintf("req-held-%d", i), events.RoundRequested{ExecutionID: exec, TeamID: fmt.Sprintf("t%d", i), TeamName: "T",
			RoundNumber: 2, UserPrompt: "go"}, t0.Add(time.Hour))
	}
	request(0)
	answeredOnce(t, e, 1, 30*time.Second)

	// Full: PROMPTS takes nothing more.
	stream, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := stream.CachedInfo().Config
	cfg.MaxBytes, cfg.Discard = int64(stream.CachedInfo().State.Bytes)+1, jetstream.DiscardNew
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		request(i)
	}
	waitReadiness(t, composer, http.StatusServiceUnavailable, 30*time.Second)
	if _, body := readiness(composer); !strings.Contains(body, "answers cannot be stored in PROMPTS") {
		t.Errorf("readiness does not name PROMPTS: %s", body)
	}
	full := time.Now()
	holds(t, 3*time.Second, "the requests held, not redelivered, while PROMPTS is full", func() (bool, string) {
		info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer)
		if err != nil {
			return false, err.Error()
		}
		return info.NumRedelivered == 0 && info.NumAckPending == 3, fmt.Sprintf("%d redelivered, %d in hand", info.NumRedelivered, info.NumAckPending)
	})
	cfg.MaxBytes = -1
	if _, err := e.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	answeredOnce(t, e, 4, 30*time.Second)
	waitReadiness(t, composer, http.StatusOK, 30*time.Second)
	healed := time.Since(full)

	// Deleted: made again by the composer (MANAGE_STREAMS), once its deletion has settled.
	if err := e.js.DeleteStream(t.Context(), events.StreamPrompts); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	for i := 4; i <= 6; i++ {
		request(i)
	}
	testenv.WaitFor(t, 30*time.Second, "PROMPTS made again with the 3 answers", func() (bool, string) {
		st, err := e.js.Stream(t.Context(), events.StreamPrompts)
		if err != nil {
			return false, err.Error()
		}
		return st.CachedInfo().State.Msgs == 3, fmt.Sprint(st.CachedInfo().State.Msgs, " answers")
	})
	remade := time.Since(deleted)
	info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 {
		t.Errorf("%d requests were redelivered while held", info.NumRedelivered)
	}
	answeredOnce(t, e, 3, 30*time.Second)
	waitReadiness(t, composer, http.StatusOK, 30*time.Second)
	t.Logf("PROMPTS full: 3 requests held %s (%v publish retries), answered once after the limit was raised; PROMPTS deleted: made again and 3 answers stored %s after the delete",
		healed.Round(time.Millisecond), composer.metric(t, "composer_answer_retries_total"), remade.Round(time.Millisecond))
}

// TestConsumerDeletedWhileBehindIsMadeAgain: the ranker is behind (ClickHouse frozen, a batch in
// hand and its pull buffer full, so no pull waits on the server) when an operator deletes its
// consumer. nats.go tells only a waiting pull of the deletion; the runtime's lookup finds the
// consumer gone, makes it again, and once ClickHouse is back every evaluation, those of before
// and after the delete, is committed once.
func TestConsumerDeletedWhileBehindIsMadeAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ch := testenv.PrivateClickHouse(t) // frozen below: the shared one would fail the tests beside it
	e.chAddr, e.database = ch.Addr, "behind"
	ranker := e.start("ranker", "RANKER_BATCH_SIZE=5", "RANKER_FLUSH_INTERVAL=20ms")
	sends, first := tournament(29, 4, 5, 4)
	third := len(sends) / 3
	publishAll(t, e, sends, 0, third)
	waitCommitted(t, e, third)

	if err := ch.Pause(); err != nil {
		t.Fatal(err)
	}
	publishAll(t, e, sends, third, 2*third)
	testenv.WaitFor(t, 15*time.Second, "the ranker to hold a batch and a full buffer", func() (bool, string) {
		info, err := consumerInfo(t.Context(), e.js, events.StreamEvaluations, events.ConsumerRanker)
		if err != nil {
			return false, err.Error()
		}
		return info.NumAckPending >= 10, fmt.Sprint(info.NumAckPending, " in hand")
	})
	if err := e.js.DeleteConsumer(t.Context(), events.StreamEvaluations, events.ConsumerRanker); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	time.Sleep(3 * time.Second) // longer than a lookup's period: the batch in hand is still behind ClickHouse
	if err := ch.Resume(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the ranker to find its consumer gone and make it again", func() (bool, string) {
		n := ranker.metric(t, "ranker_consumer_recoveries_total")
		return n >= 1, fmt.Sprint(n, " recoveries")
	})
	remade := time.Since(deleted)
	publishAll(t, e, sends, 2*third, len(sends))
	waitCommitted(t, e, len(sends))
	waitStatus(t, ranker, http.StatusOK, 30*time.Second)
	checkAgainstTruth(t, ranker, first)
	cause, _ := checkLostAndMadeAgain(t, ranker, events.ConsumerRanker)
	t.Logf("consumer deleted with %d evaluations behind: made again %s after the delete, ClickHouse back after 3 s (cause %q); all %d committed",
		third, remade.Round(time.Millisecond), cause, len(sends))
}

// TestConsumerMadeAgainResumesAfterWhatWasHandled: a consumer made again after an operator
// deleted it starts after the last ack floor the service saw, not at the stream's first message:
// requests answered long ago (past PROMPTS' ten-minute duplicate window) are not answered again.
// The service restarted afterwards keeps that start.
func TestConsumerMadeAgainResumesAfterWhatWasHandled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	for i := range 5 {
		e.requestRound(fmt.Sprintf("req-resume-%d", i), events.RoundRequested{ExecutionID: "resume", TeamID: fmt.Sprintf("t%d", i), TeamName: "T",
			RoundNumber: 1, UserPrompt: "go"}, t0)
	}
	answeredOnce(t, e, 5, 30*time.Second)
	time.Sleep(3 * time.Second) // the runtime looks its consumer up every 2 s: it has seen the floor at 5
	if err := e.js.DeleteConsumer(t.Context(), events.StreamRounds, events.ConsumerComposer); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the composer's consumer made again", func() (bool, string) {
		n := composer.metric(t, "composer_consumer_recoveries_total")
		return n >= 1, fmt.Sprint(n, " recoveries")
	})
	info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || info.Config.OptStartSeq != 6 {
		t.Errorf("the consumer made again starts with %v at %d, want by start sequence at 6", info.Config.DeliverPolicy, info.Config.OptStartSeq)
	}
	if _, err := composer.stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	composer = e.start("composer") // its start updates the consumer: the start sequence stays
	// Deleted again at once: the new process knows the floor from its start, not only from its
	// first lookup two seconds later (the soak found a replica that started from the first
	// request, and answered 34,308 requests a second time past the duplicate window).
	if err := e.js.DeleteConsumer(t.Context(), events.StreamRounds, events.ConsumerComposer); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 15*time.Second, "the consumer made again by the new composer", func() (bool, string) {
		_, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer)
		return err == nil, fmt.Sprint(err)
	})
	if info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer); err != nil ||
		info.Config.DeliverPolicy != jetstream.DeliverByStartSequencePolicy || info.Config.OptStartSeq != 6 {
		t.Errorf("deleted right after a start, the consumer was made again with %+v (err %v), want by start sequence at 6", info.Config, err)
	}
	e.requestRound("req-resume-after", events.RoundRequested{ExecutionID: "resume", TeamID: "t9", TeamName: "T", RoundNumber: 1, UserPrompt: "go"}, t0)
	answeredOnce(t, e, 6, 30*time.Second)
	if info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer); err != nil || info.Config.OptStartSeq != 6 {
		t.Errorf("after a restart the consumer starts at %v (err %v), want 6", info.Config.OptStartSeq, err)
	}
}
