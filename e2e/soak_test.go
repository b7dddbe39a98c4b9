package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	gocmp "github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/servers"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// TestChaosSoak plays tournaments (several executions, two composer replicas, replays and
// re-evaluations) while a seeded schedule injects faults: the ranker, composer replicas and the
// archiver killed with SIGKILL, the NATS server restarted, ClickHouse frozen, a durable consumer
// deleted, the evaluations table or the prompts archive dropped. Then, once every service is back:
//   - every request JetStream acknowledged is answered exactly once;
//   - the prompts archive holds every PROMPTS record once, byte for byte;
//   - every leaderboard equals a recount of the EVALUATIONS stream;
//   - every prompt's leaderboard equals a recomputation from the stream as of its
//     evaluations_seq, and `podium prompts verify --all` re-renders every prompt to its bytes;
//   - no service was ready with work pending and none of it done for more than soakIdleLimit
//     (from a log of probes taken every 500 ms).
//
// PODIUM_SOAK sets how long it plays (default 75s; `make soak` plays 30 minutes) and
// PODIUM_SOAK_SEED the schedule (default: the clock). The seed is printed first: a failing seed
// plays the same schedule again.
func TestChaosSoak(t *testing.T) {
	t.Parallel()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	play := 75 * time.Second
	if v := os.Getenv("PODIUM_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("PODIUM_SOAK: %v", err)
		}
		play = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("PODIUM_SOAK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PODIUM_SOAK_SEED: %v", err)
		}
		seed = s
	}
	t.Logf("chaos soak: seed %d (PODIUM_SOAK_SEED=%d reproduces the schedule), playing %s", seed, seed, play)

	s := newSoak(t, seed)
	deadline := time.Now().Add(play)
	var wg sync.WaitGroup
	for x := range soakExecutions {
		wg.Go(func() { s.orchestrate(fmt.Sprintf("soak-%d", x), deadline, seed+uint64(x)) })
	}
	probesDone := make(chan struct{})
	stopProbes := make(chan struct{})
	go func() { defer close(probesDone); s.probe(stopProbes) }()
	s.chaos(deadline)
	wg.Wait()

	// Every fault is healed by now: the services catch up by themselves.
	s.waitQuiet()
	close(stopProbes)
	<-probesDone
	s.check()
}

const (
	soakExecutions = 3 // played at once, each by its own orchestrator
	soakTeams      = 4
	soakRounds     = 10
	soakVerified   = 40 // executions podium prompts verify re-renders whole
	// soakIdleLimit is how long a service may be ready while work is pending and none of it gets
	// done: longer than a composer's wait for the ranker (COMPOSER_INPUTS_TIMEOUT, 10 s) after
	// which it answers anyway.
	soakIdleLimit = 20 * time.Second
)

// soak is one soak's servers, services, and what the orchestrators saw acknowledged.
type soak struct {
	t    *testing.T
	e    *env
	rng  *rand.Rand // the schedule's: used by chaos alone
	ch   *servers.ClickHouse
	port int
	dir  string

	nsMu sync.Mutex
	ns   *server.Server

	mu       sync.Mutex
	services map[string]*soakService
	faults   []string // "at: what", in order
	idle     []string // probe log violations
	unready  map[string]time.Duration

	requests  sync.Map // request id -> struct{}: acknowledged by JetStream
	published atomic.Int64
	answered  atomic.Int64 // seen by the orchestrators in time
	late      atomic.Int64 // not seen within their wait
}

// soakService is one running service process and how to start it again.
type soakService struct {
	name, bin string
	extra     []string
	p         *proc
}

