package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// One answer per request for ever (docs/contract.md#one-answer-per-request): a request replayed
// with its id after PROMPTS' duplicate window, to one composer or to three at once, after a
// restart, gets no second answer; its first answer is noted in ANSWERED.

// onceRequest is the request every test here replays.
var onceRequest = events.RoundRequested{ExecutionID: "once", TeamID: "t1", TeamName: "Team t1", RoundNumber: 2, UserPrompt: "Again."}

// answerFirst publishes an evaluation and the request, and returns its one answer.
func answerFirst(t *testing.T, e *env) answer {
	t.Helper()
	e.publishEvaluation("once-ev-1", evaluation("once", "t1", "Team t1", 1, 60, "FIRST-WORK", t0))
	e.requestRound("once-req", onceRequest, t0.Add(time.Hour))
	a := e.answers("prompt.*.once.t1", 1, 30*time.Second)["once-req"]
	if !a.ok() || !strings.Contains(a.composed.Prompt, "FIRST-WORK") {
		t.Fatalf("the first answer: %s %+v", a.subject, a.failed)
	}
	return a
}

// checkNoted checks that ANSWERED notes the request's answer at its PROMPTS sequence.
func checkNoted(t *testing.T, e *env, requestID string) {
	t.Helper()
	var answerSeq uint64
	for _, m := range e.collect(events.StreamPrompts, "prompt.*.once.t1", 100, time.Second) {
		if m.Header.Get(jetstream.MsgIDHeader) == events.PromptEventID(requestID) {
			answerSeq = m.Seq
		}
	}
	kv, err := e.js.KeyValue(t.Context(), events.BucketAnswered)
	if err != nil {
		t.Fatal(err)
	}
	// The note comes just after PROMPTS took the answer, before the request is acknowledged.
	var entry jetstream.KeyValueEntry
	testenv.WaitFor(t, 10*time.Second, "ANSWERED's note of "+requestID, func() (bool, string) {
		entry, err = kv.Get(t.Context(), events.PromptEventID(requestID))
		return err == nil, fmt.Sprint(err)
	})
	var v events.Answered
	if err := json.Unmarshal(entry.Value(), &v); err != nil || answerSeq == 0 || v.PromptsSeq != answerSeq {
		t.Errorf("ANSWERED's note of %s: %s (%v), want prompts_seq %d", requestID, entry.Value(), err, answerSeq)
	}
}

// replayAndSettle publishes the request's bytes again, copies times, each under a Nats-Msg-Id of
// its own made from tag when tag is set (so ROUNDS keeps every copy and each composer may take one
// at once), under the request's own id otherwise, and waits until the composers acknowledged all
// of them.
func replayAndSettle(t *testing.T, e *env, copies int, tag string) {
	t.Helper()
	body, err := events.Marshal("once-req", "orchestrator/test", events.TypeRoundRequested, t0.Add(time.Hour), onceRequest)
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for k := range copies {
		msgID := "once-req"
		if tag != "" {
			msgID = fmt.Sprintf("once-req-%s-%d", tag, k)
		}
		last = e.publishRaw(events.RoundSubject("once", "t1"), msgID, body)
	}
	testenv.WaitFor(t, 60*time.Second, "the composers to acknowledge the replays", func() (bool, string) {
		info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer)
		if err != nil {
			return false, err.Error()
		}
		return info.AckFloor.Stream >= last && info.NumAckPending == 0, fmt.Sprintf("ack floor %d of %d, %d pending", info.AckFloor.Stream, last, info.NumAckPending)
	})
}

