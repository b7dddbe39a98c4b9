package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
)

// Faults of the broker and of the store under the running services: a durable consumer or a
// stream deleted by an operator, a JetStream server restarted, the evaluations table dropped or
// altered by hand, the dead-letter stream gone. Each test has its own JetStream server and
// ClickHouse database, waits only on what it can observe, and logs how long recovery took.

// allStreams are the five streams of the contract.
var allStreams = []string{events.StreamEvaluations, events.StreamRounds, events.StreamPrompts, events.StreamLeaderboards, events.StreamDeadLetter}

// readiness asks p's /readyz without failing the test: the status (0 when p does not answer) and
// the body.
func readiness(p *proc) (int, string) {
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + p.addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// waitReadiness waits until p's /readyz answers want.
func waitReadiness(t testing.TB, p *proc, want int, limit time.Duration) {
	t.Helper()
	testenv.WaitFor(t, limit, fmt.Sprintf("%s /readyz %d", p.name, want), func() (bool, string) {
		code, body := readiness(p)
		return code == want, fmt.Sprintf("%d %s", code, body)
	})
}

// holds checks cond for the whole of d (polled every 50 ms) and fails the test the first time it
// does not hold: for what must stay true while nothing is done, as an unready service that waits
// for its stream.
func holds(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if ok, seen := cond(); !ok {
			t.Fatalf("%s stopped holding; seen: %s", what, seen)
		}
	}
}

// waitMetricAtLeast waits until a series of p reaches want and returns its value.
func waitMetricAtLeast(t testing.TB, p *proc, series string, want float64, limit time.Duration) float64 {
	t.Helper()
	var got float64
	testenv.WaitFor(t, limit, fmt.Sprintf("%s >= %v", series, want), func() (bool, string) {
		got = p.metric(t, series)
		return got >= want, fmt.Sprint(got)
	})
	return got
}

// logLines returns p's JSON log lines whose msg starts with msg, decoded.
func logLines(p *proc, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			continue
		}
		if s, _ := m["msg"].(string); strings.HasPrefix(s, msg) {
			out = append(out, m)
		}
	}
	return out
}

// checkLostAndMadeAgain checks that p logged the loss of its consumer once, as an error with a
// cause, and its recovery with how long it took; it returns the cause and that time as logged.
func checkLostAndMadeAgain(t *testing.T, p *proc, durable string) (cause, after string) {
	t.Helper()
	lost := logLines(p, "consumer lost")
	if len(lost) != 1 {
		t.Errorf("%s logged \"consumer lost\" %d times, want once", p.name, len(lost))
	}
	for _, l := range lost {
		if l["level"] != "ERROR" || l["consumer"] != durable {
			t.Errorf("%s logged the loss as %v of consumer %v, want ERROR of %s: %v", p.name, l["level"], l["consumer"], durable, l)
		}
		if cause, _ = l["cause"].(string); cause == "" {
			t.Errorf("%s logged the loss without a cause: %v", p.name, l)
		}
	}
	again := logLines(p, "consumer made again; consuming")
	if len(again) != 1 {
		t.Errorf("%s logged \"consumer made again; consuming\" %d times, want once", p.name, len(again))
		return cause, ""
	}
	if after, _ = again[0]["after"].(string); after == "" {
		t.Errorf("%s logged the recovery without \"after\": %v", p.name, again[0])
	}
	return cause, after
}

// consumerInfo is the info of a durable, asked by name.
func consumerInfo(ctx context.Context, js jetstream.JetStream, stream, durable string) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := js.Consumer(ctx, stream, durable)
	if err != nil {
		return nil, err
	}
	return cons.Info(ctx)
}

// streamState is the state of a stream, asked afresh.
func streamState(t testing.TB, js jetstream.JetStream, name string) jetstream.StreamState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return st.CachedInfo().State
}

// checkConsumerConfig fails the test when the durable made again differs from the one before in
// what the service configures.
func checkConsumerConfig(t *testing.T, before, after jetstream.ConsumerConfig) {
	t.Helper()
	type shape struct {
		Durable, FilterSubject, Description string
		AckPolicy                           jetstream.AckPolicy
		DeliverPolicy                       jetstream.DeliverPolicy
		AckWait                             time.Duration
		MaxAckPending, MaxDeliver           int
	}
	of := func(c jetstream.ConsumerConfig) shape {
		return shape{c.Durable, c.FilterSubject, c.Description, c.AckPolicy, c.DeliverPolicy, c.AckWait, c.MaxAckPending, c.MaxDeliver}
	}
	if b, a := of(before), of(after); b != a {
		t.Errorf("the consumer made again differs:\nbefore %+v\nafter  %+v", b, a)
	}
}

// boardRounds is the sum of the rounds of every team on exec's leaderboard, and the board.
func boardRounds(t testing.TB, ranker *proc, exec string) (int, leaderboard) {
	t.Helper()
	var lb leaderboard
	if code := ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &lb); code != http.StatusOK {
		return -1, lb
	}
	n := 0
	for _, row := range lb.Teams {
		n += row.Rounds
	}
	return n, lb
}