func newSoak(t *testing.T, seed uint64) *soak {
	_, portText, _ := net.SplitHostPort(freeAddr(t))
	port, _ := strconv.Atoi(portText)
	s := &soak{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), port: port, dir: t.TempDir(), services: map[string]*soakService{},
		unready: map[string]time.Duration{}}
	s.ns = startNATSAt(t, port, s.dir)
	t.Cleanup(func() {
		s.nsMu.Lock()
		defer s.nsMu.Unlock()
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
	nc, err := nats.Connect(s.ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s.ch = testenv.PrivateClickHouse(t) // frozen and written to by hand below: not the shared one
	s.e = &env{t: t, ns: s.ns, nc: nc, js: js, chAddr: s.ch.Addr, database: "soak"}
	// Short redelivery, so a killed service's work is taken over within seconds.
	s.add("ranker", "ranker", "RANKER_ACK_WAIT=3s")
	s.add("composer-a", "composer", "COMPOSER_ACK_WAIT=5s")
	s.add("composer-b", "composer", "COMPOSER_ACK_WAIT=5s")
	s.add("archiver", "archiver", "ARCHIVER_ACK_WAIT=3s")
	for _, svc := range s.services {
		svc.p.waitOK(t, "http://"+svc.p.addr+"/readyz")
	}
	return s
}

func (s *soak) add(name, bin string, extra ...string) {
	svc := &soakService{name: name, bin: bin, extra: extra}
	svc.p = s.e.spawn(bin, extra...)
	s.services[name] = svc
}

// fault records a fault injected (or healed) now.
func (s *soak) fault(start time.Time, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, fmt.Sprintf("%6.1fs %s", time.Since(start).Seconds(), what))
}

// chaos injects faults on the seeded schedule until deadline: one at a time, each healed before
// the next, every 3 to 8 seconds.
func (s *soak) chaos(deadline time.Time) {
	start := time.Now()
	kinds := []string{"kill ranker", "kill composer", "restart nats", "freeze clickhouse", "delete durable", "drop table", "kill archiver", "drop archive"}
	for {
		pause := time.Duration(3000+s.rng.IntN(5000)) * time.Millisecond
		if time.Now().Add(pause).After(deadline) {
			return
		}
		time.Sleep(pause)
		kind := kinds[s.rng.IntN(len(kinds))]
		switch kind {
		case "kill ranker":
			s.kill("ranker", start)
		case "kill composer":
			s.kill([]string{"composer-a", "composer-b"}[s.rng.IntN(2)], start)
		case "kill archiver":
			s.kill("archiver", start)
		case "restart nats":
			s.nsMu.Lock()
			s.ns.Shutdown()
			s.ns.WaitForShutdown()
			time.Sleep(time.Duration(200+s.rng.IntN(800)) * time.Millisecond)
			s.ns = startNATSAt(s.t, s.port, s.dir)
			s.nsMu.Unlock()
			s.fault(start, "NATS server restarted")
		case "freeze clickhouse":
			d := time.Duration(1000+s.rng.IntN(3000)) * time.Millisecond
			if err := s.ch.Pause(); err != nil {
				s.t.Error(err)
				continue
			}
			time.Sleep(d)
			if err := s.ch.Resume(); err != nil {
				s.t.Error(err)
			}
			s.fault(start, "ClickHouse frozen for "+d.String())
		case "delete durable":
			stream, durable := events.StreamEvaluations, events.ConsumerRanker
			switch s.rng.IntN(3) {
			case 1:
				stream, durable = events.StreamRounds, events.ConsumerComposer
			case 2:
				stream, durable = events.StreamPrompts, events.ConsumerArchiver
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := s.e.js.DeleteConsumer(ctx, stream, durable)
			cancel()
			s.fault(start, fmt.Sprintf("durable %s deleted (%v)", durable, errText(err)))
		case "drop table":
			conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{s.ch.Addr}, Auth: clickhouse.Auth{Database: "soak"}})
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = conn.Exec(ctx, "DROP TABLE IF EXISTS evaluations")
				cancel()
				conn.Close()
			}
			s.fault(start, fmt.Sprintf("evaluations table dropped (%v)", errText(err)))
		case "drop archive":
			conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{s.ch.Addr}, Auth: clickhouse.Auth{Database: "soak"}})
			if err == nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err = conn.Exec(ctx, "DROP TABLE IF EXISTS prompts")
				cancel()
				conn.Close()
			}
			s.fault(start, fmt.Sprintf("prompts table (the archive) dropped (%v)", errText(err)))
		}
	}
}

func errText(err error) string {
	if err == nil {
		return "done"
	}
	return err.Error()
}