// onlyAnswer checks that PROMPTS holds exactly one answer of the request, the first.
func onlyAnswer(t *testing.T, e *env, first answer) {
	t.Helper()
	// Reads to the end of the stream: a second answer, had one come, is there by now (the
	// composers acknowledged the replays only after storing what they answered).
	got := e.collect(events.StreamPrompts, "prompt.*.once.t1", 2, 2*time.Second)
	if len(got) != 1 || got[0].Seq == 0 {
		for _, m := range got {
			t.Logf("PROMPTS %d %s: %.300s", m.Seq, m.Subject, m.Body)
		}
		t.Fatalf("PROMPTS holds %d answers of the request, want only the first", len(got))
	}
	var again events.PromptComposed
	dataOf(t, got[0].Body, &again)
	if again.Prompt != first.composed.Prompt {
		t.Errorf("the one answer changed")
	}
}

// replayedCount sums composer_requests_total{outcome="replayed"} over the composers.
func replayedCount(t *testing.T, ps []*proc) float64 {
	var n float64
	for _, p := range ps {
		n += p.metric(t, `composer_requests_total{code="",outcome="replayed"}`)
	}
	return n
}

// TestReplayAfterDuplicateWindow: the window shortened to a second (as a test may), a request
// replayed after it to three composers at once, then again after a composer restarts, is not
// answered again, although a newer evaluation would change its prompt; a new request still is.
func TestReplayAfterDuplicateWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composers := []*proc{e.start("composer"), e.start("composer"), e.start("composer")}
	first := answerFirst(t, e)
	checkNoted(t, e, "once-req")

	// PROMPTS' duplicate window down to a second: the composers set it only at start.
	ctx := t.Context()
	st, err := e.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.Duplicates = time.Second
	if _, err := e.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the window: PROMPTS itself would now store a second answer
	probeWindowPassed(t, e)

	// A newer evaluation: a second answer would show it.
	e.publishEvaluation("once-ev-2", evaluation("once", "t1", "Team t1", 1, 90, "NEWER-WORK", t0))
	waitCommitted(t, e, 2)
	replayAndSettle(t, e, 3, "past-window") // three copies at once: each composer may hold one
	onlyAnswer(t, e, first)
	if n := replayedCount(t, composers); n != 3 {
		t.Errorf("composer_requests_total{outcome=\"replayed\"} sums to %v over the composers, want 3", n)
	}

	// A composer restarted knows it too: the note is in NATS, not in a process.
	for _, p := range composers[1:] {
		if _, err := p.stop(t, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := composers[0].stop(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	restarted := e.start("composer")
	replayAndSettle(t, e, 1, "restarted")
	onlyAnswer(t, e, first)
	waitMetric(t, restarted, `composer_requests_total{code="",outcome="replayed"}`, 1)

	// A new request of the team is answered, from the newer evaluation.
	e.requestRound("once-req-2", onceRequest, t0.Add(time.Hour))
	got := e.answers("prompt.*.once.t1", 2, 30*time.Second)
	if a := got["once-req-2"]; !a.ok() || !strings.Contains(a.composed.Prompt, "NEWER-WORK") {
		t.Errorf("a new request after the replays: %s %+v", a.subject, a.failed)
	}
}

// probeWindowPassed shows that PROMPTS' window no longer stops a second copy: a message published
// twice under one Nats-Msg-Id on a subject no answer uses is stored twice.
func probeWindowPassed(t *testing.T, e *env) {
	t.Helper()
	subject := events.PromptFailedSubject("window-probe", "probe")
	var seqs []uint64
	for range 2 {
		ack, err := e.js.PublishMsg(t.Context(), &nats.Msg{Subject: subject, Data: []byte("{}"), Header: nats.Header{jetstream.MsgIDHeader: []string{"probe"}}})
		if err != nil {
			t.Fatal(err)
		}
		if ack.Duplicate {
			t.Fatalf("PROMPTS' window still holds the probe's id; the test would not show a replay past it")
		}
		seqs = append(seqs, ack.Sequence)
		time.Sleep(1500 * time.Millisecond)
	}
	t.Logf("PROMPTS stored one id twice past its window (sequences %v)", seqs)
}

// TestReplayAfterShippedWindow waits out the shipped 10-minute window for real (PODIUM_LONG=1;
// make test-long): a request replayed under its own id after it gets no second answer.
func TestReplayAfterShippedWindow(t *testing.T) {
	if os.Getenv("PODIUM_LONG") == "" {
		t.Skip("waits 10.5 minutes: set PODIUM_LONG=1 (make test-long)")
	}
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	first := answerFirst(t, e)
	st, err := e.js.Stream(t.Context(), events.StreamPrompts)
	if err != nil {
		t.Fatal(err)
	}
	if w := st.CachedInfo().Config.Duplicates; w != 10*time.Minute {
		t.Fatalf("PROMPTS' duplicate window is %s, want the shipped 10m", w)
	}
	wait := 10*time.Minute + 30*time.Second
	t.Logf("waiting %s, past PROMPTS' and ROUNDS' duplicate windows", wait)
	time.Sleep(wait)
	e.publishEvaluation("once-ev-2", evaluation("once", "t1", "Team t1", 1, 90, "NEWER-WORK", t0))
	waitCommitted(t, e, 2)
	replayAndSettle(t, e, 1, "") // as an orchestrator replays: the same id in the header
	onlyAnswer(t, e, first)
	waitMetric(t, composer, `composer_requests_total{code="",outcome="replayed"}`, 1)
}

// TestConcurrentFirstAnswers: the same request held by three composers at once inside the window
// (three copies published together) is stored once, and noted once, at that answer.
func TestConcurrentFirstAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	for range 3 {
		e.start("composer")
	}
	e.publishEvaluation("once-ev-1", evaluation("once", "t1", "Team t1", 1, 60, "FIRST-WORK", t0))
	waitCommitted(t, e, 1)
	replayAndSettle(t, e, 3, "at-once")
	got := e.answers("prompt.*.once.t1", 1, 30*time.Second)
	if a := got["once-req"]; !a.ok() {
		t.Fatalf("the request: %s %+v", a.subject, a.failed)
	}
	onlyAnswer(t, e, got["once-req"])
	checkNoted(t, e, "once-req")

	// A note that names another answer (PROMPTS made again starts its sequences over; a key put by
	// hand) is not taken: the request it claims is answered.
	kv, err := e.js.KeyValue(t.Context(), events.BucketAnswered)
	if err != nil {
		t.Fatal(err)
	}
	first := e.collect(events.StreamPrompts, "prompt.*.once.t1", 1, 5*time.Second)[0]
	if _, err := kv.Put(t.Context(), events.PromptEventID("once-other"), fmt.Appendf(nil, `{"prompts_seq": %d}`, first.Seq)); err != nil {
		t.Fatal(err)
	}
	e.requestRound("once-other", onceRequest, t0.Add(time.Hour))
	if a := e.answers("prompt.*.once.t1", 2, 30*time.Second)["once-other"]; !a.ok() {
		t.Errorf("a request whose note names another answer: %s %+v", a.subject, a.failed)
	}
	checkNoted(t, e, "once-other")
}

// TestAnsweredDeletedIsMadeAgain: ANSWERED deleted under a running composer holds the requests
// that need it (unready, never answered without their note) until the composer has made it again,
// then answers them once.
func TestAnsweredDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.start("ranker")
	composer := e.start("composer")
	answerFirst(t, e)
	if err := e.js.DeleteKeyValue(t.Context(), events.BucketAnswered); err != nil {
		t.Fatal(err)
	}
	e.requestRound("once-after", onceRequest, t0.Add(time.Hour))
	got := e.answers("prompt.*.once.t1", 2, 30*time.Second)
	if a := got["once-after"]; !a.ok() {
		t.Fatalf("the request after ANSWERED was deleted: %s %+v", a.subject, a.failed)
	}
	checkNoted(t, e, "once-after") // in the bucket made again
	if n := composer.metric(t, "composer_answer_retries_total"); n < 1 {
		t.Errorf("composer_answer_retries_total = %v: the answer was not held while ANSWERED was missing", n)
	}
	composer.waitOK(t, "http://"+composer.addr+"/readyz")
}