// waitBoardRounds waits until exec's leaderboard counts want rounds in all.
func waitBoardRounds(t testing.TB, ranker *proc, exec string, want int, limit time.Duration) {
	t.Helper()
	testenv.WaitFor(t, limit, fmt.Sprintf("%d rounds on the leaderboard of %s", want, exec), func() (bool, string) {
		n, lb := boardRounds(t, ranker, exec)
		return n == want, fmt.Sprintf("%d rounds: %+v", n, lb.Teams)
	})
}

// publishUntilAcked publishes one event until its stream acknowledges it, every try with the
// same Nats-Msg-Id, so a try that was stored but whose ack was lost is not stored again. It
// returns how many tries it took and whether the acknowledging stream called it a duplicate.
func publishUntilAcked(ctx context.Context, js jetstream.JetStream, subject, id string, body []byte) (tries int, dup bool, err error) {
	for {
		tries++
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ack, err := events.Publish(tctx, js, subject, id, body)
		cancel()
		if err == nil {
			return tries, ack.Duplicate, nil
		}
		select {
		case <-ctx.Done():
			return tries, false, fmt.Errorf("publish %s: %w (last try: %v)", id, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond): // the pause between two tries of a publish
		}
	}
}

// answeredOnce waits until the composer has settled every request of ROUNDS, then checks that
// PROMPTS holds one answer per request and returns the answers counted by request id.
func answeredOnce(t *testing.T, e *env, requests int, limit time.Duration) map[string]int {
	t.Helper()
	testenv.WaitFor(t, limit, "the composer to settle every request", func() (bool, string) {
		info, err := consumerInfo(t.Context(), e.js, events.StreamRounds, events.ConsumerComposer)
		if err != nil {
			return false, err.Error()
		}
		last := streamState(t, e.js, events.StreamRounds).LastSeq
		return info.AckFloor.Stream >= last && info.NumAckPending == 0 && info.NumPending == 0,
			fmt.Sprintf("ack floor %d of %d, ack pending %d, pending %d", info.AckFloor.Stream, last, info.NumAckPending, info.NumPending)
	})
	held := int(streamState(t, e.js, events.StreamPrompts).Msgs)
	count := map[string]int{}
	for _, m := range e.collect(events.StreamPrompts, "prompt.>", held, limit) {
		var d struct {
			RequestID string `json:"request_id"`
		}
		dataOf(t, m.Body, &d)
		count[d.RequestID]++
	}
	if held != requests {
		t.Errorf("PROMPTS holds %d answers, want %d (one per request): %v", held, requests, count)
	}
	for id, n := range count {
		if n != 1 {
			t.Errorf("request %s answered %d times on PROMPTS", id, n)
		}
	}
	return count
}