// kill ends a service with SIGKILL and starts it again after up to two seconds.
func (s *soak) kill(name string, start time.Time) {
	s.mu.Lock()
	svc := s.services[name]
	s.mu.Unlock()
	_ = svc.p.cmd.Process.Kill()
	err := <-svc.p.done
	svc.p.done <- err // the cleanup waits for it too
	time.Sleep(time.Duration(s.rng.IntN(2000)) * time.Millisecond)
	p := s.e.spawn(svc.bin, svc.extra...)
	s.mu.Lock()
	svc.p = p
	s.mu.Unlock()
	s.fault(start, name+" killed (SIGKILL) and started again")
}

// orchestrate plays executions of soakRounds rounds, one after the other, until deadline, as an
// orchestrator does: each round, every team's request, then (once answered, or after a while)
// every team's evaluation; now and then an evaluation is replayed (the same event id stored
// again) or re-evaluated (a new id, a later evaluated_at, another score).
func (s *soak) orchestrate(name string, deadline time.Time, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed>>1|1))
	for n := 0; time.Now().Before(deadline); n++ {
		exec := fmt.Sprintf("%s-%d", name, n)
		for round := 1; round <= soakRounds && time.Now().Before(deadline); round++ {
			if !s.playRound(rng, exec, round) {
				return
			}
		}
	}
}

// playRound plays one round of an execution; false when the orchestrator cannot go on.
func (s *soak) playRound(rng *rand.Rand, exec string, round int) bool {
	at := t0.Add(time.Duration(round) * time.Hour)
	ids := map[string]string{}
	for tm := range soakTeams {
		team := fmt.Sprintf("t%d", tm)
		id := fmt.Sprintf("req-%s-%s-%d", exec, team, round)
		rr := events.RoundRequested{ExecutionID: exec, TeamID: team, TeamName: "Team " + team, RoundNumber: round, MaxRounds: soakRounds,
			UserPrompt: "Design a protocol that survives the failures it will meet."}
		body, err := events.Marshal(id, "orchestrator/soak", events.TypeRoundRequested, at, rr)
		if err == nil {
			_, _, err = publishUntilAcked(context.Background(), s.e.js, events.RoundSubject(exec, team), id, body)
		}
		if err != nil {
			s.t.Error(err)
			return false
		}
		s.requests.Store(id, struct{}{})
		s.published.Add(1)
		ids[team] = id
	}
	s.awaitAnswers(exec, ids, 20*time.Second)
	for tm := range soakTeams {
		team := fmt.Sprintf("t%d", tm)
		at = at.Add(time.Second)
		id := fmt.Sprintf("ev-%s-%s-%d", exec, team, round)
		ev := evaluation(exec, team, "Team "+team, round, float64(rng.IntN(10000))/100, soakText(rng, exec, team, round), at)
		s.publishEvaluation(id, id, ev)
		if rng.IntN(10) == 0 { // a replay: the same event stored again, which must count once
			s.publishEvaluation(id, id+"#replay", ev)
		}
		if rng.IntN(10) == 0 { // a re-evaluation: the newest evaluation of the round counts
			at = at.Add(time.Second)
			re := evaluation(exec, team, "Team "+team, round, float64(rng.IntN(10000))/100, soakText(rng, exec, team, round), at)
			s.publishEvaluation(id+"-re", id+"-re", re)
		}
	}
	return true
}

// soakText is an answer as a model writes one: a few KiB of text that repeats no other's.
func soakText(rng *rand.Rand, exec, team string, round int) string {
	words := []string{"quorum", "leader", "lease", "epoch", "replica", "commit", "snapshot", "fence", "term", "log", "heartbeat", "partition"}
	var b strings.Builder
	fmt.Fprintf(&b, "Answer of %s in %s, round %d.\n", team, exec, round)
	for b.Len() < 2000+rng.IntN(2000) {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(" \n"[rng.IntN(2)])
	}
	return b.String()
}

func (s *soak) publishEvaluation(id, msgID string, ev events.EvaluationCompleted) {
	body, err := events.Marshal(id, "orchestrator/soak", events.TypeEvaluationCompleted, ev.EvaluatedAt, ev)
	if err == nil {
		_, _, err = publishUntilAcked(context.Background(), s.e.js, events.EvaluationSubject(ev.ExecutionID, ev.TeamID), msgID, body)
	}
	if err != nil {
		s.t.Error(err)
	}
}