// TestConsumerDeletedIsMadeAgain: an operator deletes a service's durable consumer under it. The
// service logs the loss with its cause, makes the consumer again with the same configuration,
// counts the recovery and consumes again: new work is handled, and the work of before, which
// the new consumer delivers again from the start, is neither counted twice nor answered twice.
func TestConsumerDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		service, stream, durable string
	}{
		{"ranker", events.StreamEvaluations, events.ConsumerRanker},
		{"composer", events.StreamRounds, events.ConsumerComposer},
	} {
		t.Run(tt.service, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ranker := e.start("ranker")
			composer := e.start("composer")
			victim := map[string]*proc{"ranker": ranker, "composer": composer}[tt.service]
			play := func(exec string) {
				t.Helper()
				for i, team := range []string{"t1", "t2", "t3"} {
					e.publishEvaluation(exec+"-"+team, evaluation(exec, team, "Team "+team, 1, float64(50+10*i), "work of "+team, t0))
				}
				e.requestRound(exec+"-req", events.RoundRequested{ExecutionID: exec, TeamID: "t1", TeamName: "Team t1", RoundNumber: 2, UserPrompt: "Again."}, t0.Add(time.Hour))
				a := e.answers("prompt.*."+exec+".*", 1, 30*time.Second)[exec+"-req"]
				if !a.ok() {
					t.Fatalf("%s: the request was answered %s %+v, want prompt.composed", exec, a.subject, a.failed)
				}
				if !strings.Contains(a.composed.Prompt, "work of t1") {
					t.Errorf("%s: the prompt lacks the team's round 1:\n%s", exec, a.composed.Prompt)
				}
				waitBoardRounds(t, ranker, exec, 3, 30*time.Second)
			}
			play("before")
			before, err := consumerInfo(t.Context(), e.js, tt.stream, tt.durable)
			if err != nil {
				t.Fatal(err)
			}

			deleted := time.Now()
			if err := e.js.DeleteConsumer(t.Context(), tt.stream, tt.durable); err != nil {
				t.Fatal(err)
			}
			series := tt.service + "_consumer_recoveries_total"
			testenv.WaitFor(t, 30*time.Second, series+" == 1", func() (bool, string) {
				n := victim.metric(t, series)
				return n == 1, fmt.Sprint(n)
			})
			recovered := time.Since(deleted)
			waitReadiness(t, victim, http.StatusOK, 30*time.Second)
			ready := time.Since(deleted)
			cause, after := checkLostAndMadeAgain(t, victim, tt.durable)
			t.Logf("%s: consumer deleted -> recoveries_total 1 in %s, ready in %s (the service logged cause %q, after=%s)",
				tt.service, recovered.Round(time.Millisecond), ready.Round(time.Millisecond), cause, after)

			again, err := consumerInfo(t.Context(), e.js, tt.stream, tt.durable)
			if err != nil {
				t.Fatalf("the consumer was not made again: %v", err)
			}
			checkConsumerConfig(t, before.Config, again.Config)

			play("after")
			// The work of before, delivered again to the consumer made again, changes nothing.
			if n, lb := boardRounds(t, ranker, "before"); n != 3 {
				t.Errorf("the leaderboard of before counts %d rounds after the consumer was made again, want 3: %+v", n, lb.Teams)
			}
			answeredOnce(t, e, 2, 30*time.Second)
			// ... and handled again where the new consumer starts before it: it starts after the
			// last ack floor the runtime saw (consume.Runtime.resumeAt), which, as the floor is
			// read while the work goes on, is anywhere from the start to the end of the work of
			// before. Every message of after is handled, none more than twice.
			least, most := map[string]float64{"ranker": 6, "composer": 2}[tt.service], map[string]float64{"ranker": 9, "composer": 3}[tt.service]
			series = tt.service + `_messages_settled_total{outcome="done"}`
			testenv.WaitFor(t, 30*time.Second, series+" counting the work of after", func() (bool, string) {
				n := victim.metric(t, series)
				return n >= least, fmt.Sprint(n)
			})
			if n := victim.metric(t, series); n > most {
				t.Errorf("%s = %v, more than the work of before twice and after (%v)", series, n, most)
			}
			for _, p := range []*proc{ranker, composer} {
				if code, body := readiness(p); code != http.StatusOK {
					t.Errorf("%s /readyz %d %s at the end", p.name, code, body)
				}
			}
			if other := map[string]*proc{"ranker": composer, "composer": ranker}[tt.service]; other.metric(t, other.name+"_consumer_recoveries_total") != 0 {
				t.Errorf("%s made its consumer again too, though only the %s's was deleted", other.name, tt.service)
			}
		})
	}
}