// awaitAnswers waits until each team's latest answer is its request's, or the limit passes.
func (s *soak) awaitAnswers(exec string, ids map[string]string, limit time.Duration) {
	pending := slices.Sorted(maps.Keys(ids))
	for end := time.Now().Add(limit); len(pending) > 0 && time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		st, err := s.e.js.Stream(context.Background(), events.StreamPrompts)
		if err != nil {
			continue
		}
		pending = slices.DeleteFunc(pending, func(team string) bool {
			for _, kind := range []string{"composed", "failed"} {
				msg, err := st.GetLastMsgForSubject(context.Background(), "prompt."+kind+"."+exec+"."+team)
				if err != nil {
					continue
				}
				var d struct {
					RequestID string `json:"request_id"`
				}
				var env events.Envelope
				if json.Unmarshal(msg.Data, &env) == nil && json.Unmarshal(env.Data, &d) == nil && d.RequestID == ids[team] {
					return true
				}
			}
			return false
		})
	}
	s.answered.Add(int64(len(ids) - len(pending)))
	s.late.Add(int64(len(pending)))
}

// probe reads every service's readiness, what its replicas settled, and both consumers every
// 500 ms until stop, and notes each time a service was ready while its consumer held pending work
// and none of it was done (no ack floor moved, no message settled) for longer than soakIdleLimit.
func (s *soak) probe(stop <-chan struct{}) {
	type progress struct {
		floor   uint64
		settled float64
		since   time.Time // when work was last done, or nothing was pending
	}
	consumers := map[string][2]string{"ranker": {events.StreamEvaluations, events.ConsumerRanker}, "composer": {events.StreamRounds, events.ConsumerComposer},
		"archiver": {events.StreamPrompts, events.ConsumerArchiver}}
	seen := map[string]*progress{}
	wasReady := map[string]time.Time{}
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-stop:
			return
		case <-time.After(500 * time.Millisecond):
		}
		now := time.Now()
		ready := map[string]bool{} // by kind: any replica ready
		s.mu.Lock()
		procs := map[string]*proc{}
		for name, svc := range s.services {
			procs[name] = svc.p
		}
		s.mu.Unlock()
		for name, p := range procs {
			ok := false
			if resp, err := client.Get("http://" + p.addr + "/readyz"); err == nil {
				resp.Body.Close()
				ok = resp.StatusCode == http.StatusOK
			}
			kind := strings.Split(name, "-")[0]
			ready[kind] = ready[kind] || ok
			if ok {
				if since, down := wasReady[name]; down && !since.IsZero() {
					s.mu.Lock()
					s.unready[name] = max(s.unready[name], now.Sub(since))
					s.mu.Unlock()
				}
				wasReady[name] = time.Time{}
			} else if wasReady[name].IsZero() {
				wasReady[name] = now
			}
		}
		settled := map[string]float64{} // by kind: messages settled by its live replicas so far
		for name, p := range procs {
			settled[strings.Split(name, "-")[0]] += settledOf(client, p, strings.Split(name, "-")[0])
		}
		for kind, c := range consumers {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			info, err := consumerInfo(ctx, s.e.js, c[0], c[1])
			cancel()
			if err != nil {
				continue // NATS restarting, the durable being made again
			}
			// Work is done while the floor moves or a replica settles messages (a request answered
			// inputs_not_ready while the ranker refills is work done too).
			pg := seen[kind]
			if pg == nil || info.AckFloor.Stream != pg.floor || info.NumPending+uint64(info.NumAckPending) == 0 || settled[kind] != pg.settled {
				seen[kind] = &progress{floor: info.AckFloor.Stream, settled: settled[kind], since: now}
				continue
			}
			if ready[kind] && now.Sub(pg.since) > soakIdleLimit {
				s.mu.Lock()
				s.idle = append(s.idle, fmt.Sprintf("%s ready with %d pending and %d in hand, ack floor at %d for %s", kind,
					info.NumPending, info.NumAckPending, pg.floor, now.Sub(pg.since).Round(time.Second)))
				s.mu.Unlock()
				pg.since = now // one line per stall
			}
		}
	}
}

// settledOf reads how many messages a service process has settled (its
// <kind>_messages_settled_total, all outcomes); 0 when it does not answer.
func settledOf(client *http.Client, p *proc, kind string) float64 {
	resp, err := client.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0
	}
	total := 0.0
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, kind+"_messages_settled_total{") {
			continue
		}
		if f := strings.Fields(line); len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			total += v
		}
	}
	return total
}

// waitQuiet waits until every service is ready and has done all the work there is.
func (s *soak) waitQuiet() {
	t := s.t
	s.mu.Lock()
	procs := []*proc{}
	for _, svc := range s.services {
		procs = append(procs, svc.p)
	}
	s.mu.Unlock()
	for _, p := range procs {
		waitReadiness(t, p, http.StatusOK, 90*time.Second)
	}
	testenv.WaitFor(t, 120*time.Second, "every evaluation committed, every request settled, every record archived", func() (bool, string) {
		var why []string
		for _, c := range [][2]string{{events.StreamEvaluations, events.ConsumerRanker}, {events.StreamRounds, events.ConsumerComposer}, {events.StreamPrompts, events.ConsumerArchiver}} {
			info, err := consumerInfo(t.Context(), s.e.js, c[0], c[1])
			if err != nil {
				return false, err.Error()
			}
			last := streamState(t, s.e.js, c[0]).LastSeq
			if info.AckFloor.Stream < last || info.NumAckPending > 0 || info.NumPending > 0 {
				why = append(why, fmt.Sprintf("%s: ack floor %d of %d, %d in hand, %d pending", c[1], info.AckFloor.Stream, last, info.NumAckPending, info.NumPending))
			}
		}
		return len(why) == 0, strings.Join(why, "; ")
	})
}