// TestStreamDeletedIsMadeAgain: a stream deleted under the services.
func TestStreamDeletedIsMadeAgain(t *testing.T) {
	t.Parallel()
	// With MANAGE_STREAMS (the default) the ranker makes EVALUATIONS and its consumer again; the
	// operator's own recreation afterwards is harmless, and a new execution is stored. (The
	// stream's sequences restart at 1 while ClickHouse keeps the old rows: hence a new execution.)
	t.Run("managed EVALUATIONS", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ranker := e.start("ranker")
		composer := e.start("composer")
		for i, team := range []string{"t1", "t2"} {
			e.publishEvaluation("old-"+team, evaluation("old", team, "Team "+team, 1, float64(40+i), "old work", t0))
		}
		waitBoardRounds(t, ranker, "old", 2, 30*time.Second)

		deleted := time.Now()
		if err := e.js.DeleteStream(t.Context(), events.StreamEvaluations); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 30*time.Second, "ranker_consumer_recoveries_total == 1", func() (bool, string) {
			n := ranker.metric(t, "ranker_consumer_recoveries_total")
			return n == 1, fmt.Sprint(n)
		})
		recovered := time.Since(deleted)
		waitReadiness(t, ranker, http.StatusOK, 30*time.Second)
		cause, after := checkLostAndMadeAgain(t, ranker, events.ConsumerRanker)
		t.Logf("EVALUATIONS deleted -> stream and consumer made again in %s, ranker ready in %s (logged cause %q, after=%s)",
			recovered.Round(time.Millisecond), time.Since(deleted).Round(time.Millisecond), cause, after)

		ctx := t.Context()
		st, err := e.js.Stream(ctx, events.StreamEvaluations)
		if err != nil {
			t.Fatalf("EVALUATIONS was not made again: %v", err)
		}
		want, _ := events.StreamConfig(events.StreamEvaluations, events.StreamOptions{})
		got := st.CachedInfo().Config
		if !slices.Equal(got.Subjects, want.Subjects) || got.AllowDirect != want.AllowDirect || got.Duplicates != want.Duplicates ||
			got.Storage != want.Storage || got.Retention != want.Retention {
			t.Errorf("EVALUATIONS made again as %+v, want %+v", got, want)
		}
		// The operator makes it again too, as a runbook would: nothing changes.
		if err := events.EnsureStreams(ctx, e.js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
			t.Fatalf("the operator's recreation after the ranker's failed: %v", err)
		}
		if _, err := consumerInfo(ctx, e.js, events.StreamEvaluations, events.ConsumerRanker); err != nil {
			t.Fatalf("the ranker consumer is gone after the operator's recreation: %v", err)
		}

		for i, team := range []string{"t1", "t2", "t3"} {
			e.publishEvaluation("new-"+team, evaluation("new", team, "Team "+team, 1, float64(70+i), "new work of "+team, t0))
		}
		waitBoardRounds(t, ranker, "new", 3, 30*time.Second)
		e.requestRound("new-req", events.RoundRequested{ExecutionID: "new", TeamID: "t2", TeamName: "Team t2", RoundNumber: 2, UserPrompt: "Again."}, t0.Add(time.Hour))
		a := e.answers("prompt.*.new.*", 1, 30*time.Second)["new-req"]
		if !a.ok() || !strings.Contains(a.composed.Prompt, "new work of t2") {
			t.Errorf("the request of the new execution: %s %+v\n%s", a.subject, a.failed, a.composed.Prompt)
		}
		if n, lb := boardRounds(t, ranker, "old"); n != 2 {
			t.Errorf("the old execution's rows changed: %d rounds %+v", n, lb.Teams)
		}
		if n := ranker.metric(t, "ranker_consumer_recoveries_total"); n != 1 {
			t.Errorf("ranker_consumer_recoveries_total = %v after the operator's recreation, want 1", n)
		}
		for _, p := range []*proc{ranker, composer} {
			if code, body := readiness(p); code != http.StatusOK {
				t.Errorf("%s /readyz %d %s at the end", p.name, code, body)
			}
		}
	})

	// Without MANAGE_STREAMS the operator owns the streams: the composer turns unready when ROUNDS
	// is deleted and stays so, then takes up the stream the operator makes again.
	t.Run("unmanaged ROUNDS", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		ctx := t.Context()
		if err := events.EnsureStreams(ctx, e.js, events.StreamOptions{}, allStreams...); err != nil {
			t.Fatal(err)
		}
		if _, err := e.js.CreateKeyValue(ctx, events.AnsweredBucketConfig(1, 0)); err != nil {
			t.Fatal(err)
		}
		ranker := e.start("ranker", "MANAGE_STREAMS=false")
		composer := e.start("composer", "MANAGE_STREAMS=false")
		e.publishEvaluation("before-t1", evaluation("before", "t1", "Team t1", 1, 60, "before work", t0))
		e.requestRound("before-req", events.RoundRequested{ExecutionID: "before", TeamID: "t1", TeamName: "Team t1", RoundNumber: 2, UserPrompt: "Again."}, t0.Add(time.Hour))
		if a := e.answers("prompt.*.before.*", 1, 30*time.Second)["before-req"]; !a.ok() {
			t.Fatalf("before the fault: %s %+v", a.subject, a.failed)
		}

		deleted := time.Now()
		if err := e.js.DeleteStream(ctx, events.StreamRounds); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 10*time.Second, "the composer to turn unready, not consuming", func() (bool, string) {
			code, body := readiness(composer)
			return code == http.StatusServiceUnavailable && strings.Contains(body, `"consuming"`), fmt.Sprintf("%d %s", code, body)
		})
		unready := time.Since(deleted)
		// The composer must not make the operator's stream itself: it stays unready.
		holds(t, 3*time.Second, "the composer unready while ROUNDS is missing", func() (bool, string) {
			code, body := readiness(composer)
			return code == http.StatusServiceUnavailable, fmt.Sprintf("%d %s", code, body)
		})
		if _, err := e.js.Stream(ctx, events.StreamRounds); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Fatalf("ROUNDS exists again though MANAGE_STREAMS=false: %v", err)
		}
		if code, body := readiness(ranker); code != http.StatusOK {
			t.Errorf("the ranker turned unready (%d %s) though only ROUNDS was deleted", code, body)
		}

		recreated := time.Now()
		if err := events.EnsureStreams(ctx, e.js, events.StreamOptions{}, events.StreamRounds); err != nil {
			t.Fatal(err)
		}
		waitReadiness(t, composer, http.StatusOK, 30*time.Second)
		ready := time.Since(recreated)
		testenv.WaitFor(t, 10*time.Second, "composer_consumer_recoveries_total == 1", func() (bool, string) {
			n := composer.metric(t, "composer_consumer_recoveries_total")
			return n == 1, fmt.Sprint(n)
		})
		cause, after := checkLostAndMadeAgain(t, composer, events.ConsumerComposer)
		t.Logf("ROUNDS deleted -> composer unready in %s; operator's ROUNDS made again -> composer ready in %s (logged cause %q, after=%s: the whole outage)",
			unready.Round(time.Millisecond), ready.Round(time.Millisecond), cause, after)
		info, err := consumerInfo(ctx, e.js, events.StreamRounds, events.ConsumerComposer)
		if err != nil {
			t.Fatal(err)
		}
		if info.Config.FilterSubject != events.TypeRoundRequested+".>" || info.Config.AckWait != 30*time.Second {
			t.Errorf("composer consumer made again as %+v", info.Config)
		}

		asked := time.Now()
		e.requestRound("after-req", events.RoundRequested{ExecutionID: "before", TeamID: "t1", TeamName: "Team t1", RoundNumber: 3, UserPrompt: "Once more."}, t0.Add(2*time.Hour))
		a := e.answers("prompt.*.before.*", 2, 30*time.Second)["after-req"]
		if !a.ok() || !strings.Contains(a.composed.Prompt, "before work") {
			t.Errorf("the request after the recreation: %s %+v\n%s", a.subject, a.failed, a.composed.Prompt)
		}
		t.Logf("a request after the recreation was answered in %s", a.at.Sub(asked).Round(time.Millisecond))
	})
}