// check verifies what the soak promises (see TestChaosSoak) and logs its figures.
func (s *soak) check() {
	t := s.t
	// The stream, recounted: every stored evaluation by id, the first copy of each.
	var recs []rank.Record
	firstByID := map[string]published{}
	_ = readStream(t, s.e.js, events.StreamEvaluations, func(msg jetstream.Msg, seq uint64) {
		ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), 0)
		if err != nil {
			t.Errorf("EVALUATIONS %d: %v", seq, err)
			return
		}
		recs = append(recs, rank.Record{EventID: ev.ID, Source: ev.Source, Seq: seq, EvaluationCompleted: ev.Data})
		if _, ok := firstByID[ev.ID]; !ok {
			firstByID[ev.ID] = published{id: ev.ID, ev: ev.Data}
		}
	})
	s.mu.Lock()
	ranker := s.services["ranker"].p
	s.mu.Unlock()
	boards, _ := truth(firstByID, false)
	for exec, want := range boards {
		var got leaderboard
		if code := ranker.getJSON(t, "/v1/executions/"+exec+"/leaderboard", &got); code != http.StatusOK {
			t.Errorf("%s leaderboard: status %d", exec, code)
		}
		if diff := gocmp.Diff(want, got.Teams); diff != "" {
			t.Errorf("%s leaderboard (-recount of the stream +ranker):\n%s", exec, diff)
		}
	}

	// Every acknowledged request answered once; each prompt's board as of its sequence.
	answers := map[string]int{}
	composed, failed := 0, map[string]int{}
	recorded := map[string][]byte{} // PROMPTS' records by event id, the first copy
	recordedExecs := map[string]bool{}
	byExec := map[string][]rank.Record{}
	for _, r := range recs {
		byExec[r.ExecutionID] = append(byExec[r.ExecutionID], r)
	}
	_ = readStream(t, s.e.js, events.StreamPrompts, func(msg jetstream.Msg, _ uint64) {
		var env events.Envelope
		if err := json.Unmarshal(msg.Data(), &env); err != nil {
			t.Errorf("PROMPTS: %v", err)
			return
		}
		if _, ok := recorded[env.ID]; !ok {
			recorded[env.ID] = msg.Data()
			recordedExecs[strings.Split(msg.Subject(), ".")[2]] = true
		}
		if env.Type == events.TypePromptFailed {
			var pf events.PromptFailed
			_ = json.Unmarshal(env.Data, &pf)
			answers[pf.RequestID]++
			failed[string(pf.Code)]++
			return
		}
		var pc events.PromptComposed
		if err := json.Unmarshal(env.Data, &pc); err != nil {
			t.Errorf("PROMPTS: %v", err)
			return
		}
		answers[pc.RequestID]++
		composed++
		seq := pc.Inputs.EvaluationsSeq
		var upTo []rank.Record
		for _, r := range byExec[pc.ExecutionID] {
			if r.Seq <= seq {
				upTo = append(upTo, r)
			}
		}
		evs, _ := rank.FromRecords(upTo)
		want := evs.ForPrompt(pc.TeamID, pc.RoundNumber, rank.Pos{Seq: seq}, pc.Request.Data.Standings, events.Desc, nil).Board.Rows
		if diff := gocmp.Diff(want, pc.Inputs.Leaderboard, gocmp.Comparer(func(a, b []events.LeaderboardRow) bool { return gocmp.Equal(a, b) || len(a) == 0 && len(b) == 0 })); diff != "" {
			t.Errorf("the prompt of %s (evaluations_seq %d) carries another board than the stream gives (-stream +prompt):\n%s", pc.RequestID, seq, diff)
		}
	})
	missing, twice := 0, 0
	s.requests.Range(func(k, _ any) bool {
		switch answers[k.(string)] {
		case 0:
			missing++
			t.Errorf("request %s acknowledged and never answered", k)
		case 1:
		default:
			twice++
			t.Errorf("request %s answered %d times", k, answers[k.(string)])
		}
		return true
	})
	s.checkArchive(recorded, recordedExecs)
	// podium prompts verify re-renders every prompt of an execution from the store; a long soak
	// plays hundreds of executions, of which a seeded sample of soakVerified is verified (every
	// prompt's board was recomputed from the stream above).
	execs := slices.Sorted(maps.Keys(boards))
	rng := rand.New(rand.NewPCG(uint64(len(execs)), 7))
	rng.Shuffle(len(execs), func(i, j int) { execs[i], execs[j] = execs[j], execs[i] })
	for _, exec := range execs[:min(len(execs), soakVerified)] {
		if out, code := s.e.podium(t, nil, "prompts", "verify", "--all", "--execution", exec); code != 0 {
			t.Errorf("podium prompts verify --all --execution %s: exit %d\n%s", exec, code, out)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range s.idle {
		t.Errorf("probe log: %s", line)
	}
	t.Logf("faults injected (%d):\n  %s", len(s.faults), strings.Join(s.faults, "\n  "))
	t.Logf("%d requests acknowledged: %d prompt.composed, prompt.failed %v, %d unanswered, %d answered twice; %d answered within the orchestrators' 20 s wait, %d later",
		s.published.Load(), composed, failed, missing, twice, s.answered.Load(), s.late.Load())
	t.Logf("%d evaluations in the stream (%d distinct ids) over %d executions; longest unready spell per service: %v", len(recs), len(firstByID), len(boards), s.unready)
}

// checkArchive compares the prompts archive with PROMPTS: every record archived once, byte for
// byte, nothing else.
func (s *soak) checkArchive(recorded map[string][]byte, execs map[string]bool) {
	t := s.t
	st, err := chstore.Open(t.Context(), chstore.Config{Addrs: []string{s.ch.Addr}, Database: "soak"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	archived := 0
	for exec := range execs {
		rows, err := st.ArchivedPrompts(t.Context(), chstore.PromptFilter{ExecutionID: exec})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			archived++
			if want, ok := recorded[r.EventID]; !ok || !bytes.Equal(want, r.Body) {
				t.Errorf("archived record %s of %s (PROMPTS sequence %d) is not PROMPTS' record (in the stream: %v)", r.EventID, exec, r.Seq, ok)
			}
		}
	}
	if archived != len(recorded) {
		t.Errorf("the archive holds %d records, PROMPTS %d", archived, len(recorded))
	}
	t.Logf("the archive holds every one of PROMPTS' %d records once, byte for byte", archived)
}

// readStream hands fn every message of a stream, in order.
func readStream(t *testing.T, js jetstream.JetStream, stream string, fn func(jetstream.Msg, uint64)) error {
	t.Helper()
	cons, err := js.OrderedConsumer(t.Context(), stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	last := streamState(t, js, stream).LastSeq
	for seq := uint64(0); seq < last; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for msg := range batch.Messages() {
			md, _ := msg.Metadata()
			seq = md.Sequence.Stream
			fn(msg, seq)
			n++
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			t.Fatal(err)
		}
		if n == 0 {
			t.Fatalf("%s: nothing read after sequence %d of %d", stream, seq, last)
		}
	}
	return nil
}