// startNATSAt starts a JetStream server on a fixed port and store, as a restart needs.
func startNATSAt(t testing.TB, port int, dir string) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatalf("nats on port %d did not accept connections within 10s", port)
	}
	return s
}

// TestNATSRestartLosesNothing restarts the JetStream server while evaluations and round requests
// flow, their publishers retrying each event with its id until it is acknowledged: every
// acknowledged evaluation is counted once, every acknowledged request answered once, and both
// services are ready again.
func TestNATSRestartLosesNothing(t *testing.T) {
	t.Parallel()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	_, portText, _ := net.SplitHostPort(freeAddr(t))
	port, _ := strconv.Atoi(portText)
	dir := t.TempDir()
	var nsMu sync.Mutex
	ns := startNATSAt(t, port, dir)
	t.Cleanup(func() {
		nsMu.Lock()
		defer nsMu.Unlock()
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	addr, db := testenv.Database(t)
	e := &env{t: t, ns: ns, nc: nc, js: js, chAddr: addr, database: db}
	ranker := e.start("ranker")
	composer := e.start("composer")

	const exec, teams, rounds, requests = "restart", 10, 30, 30
	var acked, retried, dups atomic.Int64
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() { // 300 evaluations over about 3 s
		defer wg.Done()
		for i := range teams * rounds {
			team, round := fmt.Sprintf("t%d", i%teams), i/teams+1
			ev := evaluation(exec, team, "Team "+team, round, float64(i%97), fmt.Sprintf("work %d", i), t0.Add(time.Duration(i)*time.Second))
			id := fmt.Sprintf("ev-%s-%d", team, round)
			body, err := events.Marshal(id, "orchestrator/test", events.TypeEvaluationCompleted, ev.EvaluatedAt, ev)
			if err != nil {
				errs <- err
				return
			}
			tries, dup, err := publishUntilAcked(ctx, js, events.EvaluationSubject(exec, team), id, body)
			if err != nil {
				errs <- err
				return
			}
			acked.Add(1)
			retried.Add(int64(tries - 1))
			if dup {
				dups.Add(1)
			}
			time.Sleep(10 * time.Millisecond) // pacing: the restart lands while evaluations flow
		}
	}()
	go func() { // 30 requests over about 3 s
		defer wg.Done()
		for i := range requests {
			id := fmt.Sprintf("req-%d", i)
			rr := events.RoundRequested{ExecutionID: "asks", TeamID: fmt.Sprintf("a%d", i), TeamName: "Asker", RoundNumber: 1, UserPrompt: "Go."}
			body, err := events.Marshal(id, "orchestrator/test", events.TypeRoundRequested, t0, rr)
			if err != nil {
				errs <- err
				return
			}
			tries, dup, err := publishUntilAcked(ctx, js, events.RoundSubject(rr.ExecutionID, rr.TeamID), id, body)
			if err != nil {
				errs <- err
				return
			}
			retried.Add(int64(tries - 1))
			if dup {
				dups.Add(1)
			}
			time.Sleep(100 * time.Millisecond) // pacing: requests are asked before, during and after the restart
		}
	}()

	testenv.WaitFor(t, 30*time.Second, "100 evaluations acknowledged before the restart", func() (bool, string) {
		return acked.Load() >= 100, fmt.Sprint(acked.Load())
	})
	atShutdown := acked.Load()
	nsMu.Lock()
	ns.Shutdown()
	ns.WaitForShutdown()
	nsMu.Unlock()
	// The outage lasts a second, long enough for every client to see it: the services turn
	// unready meanwhile.
	down := map[string]bool{}
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		for _, p := range []*proc{ranker, composer} {
			if code, _ := readiness(p); code == http.StatusServiceUnavailable {
				down[p.name] = true
			}
		}
	}
	nsMu.Lock()
	ns = startNATSAt(t, port, dir)
	e.ns = ns
	nsMu.Unlock()
	restarted := time.Now()
	for _, p := range []*proc{ranker, composer} {
		if !down[p.name] {
			t.Errorf("%s stayed ready while NATS was down", p.name)
		}
	}
	testenv.WaitFor(t, 30*time.Second, "both services ready after the restart", func() (bool, string) {
		rc, rb := readiness(ranker)
		cc, cb := readiness(composer)
		return rc == http.StatusOK && cc == http.StatusOK, fmt.Sprintf("ranker %d %s; composer %d %s", rc, rb, cc, cb)
	})
	ready := time.Since(restarted)

	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	published := teams * rounds
	waitBoardRounds(t, ranker, exec, published, 60*time.Second)
	waitCommitted(t, e, published)
	committed := time.Since(restarted)
	rinfo, err := consumerInfo(t.Context(), js, events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	// Deliveries beyond one per message: evaluations whose ack the shutdown lost, delivered again
	// after RANKER_ACK_WAIT; until then the ack floor, which composers wait on, stays behind them.
	redelivered := rinfo.Delivered.Consumer - rinfo.Delivered.Stream
	if st := streamState(t, js, events.StreamEvaluations); st.Msgs != uint64(published) {
		t.Errorf("EVALUATIONS holds %d messages, want %d: a retried publish was stored twice", st.Msgs, published)
	}
	if st := streamState(t, js, events.StreamRounds); st.Msgs != requests {
		t.Errorf("ROUNDS holds %d messages, want %d: a retried publish was stored twice", st.Msgs, requests)
	}
	count := answeredOnce(t, e, requests, 60*time.Second)
	for i := range requests {
		if id := fmt.Sprintf("req-%d", i); count[id] != 1 {
			t.Errorf("request %s answered %d times", id, count[id])
		}
	}
	// When the first answer after the restart was stored.
	var first time.Time
	composed, failed := 0, map[events.FailureCode]int{}
	for _, m := range e.collect(events.StreamPrompts, "prompt.>", requests, 10*time.Second) {
		if m.Time.After(restarted) && (first.IsZero() || m.Time.Before(first)) {
			first = m.Time
		}
		if strings.HasPrefix(m.Subject, "prompt.composed.") {
			composed++
			continue
		}
		// A request may be answered inputs_not_ready (retryable) when the ranker's commits stall
		// past COMPOSER_INPUTS_TIMEOUT: answered all the same, counted for the log.
		var pf events.PromptFailed
		dataOf(t, m.Body, &pf)
		failed[pf.Code]++
	}
	for _, p := range []*proc{ranker, composer} {
		if code, body := readiness(p); code != http.StatusOK {
			t.Errorf("%s /readyz %d %s at the end", p.name, code, body)
		}
	}
	firstAnswer := "none (every request was answered before the restart)"
	if !first.IsZero() {
		firstAnswer = first.Sub(restarted).Round(time.Millisecond).String()
	}
	t.Logf("restart after %d of %d evaluations; restart -> both services ready %s; restart -> first answer %s; restart -> every evaluation committed (ack floor) %s; "+
		"%d evaluations redelivered to the ranker; %d publish tries repeated, %d acks were duplicates; %d of %d answers prompt.composed, failed %v; recoveries: ranker %v, composer %v",
		atShutdown, published, ready.Round(time.Millisecond), firstAnswer, committed.Round(time.Millisecond), redelivered, retried.Load(), dups.Load(), composed, requests, failed,
		ranker.metric(t, "ranker_consumer_recoveries_total"), composer.metric(t, "composer_consumer_recoveries_total"))
}

// TestClickHouseTableDroppedUnderLoad: an operator drops the evaluations table while evaluations
// flow. The ranker makes it again from the migrations and stores every evaluation published after
// the drop (those stored before it are gone from ClickHouse until a rebuild: not asserted).
func TestClickHouseTableDroppedUnderLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker", "RANKER_BATCH_SIZE=20")
	const exec, teams, total = "dropped", 5, 300
	var dropped atomic.Bool
	var mu sync.Mutex
	afterDrop := map[string][]string{} // team -> evaluation ids published after the drop
	done := make(chan error, 1)
	go func() {
		for i := range total {
			team, round := fmt.Sprintf("t%d", i%teams), i/teams+1
			ev := evaluation(exec, team, "Team "+team, round, float64(i%89), "x", t0.Add(time.Duration(i)*time.Second))
			id := fmt.Sprintf("ev-%s-%d", team, round)
			late := dropped.Load() // read before the publish: true means it starts after the drop
			body, err := events.Marshal(id, "orchestrator/test", events.TypeEvaluationCompleted, ev.EvaluatedAt, ev)
			if err == nil {
				_, _, err = publishUntilAcked(t.Context(), e.js, events.EvaluationSubject(exec, team), id, body)
			}
			if err != nil {
				done <- err
				return
			}
			if late {
				mu.Lock()
				afterDrop[team] = append(afterDrop[team], id)
				mu.Unlock()
			}
			time.Sleep(5 * time.Millisecond) // pacing: the drop lands while evaluations flow
		}
		done <- nil
	}()
	testenv.WaitFor(t, 30*time.Second, "60 evaluations committed before the drop", func() (bool, string) {
		n := ackFloor(t, e)
		return n >= 60, fmt.Sprint(n)
	})
	e.storeExec("DROP TABLE evaluations")
	droppedAt := time.Now()
	dropped.Store(true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	repairs := waitMetricAtLeast(t, ranker, "ranker_clickhouse_repairs_total", 1, 30*time.Second)
	waitCommitted(t, e, total)
	committed := time.Since(droppedAt)

	late := 0
	for team, ids := range afterDrop {
		late += len(ids)
		testenv.WaitFor(t, 10*time.Second, "the evaluations of "+team+" published after the drop in its history", func() (bool, string) {
			var h history
			if code := ranker.getJSON(t, "/v1/executions/"+exec+"/teams/"+team+"/history", &h); code != http.StatusOK {
				return false, fmt.Sprint("status ", code)
			}
			have := map[string]bool{}
			for _, r := range h.Rounds {
				have[r.EvaluationID] = true
			}
			var missing []string
			for _, id := range ids {
				if !have[id] {
					missing = append(missing, id)
				}
			}
			return len(missing) == 0, fmt.Sprintf("missing %v", missing)
		})
	}
	if late == 0 {
		t.Fatal("no evaluation was published after the drop: the test shows nothing")
	}
	n, lb := boardRounds(t, ranker, exec)
	if n < late || n > total {
		t.Errorf("the leaderboard counts %d rounds, want from %d (published after the drop) to %d: %+v", n, late, total, lb.Teams)
	}
	waitReadiness(t, ranker, http.StatusOK, 30*time.Second)
	t.Logf("table dropped after %d evaluations committed; %v repairs; all %d committed %s after the drop; %d published after it are stored, %d rounds on the board",
		total-late, repairs, total, committed.Round(time.Millisecond), late, n)
}

// TestClickHouseTableAlteredStopsTheRanker: a column dropped by hand makes the table refuse every
// evaluation. The ranker names the difference, turns unready and exits non-zero without acking
// the evaluation; once the column is back, a new ranker stores it.
func TestClickHouseTableAlteredStopsTheRanker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ranker := e.start("ranker")
	e.storeExec("ALTER TABLE evaluations DROP COLUMN feedback")
	published := time.Now()
	seq := e.publishEvaluation("ev-altered", evaluation("altered", "t1", "Team t1", 1, 77, "refused work", t0))

	const stopMsg = "clickhouse refuses every evaluation; stopping"
	var exitErr error
	sawUnready, sawReadyAfterStop := false, false
	limit := time.After(30 * time.Second)
	for exited := false; !exited; {
		select {
		case exitErr = <-ranker.done:
			ranker.done <- exitErr // the cleanup waits for it too
			exited = true
			continue
		case <-limit:
			t.Fatalf("the ranker did not exit within 30s of an evaluation the altered table refuses\n%s", ranker.logs)
		case <-time.After(20 * time.Millisecond): // polling /readyz until the process ends
		}
		stopped := len(logLines(ranker, stopMsg)) > 0
		switch code, body := readiness(ranker); {
		case code == http.StatusServiceUnavailable:
			sawUnready = true
			if !strings.Contains(body, "clickhouse") {
				t.Errorf("/readyz 503 without the clickhouse check failing: %s", body)
			}
		case code == http.StatusOK && stopped:
			sawReadyAfterStop = true
		}
	}
	exited := time.Since(published)
	var ee *exec.ExitError
	if !errors.As(exitErr, &ee) || ee.ExitCode() == 0 {
		t.Errorf("the ranker exited with %v, want a non-zero exit status", exitErr)
	}
	if sawReadyAfterStop {
		t.Errorf("/readyz answered 200 after the ranker logged %q", stopMsg)
	}
	logs := ranker.logs.String()
	stops := logLines(ranker, stopMsg)
	if len(stops) == 0 {
		t.Errorf("the ranker did not log %q", stopMsg)
	}
	for _, l := range stops {
		if msg, _ := l["error"].(string); l["level"] != "ERROR" || !strings.Contains(msg, "column feedback is missing") || !strings.Contains(msg, "clickhouse") {
			t.Errorf("the stop is logged as %v", l)
		}
	}
	if !strings.Contains(logs, "column feedback is missing") {
		t.Errorf("the ranker's logs do not name the missing column")
	}
	info, err := consumerInfo(t.Context(), e.js, events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream >= seq || info.NumAckPending+int(info.NumPending) == 0 {
		t.Errorf("the refused evaluation was acked: ack floor %d (its sequence %d), ack pending %d, pending %d",
			info.AckFloor.Stream, seq, info.NumAckPending, info.NumPending)
	}
	t.Logf("evaluation published -> ranker exited (%v) in %s; /readyz 503 seen before the exit: %v; left unacked: ack pending %d, pending %d",
		exitErr, exited.Round(time.Millisecond), sawUnready, info.NumAckPending, info.NumPending)

	e.storeExec("ALTER TABLE evaluations ADD COLUMN feedback String AFTER metrics")
	restarted := time.Now()
	again := e.start("ranker")
	waitBoardRounds(t, again, "altered", 1, 30*time.Second)
	waitCommitted(t, e, int(seq))
	t.Logf("column restored -> the evaluation stored by a new ranker in %s", time.Since(restarted).Round(time.Millisecond))
}

// TestDeadLetterUnavailableKeepsTheBatchAlive: with DEADLETTER gone, dead-lettering a poison
// evaluation fails three times with backoff, longer than the consumer's AckWait. The batch it
// shares with valid evaluations is kept in progress meanwhile: the valid ones are stored and
// never redelivered, and the poison one is terminated anyway.
func TestDeadLetterUnavailableKeepsTheBatchAlive(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// A linger of 100 ms (the flush interval) gathers the burst below into one batch however
	// loaded the machine. (Evaluations that arrive after a batch was handed on wait in the pull
	// buffer, which nothing keeps alive: behind a poison alone in its batch they would be
	// redelivered every AckWait while its dead letter is tried.)
	ranker := e.start("ranker", "RANKER_ACK_WAIT=1s", "RANKER_LINGER=100ms")
	ctx := t.Context()
	if err := e.js.DeleteStream(ctx, events.StreamDeadLetter); err != nil {
		t.Fatal(err)
	}

	const valid = 5
	msgs := []*nats.Msg{nats.NewMsg(events.EvaluationSubject("dl", "t0"))}
	msgs[0].Data = []byte("{not json")
	msgs[0].Header.Set(nats.MsgIdHdr, "poison")
	for i := range valid {
		team := fmt.Sprintf("t%d", i+1)
		ev := evaluation("dl", team, "Team "+team, 1, float64(60+i), "fine", t0)
		body, err := events.Marshal("ok-"+team, "orchestrator/test", events.TypeEvaluationCompleted, t0, ev)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg(events.EvaluationSubject("dl", team))
		m.Data = body
		m.Header.Set(nats.MsgIdHdr, "ok-"+team)
		msgs = append(msgs, m)
	}
	// One burst: sent without waiting for each ack, so the ranker pulls them together.
	published := time.Now()
	var acks []jetstream.PubAckFuture
	for _, m := range msgs {
		f, err := e.js.PublishMsgAsync(m)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, f)
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(5 * time.Second):
			t.Fatal("no publish ack within 5s")
		}
	}

	maxRedelivered := 0
	testenv.WaitFor(t, 30*time.Second, "the valid evaluations stored and everything settled", func() (bool, string) {
		info, err := consumerInfo(ctx, e.js, events.StreamEvaluations, events.ConsumerRanker)
		if err != nil {
			return false, err.Error()
		}
		maxRedelivered = max(maxRedelivered, info.NumRedelivered)
		n, _ := boardRounds(t, ranker, "dl")
		return n == valid && info.AckFloor.Stream == uint64(len(msgs)) && info.NumAckPending == 0 && info.NumPending == 0,
			fmt.Sprintf("%d rounds stored; ack floor %d, ack pending %d, pending %d, redelivered %d", n, info.AckFloor.Stream, info.NumAckPending, info.NumPending, info.NumRedelivered)
	})
	stored := time.Since(published)
	info, err := consumerInfo(ctx, e.js, events.StreamEvaluations, events.ConsumerRanker)
	if err != nil {
		t.Fatal(err)
	}
	// The broker forgets a redelivery once the message is acked (NumRedelivered counts those
	// outstanding): the consumer's delivery sequence counts every delivery, redeliveries too.
	if maxRedelivered != 0 || info.NumRedelivered != 0 || info.Delivered.Consumer != uint64(len(msgs)) {
		t.Errorf("messages were redelivered: %d deliveries of %d messages, redelivered %d (at most %d while waiting)",
			info.Delivered.Consumer, len(msgs), info.NumRedelivered, maxRedelivered)
	}
	waitMetricAtLeast(t, ranker, "ranker_dead_letters_failed_total", 1, 10*time.Second)
	for series, want := range map[string]float64{
		`ranker_messages_settled_total{outcome="retry"}`:         0,
		`ranker_messages_settled_total{outcome="done"}`:          valid,
		`ranker_messages_settled_total{outcome="dead_lettered"}`: 1,
		"ranker_dead_letters_failed_total":                       1,
		"ranker_batch_size_count":                                1, // the valid ones in one insert
	} {
		if got := ranker.metric(t, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if len(logLines(ranker, "dead letter failed")) != 1 {
		t.Errorf("the ranker did not log \"dead letter failed\" once")
	}
	if stored < 1500*time.Millisecond { // the backoff between the three tries alone
		t.Errorf("the valid evaluations were stored %s after the burst, before the dead letter's 1.5 s of tries: they did not share the poison's batch", stored)
	}
	t.Logf("valid evaluations stored %s after the burst (the dead letter tried 3 times with 1.5 s of backoff; AckWait 1 s); %d deliveries of %d messages",
		stored.Round(time.Millisecond), info.Delivered.Consumer, len(msgs))
}
